"""Environments (SPEC §5): Brax envs on the MJX backend behind our own batched wrapper.

`VecEnv` steps `num_envs` copies at once and owns the episode bookkeeping Brax's training wrappers
get wrong for bootstrapping:
  * an episode limit that sets a **truncation** flag (not `done`) and keeps the **true final
    observation** as `next_obs`, so the learner can bootstrap from `V(s'_t)`;
  * auto-reset to a **freshly randomised** initial state: every episode starts from its own
    independent draw (not Brax's cached first state), taken from a pool of pre-drawn states that
    is refilled, B at a time, only when it runs out.
A new run's envs start unstarted (`VecEnv.unstarted`: shaped, not reset) and are reset by the
learner's first iteration (`VecEnv.start`), so making the initial state runs no physics.
Observation normalisation is per seed and lives in the train state (it travels with each policy
snapshot), not here.

The DeepMind Control Suite comes from MuJoCo Playground (`dmc:<Task>`, e.g. `dmc:CheetahRun`;
`pip install -e ".[dmc]"`), with MJX's JAX implementation, behind the same interface and wrapper
(`PlaygroundEnv`). Two tiny pure-JAX envs (`toy_reach`, `toy_bandit`) share the Brax `Env`
interface for fast unit tests.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

# Importing mujoco.mjx (through brax) prints "Failed to import warp: ..." to stdout when the
# optional NVIDIA Warp backend is absent; we use the JAX implementation, so that line is noise in
# every command's output (and in piped results). Only this import's stdout is swallowed.
with contextlib.redirect_stdout(io.StringIO()):
    from brax import envs as brax_envs
    from brax.envs.base import Env, State, Wrapper

MJX_ENVS = (
    "ant", "halfcheetah", "hopper", "humanoid", "humanoidstandup", "inverted_pendulum",
    "inverted_double_pendulum", "pusher", "reacher", "walker2d",
)
# The DM Control Suite of MuJoCo Playground 0.2.0 (the version the `dmc` extra pins); its XML
# assets ship in the package. Playground's locomotion and manipulation envs need the MuJoCo
# Menagerie downloaded at run time and are not offered.
DMC_PREFIX = "dmc:"
DMC_TASKS = (
    "AcrobotSwingup", "AcrobotSwingupSparse", "BallInCup", "CartpoleBalance",
    "CartpoleBalanceSparse", "CartpoleSwingup", "CartpoleSwingupSparse", "CheetahRun", "FingerSpin",
    "FingerTurnEasy", "FingerTurnHard", "FishSwim", "HopperHop", "HopperStand", "HumanoidRun",
    "HumanoidStand", "HumanoidWalk", "PendulumSwingup", "PointMass", "ReacherEasy", "ReacherHard",
    "SwimmerSwimmer6", "WalkerRun", "WalkerStand", "WalkerWalk",
)
DMC_ENVS = tuple(DMC_PREFIX + task for task in DMC_TASKS)
DMC_INSTALL = 'pip install -e ".[dmc]"'
TOY_ENVS = ("toy_reach", "toy_bandit")
ENV_NAMES = MJX_ENVS + DMC_ENVS + TOY_ENVS


def dmc_available() -> bool:
    """Is MuJoCo Playground (the `dmc` extra) installed?"""
    import importlib.util

    return importlib.util.find_spec("mujoco_playground") is not None


class ToyReach(Env):
    """A point in the plane moves by `0.1 · a` towards a random target; reward `−‖pos − target‖`.

    Terminates (no bootstrap) when the point leaves the box `|pos| > 2`; otherwise runs until the
    time limit. Cheap enough to compile and run in a second, with all three kinds of step.
    """

    def reset(self, rng):
        pos_key, target_key = jax.random.split(rng)
        pos = jax.random.uniform(pos_key, (2,), minval=-1.0, maxval=1.0)
        target = jax.random.uniform(target_key, (2,), minval=-1.0, maxval=1.0)
        pipeline_state = jnp.concatenate([pos, target])
        zero = jnp.zeros(())
        return State(pipeline_state, self._obs(pipeline_state), zero, zero, {}, {})

    def step(self, state, action):
        pos, target = state.pipeline_state[:2], state.pipeline_state[2:]
        pos = pos + 0.1 * jnp.clip(action, -1.0, 1.0)
        pipeline_state = jnp.concatenate([pos, target])
        reward = -jnp.linalg.norm(pos - target)
        done = jnp.any(jnp.abs(pos) > 2.0).astype(jnp.float32)
        return state.replace(pipeline_state=pipeline_state, obs=self._obs(pipeline_state),
                             reward=reward, done=done)

    @staticmethod
    def _obs(pipeline_state):
        pos, target = pipeline_state[:2], pipeline_state[2:]
        return jnp.concatenate([pos, target - pos])

    @property
    def observation_size(self):
        return 4

    @property
    def action_size(self):
        return 2

    @property
    def backend(self):
        return "jax"


class ToyBandit(Env):
    """A one-step-per-episode continuous bandit: reward `−(a − 0.5)²`, observation constant.

    Every step terminates, so the optimal policy and its value are known in closed form (V* = 0).
    """

    def reset(self, rng):
        zero = jnp.zeros(())
        return State(jnp.zeros(1), jnp.ones(1), zero, zero, {}, {})

    def step(self, state, action):
        reward = -jnp.sum(jnp.square(action - 0.5))
        return state.replace(reward=reward, done=jnp.ones(()))

    @property
    def observation_size(self):
        return 1

    @property
    def action_size(self):
        return 1

    @property
    def backend(self):
        return "jax"


# MJX constraint-solver settings for `mjx_solver="fast"` (SPEC §5). Brax tunes only ant and
# humanoid (Newton, 1 iteration, 4 line-search steps); the others keep their model's Newton
# iterations (4 for the locomotion envs, 100 for inverted_pendulum) and 50 line-search steps.
# MJX runs the line search as a fixed-length scan with a `cond` inside, which under vmap becomes a
# select: every env pays for all 50 steps in every Newton iteration although a few suffice. `fast`
# keeps the Newton iterations and allows 4 line-search steps. Checked against the default solver
# by `python -m benchmarks.solver_check` (benchmarks/results/solver_check-*.json): identical mean
# returns of zero, random and trained policies, one-step qvel error <= 7e-7 (README "Performance").
FAST_SOLVER: dict[str, dict] = {
    "hopper": {"ls_iterations": 4},
    "walker2d": {"ls_iterations": 4},
    "halfcheetah": {"ls_iterations": 4},
    "inverted_pendulum": {"ls_iterations": 4},
}


def make_env(name: str, mjx_solver: str = "default", **kwargs) -> Env:
    """An unwrapped single environment: a Brax env on the MJX backend, or a toy env.

    `mjx_solver="fast"` applies `FAST_SOLVER[name]` (if the env has an entry) to the MJX model;
    `"default"` keeps Brax's settings, so default-solver physics stays reproducible.
    """
    if name == "toy_reach":
        return ToyReach()
    if name == "toy_bandit":
        return ToyBandit()
    if name.startswith(DMC_PREFIX):
        return PlaygroundEnv.load(name[len(DMC_PREFIX):])
    if name not in MJX_ENVS:
        raise ValueError(f"unknown env {name!r}; allowed values are {list(ENV_NAMES)}")
    if mjx_solver not in ("default", "fast"):
        raise ValueError(f"mjx_solver must be 'default' or 'fast', got {mjx_solver!r}")
    with warnings.catch_warnings():
        # Brax's notice that its own envs are unmaintained (printed for every env built): these
        # envs are pinned here and checked by our tests, so it tells a user nothing to act on.
        warnings.filterwarnings("ignore", message="Brax System, piplines and environments")
        env = brax_envs.get_environment(name, backend="mjx", **kwargs)
    if mjx_solver == "fast" and name in FAST_SOLVER:
        set_solver(env, **FAST_SOLVER[name])
    return env


class PlaygroundEnv(Env):
    """A MuJoCo Playground env behind the Brax `Env` interface that `VecEnv` steps: Playground's
    `State.data` (an `mjx.Data`) is the `pipeline_state`; a dict observation (no DM Control task
    has one without vision) is flattened, its arrays concatenated in sorted key order. Time limits,
    truncation and resets are `VecEnv`'s, as for every env."""

    def __init__(self, env):
        self.env = env

    @classmethod
    def load(cls, task: str) -> "PlaygroundEnv":
        """DM Control Suite `task` with MJX's JAX implementation (Playground's default is Warp)."""
        import mujoco

        with contextlib.redirect_stdout(io.StringIO()):   # the same "Failed to import warp" notice
            from mujoco_playground import registry
        # MuJoCo's compiler warns on stdout (and in MUJOCO_LOG.TXT) about attributes some of the
        # suite's XML files use (e.g. CheetahRun's deprecated `settotalmass`); send them to the log.
        previous = mujoco.get_mju_user_warning()
        mujoco.set_mju_user_warning(lambda text: logging.getLogger(__name__).info("MuJoCo: %s", text))
        try:
            return cls(registry.load(task, config_overrides={"impl": "jax"}))
        finally:
            mujoco.set_mju_user_warning(previous)

    @staticmethod
    def _flat(obs):
        if isinstance(obs, dict):
            return jnp.concatenate([jnp.ravel(obs[k]) for k in sorted(obs)])
        return obs

    def _ours(self, state) -> State:
        return State(state.data, self._flat(state.obs), state.reward, state.done, state.metrics,
                     state.info)

    def reset(self, rng) -> State:
        return self._ours(self.env.reset(rng))

    def step(self, state: State, action) -> State:
        from mujoco_playground import State as PlaygroundState

        theirs = PlaygroundState(state.pipeline_state, state.obs, state.reward, state.done,
                                 state.metrics, state.info)
        return self._ours(self.env.step(theirs, action))

    @property
    def observation_size(self) -> int:
        return int(jax.eval_shape(self.reset, jax.random.PRNGKey(0)).obs.shape[-1])

    @property
    def action_size(self) -> int:
        return int(self.env.action_size)

    @property
    def backend(self) -> str:
        return "mjx"

    @property
    def dt(self) -> float:
        return float(self.env.dt)

    @property
    def mj_model(self):
        return self.env.mj_model


class TracedOnce(Wrapper):
    """`env` with `reset` and `step` under `jax.jit`: each is traced once per input type, and that
    trace is shared by every program that calls it (the initial state's shape, the learner's first
    reset, its rollout and pool refill, the evaluation) instead of being traced again in each. XLA
    inlines the calls; the numbers are the same up to float32 rounding (XLA may order a few sums
    differently)."""

    def __init__(self, env: Env):
        super().__init__(env)
        self._reset = jax.jit(env.reset)
        self._step = jax.jit(env.step)

    def reset(self, rng: jax.Array) -> State:
        with explicit_mesh():   # the pool's refill calls it from inside `cond_any`'s branch
            return self._reset(rng)

    def step(self, state: State, action: jax.Array) -> State:
        with explicit_mesh():
            return self._step(state, action)


def explicit_mesh():
    """The current abstract mesh, set explicitly. JAX's trace cache tells an unset empty mesh from
    a set one, so a jitted function called both inside `cond_any`'s branch (which sets it) and
    outside would be traced twice; under this it is traced once."""
    return jax.sharding.use_abstract_mesh(jax.sharding.get_abstract_mesh())


def set_solver(env: Env, **options) -> Env:
    """Set MJX solver options (`iterations`, `ls_iterations`, ...) of a Brax MJX env in place."""
    env.sys = env.sys.tree_replace({f"opt.{k}": v for k, v in options.items()})
    return env


@struct.dataclass
class EnvState:
    """Batched state of `VecEnv`; `inner.obs` is the observation the next action is taken from."""

    inner: Any          # batched Brax `State`
    step_count: jax.Array      # [B] int32, steps since the last reset
    episode_return: jax.Array  # [B] undiscounted return of the running episode
    pool: Any           # [B] fresh initial states, handed out in order to envs that end
    pool_used: jax.Array       # int32: entries of `pool` already handed out (B = empty)
    started: jax.Array         # bool: the envs have been reset (false until `VecEnv.start`)
    nonfinite_episodes: jax.Array  # [B] int32: episodes so far that ended in a non-finite reward
                                   # or observation (replaced by 0: `zero_nonfinite_ends`)

    @property
    def obs(self):
        return self.inner.obs


@struct.dataclass
class StepResult:
    """What one batched step produced, all `[B, ...]`."""

    next_obs: jax.Array        # the true next observation s'_t (the final one at an episode end)
    reward: jax.Array
    terminated: jax.Array      # bool: terminal state, no bootstrap
    truncated: jax.Array       # bool: time limit reached in a non-terminal state, bootstrap
    episode_return: jax.Array  # return of the episode that ended at this step (0 where none did)
    nonfinite: jax.Array       # bool: the episode ended here with a non-finite reward or next
                               # observation, replaced by 0 in both (see `zero_nonfinite_ends`)


class VecEnv:
    """`num_envs` copies of an env with an episode limit and auto-reset (see module docstring)."""

    def __init__(self, env: Env, num_envs: int, episode_length: int):
        self.env = env
        self.num_envs = num_envs
        self.episode_length = episode_length

    @property
    def action_size(self) -> int:
        return int(self.env.action_size)

    def reset(self, key) -> EnvState:
        inner = jax.vmap(self.env.reset)(jax.random.split(key, self.num_envs))
        zeros = jnp.zeros((self.num_envs,))
        # The pool starts empty (`inner` only gives it its structure); the first env to end fills it.
        counts = jnp.zeros((self.num_envs,), jnp.int32)
        return EnvState(inner, counts, zeros, inner, jnp.int32(self.num_envs), jnp.bool_(True),
                        counts)

    def unstarted(self, key_like) -> EnvState:
        """The state of envs not reset yet: zeros shaped like `reset`'s, `started` false, for
        `start` to reset. Making it traces the reset (`jax.eval_shape`) but neither compiles nor
        runs it: a new run's initial state costs no physics and no program of its own.
        `key_like`: a key like the one `start` will get, for its type only (and its placement:
        JAX's trace cache tells placed from unplaced arguments, and the reset is traced once when
        both are placed alike)."""
        shape = jax.eval_shape(self.reset, key_like)
        return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shape).replace(
            started=jnp.bool_(False))

    def start(self, state: EnvState, key) -> EnvState:
        """`state` reset with `key` if it was not started (`unstarted`), else `state` unchanged.
        Under vmap the reset runs when any member needs it and is skipped when none does
        (`cond_any`): after a run's first iteration it costs one test."""
        def reset_unstarted(operand):
            needed, key, state = operand
            fresh = self.reset(key)
            return needed, key, jax.tree.map(lambda f, s: jnp.where(needed, f, s), fresh, state)

        needed = ~state.started
        # `reset_unstarted` leaves a member whose `needed` is false unchanged, as `cond_any` requires.
        return cond_any(needed, reset_unstarted, (needed, key, state))[2]

    def step(self, state: EnvState, action, key) -> tuple[EnvState, StepResult]:
        """Step every env with `action [B, action_dim]` (clipped to [-1, 1]); reset those that ended."""
        inner = jax.vmap(self.env.step)(state.inner, jnp.clip(action, -1.0, 1.0))
        step_count = state.step_count + 1
        terminated = inner.done > 0.5
        truncated = jnp.logical_and(step_count >= self.episode_length, ~terminated)
        done = jnp.logical_or(terminated, truncated)
        reward, next_obs, nonfinite = zero_nonfinite_ends(inner.reward.astype(jnp.float32),
                                                          inner.obs, done)
        episode_return = state.episode_return + reward
        result = StepResult(next_obs, reward, terminated, truncated,
                            jnp.where(done, episode_return, 0.0), nonfinite)

        # Fresh resets come from a pool of B independently randomised initial states, refilled
        # (one vmapped reset of B envs) only when the envs ending now would overdraw it. Resetting
        # the whole batch whenever any env ends costs a physics forward pass per env on almost every
        # step early in training; the pool pays it once per B episode ends, and each env that ends
        # still starts from its own fresh draw of the initial-state distribution.
        n_done = jnp.sum(done, dtype=jnp.int32)

        def refill(operand):
            needed, key, pool, used = operand
            fresh = jax.vmap(self.env.reset)(jax.random.split(key, self.num_envs))
            fresh = fresh.replace(metrics=pool.metrics, info=pool.info)
            pool = jax.tree.map(lambda f, p: jnp.where(needed, f, p), fresh, pool)
            return needed, key, pool, jnp.where(needed, 0, used)

        needed = state.pool_used + n_done > self.num_envs
        # `refill` leaves a member whose `needed` is false unchanged, as `cond_any` requires.
        _, _, pool, pool_used = cond_any(needed, refill, (needed, key, state.pool, state.pool_used))
        slot = jnp.clip(pool_used + jnp.cumsum(done) - 1, 0, self.num_envs - 1)
        fresh = jax.tree.map(lambda p: p[slot], pool).replace(metrics=inner.metrics, info=inner.info)
        inner = select_per_env(done, fresh, inner)
        new_state = EnvState(inner, jnp.where(done, 0, step_count), jnp.where(done, 0.0, episode_return),
                             pool, pool_used + n_done, state.started,
                             state.nonfinite_episodes + nonfinite)
        return new_state, result


def zero_nonfinite_ends(reward, obs, done):
    """`(reward [B], obs [B, ...], nonfinite [B])`: the non-finite rewards and observation entries
    of the envs whose episode ends here (`done`) replaced by 0, and which envs had any. A physics
    blow-up ends an episode with a NaN state (DM Control's tasks end one when MJX's state turns
    NaN): its NaN reward would reach every return and loss, and its NaN final observation the
    critic. Elsewhere nothing changes (a finite step is bit for bit what the env returned)."""
    finite_reward, finite_obs = jnp.isfinite(reward), jnp.isfinite(obs)
    ends = done.reshape(done.shape + (1,) * (obs.ndim - 1))
    nonfinite = done & ~(finite_reward & jnp.all(finite_obs.reshape(obs.shape[0], -1), axis=-1))
    return (jnp.where(done & ~finite_reward, 0.0, reward), jnp.where(ends & ~finite_obs, 0.0, obs),
            nonfinite)


def cond_any(pred, branch, operand):
    """`lax.cond(pred, branch, identity, operand)` that stays a branch under `jax.vmap`.

    Under vmap, `lax.cond` with a batched predicate becomes a `select` that evaluates the branch
    for every batch member on every call. Here the batched rule instead runs the vmapped branch
    when `pred` holds for *any* member, and skips it when it holds for none (recursively, so
    nested vmaps — seeds × hyper-parameters — keep one branch). Exact only if `branch` returns
    its operand unchanged for a member whose `pred` is false, which the caller must guarantee
    (`VecEnv.step`'s refill selects the new pool only where it was needed).
    """
    # Under vmap the branch is built twice (unbatched below, batched in the rule); jitted, the
    # second build reuses the first's trace. The mesh is set explicitly because the two builds run
    # under differently represented empty meshes, which JAX's trace cache tells apart.
    branch = jax.jit(branch)

    @jax.custom_batching.custom_vmap
    def branch_if(pred, operand):
        with explicit_mesh():
            return jax.lax.cond(pred, branch, lambda x: x, operand)

    @branch_if.def_vmap
    def branch_if_any(axis_size, in_batched, pred, operand):
        pred_batched, operand_batched = in_batched
        operand = jax.tree.map(
            lambda x, batched: x if batched else jnp.broadcast_to(x, (axis_size,) + jnp.shape(x)),
            operand, operand_batched)
        out = cond_any(jnp.any(pred) if pred_batched else pred, jax.vmap(branch), operand)
        return out, jax.tree.map(lambda _: True, out)

    return branch_if(pred, operand)


def select_per_env(mask, on_true, on_false):
    """Per-env `where` over a batched pytree (`mask [B]`)."""
    def pick(a, b):
        return jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - 1)), a, b)
    return jax.tree.map(pick, on_true, on_false)
