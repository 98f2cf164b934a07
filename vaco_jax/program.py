"""One program builder for every entry point: many runs in one `jit(vmap(...))`, on every device.

A *run* is one seed at one hyper-parameter setting. The CLI (its seeds), a sweep cell (capacities ×
δ × seeds), the reference returns (PPO-Clip seeds) and the LLM experiment (objectives × seeds) all
hand their runs' keys and hyper-parameters to this module and get their per-run results back.

Placement (`Layout`): a 1-D mesh over every device of every process (`jax.devices()`; after
`jax.distributed.initialize` that spans all hosts):
* several runs: the run axis is split over the devices. When the number of runs is not a multiple
  of the device count, the program carries copies of the last run as padding (every device gets the
  same share) and every result drops them: no device is left out and nothing padded is reported;
* one run with an env axis (MuJoCo): its environments are split instead, so the rollout (the
  expensive part) runs on every device and XLA's partitioner inserts what the update gathers
  (over the most devices that take equal shares, as many in every process: `env_devices`).

`TrainProgram` is the MuJoCo trainer's program (init + one chunk of iterations and an evaluation),
compiled ahead of time, with its per-device memory (`memory()`) known before it runs. A chunk is
two programs, the learner iterations and the evaluation, compiled at the same time in two threads
(XLA compiles outside the GIL) and run one after the other: the same results as one
`jit(vmap(Trainer.run_chunk))`, the compile time of the larger part, and each part timed apart.
With JAX's compilation cache on, the compiled learner and evaluation programs are also kept
whole (`vaco_jax.cache.ProgramStore`): a later process building the same program loads them without
tracing anything.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import sys
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vaco_jax import algorithms, cache
from vaco_jax import fingerprint as fingerprint_lib
from vaco_jax.config import Config
from vaco_jax.hparams import HParams
from vaco_jax.runtime import to_host
from vaco_jax.trainer import Trainer, stack_hparams

AXIS = "devices"


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the arrays of `num_runs` vmapped runs live; `axis` is "runs", "envs" or "none"."""

    mesh: Mesh
    axis: str
    num_runs: int          # the caller's runs
    padded_runs: int       # runs in the program: num_runs plus copies of the last one
    num_envs: int = 0      # the env axis split when axis == "envs"

    @property
    def num_devices(self) -> int:
        return self.mesh.devices.size

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    def runs(self) -> NamedSharding:
        """For arrays with a leading run axis."""
        return NamedSharding(self.mesh, P(AXIS)) if self.axis == "runs" else self.replicated()

    def shardings(self, abstract_tree, env_state=lambda tree: None):
        """Shardings for a tree of per-run arrays `[padded_runs, ...]`: split over runs, or, when
        the envs are split, the leaves of `env_state(tree)` with an env axis `[runs, num_envs, ...]`."""
        shardings = jax.tree.map(lambda _: self.runs(), abstract_tree)
        if self.axis == "envs":
            split_envs = NamedSharding(self.mesh, P(None, AXIS))
            envs = jax.tree.map(lambda x: split_envs if len(x.shape) > 1 and x.shape[1] == self.num_envs
                                else self.replicated(), env_state(abstract_tree))
            shardings = shardings.replace(env_state=envs)
        return shardings

    def pad(self, tree):
        """Host arrays `[num_runs, ...]` → `[padded_runs, ...]`, the padding a copy of the last run."""
        extra = self.padded_runs - self.num_runs
        return jax.tree.map(lambda x: np.concatenate([x, np.repeat(x[-1:], extra, axis=0)])
                            if extra else np.asarray(x), tree)

    def put(self, tree):
        """Host arrays `[num_runs, ...]` → global arrays `[padded_runs, ...]` split like the runs
        (every process passes the same values and keeps its own devices' shards)."""
        return _global(self.pad(jax.tree.map(np.asarray, tree)), self.runs())

    def replicate(self, tree):
        """Host (or single-device) arrays shared by every run → global arrays on every device."""
        return _global(to_host(tree), self.replicated())

    def unpad(self, tree):
        """Per-run results `[padded_runs, ...]` → host numpy `[num_runs, ...]` (padding dropped)."""
        return jax.tree.map(lambda x: x[:self.num_runs], to_host(tree))

    def describe(self) -> str:
        """One line for logs: how the runs are spread."""
        runs = f"{self.num_runs} run{'s' if self.num_runs > 1 else ''}"
        if self.axis == "none":
            return f"{runs} on 1 device"
        padding = (f" (+{self.padded_runs - self.num_runs} padding)"
                   if self.padded_runs > self.num_runs else "")
        if self.axis == "runs":
            return f"{runs}{padding} split over {self.num_devices} devices"
        return f"{runs}, its {self.num_envs} envs split over {self.num_devices} devices"


def _global(host_tree, sharding: NamedSharding):
    """Host arrays → global arrays with `sharding`, each process filling its own devices' shards."""
    return jax.tree.map(lambda x: jax.make_array_from_callback(x.shape, sharding, lambda i: x[i]),
                        host_tree)


def layout(num_runs: int, *, num_envs: int = 0, devices=None, log=None) -> Layout:
    """Runs over every device (padded to a multiple of the device count); one run with an env
    axis splits its envs (over the most devices that divide `num_envs` evenly, as many of every
    process, said in `log`; when no split uses more than one device, the run is padded like
    several)."""
    devices = list(jax.devices() if devices is None else devices)
    count = len(devices)
    if count == 1:
        return Layout(Mesh(np.asarray(devices), (AXIS,)), "none", num_runs, num_runs, num_envs)
    if num_runs == 1 and num_envs:
        used = env_devices(num_envs, devices)
        if len(used) > 1:
            if len(used) < count and log is not None:
                log(f"warning: the one run's {num_envs} envs split evenly over {len(used)} of the "
                    f"{count} devices only; use a num_envs divisible by {count} to use them all")
            return Layout(Mesh(np.asarray(used), (AXIS,)), "envs", 1, 1, num_envs)
        processes = len({device.process_index for device in devices})
        if processes > 1 and log is not None:
            log(f"warning: the one run's {num_envs} envs cannot be split evenly over the "
                f"{processes} processes, so every device runs a copy of the run; use a num_envs "
                f"divisible by {processes}")
    padded = -(-num_runs // count) * count
    return Layout(Mesh(np.asarray(devices), (AXIS,)), "runs", num_runs, padded, num_envs)


def env_devices(num_envs: int, devices) -> list:
    """The devices that one run's `num_envs` envs are split over: the most that take an equal
    share, the same number from every process (process by process, each in its own order). A
    process without a share would hold no part of the run: every process runs the program."""
    by_process: dict[int, list] = {}
    for device in devices:
        by_process.setdefault(device.process_index, []).append(device)
    processes, per_process = len(by_process), min(len(d) for d in by_process.values())
    shares = [k for k in range(1, per_process + 1) if num_envs % (k * processes) == 0]
    if not shares:   # no split over every process: the caller pads the run instead
        return []
    return [device for _, own in sorted(by_process.items()) for device in own[:shares[-1]]]


def jit_runs(fn, layout_: Layout, *, in_run_axes):
    """`jit(vmap(fn))` over the run axis of the arguments marked in `in_run_axes` (True: split like
    the runs; False: shared by every run, replicated), placed on `layout_`'s devices; every output
    has a leading run axis."""
    in_axes = tuple(0 if per_run else None for per_run in in_run_axes)
    in_shardings = tuple(layout_.runs() if per_run else layout_.replicated()
                         for per_run in in_run_axes)
    return jax.jit(jax.vmap(fn, in_axes=in_axes), in_shardings=in_shardings,
                   out_shardings=layout_.runs())


def memory_report(compiled) -> dict:
    """Per-device bytes of a compiled program: arguments, outputs, temporaries, and the peak."""
    stats = compiled.memory_analysis()
    if stats is None:
        return {}
    report = {name: int(getattr(stats, f"{name}_size_in_bytes", 0)) for name in
              ("argument", "output", "temp", "alias", "generated_code")}
    report["peak"] = report["argument"] + report["output"] + report["temp"] - report["alias"]
    return report


def describe_memory(report: dict) -> str:
    """`memory_report` in one line."""
    if not report:
        return "memory not reported by this backend"
    return (f"peak {size(report['peak'])} (arguments {size(report['argument'])}, outputs "
            f"{size(report['output'])}, temporaries {size(report['temp'])}, aliased "
            f"{size(report['alias'])})")


def size(num_bytes: float) -> str:
    """Bytes in the largest decimal unit that keeps the number ≥ 1 (e.g. `12.3 MB`)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.3g} {unit}"
    return f"{num_bytes:.0f} B"


def device_memory_bytes() -> int | None:
    """Memory of one device as the backend reports it (None on the CPU, which reports none)."""
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_limit")


# --- the MuJoCo trainer's program ----------------------------------------------------------------

def seed_keys(seeds) -> np.ndarray:
    """One raw key per run: run i uses `PRNGKey(seeds[i])`, as a single run with that seed."""
    return np.stack([np.asarray(jax.random.PRNGKey(s)) for s in seeds])


@dataclasses.dataclass(frozen=True)
class CompiledChunk:
    """One chunk, `chunk(state) -> (state, metrics)` like `jit(vmap(Trainer.run_chunk))`, as two
    compiled programs run one after the other: `learn` (the iterations) and `evaluate`."""

    learn: Any
    evaluate: Any

    def __call__(self, state):
        state, metrics, _ = self.run(state)
        return state, metrics

    def run(self, state):
        """`(state, metrics, per_iteration)`: as a call, and every iteration's metrics
        (`[runs, iterations_per_eval]` per leaf) when the program keeps them
        (`TrainProgram.build(..., per_iteration=True)`), else None."""
        state, metrics, *kept = self.learn(state)
        eval_return, key = self.evaluate(state.params["actor"], state.normalizer, state.key)
        return (state.replace(key=key), {**metrics, "eval_return": eval_return},
                kept[0] if kept else None)


class ChunkTimer:
    """Seconds the two parts of the chunks given to `track` took on the devices, measured by a
    thread that waits for each part's outputs in turn: parts run in the order they were
    dispatched, so a part took the time from the end of the one before it to its own end (time
    the devices wait for the host counts to the learner part). `seconds()` waits for the last."""

    def __init__(self):
        self._learn = self._evaluate = 0.0
        self._last = time.perf_counter()
        self._waiter = concurrent.futures.ThreadPoolExecutor(max_workers=1)

    def track(self, metrics) -> concurrent.futures.Future:
        """`metrics`: a chunk's outputs as `CompiledChunk` returns them (not waited for here).
        Returns the future `(learn seconds, evaluation seconds)` of this chunk."""
        return self._waiter.submit(self._wait, metrics["iteration"], metrics["eval_return"])

    def _wait(self, learned, evaluated) -> tuple[float, float]:
        jax.block_until_ready(learned)
        now = time.perf_counter()
        learn, self._last = now - self._last, now
        jax.block_until_ready(evaluated)
        now = time.perf_counter()
        evaluate, self._last = now - self._last, now
        self._learn, self._evaluate = self._learn + learn, self._evaluate + evaluate
        return learn, evaluate

    def seconds(self) -> dict:
        """`{"learn_seconds", "eval_seconds", "eval_fraction"}` of every chunk tracked."""
        self._waiter.shutdown(wait=True)
        total = self._learn + self._evaluate
        return {"learn_seconds": self._learn, "eval_seconds": self._evaluate,
                "eval_fraction": self._evaluate / total if total > 0 else 0.0}


@dataclasses.dataclass
class TrainProgram:
    """`init(keys, hparams)` and one chunk `state -> (state, metrics)` of `Trainer`, vmapped over
    `layout.num_runs` runs and placed on every device."""

    trainer: Trainer      # built from the shared static config: every run's values are in HParams
    layout: Layout
    abstract_state: object  # ShapeDtypeStructs with shardings, padded runs (also the restore target)
    init: object          # jit(vmap(Trainer.init))
    learn: object         # jit(vmap(Trainer.learn_chunk))
    evaluate: object      # jit(vmap(Trainer.evaluate))
    compiled: CompiledChunk | None = None
    compile_seconds: float = 0.0
    store: cache.ProgramStore | None = None
    store_key: str = ""
    loaded: bool = False  # the compiled programs came from the store
    _reported: bool = False

    @classmethod
    def build(cls, config: Config, num_runs: int, *, env=None, networks=None, donate: bool = False,
              store: "bool | cache.ProgramStore" = True, per_iteration: bool = False,
              log=None) -> "TrainProgram":
        """The program of `num_runs` runs of `config`'s static fields, on `config.env` or on `env`,
        an env object passed beside it, with `config.network`'s networks or `networks`, your own
        Flax modules (`Trainer`). `donate`: the chunk reuses
        the input state's memory (the caller must not keep the state it passes in). `store`: where
        compiled programs are loaded from and kept: True for `ProgramStore.default()` (beside JAX's
        compilation cache, when that is on), False for nowhere (always compile, e.g. to measure
        compilation), or a `ProgramStore`. `per_iteration`: the learner program also returns
        every iteration's metrics (`CompiledChunk.run`); the state and metrics are the same."""
        placed = layout(num_runs, num_envs=config.num_envs, log=log)
        config = program_config(config)
        trainer = Trainer(config, env, networks=networks)   # its config: with the env's own episode limit
        return _build(trainer.config, placed, donate,
                      cache.ProgramStore.default() if store is True else store or None,
                      _Traced(traced_from(trainer), trainer), per_iteration)

    def init_state(self, keys, hparams: HParams):
        """The initial state of the runs: `keys` `[num_runs, 2]`, `hparams` stacked `[num_runs]`."""
        return self.init(*self.layout.put((keys, hparams)))

    def compiled_chunk(self) -> tuple[CompiledChunk, float]:
        """The chunk compiled ahead of time (its two programs at once), or loaded from the store,
        and the seconds that took (0 after the first call)."""
        if self.compiled is None:
            start, xla_cache_hits = time.perf_counter(), cache.xla_cache_hits()
            state = self.abstract_state
            with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
                learn = pool.submit(lambda: self.learn.lower(state).compile())
                evaluate = pool.submit(lambda: self.evaluate.lower(
                    state.params["actor"], state.normalizer, state.key).compile())
                self.compiled = CompiledChunk(learn.result(), evaluate.result())
            # Kept only when compiled here (see `ProgramStore.save`): after a change of this
            # package's source, JAX's cache may still hold the programs, and they are loaded from
            # there (traced, not compiled) until they are next compiled.
            if self.store is not None and cache.xla_cache_hits() == xla_cache_hits:
                self.store.save(self.store_key, "evaluate", self.compiled.evaluate)
                self.store.save(self.store_key, "learn", self.compiled.learn)   # last: marks it whole
            self.compile_seconds = time.perf_counter() - start
        seconds, self._reported = (0.0 if self._reported else self.compile_seconds), True
        return self.compiled, seconds

    def memory(self) -> dict:
        """Per-device bytes of the compiled chunk (compiling it if needed): the learner program's,
        with the peak of the evaluation (which runs while the state is held) if that is higher."""
        compiled = self.compiled_chunk()[0]
        report, evaluation = memory_report(compiled.learn), memory_report(compiled.evaluate)
        if report and evaluation:
            report["peak"] = max(report["peak"], report["argument"] + evaluation["peak"])
        return report

    def dry_run(self) -> dict:
        """Compile the chunk (nothing runs) and report the placement, the compile seconds and the
        per-device memory."""
        _, compile_seconds = self.compiled_chunk()
        return {"devices": self.layout.describe(), "padded_runs": self.layout.padded_runs,
                "compile_seconds": compile_seconds, "memory_per_device": self.memory()}


_HPARAM_FIELDS = {f.name for f in dataclasses.fields(HParams)}


def program_config(config: Config) -> Config:
    """`config` as its program sees it. The program depends on neither the seed nor the
    hyper-parameters (arguments of `init`, then state leaves): they are normalised so that configs
    that differ only there share one program."""
    shared = {f.name: f.default for f in dataclasses.fields(Config)
              if f.name in _HPARAM_FIELDS or f.name in ("seed", "num_seeds")}
    shared.update(capacity=1, max_capacity=config.slots)
    if config.snapshot_sampling == "profile":   # a profile's values are leaves too
        shared.update(lag_profile=(1.0,))
    return dataclasses.replace(config, **shared)


def lowered_texts(config: Config, num_runs: int, *, env=None, networks=None) -> list[str]:
    """What `num_runs` runs of `config` compute: the StableHLO of their init, learner and
    evaluation programs, without source locations, lowered for the CPU on one device and without
    placement, so that neither the machine nor the device count changes it. The hyper-parameters
    and seeds are arguments of these programs, not part of them: a caller that keys results by
    this adds their values (`study.keys`). Tracing and lowering only: nothing is compiled."""
    trainer = Trainer(program_config(config), env, networks=networks)
    batched_init = jax.vmap(trainer.init)
    args = (seed_keys(range(num_runs)), stack_hparams([trainer.config.hparams()] * num_runs))
    state = jax.eval_shape(batched_init, *args)
    traced = (jax.jit(batched_init).trace(*args),
              jax.jit(jax.vmap(trainer.learn_chunk)).trace(state),
              jax.jit(jax.vmap(trainer.evaluate)).trace(state.params["actor"], state.normalizer,
                                                        state.key))
    return [t.lower(lowering_platforms=("cpu",)).as_text(debug_info=False) for t in traced]


def lowered_text(config: Config, num_runs: int, *, env=None, networks=None) -> str:
    """`lowered_texts` as one text, its functions renamed in order of appearance
    (`fingerprint.rename_symbols`)."""
    return "\n".join(fingerprint_lib.rename_symbols(text) for text in
                     lowered_texts(config, num_runs, env=env, networks=networks))


@dataclasses.dataclass(frozen=True)
class _Traced:
    """A trainer, compared by what its programs are traced from (`traced_from`)."""

    fingerprint: fingerprint_lib.Fingerprint
    trainer: Trainer = dataclasses.field(compare=False)


@functools.lru_cache(maxsize=8)
def _build(config: Config, placed: Layout, donate: bool, store: cache.ProgramStore | None,
           traced: _Traced, per_iteration: bool) -> TrainProgram:
    """Built once per (static config, layout, what the trainer's programs are traced from, whether
    the learner returns every iteration's metrics), so repeated runs in one process reuse the
    traced and compiled program; loaded from `store` when a process before built the same."""
    trainer = traced.trainer
    if not traced.fingerprint.storable:   # e.g. an env class defined in a notebook
        store = None
    if store is not None:
        devices = [(d.platform, d.device_kind, d.id) for d in placed.mesh.devices.flat]
        key = cache.program_key(config, placed.axis, placed.padded_runs, placed.num_envs, devices,
                                donate, per_iteration, traced.fingerprint.digest)
        loaded = _load(trainer, placed, store, key)
        if loaded is not None:
            return loaded
    batched_init = jax.vmap(trainer.init)
    # Evaluated on arguments placed like the `init` program's, which then reuses this trace.
    init_args = (seed_keys(range(placed.padded_runs)),
                 stack_hparams([config.hparams()] * placed.padded_runs))
    abstract = jax.eval_shape(batched_init, *jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placed.runs()), init_args))
    state_shardings = placed.shardings(abstract, env_state=lambda state: state.env_state)
    init = jax.jit(batched_init, in_shardings=(placed.runs(), placed.runs()),
                   out_shardings=state_shardings)
    learn_chunk, metrics_shardings = trainer.learn_chunk, (placed.runs(),)
    if per_iteration:   # a third output; without it, the program as it always was
        learn_chunk = functools.partial(trainer.learn_chunk, per_iteration=True)
        metrics_shardings += (placed.runs(),)
    learn = jax.jit(jax.vmap(learn_chunk), in_shardings=(state_shardings,),
                    out_shardings=(state_shardings, *metrics_shardings),
                    donate_argnums=(0,) if donate else ())
    policy = (state_shardings.params["actor"], state_shardings.normalizer, state_shardings.key)
    evaluate = jax.jit(jax.vmap(trainer.evaluate), in_shardings=policy,
                       out_shardings=(placed.runs(), state_shardings.key))
    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            abstract, state_shardings)
    if store is None:
        return TrainProgram(trainer, placed, abstract, init, learn, evaluate)
    return TrainProgram(trainer, placed, abstract, init, learn, evaluate, store=store, store_key=key)


def traced_from(trainer: Trainer) -> fingerprint_lib.Fingerprint:
    """What `trainer`'s programs are traced from, besides its config (`vaco_jax.fingerprint`): the
    code of the trainer and of everything it calls as loaded now (module constants such as
    `objectives.MAX_LOG_RATIO` and `envs.FAST_SOLVER` included), its algorithm's functions, its
    actor and critic (Flax modules: their classes' code and their attributes, a user's torso
    modules included, with their package's code), and its env: the envs it wraps, their
    constructor arguments and other attributes, their MJX models (from which their XML files are
    compiled) and their package's code. A user can register another env or algorithm under a known
    name, edit a reward function, edit their objective or pass other networks, without any name or
    version changing. A user's objective's package is hashed by value too, even if installed, and
    so is what it computes (`algorithms.objective_fingerprint`: its traced program, with what it
    calls in other packages, under `functools.partial` or `jax.jit`)."""
    objective = trainer.algorithm.objective
    torsos = [getattr(net, "torso", None) for net in (trainer.actor, trainer.critic)]
    packages = env_packages(trainer.env) | {fingerprint_lib.top_level_package(torso)
                                            for torso in torsos if torso is not None}
    computes = ()
    if not algorithms.is_builtin(objective):
        packages.add(fingerprint_lib.top_level_package(algorithms.unwrapped(objective.fn)))
        computes = (algorithms.objective_fingerprint(objective),)
    return fingerprint_lib.fingerprint(type(trainer), trainer.algorithm, trainer.env,
                                       trainer.actor, trainer.critic, *computes, packages=packages)


def env_packages(env) -> set[str]:
    """The top-level packages of the classes of `env` and of the envs it wraps (`.env`)."""
    packages, seen = set(), set()
    while env is not None and id(env) not in seen:
        seen.add(id(env))
        packages.add(fingerprint_lib.top_level_package(env))
        env = getattr(env, "env", None)
    return packages


def _load(trainer: Trainer, placed: Layout, store: cache.ProgramStore, key: str):
    """The program `key` from the store (its learner and evaluation programs), or None. (The init
    program is not kept: it is small, and arrays made by a deserialised init program crash this
    jaxlib when passed on. Nor is it kept lowered (`jax.export`): compiled from JAX's cache in a
    process that has loaded the stored programs, its arrays crash jaxlib too.)"""
    start = time.perf_counter()
    learn = store.load(key, "learn")
    evaluate = store.load(key, "evaluate") if learn is not None else None
    if evaluate is None:
        return None
    init = jax.jit(jax.vmap(trainer.init), in_shardings=(placed.runs(), placed.runs()),
                   out_shardings=learn.input_shardings[0][0])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                            learn.out_info[0])
    return TrainProgram(trainer, placed, abstract, init, learn, evaluate,
                        CompiledChunk(learn, evaluate), time.perf_counter() - start, store, key,
                        loaded=True)


def log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
