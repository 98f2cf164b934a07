"""What the command line can name before anything heavy is imported: the built-in envs, and the
config fields a built-in env or algorithm runs with unless the user sets them (class < env <
algorithm < flags: `Config.for_env`). Plain tables, so that parsing a command (and its `--help`)
imports no JAX; `vaco_jax.envs` and `vaco_jax.algorithms` read them too."""

from __future__ import annotations

from typing import Any

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
TOY_ENVS = ("toy_reach", "toy_bandit")
ENV_NAMES = MJX_ENVS + DMC_ENVS + TOY_ENVS
# gymnax's envs by their id (`gymnax:CartPole-v1`, `gymnax:Pendulum-v1`, ...; `gymnax.registered_envs`).
GYMNAX_PREFIX = "gymnax:"


# --- per-env defaults ------------------------------------------------------------------------------
# The config fields an env runs with unless the user sets them (`Config.for_env`, the command line):
# what learns on a 2-core CPU, from the sweep presets and the results measured with them
# (docs/environments.md has the table, with the settings Brax and MuJoCo Playground publish for
# accelerators beside it). An env not listed runs with `Config`'s own defaults, which are
# inverted_pendulum's (it learns to the maximum return in ~40k steps).
_LOCOMOTION_CPU = {"total_steps": 1_000_000, "mjx_solver": "fast"}
ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    # The `cpu` preset's budget: synchronous VACO 8,740, PPO-Clip 9,248 (maximum ~9,360).
    "inverted_double_pendulum": {"total_steps": 204_800},
    # `hopper-1m`: returns rise from ~400 to 2,000-3,000 within 1M steps (fast solver: checked).
    "hopper": {**_LOCOMOTION_CPU, "num_evals": 20},
    # hopper's budget; the fast solver is checked for them (FAST_SOLVER), learning is not measured.
    "walker2d": dict(_LOCOMOTION_CPU),
    "halfcheetah": dict(_LOCOMOTION_CPU),
    # `cpu-dmc`: CartpoleBalance and CartpoleSwingup learn within 1M steps (others: not measured,
    # PointMass does not).
    **{name: {"total_steps": 1_000_000} for name in DMC_ENVS},
    # Measured by tests/test_learning.py (every seed 500 at 204,800 steps).
    "gymnax:CartPole-v1": {"episode_length": 500, "total_steps": 204_800, "num_evals": 5},
    # Measured by tests/test_learning.py (seeds -115 to -466 at 819,200 steps; random -1244).
    "gymnax:Pendulum-v1": {"episode_length": 200, "num_envs": 64, "total_steps": 819_200,
                           "learning_rate": 1e-3, "gamma": 0.9, "anneal_lr": True,
                           "num_evals": 5, "eval_envs": 16},
}


# The config fields an algorithm of `vaco_jax.algorithms.REGISTRY` runs with unless set: its usual
# form where that differs from the shared protocol (`Algorithm.defaults`).
ALGORITHM_DEFAULTS: dict[str, dict[str, Any]] = {
    # IMPALA (Espeholt et al. 2018) as its authors and Stoix run it: one pass over each batch.
    "impala": {"num_epochs": 1},
}


# --- names an algorithm can be given by (`vaco_jax.algorithms` registers them: its tests check
# that these are its names), so that a misspelt `--algo` or `--env` is refused before JAX loads --
ALGORITHM_NAMES = ("appo", "cispo", "decoupled_ppo", "dppo_tv", "geppo", "gspo", "icepop", "impala",
                   "m2po", "pg", "ppo_clip", "ppo_kl", "spo", "tis", "topr", "vaco")
ESTIMATOR_NAMES = ("gae", "vtrace_once", "vtrace_every")
OBJECTIVE_NAMES = ("tv_filter", "ppo_clip", "ppo_kl", "spo", "impala_pg", "pg", "decoupled_ppo",
                   "icepop", "cispo", "dppo_tv", "m2po", "topr", "geppo", "geppo_clip", "gspo")
ABLATION_NAMES = ("gae+tv_filter", "vtrace_once+ppo_clip")
USER_OBJECTIVE = ("a name given to vaco_jax.register_objective, or 'module:function' naming a "
                  "function `fn(x: PolicyInputs, p: ObjectiveParams) -> (loss, metrics)` in an "
                  "importable module")


def unknown_algo(name: str):
    """The error of an `algo` that names no algorithm, with the closest names."""
    from vaco_jax.errors import did_you_mean, invalid

    pairings = [f"{e}+{o}" for e in ESTIMATOR_NAMES for o in OBJECTIVE_NAMES]
    return invalid("algo", name, f"allowed values are {sorted(ALGORITHM_NAMES)} or a pairing "
                                 f"'<estimator>+<objective>' with estimator in "
                                 f"{list(ESTIMATOR_NAMES)} and objective in {list(OBJECTIVE_NAMES)} "
                                 f"(e.g. {', '.join(ABLATION_NAMES)}), {USER_OBJECTIVE}"
                   + did_you_mean(name, [*ALGORITHM_NAMES, *pairings]))


def unknown_env(name: str, registered=(), objects: str = "an env object"):
    """The error of an `env` that names no env, with the closest names."""
    from vaco_jax.errors import did_you_mean, invalid

    if name.startswith(DMC_PREFIX):
        return invalid("env", name, f"the DM Control Suite tasks are {list(DMC_ENVS)}"
                       + did_you_mean(name, DMC_ENVS))
    return invalid("env", name, f"allowed values are {sorted(MJX_ENVS + TOY_ENVS)}, "
                                f"'{DMC_PREFIX}<Task>' (Task in {list(DMC_TASKS)}), "
                                f"'{GYMNAX_PREFIX}<id>' (gymnax's envs), a name given to "
                                f"vaco_jax.register_env (registered now: {sorted(registered)}), or "
                                f"'module:factory' naming a function that returns {objects}"
                   + did_you_mean(name, [*ENV_NAMES, *registered]))


def check_names(env: str | None = None, algo: str | None = None) -> None:
    """Refuse (`ConfigError`, with the closest names) an `env` or `algo` that can name nothing,
    importing no JAX: what the command line checks first. A name this cannot judge (a user's
    `module:function`, gymnax's envs, an objective of a pairing) is left to `config.validate`."""
    import sys

    envs, algorithms = sys.modules.get("vaco_jax.envs"), sys.modules.get("vaco_jax.algorithms")
    registered_envs = sorted(getattr(envs, "_REGISTRY", {}))
    if (isinstance(env, str) and env not in ENV_NAMES and env not in registered_envs
            and not env.startswith(GYMNAX_PREFIX)
            and (env.startswith(DMC_PREFIX) or ":" not in env)):
        raise unknown_env(env, registered_envs)
    if not isinstance(algo, str) or algo in ALGORITHM_NAMES:
        return
    estimator, plus, _ = algo.partition("+")
    user = getattr(algorithms, "_USER_OBJECTIVES", {})
    if (plus and estimator not in ESTIMATOR_NAMES) or (
            not plus and ":" not in algo and algo not in user):
        raise unknown_algo(algo)
