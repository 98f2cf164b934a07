"""One throughput measurement each: the simulator's limit, our trainer, Brax's PPO trainer.

Every function takes a `Case` (env, shapes, seeds) and returns a flat dict with the env steps per
second (compilation excluded), the compile time and the process's peak RSS so far. The benchmark
runs each measurement in its own subprocess (`python -m benchmarks.throughput --worker ...`), so
that the peak RSS belongs to that configuration alone.

Timing: a measurement compiles its program ahead of time (`lower().compile()`), runs it once to
warm up, then times `repeats` calls of `iterations` learner iterations each and reports the median.
"""

from __future__ import annotations

import dataclasses
import functools
import resource
import statistics
import time

import jax
import jax.numpy as jnp
from brax.envs.wrappers import training as training_wrappers

from vaco_jax import Config, program
from vaco_jax.envs import PlaygroundEnv, VecEnv, make_env
from vaco_jax.trainer import Trainer, stack_hparams


@dataclasses.dataclass(frozen=True)
class Case:
    """The shapes every measurement of one benchmark run shares (the 'same hyper-parameters')."""

    env: str = "inverted_pendulum"
    num_envs: int = 32
    unroll_length: int = 32
    num_epochs: int = 4
    num_minibatches: int = 8
    hidden: tuple[int, ...] = (64, 64)
    episode_length: int = 1000
    eval_envs: int = 16
    mjx_solver: str = "default"
    iterations: int = 8          # learner iterations per timed call
    repeats: int = 3             # timed calls (median reported)
    learning_rate: float | None = None
    """None: the project's default (Brax gets the same). A tiny rate (1e-20) freezes the policy in
    float32 while every computation still runs (the rate is a traced leaf for us, a runtime multiply
    for Brax): every algorithm then acts with the same policy on the same keys, so the environment's
    cost (episode lengths, resets, solver iterations) is the same for all of ours and the ratios
    isolate the algorithms' own cost."""

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.unroll_length

    def config(self, algo: str, capacity: int = 1, **overrides) -> Config:
        return Config(env=self.env, algo=algo, capacity=capacity, num_envs=self.num_envs,
                      unroll_length=self.unroll_length, num_epochs=self.num_epochs,
                      num_minibatches=self.num_minibatches, actor_hidden=self.hidden,
                      critic_hidden=self.hidden, episode_length=self.episode_length,
                      eval_envs=self.eval_envs, mjx_solver=self.mjx_solver,
                      total_steps=self.iterations * self.batch_size, num_evals=1,
                      **({} if self.learning_rate is None else {"learning_rate": self.learning_rate}),
                      **overrides)


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class Clock:
    """Wall-clock and process CPU seconds of a block (CPU time is less sensitive to other load)."""

    def __enter__(self):
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self._wall
        self.cpu = time.process_time() - self._cpu


def _compile(fn, *args):
    with Clock() as clock:
        compiled = fn.lower(*args).compile()
    return compiled, clock


def _time_calls(compiled, state, repeats: int):
    """Warm up once, then time `repeats` calls; `(state, [Clock per call])`."""
    state, out = compiled(state)
    jax.block_until_ready(out)
    clocks = []
    for _ in range(repeats):
        with Clock() as clock:
            state, out = compiled(state)
            jax.block_until_ready(out)
        clocks.append(clock)
    return state, clocks


def _result(steps_per_call: int, clocks: list, compile_clock, **extra) -> dict:
    """Steps/s of the median call (wall and CPU), compile seconds (wall and CPU), peak RSS."""
    wall = [c.wall for c in clocks]
    cpu = [c.cpu for c in clocks]
    return {"sps": steps_per_call / statistics.median(wall),
            "cpu_sps": steps_per_call / statistics.median(cpu),
            "compile_s": compile_clock.wall, "compile_cpu_s": compile_clock.cpu,
            "seconds": wall, "peak_rss_mb": peak_rss_mb(), **extra}


# --- the limit: the simulator alone -------------------------------------------------------------

WRAPPERS = ("none", "ours", "brax")


def limit(case: Case, wrapper: str = "none") -> dict:
    """Raw env stepping with uniform random actions in a `lax.scan` (no policy, no learning).

    `wrapper="none"`: `vmap(env.step)` of the Brax env, no resets (the simulator's own speed).
    `wrapper="ours"`: our `VecEnv.step` (time limit, truncation bookkeeping, fresh auto-resets).
    `wrapper="brax"`: the wrappers Brax's PPO trainer steps through (`EpisodeWrapper` time limit,
    `AutoResetWrapper` back to each env's first state), on the same actions as `ours`.
    """
    if wrapper not in WRAPPERS:
        raise ValueError(f"wrapper must be one of {WRAPPERS}, got {wrapper!r}")
    env = make_env(case.env, mjx_solver=case.mjx_solver)
    vec_env = VecEnv(env, case.num_envs, case.episode_length)
    brax_env = training_wrappers.AutoResetWrapper(training_wrappers.EpisodeWrapper(
        training_wrappers.VmapWrapper(env), case.episode_length, action_repeat=1))
    steps = case.iterations * case.unroll_length

    def run(carry):
        state, key = carry
        key, scan_key = jax.random.split(key)

        def step(state, step_key):
            action_key, reset_key = jax.random.split(step_key)
            action = jax.random.uniform(action_key, (case.num_envs, vec_env.action_size),
                                        minval=-1.0, maxval=1.0)
            if wrapper == "ours":
                state, result = vec_env.step(state, action, reset_key)
                return state, result.reward
            state = (brax_env.step if wrapper == "brax" else jax.vmap(env.step))(state, action)
            return state, state.reward

        state, rewards = jax.lax.scan(step, state, jax.random.split(scan_key, steps))
        return (state, key), jnp.sum(rewards)

    key = jax.random.PRNGKey(0)
    # Jitted, so no two leaves share a buffer (donation refuses aliased inputs).
    resets = {"none": lambda k: jax.vmap(env.reset)(jax.random.split(k, case.num_envs)),
              "ours": vec_env.reset,
              "brax": lambda k: brax_env.reset(jax.random.split(k, case.num_envs))}
    state = jax.jit(resets[wrapper])(key)
    compiled, compile_clock = _compile(jax.jit(run, donate_argnums=0), (state, key))
    _, clocks = _time_calls(compiled, (state, key), case.repeats)
    return _result(steps * case.num_envs, clocks, compile_clock)


# --- ours ---------------------------------------------------------------------------------------

def ours(case: Case, algo: str, capacity: int = 1, seeds: int = 1, sequential: bool = False,
         **overrides) -> dict:
    """Our trainer's training throughput: `iterations` learner iterations per call, no evaluation.

    `seeds` seeds run as one vmapped program; with `sequential=True` the single-seed program is
    run once per seed instead (one call each, after one warm-up call), as separate runs would be.
    """
    config = case.config(algo, capacity, **overrides)
    trainer = Trainer(config)

    def iterations(state):
        state, metrics = jax.lax.scan(lambda s, _: trainer.iteration(s), state, None,
                                      length=case.iterations)
        return state, jax.tree.map(jnp.mean, metrics)

    width = 1 if sequential else seeds
    keys = jax.random.split(jax.random.PRNGKey(0), width)
    init = jax.jit(jax.vmap(trainer.init))
    state = init(keys)
    compiled, compile_clock = _compile(jax.jit(jax.vmap(iterations), donate_argnums=0), state)
    steps_per_call = width * case.iterations * config.batch_size
    if not sequential:
        _, clocks = _time_calls(compiled, state, case.repeats)
        return _result(steps_per_call, clocks, compile_clock, seeds=seeds)
    _time_calls(compiled, state, 0)  # warm-up (first-call overheads), not timed
    with Clock() as total:
        per_seed = []
        for seed in range(seeds):
            with Clock() as clock:
                state, metrics = compiled(init(jax.random.split(jax.random.PRNGKey(seed), 1)))
                jax.block_until_ready(metrics)
            per_seed.append(clock.wall)
    return _result(steps_per_call * seeds, [total], compile_clock, seeds=seeds,
                   per_seed_s=per_seed, steps_per_seed=steps_per_call)


def ours_chunk(case: Case, algo: str) -> dict:
    """The CLI's compiled chunk (`vaco_jax.program`: the iterations, then an evaluation, two
    programs compiled at once).

    Its compile time is "the compile time of the training program"; its throughput includes the
    deterministic evaluation (`eval_envs` episodes of up to `episode_length` steps).
    """
    config = case.config(algo)
    # A copy without the compiled chunk that an earlier call in this process may have cached.
    built = dataclasses.replace(program.TrainProgram.build(config, 1, donate=True, store=False), compiled=None)
    state = built.init_state(program.seed_keys([0]), stack_hparams([config.hparams()]))
    with Clock() as compile_clock:
        compiled, _ = built.compiled_chunk()
    _, clocks = _time_calls(compiled, state, case.repeats)
    return _result(config.iterations_per_eval * config.batch_size, clocks, compile_clock)


# --- the peer: Brax's PPO trainer ---------------------------------------------------------------

def brax_ppo(case: Case) -> dict:
    """`brax.training.agents.ppo.train` with our shapes; env steps/s from its own timing.

    Brax collects `batch_size × num_minibatches` segments of `unroll_length` steps per training
    step from `num_envs` envs; with `batch_size = num_envs / M` that is one segment per env, the
    same `num_envs × unroll_length` batch and M minibatches of whole segments as ours. Brax's
    `training/sps` times each training epoch (`iterations` training steps, no evaluation); the
    first two epochs (compilation, and a second trace of the pmapped epoch) are dropped.
    A DM Control task (`dmc:<Task>`) runs as MuJoCo Playground's own training scripts run it: the
    Playground env behind Playground's Brax training wrapper (`wrap_for_brax_training`).
    """
    from brax.training.agents.ppo import networks as ppo_networks
    from brax.training.agents.ppo import train as ppo
    from flax import linen

    env = make_env(case.env, mjx_solver=case.mjx_solver)
    wrap = {}
    if isinstance(env, PlaygroundEnv):
        from mujoco_playground import wrapper

        env, wrap = env.env, {"wrap_env_fn": wrapper.wrap_for_brax_training}
    network_factory = functools.partial(
        ppo_networks.make_ppo_networks, policy_hidden_layer_sizes=case.hidden,
        value_hidden_layer_sizes=case.hidden, activation=linen.tanh)
    defaults = Config()
    sps, cpu_marks = [], [time.process_time()]

    def progress(step, metrics):
        sps.append(float(metrics["training/sps"]))
        cpu_marks.append(time.process_time())

    epochs = case.repeats + 2
    ppo.train(
        environment=env, num_timesteps=epochs * case.iterations * case.batch_size,
        num_evals=epochs + 1, run_evals=False, episode_length=case.episode_length,
        num_envs=case.num_envs, unroll_length=case.unroll_length,
        batch_size=case.num_envs // case.num_minibatches, num_minibatches=case.num_minibatches,
        num_updates_per_batch=case.num_epochs, network_factory=network_factory,
        learning_rate=defaults.learning_rate if case.learning_rate is None else case.learning_rate,
        entropy_cost=defaults.ent_coef,
        discounting=defaults.gamma, gae_lambda=defaults.gae_lambda,
        clipping_epsilon=defaults.clip_eps, max_grad_norm=defaults.max_grad_norm,
        reward_scaling=defaults.reward_scale, normalize_observations=True, seed=0,
        progress_fn=progress, **wrap)
    steps = case.iterations * case.batch_size
    clocks = [_Timed(steps / s, cpu_end - cpu_start)
              for s, cpu_start, cpu_end in zip(sps, cpu_marks, cpu_marks[1:])]
    steady = clocks[2:]
    compile_clock = _Timed(clocks[0].wall - statistics.median(c.wall for c in steady),
                           clocks[0].cpu - statistics.median(c.cpu for c in steady))
    return _result(steps, steady, compile_clock, all_seconds=[c.wall for c in clocks])


@dataclasses.dataclass
class _Timed:
    wall: float
    cpu: float
