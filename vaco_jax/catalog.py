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
