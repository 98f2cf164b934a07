"""The process a run lives in: multi-host start-up, the backend line, and which process writes.

vaco_jax scales out with JAX's own multi-controller runtime: every process (one per host, or one
per GPU) runs the same command; `jax.distributed.initialize` connects them, after which
`jax.devices()` lists every device of every process and one `jit` program runs over all of them
(`vaco_jax.program`). Results, metrics and plots are written by process 0 only; checkpoints go
through orbax, which writes each process's shards itself. Every process must see the same
filesystem (the output directory) for resuming. A choice that leads into a collective step (whether
to checkpoint now, which checkpoint to resume, whether the output directory may be used) is made
by process 0 and sent to the others (`primary_decision`): each process's clock and view of the
filesystem can differ, and processes that chose differently would wait for each other forever.

The runtime starts with `--distributed` (flags name the coordinator, the process count and this
process's id, or JAX detects them: SLURM, Open MPI, Cloud TPU), or by itself when the environment
shows a multi-process launch (`SLURM_NTASKS` > 1 or `OMPI_COMM_WORLD_SIZE` > 1).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import jax
import numpy as np

from vaco_jax import cache
from vaco_jax.errors import invalid
from vaco_jax.options import Cluster


def detected_launcher() -> str | None:
    """The multi-process launcher this process was started by, if any."""
    for variable, name in (("SLURM_NTASKS", "SLURM"), ("OMPI_COMM_WORLD_SIZE", "Open MPI")):
        try:
            if int(os.environ.get(variable, "1")) > 1:
                return name
        except ValueError:
            pass
    return None


def initialize(cluster: Cluster = Cluster()) -> bool:
    """Start the multi-process runtime when asked or detected (once per process); returns whether
    this process is part of a multi-process run. Call before anything touches a device."""
    _check(cluster)
    if jax.distributed.is_initialized():
        return jax.process_count() > 1
    if not (cluster.distributed or cluster.coordinator_address or detected_launcher()):
        return False
    # CPU processes exchange data over gloo (TCP); accelerators use their own collectives.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=cluster.coordinator_address or None,
        num_processes=cluster.num_processes or None,
        process_id=cluster.process_id if cluster.process_id >= 0 else None)
    return jax.process_count() > 1


def _check(cluster: Cluster) -> None:
    if cluster.num_processes < 0:
        raise invalid("num_processes", cluster.num_processes, "must be >= 1 (0 = from the environment)")
    if cluster.process_id < -1 or (cluster.num_processes and cluster.process_id >= cluster.num_processes):
        raise invalid("process_id", cluster.process_id,
                      f"must be in [0, num_processes) = [0, {cluster.num_processes}) "
                      f"(-1 = from the environment)")
    if cluster.coordinator_address and ":" not in cluster.coordinator_address:
        raise invalid("coordinator_address", cluster.coordinator_address, "must be host:port")


def describe() -> str:
    """One line: the JAX backend and the devices and processes a program runs on."""
    devices = jax.devices()
    kinds = sorted({d.device_kind for d in devices})
    line = (f"JAX {jax.__version__} on {jax.default_backend()}: {len(devices)} device"
            f"{'s' if len(devices) > 1 else ''} ({', '.join(kinds)})")
    if jax.process_count() > 1:
        line += (f" in {jax.process_count()} processes, {jax.local_device_count()} here; "
                 f"this is process {jax.process_index()}")
    return line


def gpu_warning() -> str | None:
    """A warning when an NVIDIA GPU is visible (`nvidia-smi -L` lists one) but JAX runs on the CPU."""
    if jax.default_backend() != "cpu" or shutil.which("nvidia-smi") is None:
        return None
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if listed.returncode != 0 or "GPU" not in listed.stdout:
        return None
    return ("warning: an NVIDIA GPU is visible (nvidia-smi) but JAX runs on the CPU: install JAX's "
            "CUDA build with `pip install -c requirements-lock.txt -e \".[cuda12]\"`")


def announce(file=None) -> None:
    """Print the backend line (process 0 only) and, on any process, the GPU warning (to `file`,
    default stderr)."""
    file = sys.stderr if file is None else file
    warning = gpu_warning()
    if is_primary():
        print(describe(), file=file, flush=True)
    if warning:
        print(warning, file=file, flush=True)


def is_primary() -> bool:
    """Whether this process writes files (process 0 of a multi-process run; always on one)."""
    return jax.process_index() == 0


BARRIER_TIMEOUT_SECONDS = 3600
_barriers_passed = 0


def barrier(name: str) -> None:
    """Wait until every process reaches this point (nothing to wait for in one process).

    Waits through JAX's coordination service, for up to an hour: processes that compile the same
    program can finish minutes apart on a busy host, and a device collective would give up after
    30 s (gloo's wait for its peers on CPU). A JAX without that service's client gets a device
    collective instead."""
    global _barriers_passed
    if jax.process_count() == 1:
        return
    client = getattr(getattr(_jax_distributed(), "global_state", None), "client", None)
    if client is None or not hasattr(client, "wait_at_barrier"):
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)
        return
    _barriers_passed += 1   # a barrier's id is used once: every process counts the same barriers
    client.wait_at_barrier(f"vaco_jax:{_barriers_passed}:{name}",
                           timeout_in_ms=BARRIER_TIMEOUT_SECONDS * 1000)


def _jax_distributed():
    try:
        from jax._src import distributed
    except ImportError:
        return None
    return distributed


def primary_decision(decide):
    """`decide()` evaluated on process 0 alone; its result, or the error it raised, on every process.

    A choice that leads into a collective step (a checkpoint write, a barrier, a gather of arrays)
    must come out the same on every process, or each waits forever for the others at a different
    step. Each process's clock, and its view of a shared filesystem, can differ, so a choice read
    from them is made once, by process 0. `decide` must return JSON (it is sent as JSON, and comes
    back as JSON on every process, process 0 included, so one process's run behaves as many's) and
    must not itself take a collective step: only process 0 runs it. An error it raises is raised on
    every process: a `vaco_jax.errors` class as itself, any other as a `RuntimeError`.
    """
    if jax.process_count() == 1:
        return json.loads(json.dumps(decide()))
    if not is_primary():
        answer = json.loads(_bytes_from_primary(None))
    else:
        try:
            answer = {"result": decide()}
        except Exception as error:
            _bytes_from_primary(json.dumps({"error": type(error).__name__,
                                            "message": str(error)}).encode())
            raise
        _bytes_from_primary(json.dumps(answer).encode())
    if "error" in answer:
        raise _error_from_primary(answer["error"], answer["message"])
    return answer["result"]


def _error_from_primary(name: str, message: str) -> Exception:
    from vaco_jax import errors

    kind = getattr(errors, name, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        return kind(message)
    return RuntimeError(f"process 0 raised {name}: {message}")


_SHORT = 252   # bytes that travel with the length in one broadcast; longer ones take a second


def _bytes_from_primary(data: bytes | None) -> bytes:
    """Process 0's `data` on every process (the others pass None). Buffers are padded to a few
    sizes, so the broadcast program is compiled a few times per process, not once per length."""
    from jax.experimental import multihost_utils

    head = np.zeros(4 + _SHORT, np.uint8)
    if data is not None:
        head[:4] = np.frombuffer(np.uint32(len(data)).tobytes(), np.uint8)
        head[4:4 + min(len(data), _SHORT)] = np.frombuffer(data[:_SHORT], np.uint8)
    head = np.asarray(multihost_utils.broadcast_one_to_all(head))
    length = int(np.frombuffer(head[:4].tobytes(), np.uint32)[0])
    if length <= _SHORT:
        return head[4:4 + length].tobytes()
    body = np.zeros(1 << (length - 1).bit_length(), np.uint8)   # the next power of two
    if data is not None:
        body[:length] = np.frombuffer(data, np.uint8)
    return np.asarray(multihost_utils.broadcast_one_to_all(body))[:length].tobytes()


def to_host(tree):
    """Arrays → numpy, each whole: an array spread over several processes is gathered (every
    process must call this for it), anything else is copied from this process's devices."""
    def whole(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            from jax.experimental import multihost_utils
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(jax.device_get(x))
    return jax.tree.map(whole, tree)


def interactive() -> bool:
    """Progress bars belong here: a terminal, or a Jupyter kernel (not merely a process that
    imported ipykernel's modules); batch logs get a line per evaluation instead."""
    if sys.stderr.isatty():
        return True
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


# --- a status line while compiling --------------------------------------------------------------

def _print_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class StatusLine:
    """One line saying what a long silent step is doing (compiling takes a minute or more), then
    how it ended and how long it took.

    `live` (a terminal or a notebook): the seconds so far are counted at the end of the line,
    rewritten in place every `tick_seconds` by a background thread (backspaces over the count,
    so a line longer than the terminal still updates in place), and replaced by `outcome` and
    its seconds when the step ends. Otherwise (batch logs) `log` gets the line when the step
    starts and `label` + outcome and seconds when it ends, nothing between. Set `outcome` inside
    the `with` block; an exception ends the line without one."""

    TAIL = 64   # room kept at the end of the line for the count and the outcome

    def __init__(self, text: str, *, live: bool, log: Callable[[str], None] = _print_to_stderr,
                 label: str = "", stream=None, tick_seconds: float = 1.0):
        self.text, self.live, self.log, self.label = text, live, log, label
        self.stream = sys.stderr if stream is None else stream
        self.tick_seconds = tick_seconds
        self.outcome = "done"
        self._start, self._shown, self._thread = 0.0, "", None
        self._stop, self._lock = threading.Event(), threading.Lock()

    def seconds(self) -> float:
        return time.perf_counter() - self._start

    def __enter__(self) -> "StatusLine":
        self._start = time.perf_counter()
        if not self.live:
            self.log(self.text)
            return self
        column = (len(self.text) + 1) % _columns(self.stream)
        # The count must fit on the line's last row (a backspace never leaves its row).
        self._write(self.text + (" " if column + self.TAIL <= _columns(self.stream) else "\n  "))
        self._show("0 s")
        self._thread = threading.Thread(target=self._count, name="status line", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        seconds = self.seconds()
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        ended = f"{self.outcome} in {seconds:.1f} s"
        if self.live:
            self._show(ended if kind is None else f"stopped after {seconds:.0f} s", end="\n")
        elif kind is None:
            self.log(self.label + ended)
        return False

    def _count(self) -> None:
        while not self._stop.wait(self.tick_seconds):
            self._show(f"{self.seconds():.0f} s")

    def _show(self, tail: str, end: str = "") -> None:
        with self._lock:
            padding = " " * max(0, len(self._shown) - len(tail))
            self._write("\b" * len(self._shown) + tail + padding + "\b" * len(padding) + end)
            self._shown = tail

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def _columns(stream) -> int:
    """The width of the terminal `stream` writes to (a pseudo-terminal may report 0: then
    $COLUMNS, else 80)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        columns = 0
    return columns or shutil.get_terminal_size().columns or 80


def compiling(env: str, algo: str, num_runs: int, *, live: bool,
              log: Callable[[str], None] = _print_to_stderr, label: str = "") -> StatusLine:
    """The status line of building and compiling a trainer's learner and evaluation programs for
    `num_runs` runs: what, and how long a first compile takes (a later run of the same config
    loads them from the program store, `cache.ProgramStore`, when there is one). Set its outcome
    with `compile_outcome`."""
    from vaco_jax import envs

    on_cpu = jax.default_backend() == "cpu"
    first = ("seconds to a minute" if env in envs.TOY_ENVS else "~1–2 min" if on_cpu else
             "a minute or more") + (" on a CPU" if on_cpu else "")
    later = ("; later runs of the same config load them from the cache"
             if cache.ProgramStore.default() is not None else "")
    runs = f"{num_runs} run{'' if num_runs == 1 else 's'}"
    return StatusLine(f"{label}compiling the learner and evaluation programs for {runs} of "
                      f"{algo} on {env} (first run of this config: {first}{later})",
                      live=live, log=log, label=label)


def compile_outcome(program, *, reused: bool, xla_cache_hits: int) -> str:
    """How a `TrainProgram`'s chunk came to be compiled: `reused` (compiled before in this process),
    loaded whole from the program store, traced and then both its programs found in JAX's
    compilation cache (it counts two more hits than `xla_cache_hits`), or compiled."""
    if program.loaded:   # checked first: a program loaded from the store is held as compiled
        return "loaded from the cache"
    if reused:
        return "reused the programs compiled earlier in this process"
    if cache.xla_cache_hits() >= xla_cache_hits + 2:   # the learner's and the evaluation's
        return "traced and loaded from JAX's compilation cache"
    return "compiled"


# Loggers of the libraries we drive; their INFO/WARNING messages (e.g. orbax's save timings) are
# internal details, shown with --verbose.
LIBRARY_LOGGERS = ("absl", "orbax", "jax", "etils", "tensorstore")


def configure_logging(verbose: bool = False) -> None:
    """Library log messages: everything with `verbose`, else errors only. (XLA's own C++ log
    lines are governed by `TF_CPP_MIN_LOG_LEVEL`, which `vaco_jax` sets on import.)"""
    level = logging.INFO if verbose else logging.ERROR
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(level)


def start(cluster: Cluster = Cluster(), *, compile_cache: str = "default",
          verbose: bool = False) -> None:
    """What every command does first: library logging, the multi-process runtime (before anything
    touches a device), the persistent compilation cache (`vaco_jax.cache`), the backend line."""
    configure_logging(verbose)
    initialize(cluster)
    cache.enable_compile_cache(compile_cache)
    announce()
