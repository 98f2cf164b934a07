"""What a sweep runs (SPEC §7): studies (algorithm × variant pairs, δ values) and presets (envs,
capacities, seeds and the shared config at one scale: `tiny`, `smoke`, `cpu`, `hopper-1m`, `paper`,
the DM Control Suite's `cpu-dmc` and `paper-dmc`, and the controlled-lag presets `lag-cpu`,
`lag-gpu` and `lag-tiny`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from vaco_jax.catalog import DMC_ENVS, DMC_PREFIX
from vaco_jax.config import Config
from vaco_jax.errors import ConfigError

ROOT = Path("runs") / "sweeps"   # a sweep's default directory is ROOT / <preset>

MAIN_ALGOS = ("vaco", "ppo_clip", "ppo_kl", "spo", "impala")
DELTAS = (0.05, 0.1, 0.2, 0.4)


@dataclasses.dataclass(frozen=True)
class Variant:
    """A named set of `Config` overrides (static ones change the compiled program)."""

    name: str = "default"
    overrides: tuple[tuple[str, Any], ...] = ()
    capacities: tuple[int, ...] = ()
    """Run only these of the preset's capacities (empty: all of them)."""
    hparams: tuple[tuple[str, tuple[float, ...]], ...] = ()
    """`HParams` leaves swept inside the cell's program, `((name, values), ...)`: every
    combination, crossed with the capacities, δ values and seeds (e.g. the learning rate)."""
    label: str = ""
    """How the lag study's tables name the method (`method_label`); empty: the algorithm, with
    the variant's name in brackets unless it is `default`. The name stays the cells' identity."""


DEFAULT = Variant()


@dataclasses.dataclass(frozen=True)
class Study:
    """Which (algorithm, variant) pairs to run on every env, and the δ values to vmap over.

    `deltas = ()` keeps the preset's δ.
    """

    name: str
    entries: tuple[tuple[str, Variant], ...]
    deltas: tuple[float, ...] = ()


# --- the controlled-lag study ---------------------------------------------------------------------
# With `snapshot_sampling="oldest"` every actor acts with the oldest snapshot of a buffer of C, so
# once the buffer has filled (after C − 1 iterations) the lag is a constant k = C − 1 iterations for
# every actor and method: capacities 1, 2, 4, 8, 16 are the constant lags 0, 1, 3, 7, 15 (k = 0 is
# synchronous), vmapped in one program. Uniform sampling over C = 16 (mean age 7.5, many fresh
# samples) is kept as a reference column, in a program of its own (the sampling mode is static).
LAG_CAPACITIES = (1, 2, 4, 8, 16)
# A lag-study run's score averages its last this many evaluations (`vaco_jax.study.lag`; the
# references must be measured alike: `vaco-references --last-evals 3`).
FINAL_EVALS = 3
UNIFORM_REFERENCE_CAPACITY = 16
# Each baseline in the paper's protocol (the same K × M updates per batch as VACO) and, where its
# usual form differs, in that form too. PPO-KL with an adaptive β_KL twice: the textbook form
# (the KL to the behaviour policy β, β_KL unbounded) and its authors' (the KL to π_T, the policy
# before the update, in the penalty and the rule, as Schulman's modular_rl and RLlib measure it;
# β_KL kept in [1/35, 35] as pat-coady/trpo's adaptive-KL PPO). IMPALA's row is its usual form, one
# pass over each batch (K = 1, as Espeholt et al. and Stoix; `--algo impala` on the command line);
# the protocol's 4 epochs are the labelled variant. The variants' names are the cells' identities
# in stored results (results/lag-cpu), so they stay; `label` names them in tables. Decoupled PPO
# and APPO are what asynchronous RL systems run today.
KL_COEF_BOUNDS = (1.0 / 35.0, 35.0)
LAG_METHODS: tuple[tuple[str, Variant], ...] = (
    ("ppo_clip", DEFAULT),
    ("vaco", DEFAULT),
    ("ppo_kl", DEFAULT),
    ("decoupled_ppo", DEFAULT),
    ("appo", DEFAULT),
    ("ppo_kl", Variant("kl_adaptive", (("kl_adaptive", True),))),
    ("ppo_kl", Variant("kl_adaptive_learner", (
        ("kl_adaptive", True), ("kl_reference", "learner"),
        ("kl_coef_min", KL_COEF_BOUNDS[0]), ("kl_coef_max", KL_COEF_BOUNDS[1])))),
    ("spo", DEFAULT),
    ("impala", Variant("epochs=1", (("num_epochs", 1),), label="impala")),
    ("impala", Variant("default", label="impala [epochs=4]")),
)
LAG_SAMPLING = {
    "oldest": Variant("oldest", (("snapshot_sampling", "oldest"),)),
    "uniform": Variant("uniform", (("snapshot_sampling", "uniform"),),
                       capacities=(UNIFORM_REFERENCE_CAPACITY,)),
}


# --- both sources of policy lag: update frequency (forward) × constant lag (backward) ------------------
# K epochs per batch at M = 8 minibatches, and the learning rate (an HParams leaf, swept inside the
# program), crossed with the constant lag k = C − 1 (oldest snapshot). K = 4 sweeps the learning
# rate; K = 16 and 32 run at the protocol's 3e-4, and K = 32 also at 3e-3 (the extreme corner).
FORWARD_SETTINGS = ((4, (3e-4, 1e-3, 3e-3)), (16, (3e-4,)), (32, (3e-4, 3e-3)))
FORWARD_METHODS = ("vaco", "ppo_clip", "appo", "decoupled_ppo")
# The new stale-data objectives: the two with the highest final retention at k = 15 on the
# benchmark's cpu leaderboard join the study (`--algos`), as pre-registered
# (docs/preregistrations.md).
STALE_DATA_OBJECTIVES = ("icepop", "cispo", "dppo_tv", "m2po", "topr", "geppo")
LEARNING_RATES = (1e-4, 3e-4, 1e-3, 3e-3)


def _forward_variant(epochs: int, rates: tuple[float, ...]) -> Variant:
    return Variant(f"K={epochs},oldest", (("num_epochs", epochs), ("snapshot_sampling", "oldest")),
                   hparams=(("learning_rate", rates),))


def _with_sampling(method: Variant, sampling: Variant) -> Variant:
    """`method`'s overrides with a snapshot-sampling column's; named `<method>,<sampling>`."""
    name = sampling.name if method.name == "default" else f"{method.name},{sampling.name}"
    return Variant(name, method.overrides + sampling.overrides, sampling.capacities,
                   method.hparams, method.label)


# The variant of a method acting with a lag profile (`vaco-sweep --lag-profile FILE`).
PROFILE_VARIANT = "profile"


def method_variant(variant: str) -> str:
    """The method part of a lag-study variant name (`"kl_adaptive,oldest"` → `"kl_adaptive"`,
    `"oldest"` → `"default"`, `"epochs=1,profile"` → `"epochs=1"`); other variant names are
    returned unchanged."""
    head, _, tail = variant.rpartition(",")
    if tail in LAG_SAMPLING or tail == PROFILE_VARIANT:
        return head or "default"
    return variant


def method_label(algo: str, variant: str) -> str:
    """How the lag study's tables name the method of a cell of `algo` and lag-study `variant`
    (`"epochs=1,oldest"`): the `LAG_METHODS` entry's label where it has one (IMPALA's rows), else
    the algorithm with the method variant in brackets unless it is `default`."""
    method = method_variant(variant)
    for entry_algo, entry in LAG_METHODS:
        if (entry_algo, entry.name) == (algo, method) and entry.label:
            return entry.label
    return algo if method == "default" else f"{algo} [{method}]"


STUDIES = {
    # The paper's claim: return vs capacity for VACO and the four baselines.
    "main": Study("main", tuple((algo, DEFAULT) for algo in MAIN_ALGOS)),
    # δ sensitivity of VACO. δ = 0.2 (the default) comes from the main study's VACO runs.
    "delta": Study("delta", (("vaco", DEFAULT),), deltas=tuple(d for d in DELTAS if d != 0.2)),
    # Align vs Filter, and the filter's switches (SPEC §3.2, §4).
    "ablations": Study("ablations", (
        ("gae+tv_filter", DEFAULT),
        ("vtrace_once+ppo_clip", DEFAULT),
        ("vaco", Variant("tv_reference=learner", (("tv_reference", "learner"),))),
        ("vaco", Variant("filter_mode=per_sample", (("filter_mode", "per_sample"),))),
    )),
    # Return vs a constant lag k (every method at k = 0, 1, 3, 7, 15), then the uniform C = 16
    # reference column: every method's constant-lag program runs before any uniform one.
    "lag": Study("lag", tuple((algo, _with_sampling(variant, LAG_SAMPLING[sampling]))
                              for sampling in ("oldest", "uniform")
                              for algo, variant in LAG_METHODS)),
    # Update frequency × constant lag (docs/preregistrations.md, section 5).
    "forward": Study("forward", tuple((algo, _forward_variant(epochs, rates))
                                      for epochs, rates in FORWARD_SETTINGS
                                      for algo in FORWARD_METHODS + STALE_DATA_OBJECTIVES)),
    # Synchronous step sizes of PPO-Clip and VACO, and the Align/Filter ablations at C = 1.
    "stepsize": Study("stepsize", (
        ("ppo_clip", Variant("lr", hparams=(("learning_rate", LEARNING_RATES),))),
        ("vaco", Variant("lr", hparams=(("learning_rate", LEARNING_RATES),))),
        ("gae+tv_filter", DEFAULT),
        ("vtrace_once+ppo_clip", DEFAULT),
    )),
    # VACO's δ at a constant lag (the preset's capacities with the oldest snapshot).
    "delta-lag": Study("delta-lag", (("vaco", LAG_SAMPLING["oldest"]),), deltas=DELTAS),
}


@dataclasses.dataclass(frozen=True)
class Preset:
    """A sweep at one scale: envs, capacities, seeds, and the shared (and per-env) config."""

    name: str
    envs: tuple[str, ...]
    capacities: tuple[int, ...]
    num_seeds: int
    config: dict[str, Any]
    env_config: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    seed: int = 0
    """First seed: run s of an env uses seed `seed + s`."""
    env_seeds: dict[str, int] = dataclasses.field(default_factory=dict)
    """Seeds per env where it differs from `num_seeds` (e.g. fewer on an expensive env)."""
    runs_per_call: int = 0
    """Split a cell's runs into programs of at most this many runs (0 = all in one; for memory)."""
    description: str = ""
    studies: tuple[str, ...] = ("main",)
    """The studies the sweep runs unless told otherwise."""
    algos: tuple[str, ...] | None = None
    """Only these algorithms of the studies unless told otherwise (None: all)."""

    def seeds(self, env: str) -> int:
        """How many seeds run on `env`."""
        return self.env_seeds.get(env, self.num_seeds)

    def env_base(self, env: str) -> Config:
        """The config every run on `env` shares (capacity/δ/seed are set per run)."""
        fields = {**self.config, **self.env_config.get(env, {})}
        return Config(env=env, capacity=max(self.capacities), max_capacity=max(self.capacities),
                      **fields)

    def with_overrides(self, **overrides) -> "Preset":
        """A reduced (or enlarged) copy: envs, capacities, num_seeds, seed, runs_per_call, or any
        Config field (applied to every env, replacing per-env values of that field)."""
        own = {k: overrides.pop(k) for k in list(overrides) if k in
               ("envs", "capacities", "num_seeds", "seed", "runs_per_call", "studies", "algos")}
        if "num_seeds" in own:   # an explicit number of seeds applies to every env
            own["env_seeds"] = {}
        env_config = {env: {k: v for k, v in fields.items() if k not in overrides}
                      for env, fields in self.env_config.items()}
        return dataclasses.replace(self, **own, config={**self.config, **overrides},
                                   env_config=env_config)


def preset(name: str, **overrides) -> Preset:
    """The preset `name` with `overrides` (`Preset.with_overrides`; None values are ignored)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; allowed values are {list(PRESETS)}")
    return PRESETS[name].with_overrides(**{k: v for k, v in overrides.items() if v is not None})


_CPU_SHAPES = dict(num_envs=32, unroll_length=32, num_epochs=4, num_minibatches=8, num_actors=4,
                   episode_length=1000, num_evals=10, eval_envs=4)

# MuJoCo Playground's published Brax PPO settings for the DM Control Suite (`mujoco_playground.
# config.dm_control_suite_params.brax_ppo_config`, version 0.2.0) in our terms. Theirs: 2048 envs,
# unrolls of 30 steps, 16 epochs of 32 minibatches of 1024 unrolls per 983,040 env steps. Ours: one
# unroll of 30 steps from each of 2048 envs per iteration, 16 epochs of 2 minibatches of 1024
# unrolls: the same minibatch size and SGD steps per env step. Their networks (Brax's PPO
# defaults: policy 4 × 32, value 5 × 256, swish), discount, learning rate, entropy cost and reward
# scaling; 60M env steps per run (100M for the tasks below). Not carried over: PendulumSwingup's
# action repeat of 4 (we have no action repeat).
_PLAYGROUND_PPO = dict(
    num_envs=2048, unroll_length=30, num_epochs=16, num_minibatches=2, num_actors=16,
    actor_hidden=(32, 32, 32, 32), critic_hidden=(256, 256, 256, 256, 256), activation="silu",
    gamma=0.995, learning_rate=1e-3, ent_coef=1e-2, reward_scale=10.0, episode_length=1000,
    num_evals=40, eval_envs=32, total_steps=60_000_000)
_PLAYGROUND_PPO_PER_TASK = {
    **{DMC_PREFIX + task: {"total_steps": 100_000_000}
       for task in ("AcrobotSwingup", "AcrobotSwingupSparse", "SwimmerSwimmer6", "WalkerRun")},
    **{DMC_PREFIX + task: {"gamma": 0.95} for task in ("BallInCup", "FingerSpin")},
}

# The controlled-lag study's evaluation: 20 evaluations of 16 episodes, so that the final score (the
# mean of the last 3 evaluations) averages 48 episodes and the curve shows whether a run has
# flattened. Budgets are whole evaluation chunks of 32 × 32 env steps, at least the round figure.
_LAG_CPU_SHAPES = {**_CPU_SHAPES, "num_evals": 20, "eval_envs": 16}
LAG_SEED = 100   # disjoint from the other presets' seeds (0-9) and the references' (10000+)

PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        "tiny", envs=("toy_reach",), capacities=(1, 4), num_seeds=3,
        config=dict(num_envs=8, unroll_length=8, num_epochs=2, num_minibatches=2, num_actors=2,
                    episode_length=50, num_evals=4, eval_envs=4, total_steps=16_384,
                    learning_rate=1e-3),
        description="seconds on CPU: tests"),
    "smoke": Preset(
        "smoke", envs=("inverted_double_pendulum",), capacities=(1, 4, 16), num_seeds=2,
        config={**_CPU_SHAPES, "num_evals": 4, "total_steps": 32_768},
        description="the CPU preset's shapes at a tiny budget, one env: checks the pipeline end to end"),
    "cpu": Preset(
        "cpu", envs=("inverted_double_pendulum", "hopper"), capacities=(1, 4, 16), num_seeds=5,
        config={**_CPU_SHAPES, "total_steps": 204_800},
        env_config={"hopper": {"total_steps": 102_400}},
        description="2-core CPU, main study < 45 min (see README)"),
    "hopper-1m": Preset(
        "hopper-1m", envs=("hopper",), capacities=(1, 16), num_seeds=5,
        config={**_CPU_SHAPES, "total_steps": 1_000_000, "num_evals": 20, "mjx_solver": "fast"},
        description="hopper at 1M env steps per run, synchronous and C = 16: hours on a 2-core "
                    "CPU, resumable (run it with --algos vaco ppo_clip ppo_kl)"),
    "paper": Preset(
        "paper", envs=("ant", "halfcheetah", "hopper", "walker2d", "humanoid"),
        capacities=(1, 2, 4, 8, 16), num_seeds=10,
        config=dict(num_envs=256, unroll_length=32, num_epochs=4, num_minibatches=8, num_actors=16,
                    episode_length=1000, num_evals=40, eval_envs=32, total_steps=100_000_000),
        description="the paper's scale (100M steps); for an accelerator"),
    "cpu-dmc": Preset(
        "cpu-dmc", envs=("dmc:CartpoleBalance", "dmc:CartpoleSwingup"), capacities=(1, 4, 16),
        num_seeds=5, config={**_CPU_SHAPES, "total_steps": 1_000_000},
        description="DM Control's cartpole tasks at 1M env steps per run on a 2-core CPU "
                    "(needs the dmc extra)"),
    "paper-dmc": Preset(
        "paper-dmc", envs=DMC_ENVS, capacities=(1, 2, 4, 8, 16), num_seeds=10,
        config=_PLAYGROUND_PPO, env_config=_PLAYGROUND_PPO_PER_TASK,
        description="every DM Control task at MuJoCo Playground's PPO budgets and settings; for "
                    "accelerators (needs the dmc extra)"),
    "lag-tiny": Preset(
        "lag-tiny", envs=("toy_reach",), capacities=(1, 2, 4), num_seeds=2,
        config=dict(num_envs=8, unroll_length=8, num_epochs=2, num_minibatches=2, num_actors=2,
                    episode_length=50, num_evals=4, eval_envs=4, total_steps=16_384,
                    learning_rate=1e-3),
        studies=("lag",), algos=("vaco", "ppo_clip"), seed=LAG_SEED,
        description="the lag study in seconds on CPU: tests"),
    "lag-cpu": Preset(
        "lag-cpu", envs=("inverted_double_pendulum", "dmc:CartpoleSwingup", "dmc:CheetahRun",
                         "hopper"),
        capacities=LAG_CAPACITIES, num_seeds=10, seed=LAG_SEED,
        env_seeds={"dmc:CheetahRun": 5, "hopper": 5},
        config={**_LAG_CPU_SHAPES, "total_steps": 1_024_000},
        env_config={"inverted_double_pendulum": {"total_steps": 614_400},
                    "hopper": {"mjx_solver": "fast"}},
        studies=("lag",),
        description="return vs a constant policy lag on 4 tasks at CPU shapes: many hours on a "
                    "2-core CPU, resumable (needs the dmc extra)"),
    "forward-cpu": Preset(
        "forward-cpu", envs=("inverted_double_pendulum", "dmc:CartpoleSwingup"),
        capacities=(1, 4, 16), num_seeds=10, seed=LAG_SEED,
        config={**_LAG_CPU_SHAPES, "total_steps": 1_024_000},
        env_config={"inverted_double_pendulum": {"total_steps": 614_400}},
        studies=("forward",), algos=FORWARD_METHODS,
        description="update frequency (K, learning rate) × constant lag k = 0, 3, 15 on two tasks: "
                    "many hours on a 2-core CPU, resumable (needs the dmc extra)"),
    "stepsize-cpu": Preset(
        "stepsize-cpu", envs=("inverted_double_pendulum", "dmc:CartpoleSwingup", "dmc:CheetahRun"),
        capacities=(1,), num_seeds=10, seed=LAG_SEED,
        config={**_LAG_CPU_SHAPES, "total_steps": 1_024_000},
        env_config={"inverted_double_pendulum": {"total_steps": 614_400}},
        studies=("stepsize",),
        description="synchronous learning rates of PPO-Clip and VACO and the Align/Filter ablations "
                    "on three tasks: hours on a 2-core CPU (needs the dmc extra)"),
    "delta-lag-cpu": Preset(
        "delta-lag-cpu", envs=("inverted_double_pendulum", "dmc:CartpoleSwingup"),
        capacities=(1, 16), num_seeds=10, seed=LAG_SEED,
        config={**_LAG_CPU_SHAPES, "total_steps": 1_024_000},
        env_config={"inverted_double_pendulum": {"total_steps": 614_400}},
        studies=("delta-lag",),
        description="VACO's δ = 0.05 … 0.4 at k = 0 and 15 on two tasks (needs the dmc extra)"),
    "lag-gpu": Preset(
        "lag-gpu", envs=("hopper", "inverted_double_pendulum"), capacities=(1, 8), num_seeds=10,
        seed=LAG_SEED,
        config=dict(num_envs=256, unroll_length=32, num_epochs=4, num_minibatches=8, num_actors=16,
                    episode_length=1000, num_evals=20, eval_envs=16, total_steps=5_242_880),
        env_config={"hopper": {"mjx_solver": "fast"},
                    "inverted_double_pendulum": {"total_steps": 2_621_440}},
        studies=("lag",), algos=("vaco", "ppo_clip"),
        description="the lag study at the paper's shapes, constant lag 0 and 7, for one GPU "
                    "(minutes)"),
}
