"""Real asynchrony: actor groups and the learner as concurrent threads (`vaco-train --async`).

The fused trainer simulates asynchrony with a ring buffer of past snapshots (SPEC §2). Here it is
real, in one process, as Sebulba and Cleanba run it: each of the `num_actors` actor groups owns
`num_envs / num_actors` envs and loops in a thread of its own (take the newest published snapshot,
act for one segment of `unroll_length` steps, hand the segment over); the learner, in the calling
thread, takes `num_actors` segments as they come, learns on them and publishes the new snapshot
(actor params and normaliser statistics) tagged with its version, the number of updates behind it.
Every compiled program runs outside the GIL, so the threads run at once on the CPU's cores (or on
devices of their own: `--async-actor-devices`, `--async-learner-device`).

A segment carries the version it was made with, so its age, `learner version when taken − its
version`, is measured: it comes from the threads' timing. Nothing else differs from the fused
trainer: the acting (`Trainer.act`, one group at a time) and the learning (`Trainer.learn`: realign,
K × M updates, normaliser, divergence guard) are the trainer's own functions, and the run writes the
same `metrics.jsonl`. The run also writes `batches.jsonl` (every batch's segments, versions, ages and
waits) and the ages' histogram as `lag_profile.json`, which `vaco-train --lag-profile` replays in the
fused program.

Random numbers: the learner walks the fused trainer's key chain (`split(key, 5)` per iteration; the
update takes the fifth key), actor group 0 walks the same chain taking the start and rollout keys
(the second and fourth), group g > 0 the chain of `fold_in(key, g)`, the evaluations a chain of
their own. With one actor group and `--async-handover sync` the run therefore computes what the
fused trainer computes at C = 1 (a test); otherwise the order of batches depends on timing, so a
run is not reproducible bit for bit, and it is not resumable.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vaco_jax import driver, io, policy, program
from vaco_jax.config import Config, to_json_dict, validate
from vaco_jax.errors import ConfigError, DivergenceError
from vaco_jax.envs import VecEnv
from vaco_jax.options import AsyncOptions, Options, validate_options
from vaco_jax.trainer import Trainer, episodes_nonfinite, guard_divergence, stack_hparams

__all__ = ["run_async", "lag_profile", "write_lag_profile", "AsyncPrograms"]

EVAL_STREAM = 2**31 - 1   # `fold_in` data of the evaluations' key chain (actor groups use 1, 2, ...)
POLL_SECONDS = 0.05        # how often a waiting thread looks whether the run was stopped


# --- the compiled programs -------------------------------------------------------------------

class AsyncPrograms:
    """The pure functions of an asynchronous run, vmapped over seeds (a leading `[seeds]` axis):
    `init`, an actor group's segment `act`, the learner's `learn` on a batch, `evaluate`."""

    def __init__(self, config: Config, env=None):
        self.trainer = trainer = Trainer(config, env)
        self.config = config = trainer.config
        self.group_envs = VecEnv(trainer.env, config.num_envs // config.num_actors,
                                 config.episode_length)
        self.init = jax.vmap(trainer.init)
        self.act = jax.vmap(self.act_segment)
        self.learn = jax.vmap(self.learn_batch, in_axes=(0, 0, None))
        self.evaluate = jax.vmap(trainer.evaluate)

    def act_segment(self, env_state, snapshot, key):
        """One actor group's segment with `snapshot`: `(env_state, next key, traj [T, envs of
        the group, ...], episodes that ended non-finite)`. The keys are the fused iteration's
        start and rollout keys (`Trainer.iteration`)."""
        key, start_key, _, rollout_key, _ = jax.random.split(key, 5)
        started = self.group_envs.start(env_state, start_key)
        snapshots = jax.tree.map(lambda x: x[None], snapshot)   # one group
        env_state, traj = self.trainer.act(self.group_envs, started, snapshots, rollout_key)
        return env_state, key, traj, episodes_nonfinite(started, env_state)

    def learn_batch(self, state, segments, snapshot_age):
        """One learner iteration on `segments` (one per actor group slot, each `[T, envs of a
        group, ...]`, made with snapshots `snapshot_age` `[num_actors]` iterations old), as the
        fused iteration learns: its update key, its counters, its divergence guard."""
        traj = jax.tree.map(lambda *parts: jnp.concatenate(parts, axis=1), *segments)
        key, _, _, _, update_key = jax.random.split(state.key, 5)
        learned, metrics, update_metrics = self.trainer.learn(state, traj, snapshot_age, update_key)
        new_state = learned.replace(key=key, iteration=state.iteration + 1,
                                    env_steps=state.env_steps + self.config.batch_size)
        return guard_divergence(state, new_state, update_metrics, traj), metrics

    def snapshot(self, state):
        return self.trainer.snapshot(state.params, state.normalizer)

    def start(self, keys, hparams, devices: "Devices"):
        """The initial learner state, each group's env state and key, the evaluations' key."""
        state = jax.jit(self.init)(*jax.device_put((keys, hparams), devices.learner))
        groups = []
        for g in range(self.config.num_actors):
            key = state.key if g == 0 else jax.vmap(jax.random.fold_in, (0, None))(state.key, g)
            if self.config.num_actors == 1:
                env_state = state.env_state   # the fused trainer's: the same envs
            else:
                env_state = jax.vmap(self.group_envs.unstarted)(key)
            groups.append(jax.device_put((env_state, key), devices.actor(g)))
        eval_key = jax.vmap(jax.random.fold_in, (0, None))(state.key, EVAL_STREAM)
        return state, groups, eval_key


@dataclasses.dataclass(frozen=True)
class Devices:
    """Where the learner and each actor group run."""

    learner: jax.Device
    actors: tuple[jax.Device, ...]

    def actor(self, group: int) -> jax.Device:
        return self.actors[group % len(self.actors)]

    @staticmethod
    def of(asynchrony: AsyncOptions) -> "Devices":
        local = jax.local_devices()
        for name, indices in (("async_actor_devices", asynchrony.async_actor_devices),
                              ("async_learner_device", (asynchrony.async_learner_device,))):
            if max(indices) >= len(local):
                raise ConfigError(f"option `{name}` = {indices!r} is invalid: this process has "
                                  f"{len(local)} local device(s), indices 0 to {len(local) - 1}")
        return Devices(local[asynchrony.async_learner_device],
                       tuple(local[i] for i in asynchrony.async_actor_devices))

    def describe(self) -> str:
        return (f"learner on {self.learner}, actors on "
                f"{', '.join(str(d) for d in dict.fromkeys(self.actors))}")


# --- the handover between the threads ------------------------------------------------------------

@dataclasses.dataclass
class Segment:
    group: int
    index: int             # the group's n-th segment (0-based)
    version: int           # learner updates behind the snapshot it was made with
    traj: object           # per-seed trajectory [seeds, T, envs of the group, ...]
    nonfinite: object      # [seeds] episodes that ended non-finite
    made_at: float         # seconds since the run's start


class Exchange:
    """What the threads share, under one condition variable: the newest snapshot and its version,
    the segments handed over and not yet taken, and the run's stop flag (an error in any thread
    stops every thread)."""

    def __init__(self, snapshot, *, num_groups: int, queue: int, handover: str, total: int):
        self.condition = threading.Condition()
        self.version, self.snapshot = 0, snapshot
        self.ready: collections.deque[Segment] = collections.deque()
        self.in_flight = 0          # segments made or being made, not yet taken
        self.started = 0            # segments started, at most `total` (what the learner takes)
        self.queue, self.handover, self.total = queue, handover, total
        self.num_groups = num_groups
        self.stopped, self.error = False, None

    def may_start(self, index: int) -> bool:
        if self.handover == "sync":   # the update made with this group's last segment is out
            return self.version >= index
        return self.in_flight < self.queue

    def stop(self, error: BaseException | None = None) -> None:
        with self.condition:
            self.stopped = True
            self.error = self.error or error
            self.condition.notify_all()

    def wait(self, ready) -> float:
        """Wait (holding the condition) until `ready()` or the run stopped; the seconds waited.
        An error in another thread is raised here."""
        start = time.perf_counter()
        while not ready() and not self.stopped:
            self.condition.wait(POLL_SECONDS)
        if self.error is not None:
            raise RuntimeError("an actor thread failed") from self.error
        return time.perf_counter() - start


class ActorGroup(threading.Thread):
    """One actor group's loop: take the newest snapshot, wait the drawn delay, act for a segment
    (its own compiled program, on its device), hand the segment over."""

    def __init__(self, group: int, exchange: Exchange, act, env_state, key, device,
                 delay_seconds, clock):
        super().__init__(name=f"actor-{group}", daemon=True)
        self.group, self.exchange, self.act = group, exchange, act
        self.env_state, self.key, self.device = env_state, key, device
        self.delay_seconds, self.clock = delay_seconds, clock
        self.waited = self.delayed = self.acted = 0.0
        self.made = 0

    def run(self) -> None:
        exchange = self.exchange
        try:
            while True:
                with exchange.condition:
                    self.waited += exchange.wait(lambda: exchange.may_start(self.made))
                    if exchange.stopped or exchange.started >= exchange.total:
                        return
                    exchange.started += 1
                    exchange.in_flight += 1
                    version, snapshot = exchange.version, exchange.snapshot
                delay = self.delay_seconds()
                time.sleep(delay)   # holding its version, as a slow actor or transfer would
                self.delayed += delay
                start = time.perf_counter()
                snapshot = jax.device_put(snapshot, self.device)
                self.env_state, self.key, traj, nonfinite = self.act(self.env_state, snapshot,
                                                                     self.key)
                jax.block_until_ready(traj)   # handed over complete
                self.acted += time.perf_counter() - start
                segment = Segment(self.group, self.made, version, traj, nonfinite, self.clock())
                self.made += 1
                with exchange.condition:
                    exchange.ready.append(segment)
                    exchange.condition.notify_all()
        except BaseException as error:   # noqa: BLE001 -- handed to the learner, which raises it
            exchange.stop(error)


class Learner:
    """The learner's side, in the calling thread: learn on a batch and publish the snapshot, log
    the batch; every `iterations_per_eval` iterations evaluate and write a metrics.jsonl row."""

    def __init__(self, programs: AsyncPrograms, learn, evaluate, state, eval_key,
                 devices: Devices, out: Path, options: Options, log):
        self.programs, self.config = programs, programs.config
        self.learn, self.evaluate_program = learn, evaluate
        self.state, self.eval_key, self.devices = state, eval_key, devices
        self.out, self.options, self.log = out, options, log
        self.ages: list[int] = []
        self.per_iteration: list[dict] = []
        self.history: dict[str, list] = collections.defaultdict(list)
        self.seconds = collections.Counter()   # waiting, learning, evaluating
        self.start = time.perf_counter()

    def clock(self) -> float:
        """Seconds since the threads started."""
        return time.perf_counter() - self.start

    def learn_on(self, iteration: int, batch: list[Segment], waited: float,
                 exchange: Exchange) -> None:
        """Learner iteration `iteration` on `batch`, then publish version `iteration + 1`."""
        start = time.perf_counter()
        ages = [iteration - s.version for s in batch]
        self.ages.extend(ages)
        segments = jax.device_put(tuple(s.traj for s in batch), self.devices.learner)
        self.state, metrics = self.learn(
            self.state, segments, jax.device_put(np.asarray(ages, np.int32), self.devices.learner))
        jax.block_until_ready(self.state)   # published complete
        with exchange.condition:
            exchange.version, exchange.snapshot = iteration + 1, self.programs.snapshot(self.state)
            exchange.condition.notify_all()
        self.seconds["waiting"] += waited
        self.seconds["learning"] += time.perf_counter() - start
        metrics["nonfinite_episodes"] = sum(np.asarray(s.nonfinite) for s in batch)
        self.per_iteration.append(metrics)
        io.append_jsonl(self.out / "batches.jsonl", [{
            "iteration": iteration, "taken_at": round(self.clock(), 6),
            "waited_seconds": round(waited, 6),
            "segments": [{"group": s.group, "index": s.index, "version": s.version,
                          "age": age, "made_at": round(s.made_at, 6)}
                         for s, age in zip(batch, ages)]}])

    def evaluate(self) -> None:
        """The chunk's evaluation and its metrics.jsonl row (as the fused run writes it)."""
        start = time.perf_counter()
        state = self.state
        eval_return, self.eval_key = self.evaluate_program(state.params["actor"],
                                                           state.normalizer, self.eval_key)
        row = _chunk_metrics(self.per_iteration, state, eval_return)
        self.seconds["evaluating"] += time.perf_counter() - start
        self.per_iteration = []
        _check_health(self.config, self.options, state)
        for name, values in row.items():
            self.history[name].append(values)
        evaluations = len(self.history["eval_return"])
        io.append_jsonl(self.out / "metrics.jsonl", [_row(self.config, row, evaluations)])
        self.log(f"evaluation {evaluations}/{self.config.num_evals}: step "
                 f"{int(np.asarray(state.env_steps)[0]):,}, eval return "
                 f"{float(np.mean(row['eval_return'])):.1f}, ages so far: mean "
                 f"{np.mean(self.ages):.2f}, max {max(self.ages)}")


def delay_sampler(asynchrony: AsyncOptions, seed: int, group: int):
    """The actor delay of group `group`: a function drawing one delay in seconds per call."""
    rng = np.random.default_rng([seed, group])
    delays = asynchrony.async_actor_delay
    mean = delays[group % len(delays)]
    if mean == 0 or asynchrony.async_delay_distribution == "fixed":
        return lambda: mean
    return lambda: float(rng.exponential(mean))


def take(exchange: Exchange, num_groups: int) -> tuple[list[Segment], float]:
    """The learner's next batch: `num_groups` segments in the order they were handed over (in
    `sync` handover, one of each group), placed by group and index; the seconds waited."""
    with exchange.condition:
        waited = exchange.wait(lambda: len(exchange.ready) >= num_groups)
        if exchange.stopped:
            raise RuntimeError("the run was stopped")
        taken = [exchange.ready.popleft() for _ in range(num_groups)]
        exchange.in_flight -= num_groups
        exchange.condition.notify_all()
    return sorted(taken, key=lambda s: (s.group, s.index)), waited


# --- the lag profile --------------------------------------------------------------------------

def lag_profile(ages) -> list[float]:
    """The share of segments of each age 0 … max(ages): a lag profile (`--lag-profile`)."""
    counts = np.bincount(np.asarray(ages, np.int64).ravel())
    return [float(c) for c in counts / counts.sum()]


def write_lag_profile(path, ages, description: str) -> Path:
    """Write the ages' histogram as a lag-profile file `{"description", "probabilities"}`, which
    `config.read_lag_profile` (the `--lag-profile` flag) reads."""
    path = Path(path)
    io.write_json_atomic(path, {"description": description, "probabilities": lag_profile(ages)})
    return path


# --- the run ----------------------------------------------------------------------------------

def run_async(config: Config, options: Options = Options(),
              asynchrony: AsyncOptions = AsyncOptions(asynchronous=True), *, env=None,
              log=program.log_to_stderr) -> dict:
    """Train `config.num_seeds` seeds (vmapped inside each program) with real actor and learner
    threads; write the run's files to `options.out` and return its summary (docs/async.md).
    `env`: an env object passed beside the config, as `Trainer` takes it."""
    from vaco_jax.options import Cluster, validate_async

    validate(config, env_given=env is not None)
    validate_options(options)
    validate_async(asynchrony, config, options, Cluster())
    if not asynchrony.asynchronous:
        raise ConfigError("option `asynchronous` = False is invalid: run_async runs --async "
                          "runs (vaco_jax.run runs the fused program)")
    devices = Devices.of(asynchrony)
    out = driver._output_dir(options, config)

    compile_start = time.perf_counter()
    programs = AsyncPrograms(config, env)
    config = programs.config
    keys = program.seed_keys(range(config.seed, config.seed + config.num_seeds))
    hparams = stack_hparams([config.hparams()] * config.num_seeds)
    state, groups, eval_key = programs.start(keys, hparams, devices)
    act, learn, evaluate = _compile(programs, state, groups, eval_key, devices)
    compile_seconds = time.perf_counter() - compile_start

    record = io.provenance()
    io.write_json_atomic(out / "config.json", {
        "config": to_json_dict(config), "options": options, "async": asynchrony,
        "mode": "async", "devices": devices.describe(), **record})
    for name in ("metrics.jsonl", "batches.jsonl"):
        (out / name).unlink(missing_ok=True)

    G = config.num_actors
    exchange = Exchange(programs.snapshot(state), num_groups=G, queue=asynchrony.async_queue,
                        handover=asynchrony.async_handover, total=G * config.num_iterations)
    learner = Learner(programs, learn, evaluate, state, eval_key, devices, out, options, log)
    actors = [ActorGroup(g, exchange, act[devices.actor(g)], *groups[g], devices.actor(g),
                         delay_sampler(asynchrony, config.seed, g), learner.clock)
              for g in range(G)]
    for actor in actors:
        actor.start()
    try:
        for iteration in range(config.num_iterations):
            batch, waited = take(exchange, G)
            learner.learn_on(iteration, batch, waited, exchange)
            if (iteration + 1) % config.iterations_per_eval == 0:
                learner.evaluate()
    except BaseException as error:
        exchange.stop(error)
        raise
    finally:
        exchange.stop()
        for actor in actors:
            actor.join()
    train_seconds = learner.clock()
    state, history, ages = learner.state, learner.history, learner.ages

    summary = _summary(config, asynchrony, devices, state, history, ages, actors,
                       learner.seconds, compile_seconds, train_seconds, out)
    write_lag_profile(out / "lag_profile.json", ages, _profile_description(config, asynchrony,
                                                                           devices, ages))
    actor_params, normalizer = jax.device_get((state.params["actor"], state.normalizer))
    policy.save_policy(out, config, actor_params, normalizer, env_steps=summary["env_steps"],
                       evaluations=len(history["eval_return"]),
                       diverged_seeds=summary["diverged_seeds"], provenance=record,
                       observation_shape=programs.trainer.observation_shape)
    io.write_json_atomic(out / "summary.json", summary)
    return summary


def _compile(programs: AsyncPrograms, state, groups, eval_key, devices: Devices):
    """The actor program on every actor device, the learner's and the evaluation's on the
    learner's, compiled ahead of time (at once: XLA compiles outside the GIL)."""
    import concurrent.futures

    group_envs, group_key = groups[0]
    traj_shape = jax.eval_shape(programs.act, group_envs, programs.snapshot(state), group_key)[2]

    def on(device, tree):
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=jax.sharding.SingleDeviceSharding(device)), tree)

    G = programs.config.num_actors
    jobs = {device: (programs.act, on(device, (group_envs, programs.snapshot(state), group_key)))
            for device in dict.fromkeys(devices.actor(g) for g in range(G))}
    ages = on(devices.learner, jax.ShapeDtypeStruct((G,), jnp.int32))
    learner_jobs = {
        "learn": (programs.learn, (state, on(devices.learner, (traj_shape,) * G), ages)),
        "evaluate": (programs.evaluate, (state.params["actor"], state.normalizer, eval_key)),
    }

    def build(fn, args):
        return jax.jit(fn).lower(*args).compile()

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs) + 2) as pool:
        acts = {device: pool.submit(build, *job) for device, job in jobs.items()}
        others = {name: pool.submit(build, *job) for name, job in learner_jobs.items()}
        act = {device: future.result() for device, future in acts.items()}
        return act, others["learn"].result(), others["evaluate"].result()


def _chunk_metrics(per_iteration: list[dict], state, eval_return) -> dict:
    """An evaluation chunk's metrics from its iterations', as `Trainer.learn_chunk` makes them:
    means over iterations per seed, the training return of the episodes that ended in them."""
    stacked = {name: np.stack([np.asarray(m[name]) for m in per_iteration])
               for name in per_iteration[0]}
    episodes = stacked.pop("episodes").sum(axis=0)
    returns = stacked.pop("episode_return_sum").sum(axis=0)
    row = {name: values.mean(axis=0) for name, values in stacked.items()}
    row["nonfinite_episodes"] = stacked["nonfinite_episodes"].sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        row["train_return"] = np.where(episodes > 0, returns / np.maximum(episodes, 1.0), np.nan)
    row["env_steps"] = np.asarray(state.env_steps)
    row["iteration"] = np.asarray(state.iteration)
    row["eval_return"] = np.asarray(eval_return)
    return row


def _row(config: Config, chunk: dict, evaluations: int) -> dict:
    """One metrics.jsonl row, as the fused run writes it (per-seed lists)."""
    iteration = evaluations * config.iterations_per_eval
    row = {"step": iteration * config.batch_size, "iteration": iteration,
           "source": io.source_hash()}
    row.update({k: np.asarray(v).tolist() for k, v in chunk.items()
                if k not in ("env_steps", "iteration")})
    return row


def _check_health(config: Config, options: Options, state) -> None:
    nonfinite = np.asarray(state.health.nonfinite)
    if np.any(nonfinite != 0) and (options.on_nan == "stop" or np.all(nonfinite != 0)):
        bad = [config.seed + i for i in np.flatnonzero(nonfinite)]
        raise DivergenceError(f"training diverged: seed(s) {bad} produced non-finite values "
                              f"(--on-nan {options.on_nan}); an --async run cannot be resumed. "
                              f"Lower --learning-rate or check the config.")


def _summary(config, asynchrony, devices, state, history, ages, actors, learner,
             compile_seconds, train_seconds, out) -> dict:
    """summary.json: the fused run's fields, and the ages and each thread's seconds."""
    ages_array = np.asarray(ages)
    env_steps = int(np.asarray(state.env_steps)[0])
    last_eval = np.asarray(history["eval_return"][-1]) if history["eval_return"] else None
    nonfinite = np.asarray(state.health.nonfinite)
    return {
        "finished": True, "mode": "async",
        "final_eval_return": None if last_eval is None else last_eval.tolist(),
        "final_eval_return_mean": None if last_eval is None else float(np.nanmean(last_eval)),
        "env_steps": env_steps,
        "env_steps_total": env_steps * config.num_seeds,
        "sps": env_steps * config.num_seeds / train_seconds if train_seconds > 0 else 0.0,
        "compile_seconds": compile_seconds, "train_seconds": train_seconds,
        "num_seeds": config.num_seeds, "devices": devices.describe(),
        "async": dataclasses.asdict(asynchrony),
        "ages": {"mean": float(ages_array.mean()), "max": int(ages_array.max()),
                 "counts": np.bincount(ages_array).tolist(), "segments": len(ages)},
        "segments_made": sum(a.made for a in actors),
        "segments_per_group": [a.made for a in actors],
        "learner_seconds": {name: learner[name] for name in ("waiting", "learning",
                                                             "evaluating")},
        "actor_seconds": [{"waiting": a.waited, "delayed": a.delayed, "acting": a.acted}
                          for a in actors],
        "diverged_seeds": [{"seed": config.seed + i, "index": int(i)}
                           for i in np.flatnonzero(nonfinite)],
        "out": str(out),
    }


def _profile_description(config: Config, asynchrony: AsyncOptions, devices: Devices,
                         ages) -> str:
    delays = asynchrony.async_actor_delay
    delay = (f"{asynchrony.async_delay_distribution} actor delays of mean "
             f"{' '.join(f'{d:g}' for d in delays)} s (group g: the (g mod {len(delays)})-th)"
             if any(delays) else "no actor delay")
    return (f"Ages measured by vaco-train --async ({len(ages)} segments; env {config.env}, algo "
            f"{config.algo}, {config.num_actors} actor groups, handover "
            f"{asynchrony.async_handover}, queue {asynchrony.async_queue}, {delay}; "
            f"{devices.describe()}; host {io.host_tag()}).")
