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
(`PlaygroundEnv`); gymnax's envs (`gymnax:<id>`, e.g. `gymnax:CartPole-v1`; `pip install -e
".[gymnax]"`) likewise (`GymnaxEnv`). Two tiny pure-JAX envs (`toy_reach`, `toy_bandit`) share the
Brax `Env` interface for fast unit tests.

The env is a value: besides these names, the trainer takes an env object (a Brax `Env`, any
object with Brax's interface (`UserEnv`), a MuJoCo Playground `MjxEnv`, a gymnax environment or its
`(env, params)` pair: `as_env`), a name given to a factory with `register_env`, or
`module:factory`, a function that returns any of these. `make_env` resolves a name; `check_name`
refuses one it cannot resolve, and `check_env` an env of the user's that breaks the contract
(docs/environments.md, "Your own env"), before anything compiles.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import io
import logging
import sys
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

# Importing mujoco.mjx (through brax) prints "Failed to import warp: ..." to stdout when the
# optional NVIDIA Warp backend is absent; we use the JAX implementation, so that line is noise in
# every command's output (and in piped results). Only this import's stdout is swallowed.
with contextlib.redirect_stdout(io.StringIO()):
    from brax import envs as brax_envs
    from brax.envs.base import Env, State, Wrapper

from vaco_jax import catalog, spaces
# The built-in env names and their defaults (a plain table, read by the command line too).
from vaco_jax.catalog import (DMC_ENVS, DMC_PREFIX, DMC_TASKS, ENV_DEFAULTS, ENV_NAMES,  # noqa: F401
                              GYMNAX_PREFIX, MJX_ENVS, TOY_ENVS)
from vaco_jax.errors import ConfigError, invalid

DMC_INSTALL = 'pip install -e ".[dmc]"'
GYMNAX_INSTALL = 'pip install -e ".[gymnax]"'


def dmc_available() -> bool:
    """Is MuJoCo Playground (the `dmc` extra) installed?"""
    return importlib.util.find_spec("mujoco_playground") is not None


def gymnax_available() -> bool:
    """Is gymnax (the `gymnax` extra) installed?"""
    return importlib.util.find_spec("gymnax") is not None


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


def defaults(name: str) -> dict[str, Any]:
    """The config fields env `name` runs with unless set: its `ENV_DEFAULTS` entry, the `defaults`
    it was registered with, and for any gymnax env or env of the user's (registered or
    `module:factory`, built to find it) its own episode limit (`episode_length`: `time_limit`)."""
    if is_users(name):
        found = dict(_REGISTRY[name].defaults if name in _REGISTRY else {})
        if "episode_length" not in found and time_limit(make_env(name)) > 0:
            found["episode_length"] = time_limit(make_env(name))
        return found
    found = dict(ENV_DEFAULTS.get(name, {}))
    if name.startswith(GYMNAX_PREFIX) and "episode_length" not in found and gymnax_available():
        import gymnax

        if name[len(GYMNAX_PREFIX):] in gymnax.registered_envs:
            limit = GymnaxEnv.make(name[len(GYMNAX_PREFIX):]).time_limit
            found.update({"episode_length": limit} if limit > 0 else {})
    return found


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


# The libraries whose version can change what an env computes, beyond those every run uses
# (`vaco_jax.checkpoint.CORE_LIBRARIES`): a resume checks these of the run's env alone.
_MJX_LIBRARIES = ("mujoco", "mujoco-mjx")


def libraries(name: str) -> tuple[str, ...]:
    """The libraries env `name` computes with, beyond the core ones: MuJoCo and MJX for Brax's
    envs, also MuJoCo Playground for `dmc:` tasks, gymnax for `gymnax:` envs, none for the toy
    envs. An env of the user's (registered or `module:factory`) is built to see what it is: a
    Playground, gymnax or Brax `PipelineEnv` env as above; any other object of the user's checks
    no library of its own (its code is the user's), and neither does one that cannot be built in
    this process (building it, later, says why)."""
    if name in TOY_ENVS:
        return ()
    if name in MJX_ENVS:
        return _MJX_LIBRARIES
    if name.startswith(DMC_PREFIX):
        return ("playground", *_MJX_LIBRARIES)
    if name.startswith(GYMNAX_PREFIX):
        return ("gymnax",)
    try:
        env = make_env(name)
    except ConfigError:
        return ()
    if isinstance(env, PlaygroundEnv):
        return ("playground", *_MJX_LIBRARIES)
    if isinstance(env, GymnaxEnv):
        return ("gymnax",)
    from brax.envs.base import PipelineEnv

    return _MJX_LIBRARIES if isinstance(env, PipelineEnv) else ()


def make_env(name: str, mjx_solver: str = "default", **kwargs) -> Env:
    """An unwrapped single environment with the Brax `Env` interface, from its name: a Brax env on
    the MJX backend, a DM Control task (`dmc:<Task>`), a gymnax env (`gymnax:<id>`), a toy env, a
    name given to `register_env`, or `module:factory` (the factory's env, through `as_env`).

    `mjx_solver="fast"` applies `FAST_SOLVER[name]` (if the env has an entry) to the MJX model;
    `"default"` keeps Brax's settings, so default-solver physics stays reproducible.
    """
    if name == "toy_reach":
        return ToyReach()
    if name == "toy_bandit":
        return ToyBandit()
    if name.startswith(DMC_PREFIX):
        return PlaygroundEnv.load(name[len(DMC_PREFIX):])
    if name.startswith(GYMNAX_PREFIX):
        return GymnaxEnv.make(name[len(GYMNAX_PREFIX):])
    if name in _REGISTRY:
        return _from_factory(name, _REGISTRY[name])
    if ":" in name:
        return _from_factory(name, _import_factory(name))
    if name not in MJX_ENVS:
        check_name(name)   # raises, naming what is allowed
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


# --- envs as values: adapters, registered factories, `module:factory` ------------------------------

ALLOWED_OBJECTS = ("an env with Brax's interface (a Brax Env such as a PipelineEnv, or any object "
                   "with reset, step, observation_size and action_size or action_space), a MuJoCo "
                   "Playground MjxEnv, a gymnax environment, or a gymnax (env, params) pair as "
                   "gymnax.make returns it")
# What an env object needs to be run as one with Brax's interface (`UserEnv`): `action_size` or
# `action_space`, and the others.
REQUIRED = ("reset", "step", "observation_size")
# Brax's training wrappers (`brax.envs.create`, `brax.envs.wrappers.training`): their episode limit
# ends an episode as `done` (a termination: no bootstrap) and their auto-reset returns to a cached
# first state; `VecEnv` does both itself, correctly.
BRAX_TRAINING_WRAPPERS = ("EpisodeWrapper", "AutoResetWrapper", "VmapWrapper", "EvalWrapper",
                          "DomainRandomizationVmapWrapper")


def as_env(env) -> Env:
    """`env` behind the Brax `Env` interface that `VecEnv` steps: a Brax `Env` as it is, a MuJoCo
    Playground `MjxEnv` in `PlaygroundEnv`, a gymnax environment (with its default params) or a
    gymnax `(env, params)` pair in `GymnaxEnv`, any other object with Brax's interface in `UserEnv`.
    A Brax env inside Brax's training wrappers is refused (with the way out), and so is anything
    else, naming what it lacks and what is allowed."""
    if isinstance(env, Env):
        _refuse_training_wrappers(env)
        return env
    gymnax_environment = _class_if_imported("gymnax.environments.environment", "Environment")
    if gymnax_environment is not None:
        if isinstance(env, gymnax_environment):
            return GymnaxEnv(env)
        if (isinstance(env, tuple) and len(env) == 2 and isinstance(env[0], gymnax_environment)):
            return GymnaxEnv(*env)
    mjx_env = _class_if_imported("mujoco_playground._src.mjx_env", "MjxEnv")
    if mjx_env is not None and isinstance(env, mjx_env):
        return PlaygroundEnv(env)
    missing = [name for name in REQUIRED if not hasattr(env, name)]
    if not (hasattr(env, "action_size") or hasattr(env, "action_space")):
        missing.append("action_size (or action_space)")
    if missing or not (callable(env.reset) and callable(env.step)):
        lacks = (f"it has no {', no '.join(f'`{name}`' for name in missing)}" if missing else
                 "its `reset` and `step` must be methods")
        raise ConfigError(f"config field `env`: the env object (a {_describe(env)}) is not one "
                          f"vaco_jax can run: {lacks}; allowed are {ALLOWED_OBJECTS}")
    return UserEnv(env)


def _refuse_training_wrappers(env: Env) -> None:
    """Refuse a Brax env wrapped in Brax's training wrappers, naming them and the way out."""
    found, inner = [], env
    while isinstance(inner, Wrapper):
        if type(inner).__name__ in BRAX_TRAINING_WRAPPERS:
            found.append(type(inner).__name__)
        inner = inner.env
    if found:
        raise ConfigError(
            f"config field `env`: the env object is wrapped in Brax's training wrappers "
            f"({', '.join(found)}), whose episode limit ends episodes as terminations and whose "
            f"auto-reset returns to a cached first state: bootstrapping would be silently wrong. "
            f"Pass the bare env: brax.envs.get_environment(name), not brax.envs.create(name); "
            f"vaco_jax sets the time limit (episode_length, with truncation) and resets itself")


class UserEnv(Env):
    """An object with Brax's interface that does not subclass Brax's `Env` (duck-typed: `reset`,
    `step`, `observation_size`, and `action_size` or `action_space`), as a Brax `Env`. No `backend`
    is needed. Its action space is its `action_space` (`spaces.Box` or `spaces.Discrete`), else
    `Box(action_size)`; its episode limit (`time_limit`) is its own `time_limit`, if any."""

    def __init__(self, env):
        self.env = env

    def reset(self, rng) -> State:
        return self.env.reset(rng)

    def step(self, state: State, action) -> State:
        return self.env.step(state, action)

    @property
    def action_space(self):
        return getattr(self.env, "action_space", None)

    @property
    def observation_size(self):
        return self.env.observation_size

    @property
    def action_size(self) -> int:
        space = self.action_space
        if isinstance(space, spaces.Box):
            return space.size
        if isinstance(space, spaces.Discrete):
            return space.n
        return self.env.action_size

    @property
    def backend(self) -> str:
        return getattr(self.env, "backend", "jax")

    @property
    def time_limit(self) -> int:
        return int(getattr(self.env, "time_limit", 0) or 0)


def user_env(env):
    """The object the user gave behind `UserEnv`, else `env` itself."""
    return env.env if isinstance(env, UserEnv) else env


def check_env(env: Env, name: str) -> Env:
    """Refuse (`ConfigError` naming `env`) an env of the user's that breaks the contract, before
    anything compiles: its reset and one step are traced (`jax.eval_shape`: nothing runs) and
    checked — `reset` returns a Brax `State`, its observation a vector of `observation_size`,
    `reward` and `done` scalars, `step` a state of the same structure, shapes and dtypes as
    `reset`'s, `action_space` (if any) a `spaces.Box` or `spaces.Discrete` that agrees with
    `action_size`. The built-in and adapted envs (toy, gymnax, Playground) are correct by
    construction and returned unchecked."""
    if isinstance(env, (ToyReach, ToyBandit, GymnaxEnv, PlaygroundEnv)):
        return env

    def refuse(what):
        return invalid("env", name, what)

    declared = getattr(env, "action_space", None)
    if declared is not None and not isinstance(declared, (spaces.Box, spaces.Discrete)):
        raise refuse(f"its `action_space` is a {_describe(declared)}; it must be "
                     f"vaco_jax.spaces.Box(size) or vaco_jax.spaces.Discrete(n)")
    space = spaces.action_space(env)
    given = getattr(user_env(env), "action_size", None)
    expected = space.size if isinstance(space, spaces.Box) else space.n
    if declared is not None and given is not None and given != expected:
        raise refuse(f"its `action_size` = {given!r} disagrees with its `action_space` = {space} "
                     f"(action_size is the number of continuous actions, or of discrete choices)")
    try:
        state = jax.eval_shape(env.reset, jax.random.PRNGKey(0))
    except Exception as error:  # noqa: BLE001 -- any failure is the user's env's, to be named
        raise refuse(f"its reset(rng) fails when traced ({type(error).__name__}: {error})") from error
    missing = [field for field in ("obs", "reward", "done", "metrics", "info")
               if not hasattr(state, field)]
    if missing or not hasattr(state, "replace"):
        raise refuse(f"reset(rng) must return a brax.envs.State (fields obs, reward, done, "
                     f"pipeline_state, metrics, info); it returned a {_describe(state)} without "
                     f"{', '.join(f'`{m}`' for m in missing) or '`replace`'}")
    size = _observation_size(env)
    if not isinstance(size, (int, np.integer)) or isinstance(size, bool):
        raise refuse(f"its `observation_size` = {size!r} must be an integer (the length of the "
                     f"observation vector)")
    if not hasattr(state.obs, "shape") or tuple(state.obs.shape) != (size,):
        shown = tuple(state.obs.shape) if hasattr(state.obs, "shape") else _describe(state.obs)
        raise refuse(f"reset(rng) returns an observation of shape {shown}, but its "
                     f"`observation_size` is {size}: the observation must be a vector of "
                     f"shape ({size},)")
    for field in ("reward", "done"):
        if tuple(getattr(getattr(state, field), "shape", (None,))) != ():
            raise refuse(f"reset(rng) returns `{field}` of shape "
                         f"{getattr(getattr(state, field), 'shape', None)}; it must be a scalar")
    action = (jax.ShapeDtypeStruct((space.size,), jnp.float32) if isinstance(space, spaces.Box)
              else jax.ShapeDtypeStruct((), jnp.int32))
    try:
        stepped = jax.eval_shape(env.step, state, action)
    except Exception as error:  # noqa: BLE001
        raise refuse(f"its step(state, action) fails when traced with an action of shape "
                     f"{action.shape} {action.dtype} ({type(error).__name__}: {error})") from error
    before, after = (jax.tree_util.tree_flatten_with_path(s) for s in (state, stepped))
    if before[1] != after[1]:
        raise refuse(f"step(state, action) returns a state of another structure than reset(rng): "
                     f"{after[1]} instead of {before[1]}")
    for (path, a), (_, b) in zip(before[0], after[0]):
        if (a.shape, a.dtype) != (b.shape, b.dtype):
            raise refuse(f"step(state, action) returns {jax.tree_util.keystr(path)} as "
                         f"{b.dtype}{list(b.shape)}, reset(rng) as {a.dtype}{list(a.shape)}: "
                         f"they must match")
    return env


def _observation_size(env):
    """`env.observation_size`, unless it is Brax's `PipelineEnv`'s own (which runs a reset to
    find it: the traced reset's is the same by construction)."""
    from brax.envs.base import PipelineEnv

    if getattr(type(env), "observation_size", None) is PipelineEnv.observation_size:
        return int(jax.eval_shape(env.reset, jax.random.PRNGKey(0)).obs.shape[-1])
    return env.observation_size


def time_limit(env) -> int:
    """The env's own episode limit (a gymnax env's `params.max_steps_in_episode`; any env's
    `time_limit` attribute), or 0 when it declares none."""
    return int(getattr(env, "time_limit", 0) or 0)


def with_time_limit(config, env):
    """`config` with the env's own episode limit (`time_limit`) as its `episode_length` when the
    config keeps Config's default (1000, which counts as not set): the default follows the env,
    another value wins. For the envs given as objects, registered or `module:factory`; the
    built-in names keep `Config`'s meaning (`Config.for_env` gives them their limits)."""
    limit = time_limit(env)
    default = next(f.default for f in dataclasses.fields(config) if f.name == "episode_length")
    if limit > 0 and config.episode_length == default and limit != default:
        return dataclasses.replace(config, episode_length=limit)
    return config


def _class_if_imported(module: str, name: str):
    """`module.name` if `module` is imported (an object of its classes exists only then)."""
    loaded = sys.modules.get(module)
    return getattr(loaded, name, None) if loaded is not None else None


def _describe(obj) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}" if not isinstance(obj, tuple) else (
        f"tuple ({', '.join(type(x).__qualname__ for x in obj)})")


@dataclasses.dataclass(frozen=True)
class Registration:
    """An env registered under a name: its factory, and the config fields it runs with unless the
    user sets them (`Config.for_env`)."""

    factory: Callable[[], Any]
    defaults: dict


_REGISTRY: dict[str, Registration] = {}


def register_env(name: str, factory: Callable[[], Any], *, defaults: dict | None = None) -> None:
    """Make `Config(env=name)` run the env `factory()` returns (anything `as_env` takes: a Brax
    `Env`, a Playground `MjxEnv`, a gymnax env or `(env, params)` pair). `defaults`: config fields
    (e.g. `episode_length`, `num_envs`, `total_steps`) that `Config.for_env(name)` and the command
    line give this env unless set. Registering a name again replaces the earlier factory: a run
    records the name only, so keep one meaning per name for checkpoints to resume (a compiled
    program is never reused for another env, whatever its name: `vaco_jax.fingerprint`).

    The name must not be a built-in env's and must not contain ':' (kept for `dmc:`, `gymnax:` and
    `module:factory`)."""
    if not isinstance(name, str) or not name or ":" in name or name in ENV_NAMES:
        raise invalid("env", name, "a registered env's name must be a non-empty string without "
                                   "':' that is not a built-in env's name")
    if not callable(factory):
        raise ConfigError(f"register_env({name!r}, ...): the factory must be callable (a function "
                          f"returning the env), got {_describe(factory)}")
    _REGISTRY[name] = Registration(factory, dict(defaults or {}))


def registered_envs() -> dict[str, Registration]:
    """The names given to `register_env` in this process, and what they run."""
    return dict(_REGISTRY)


def registration_record(name: str) -> dict | None:
    """Where the factory of registered env `name` lives (its module, qualified name and source
    file), as a run records it so that another process can register it again
    (`restore_registration`); None for any other env."""
    if name not in _REGISTRY:
        return None
    factory = _REGISTRY[name].factory
    try:
        file = inspect.getsourcefile(factory)
    except (TypeError, OSError):   # a built-in, or a class defined in a notebook
        file = None
    return {"name": name, "module": getattr(factory, "__module__", None),
            "factory": _name_of(factory), "file": file}


def restore_registration(name: str, record: dict | None) -> None:
    """Make a run's registered env `name` known in this process, as the run recorded it
    (`registration_record`): import the module of its factory (which registers it, if that is
    where `register_env` is called), else register that module's factory under `name`. Nothing to
    do for a name already registered or any other env. Raises `ConfigError` naming `env`, and
    how to go on, when it cannot: a factory defined in a script (`__main__`) or inside a function,
    or a module that does not import."""
    if name in _REGISTRY or name in ENV_NAMES or ":" in name or not record:
        return
    module_name, qualname = record.get("module"), record.get("factory", "")
    where = f"{qualname} of {record.get('file') or module_name}"
    how = (f"register it again in this process before resuming or evaluating "
           f"(vaco_jax.register_env({name!r}, factory), then vaco_jax.run(config, "
           f"Options(resume=...)) or load_policy), or define the factory in an importable module")
    if not module_name or module_name == "__main__":
        raise invalid("env", name, f"the run's env was registered with vaco_jax.register_env "
                                   f"from a script ({where}), which this process cannot import: "
                                   f"{how}")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 -- any failure to import is the user's to see
        raise invalid("env", name, f"the run's env was registered from module {module_name!r}, "
                                   f"which does not import here ({type(error).__name__}: {error}); "
                                   f"{how}") from error
    if name in _REGISTRY:
        return
    factory = module
    for part in qualname.split("."):
        factory = getattr(factory, part, None)
    if "<locals>" in qualname or not callable(factory):
        raise invalid("env", name, f"importing module {module_name!r} does not register it and "
                                   f"its factory {qualname!r} cannot be found there: {how}")
    register_env(name, factory)


def _import_factory(name: str) -> Registration:
    """`module:factory` resolved to its function (imported now), or a `ConfigError`."""
    module_name, _, attribute = name.partition(":")
    allowed = (f"`module:factory` names a function in an importable module that returns "
               f"{ALLOWED_OBJECTS}")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 -- any failure to import is the user's to see
        raise invalid("env", name, f"module {module_name!r} does not import ({type(error).__name__}: "
                                   f"{error}); {allowed}") from error
    factory = getattr(module, attribute, None) if attribute else None
    if not callable(factory):
        raise invalid("env", name, f"module {module_name!r} has no function {attribute!r}; "
                                   f"{allowed}")
    return Registration(factory, {})


def _from_factory(name: str, registration: Registration) -> Env:
    """The env of a registered name or `module:factory`: the factory's env through `as_env`,
    checked (`check_env`). Built once per factory in a process (envs are values: every run of the
    name shares it), so checking the name before compiling costs nothing later. A factory that
    raises, returns no env or one that breaks the contract is refused, naming `env`."""
    if registration.factory in _BUILT:
        return _BUILT[registration.factory]
    try:
        made = registration.factory()
    except Exception as error:  # noqa: BLE001 -- any failure is the factory's, to be named
        raise invalid("env", name, f"its factory {_name_of(registration.factory)} raised "
                                   f"{type(error).__name__}: {error}") from error
    try:
        env = as_env(made)
    except ConfigError as error:
        why = str(error)
        why = why.split("can run: ", 1)[1] if "can run: " in why else why.split(": ", 1)[1]
        raise invalid("env", name, f"its factory returned a {_describe(made)}: {why}") from error
    _BUILT[registration.factory] = check_env(env, name)
    return env


# Envs built from factories, by factory (`_from_factory`).
_BUILT: dict[Callable, Env] = {}


def _name_of(factory) -> str:
    return getattr(factory, "__qualname__", None) or _describe(factory)


def is_users(name: str) -> bool:
    """Does `name` name an env of the user's (registered, or `module:factory`)?"""
    return name in _REGISTRY or (":" in name and not name.startswith((DMC_PREFIX, GYMNAX_PREFIX)))


def check_name(name: str) -> None:
    """Refuse (`ConfigError` naming `env`, the value and what is allowed) a name `make_env` cannot
    resolve: unknown, an extra's env without the extra, or a `module:factory` that does not import
    or names no function, and an env of the user's (registered or `module:factory`) whose factory
    raises or whose env breaks the contract (`check_env`: it is built and traced, once per
    process). A built-in name costs an import at most: no env is built."""
    if name in ENV_NAMES and name not in DMC_ENVS:
        return
    if name in _REGISTRY:
        _from_factory(name, _REGISTRY[name])
        return
    if name.startswith(DMC_PREFIX):
        if name not in DMC_ENVS:
            raise catalog.unknown_env(name)
        if not dmc_available():
            raise invalid("env", name, f"DM Control Suite tasks need MuJoCo Playground: {DMC_INSTALL}")
        return
    if name.startswith(GYMNAX_PREFIX):
        if not gymnax_available():
            raise invalid("env", name, f"gymnax's envs need gymnax: {GYMNAX_INSTALL}")
        import gymnax

        if name[len(GYMNAX_PREFIX):] not in gymnax.registered_envs:
            raise invalid("env", name, f"gymnax's envs are "
                                       f"{[GYMNAX_PREFIX + e for e in gymnax.registered_envs]}")
        return
    if ":" in name:
        _from_factory(name, _import_factory(name))
        return
    raise catalog.unknown_env(name, sorted(_REGISTRY), ALLOWED_OBJECTS)


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

    def _ours(self, state) -> State:
        return State(state.data, flat_dict(state.obs), state.reward, state.done, state.metrics,
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


def flat_dict(obs):
    """A dict observation as one vector, its arrays concatenated in sorted key order; an array as
    it is."""
    if isinstance(obs, dict):
        return jnp.concatenate([jnp.ravel(obs[k]) for k in sorted(obs)])
    return obs


class GymnaxEnv(Env):
    """A gymnax environment and its params behind the Brax `Env` interface that `VecEnv` steps.

    Steps with gymnax's `step_env` (no auto-reset, no time limit: since gymnax 1.0 its `done` is
    termination only), so time limits, truncation and fresh resets are `VecEnv`'s as for every env;
    gymnax's own limit (`params.max_steps_in_episode`, `time_limit`) is `gymnax:<id>`'s default
    `episode_length`. gymnax's `step_env` takes a key: each env's key travels in its state
    (`pipeline_state = {"state", "key"}`), split at every step. Observations are flattened to
    float32 vectors; a `Box` action arrives in [-1, 1] and is rescaled to the space's bounds, a
    `Discrete` one is passed on as the integer it is.
    """

    def __init__(self, env, params=None):
        self.env = env
        self.params = env.default_params if params is None else params
        theirs = env.action_space(self.params)
        if hasattr(theirs, "n"):
            self.action_space = spaces.Discrete(int(theirs.n))
            self._low = self._high = None
        else:
            self.action_space = spaces.Box(int(np.prod(theirs.shape, dtype=int)))
            self._low, self._high = np.asarray(theirs.low), np.asarray(theirs.high)
        self._action_shape = tuple(theirs.shape)

    @classmethod
    def make(cls, env_id: str) -> "GymnaxEnv":
        """gymnax's env `env_id` (`gymnax.make`) with its default params."""
        import gymnax

        return cls(*gymnax.make(env_id))

    @property
    def time_limit(self) -> int:
        """gymnax's episode limit for these params (0 when they have none)."""
        return int(getattr(self.params, "max_steps_in_episode", 0))

    def reset(self, rng) -> State:
        key, reset_key = jax.random.split(rng)
        obs, state = self.env.reset_env(reset_key, self.params)
        zero = jnp.zeros(())
        return State({"state": state, "key": key}, self._obs(obs), zero, zero, {}, {})

    def step(self, state: State, action) -> State:
        key, step_key = jax.random.split(state.pipeline_state["key"])
        obs, inner, reward, done, _ = self.env.step_env(
            step_key, state.pipeline_state["state"], self._theirs(action), self.params)
        return state.replace(pipeline_state={"state": inner, "key": key}, obs=self._obs(obs),
                             reward=jnp.asarray(reward, jnp.float32),
                             done=jnp.asarray(done, jnp.float32))

    def _theirs(self, action):
        if self._low is None:
            return action
        scaled = self._low.ravel() + (action + 1.0) * 0.5 * (self._high - self._low).ravel()
        return scaled.reshape(self._action_shape)

    @staticmethod
    def _obs(obs):
        return jnp.ravel(flat_dict(obs)).astype(jnp.float32)

    @property
    def observation_size(self) -> int:
        return int(jax.eval_shape(self.reset, jax.random.PRNGKey(0)).obs.shape[-1])

    @property
    def observation_shape(self) -> tuple[int, ...]:
        """The shape of gymnax's observations before they are flattened (e.g. MinAtar's
        `(10, 10, channels)` images); a dict observation's is its flattened size."""
        obs = jax.eval_shape(self.env.reset_env, jax.random.PRNGKey(0), self.params)[0]
        return (self.observation_size,) if isinstance(obs, dict) else tuple(obs.shape)

    @property
    def action_size(self) -> int:
        """The actor's output width: the number of continuous actions, or of discrete choices."""
        space = self.action_space
        return space.size if isinstance(space, spaces.Box) else space.n

    @property
    def backend(self) -> str:
        return "jax"


def observation_shape(env) -> tuple[int, ...] | None:
    """The shape of `env`'s observations before they were flattened to the vectors it returns
    (its `observation_shape`, e.g. `GymnaxEnv`'s), or None when it declares none (they are flat).
    Wrappers pass it on."""
    shape = getattr(env, "observation_shape", None)
    return None if shape is None else tuple(int(n) for n in shape)


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
        self.action_space = spaces.action_space(env)

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
        """Step every env with `action` (`[B, action_dim]` continuous ones, clipped to [-1, 1]; `[B]`
        discrete ones); reset those that ended."""
        inner = jax.vmap(self.env.step)(state.inner, self.action_space.clip(action))
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
