"""The process a run lives in: multi-host start-up, the backend line, and which process writes.

vaco_jax scales out with JAX's own multi-controller runtime: every process (one per host, or one
per GPU) runs the same command; `jax.distributed.initialize` connects them, after which
`jax.devices()` lists every device of every process and one `jit` program runs over all of them
(`vaco_jax.program`). Results, metrics and plots are written by process 0 only; checkpoints go
through orbax, which writes each process's shards itself. Every process must see the same
filesystem (the output directory) for resuming.

The runtime starts with `--distributed` (flags name the coordinator, the process count and this
process's id, or JAX detects them: SLURM, Open MPI, Cloud TPU), or by itself when the environment
shows a multi-process launch (`SLURM_NTASKS` > 1 or `OMPI_COMM_WORLD_SIZE` > 1).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import sys

import jax
import numpy as np

from vaco_jax import cache
from vaco_jax.errors import invalid


@dataclasses.dataclass(frozen=True)
class Cluster:
    """How this process joins a multi-process (multi-host) run; the defaults run one process."""

    distributed: bool = False
    """Start JAX's multi-controller runtime (`jax.distributed.initialize`): run the same command in
    every process. Automatic when SLURM or Open MPI launched more than one task."""
    coordinator_address: str = ""
    """host:port of process 0 (empty: from the environment: SLURM, Open MPI, Cloud TPU or
    JAX_COORDINATOR_ADDRESS)."""
    num_processes: int = 0
    """Processes in the run (0: from the environment)."""
    process_id: int = -1
    """This process's index in [0, num_processes) (-1: from the environment)."""


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


def barrier(name: str) -> None:
    """Wait until every process reaches this point (nothing to wait for in one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


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
