"""The lag-robustness benchmark: any method, a fixed versioned protocol, one scorecard.

A **protocol** fixes everything but the method: tasks (env, budget, shapes, seeds), a constant
backward-lag axis k (every actor acts with the snapshot k learner iterations old: capacity k + 1,
`snapshot_sampling="oldest"`, as in the controlled-lag study), and a high-update-frequency setting
(forward lag: more epochs per batch) at the lags it names. A **method** is an algorithm
(`--algo`: a registry name, `<estimator>+<objective>`, a user's `<estimator>+<module>:<function>`)
with optional config overrides (`ppo_kl` with `kl_adaptive=True`). Seed s of every method uses
`PRNGKey(protocol.seed + s)`, so methods are paired by seed (common random numbers).

`bench_cells` plans a method's cells (one compiled program per task and setting, every lag ×
seed vmapped in it); `run_bench` runs them with the sweep machinery (`vaco_jax.study.sweep`:
resumable cell by cell, shardable over processes) into `<out>/runs/`, and records in
`<out>/bench.json` the method, the protocol and its **comparability key**: the protocol's
version, the libraries' versions and each cell's key (`vaco_jax.study.keys`: its config and
runs, the values its programs receive and what they compute). Two results may be
compared when both are what one checkout computes (`computed_here`): a docstring or a refactor
keeps a leaderboard comparable, a change of behaviour does not. The scorecard itself is
`vaco_jax.study.scorecard`.

From version 2 on, a protocol makes its constant lags as lag profiles (all the mass on age k) in
the same program as a stochastic lag, and each method's learning rate is chosen first on design
seeds (`tuning_cells`, `run_tuning`, `choose_learning_rate`: `<out>/tuning.json`), then frozen for
its scored runs. Each run's rows say its setting, lag, K, learning rate and seed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from pathlib import Path
from typing import Any

from vaco_jax import algorithms, cache, io, program, runtime
from vaco_jax.config import Config, validate, with_lag_profile
from vaco_jax.errors import ConfigError
from vaco_jax.study import keys, sweep, tuning
from vaco_jax.study.sweep import KEY_LIBRARIES, Cell, Run, key_versions

BENCH_FILE = "bench.json"
RUNS = "runs"
REFERENCES = "random_returns.json"
STUDY = "bench"
PROFILE = "profile"   # the setting of a method acting with the user's lag profile

def committed_leaderboard(protocol: str, version: int = 1, held_out: bool = False) -> Path:
    """The leaderboard committed with the repository, `results/lag-bench/<protocol>` of the
    checkout this package runs from (`<protocol>-v<version>` from version 2 on, `…-held-out` for
    its held-out tasks; absent when it is installed without one): found from any directory."""
    name = (protocol if version == 1 else f"{protocol}-v{version}") + ("-held-out" * held_out)
    return Path(io.__file__).resolve().parent.parent / "results" / "lag-bench" / name


@dataclasses.dataclass(frozen=True)
class Task:
    env: str
    config: tuple[tuple[str, Any], ...]
    """Config fields of every run on this task (budget, shapes)."""
    seeds: int


@dataclasses.dataclass(frozen=True)
class Protocol:
    """What a method is scored on. Changing anything here changes `version`."""

    name: str
    version: int
    tasks: tuple[Task, ...]
    lags: tuple[int, ...]
    """Constant backward lags k (learner iterations), 0 first: synchronous."""
    forward: tuple[tuple[str, Any], ...]
    """Static overrides of the high-update-frequency setting (e.g. num_epochs=16)."""
    forward_lags: tuple[int, ...] = (0,)
    """The lags the high-update-frequency setting runs at."""
    seed: int = 200
    """Seed s of a task runs with `PRNGKey(seed + s)`."""
    references: tuple[str, ...] = ("ppo_clip", "appo", "vaco")
    """The methods every scorecard is tested against (the pre-registered family)."""
    last_evals: int = 3
    """A run's final score: the mean of its last this many evaluations."""
    description: str = ""
    # From version 2 on (version 1's protocols leave these at their defaults):
    sampling: str = "oldest"
    """How a constant lag k is made: `oldest` (capacity k + 1), or `profile` (a lag profile with
    all its mass on age k: the same computation, in a program that also holds `stochastic`)."""
    stochastic: tuple[tuple[str, tuple[float, ...]], ...] = ()
    """Stochastic lags in the lag axis's program: (name, lag profile p_0 … p_{C−1}) each."""
    design_seed: int = 0
    design_seeds: int = 0
    """The learning-rate choice runs seeds design_seed … design_seed + design_seeds − 1, never
    used for a score."""
    learning_rates: tuple[float, ...] = ()
    """The grid each method's learning rate is chosen from at k = 0 (empty: no choice)."""
    default_learning_rate: float = 3e-4
    """The learning rate chosen where the grid's scores tie."""
    requires: tuple[str, ...] = ()
    """The extras the tasks need (`pip install -e ".[extra]"`)."""
    # From version 3 on:
    per_task: bool = False
    """False: one learning rate over every task (version 2). True: per task, the learning rates ×
    the method's key constraint (`constraints`), a choice on an edge extended (`study.tuning`)."""
    constraints: tuple[tuple[str, tuning.Constraint], ...] = ()
    """(method or objective name, its key constraint): the second axis of its grid."""
    lr_only: tuple[float, ...] = ()
    """The learning rates of a method without a constraint: the same budget, a finer ladder."""
    held_out: tuple[Task, ...] = ()
    """Tasks named before any run, scored only after the board (`--held-out`), reported apart."""

    @property
    def largest_lag(self) -> int:
        return max(self.lags)

    @property
    def tuned(self) -> bool:
        """Is each method's learning rate chosen on the design seeds (`--tune`)?"""
        return bool(self.learning_rates)

    def describe(self) -> dict:
        return io.to_jsonable(dataclasses.asdict(self))

    def check_requires(self) -> None:
        """`ConfigError` with the install command when an extra the tasks need is missing."""
        from vaco_jax import envs

        available = {"dmc": envs.dmc_available, "gymnax": envs.gymnax_available}
        missing = [extra for extra in self.requires if not available[extra]()]
        if missing:
            raise ConfigError(f"option `protocol` = {self.name!r} (v{self.version}) needs the "
                              f"extras {missing}: pip install -e \".[{','.join(missing)}]\"")


_TINY = (("num_envs", 8), ("unroll_length", 8), ("num_epochs", 2), ("num_minibatches", 2),
         ("num_actors", 2), ("episode_length", 50), ("num_evals", 4), ("eval_envs", 4),
         ("total_steps", 8_192), ("learning_rate", 1e-3))
# The controlled-lag study's CPU shapes (presets._LAG_CPU_SHAPES): 32 envs × 32 steps per
# iteration, K = 4 epochs × M = 8 minibatches, 20 evaluations of 16 episodes.
_CPU = (("num_envs", 32), ("unroll_length", 32), ("num_epochs", 4), ("num_minibatches", 8),
        ("num_actors", 4), ("episode_length", 1000), ("num_evals", 20), ("eval_envs", 16))

# Version 2: tasks at budgets where synchronous PPO-Clip has not saturated, chosen on the design
# seeds (results/lag-bench/design-v2), each a row of this table (env, env steps per run, its own
# config fields); every other field is the shared shapes', the episode length the env's own
# (`Config.for_env`).
_CPU_V2_TASKS = (
    ("inverted_double_pendulum", 61_440, ()),
    ("dmc:CartpoleSwingup", 512_000, ()),
    ("dmc:ReacherEasy", 409_600, ()),
    ("gymnax:Pendulum-v1", 409_600, (("gamma", 0.9),)),
    ("gymnax:Breakout-MinAtar", 409_600, (("ent_coef", 0.01),)),
)
# One GPU: the lag-gpu preset's shapes (256 envs × 32 steps per run, 16 actor groups) at
# 1,146,880 steps per run, planned from the H200's measured rate (docs/benchmark.md, "gpu v2").
_GPU_V2_TASKS = (
    ("hopper", 1_146_880, (("mjx_solver", "fast"),)),
    ("ant", 1_146_880, (("mjx_solver", "fast"),)),
    ("dmc:CheetahRun", 1_146_880, ()),
)
_GPU_V2_SHAPES = (("num_envs", 256), ("unroll_length", 32), ("num_epochs", 4),
                  ("num_minibatches", 8), ("num_actors", 16), ("num_evals", 20), ("eval_envs", 16))
_V2_SHAPES = tuple((k, v) for k, v in _CPU if k != "episode_length")
_LR_GRID = (1e-4, 3e-4, 1e-3)
# cpu and gpu: PPO-Clip's choice is 1e-3 and Breakout-MinAtar's best 3e-3 on the design seeds
# (results/lag-bench/design-v2), so the grid extends one step past both.
_LR_GRID_V2 = (1e-4, 3e-4, 1e-3, 3e-3)


def _v2_tasks(table, shapes, seeds: int) -> tuple[Task, ...]:
    return tuple(Task(env, shapes + (("total_steps", steps),) + own, seeds)
                 for env, steps, own in table)


def uniform_profile(largest: int) -> tuple[float, ...]:
    """The lag profile of ages 0 … `largest`, each as likely (capacity `largest` + 1)."""
    return (1.0 / (largest + 1),) * (largest + 1)


PROTOCOLS_V2 = (
    Protocol("tiny", 2, (Task("toy_reach", _TINY, 3),), lags=(0, 1, 3),
             forward=(("num_epochs", 4),), forward_lags=(0, 3), seed=300,
             sampling="profile", stochastic=(("uniform≤3", uniform_profile(3)),),
             design_seed=900, design_seeds=2, learning_rates=_LR_GRID,
             description="seconds on a CPU: the pipeline end to end (tests, CI)"),
    Protocol("cpu", 2, _v2_tasks(_CPU_V2_TASKS, _V2_SHAPES, 10), lags=(0, 2, 8),
             forward=(("num_epochs", 16),), forward_lags=(0, 8), seed=300,
             sampling="profile", stochastic=(("uniform≤8", uniform_profile(8)),),
             design_seed=900, design_seeds=5, learning_rates=_LR_GRID_V2,
             requires=("dmc", "gymnax"),
             description="five tasks of three suites on one 2-core CPU machine"),
    Protocol("gpu", 2, _v2_tasks(_GPU_V2_TASKS, _GPU_V2_SHAPES, 10), lags=(0, 2, 8),
             forward=(("num_epochs", 16),), forward_lags=(0, 8), seed=300,
             sampling="profile", stochastic=(("uniform≤8", uniform_profile(8)),),
             design_seed=900, design_seeds=5, learning_rates=_LR_GRID_V2, requires=("dmc",),
             description="hopper, ant and CheetahRun on one GPU"),
)
# Version 3: each method tuned per task, over learning rates × its key constraint (`study.tuning`):
# four values of each, or sixteen learning rates where the method has no constraint (IMPALA, PG,
# TOPR). The windows hold each method's default; a choice on an edge extends its grid.
_CLIP = tuning.Constraint("clip_eps", tuning.DOUBLING, (0.05, 0.1, 0.2, 0.4))
_KL_TARGET = tuning.Constraint("kl_target", tuning.TARGETS, (0.003, 0.01, 0.03, 0.1))
CONSTRAINTS_V3 = (
    ("tv_filter", tuning.Constraint("delta", tuning.DOUBLING, (0.05, 0.1, 0.2, 0.4))),
    ("ppo_clip", _CLIP), ("spo", _CLIP), ("decoupled_ppo", _CLIP), ("icepop", _CLIP),
    ("geppo", _CLIP),
    ("ppo_kl_adaptive", _KL_TARGET), ("ppo_kl_adaptive_learner", _KL_TARGET),
    ("ppo_kl", tuning.Constraint("kl_coef", tuning.COEFFICIENTS, (0.03, 0.1, 0.3, 1.0))),
    ("cispo", tuning.Constraint("cispo_eps_high", (0.035, 0.07, 0.14, 0.28, 0.56, 1.12, 2.24),
                                (0.07, 0.14, 0.28, 0.56), own=True)),
    ("dppo_tv", tuning.Constraint("tv_delta", tuning.DOUBLING, (0.05, 0.1, 0.2, 0.4), own=True)),
    ("m2po", tuning.Constraint("m2_tau", (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32),
                               (0.01, 0.02, 0.04, 0.08), own=True)),
)
_LR_V3 = (3e-4, 1e-3, 3e-3, 1e-2)
_LR_ONLY_V3 = tuning.FINE_LR_LADDER[12:28]          # 3.16e-4 … 2.37e-2, 10^(1/8) apart
# cpu v3: the tasks the design rule kept on the design seeds (results/lag-bench/design-v3, rounds
# 1-3), each run T = 128 learner iterations of num_envs × 32 steps, so a lag is the same fraction
# of every run; the held-out tasks were named before any design run and are scored after the board.
_V3_T = 128
_V3_SHAPES = (("unroll_length", 32), ("num_epochs", 4), ("num_minibatches", 8), ("num_actors", 4),
              ("num_evals", 16), ("eval_envs", 16))
_CPU_V3_TASKS = (   # (env, envs per iteration, its own fields)
    ("dmc:CartpoleBalance", 32, ()),
    ("dmc:CartpoleSwingup", 128, ()),
    ("dmc:ReacherEasy", 32, ()),
    ("inverted_double_pendulum", 16, ()),
    ("gymnax:Breakout-MinAtar", 64, (("ent_coef", 0.01),)),
    ("gymnax:SpaceInvaders-MinAtar", 32, (("ent_coef", 0.01),)),
)
_CPU_V3_HELD_OUT = (
    ("gymnax:Asterix-MinAtar", 64, (("ent_coef", 0.01),)),
    ("dmc:FingerTurnEasy", 64, ()),
    ("pusher", 32, ()),
)


def _v3_tasks(table, seeds: int) -> tuple[Task, ...]:
    return tuple(Task(env, (("num_envs", envs),) + _V3_SHAPES
                      + (("total_steps", _V3_T * envs * 32),) + own, seeds)
                 for env, envs, own in table)


CPU_V3_KMAX = 4
PROTOCOLS_V3 = (
    Protocol("cpu", 3, _v3_tasks(_CPU_V3_TASKS, 20), lags=(0, 1, 2, CPU_V3_KMAX),
             forward=(("num_epochs", 16),), forward_lags=(0, CPU_V3_KMAX), seed=400,
             sampling="profile", stochastic=((f"uniform≤{CPU_V3_KMAX}",
                                              uniform_profile(CPU_V3_KMAX)),),
             design_seed=900, design_seeds=5, learning_rates=_LR_V3, per_task=True,
             constraints=CONSTRAINTS_V3, lr_only=_LR_ONLY_V3,
             held_out=_v3_tasks(_CPU_V3_HELD_OUT, 20), requires=("dmc", "gymnax"),
             description="six tasks of three suites, 128 iterations each, every method tuned "
                         "per task; one 2-core CPU machine"),
    Protocol("tiny", 3, (Task("toy_reach", _TINY, 3),), lags=(0, 1, 3),
             forward=(("num_epochs", 4),), forward_lags=(0, 3), seed=400,
             sampling="profile", stochastic=(("uniform≤3", uniform_profile(3)),),
             design_seed=900, design_seeds=2, learning_rates=_LR_V3, per_task=True,
             constraints=CONSTRAINTS_V3, lr_only=_LR_ONLY_V3,
             description="seconds on a CPU: the pipeline end to end (tests, CI)"),
)
VERSIONS: dict[tuple[str, int], Protocol] = {(p.name, p.version): p for p in (
    Protocol("tiny", 1, (Task("toy_reach", _TINY, 3),), lags=(0, 1, 3),
             forward=(("num_epochs", 4),), forward_lags=(0, 3), seed=200,
             description="seconds on a CPU: the pipeline end to end (tests, CI)"),
    # inverted_double_pendulum at the controlled-lag study's budget: there (results/lag-cpu)
    # PPO-KL, SPO, decoupled PPO and adaptive PPO-KL break by k = 15 and PPO-Clip, APPO and VACO
    # do not; at half the budget every method, PPO-Clip and VACO included, is still below 0.8 of
    # its synchronous score at k = 15 (lag slows learning before it ends at the cap), so the
    # budget cannot be cut. Forward lag: 16 epochs per batch instead of 4 (4x the SGD steps).
    Protocol("cpu", 1, (Task("inverted_double_pendulum", _CPU + (("total_steps", 614_400),), 10),),
             lags=(0, 3, 15), forward=(("num_epochs", 16),), forward_lags=(0,), seed=200,
             description="one 2-core CPU machine, about half an hour per method"),
    Protocol("gpu", 1, (
        Task("inverted_double_pendulum", _CPU + (("total_steps", 614_400),), 10),
        Task("dmc:CartpoleSwingup", _CPU + (("total_steps", 1_024_000),), 10),
        Task("dmc:CheetahRun", _CPU + (("total_steps", 1_024_000),), 10),
        Task("hopper", _CPU + (("total_steps", 1_024_000), ("mjx_solver", "fast")), 10)),
        lags=(0, 3, 15), forward=(("num_epochs", 16),), forward_lags=(0, 15), seed=200,
        description="the four tasks of the controlled-lag study: one GPU (needs the dmc extra)"),
    *PROTOCOLS_V2, *PROTOCOLS_V3,
)}
# `--protocol NAME` runs the newest version of NAME.
PROTOCOLS: dict[str, Protocol] = {name: VERSIONS[name, max(v for n, v in VERSIONS if n == name)]
                                  for name, _ in VERSIONS}


def protocol(name: str, version: int | None = None) -> Protocol:
    """Protocol `name` at `version` (default: its newest)."""
    if name not in PROTOCOLS:
        raise ConfigError(f"option `protocol` = {name!r} is invalid: allowed values are "
                          f"{list(PROTOCOLS)}")
    if version is None:
        return PROTOCOLS[name]
    if (name, version) not in VERSIONS:
        raise ConfigError(f"option `protocol_version` = {version!r} is invalid: protocol {name!r} "
                          f"has versions {sorted(v for n, v in VERSIONS if n == name)}")
    return VERSIONS[name, version]


# --- methods -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Method:
    algo: str
    overrides: tuple[tuple[str, Any], ...] = ()
    label: str = ""

    @property
    def name(self) -> str:
        """The method's name in tables: its label, else `algo` or `algo[field=value,...]`."""
        if self.label:
            return self.label
        if not self.overrides:
            return self.algo
        return f"{self.algo}[{','.join(f'{k}={v}' for k, v in self.overrides)}]"


def leaderboard_methods() -> tuple[Method, ...]:
    """Every distinct algorithm the leaderboard holds, one entry each: the registered algorithms
    and the ablations, a name that is another's computation merged into the first (`tis` is
    `decoupled_ppo`, `vtrace_once+ppo_clip` is `appo`), the LLM-only ones left out (`validate`
    refuses them in control), and PPO-KL's two adaptive forms as the version 1 board had them."""
    entries, seen = [], set()
    for name in (*algorithms.REGISTRY, *algorithms.ABLATIONS):
        algorithm = algorithms.parse(name)
        key = (algorithm.estimator.name, algorithm.objective.name, algorithm.defaults)
        if key in seen or algorithm.objective.sequences:
            continue
        seen.add(key)
        entries.append(Method(name))
    return (*entries,
            Method("ppo_kl", (("kl_adaptive", True),), "ppo_kl_adaptive"),
            Method("ppo_kl", (("kl_adaptive", True), ("kl_reference", "learner"),
                              ("kl_coef_min", 0.02857), ("kl_coef_max", 35)),
                   "ppo_kl_adaptive_learner"))


LEADERBOARD_METHODS = leaderboard_methods()


def parse_overrides(items) -> tuple[tuple[str, Any], ...]:
    """`field=value` strings as typed Config overrides (JSON values: 1e-3, true, "learner"), each
    field checked to exist; `ConfigError` names the option otherwise. A field that holds a tuple
    takes a JSON list (`actor_hidden=[64,64]`) or items one at a time, each `--set` adding one
    (`objective_hparams=tau=0.1 objective_hparams=scale=2`)."""
    hints = typing.get_type_hints(Config)
    out: dict[str, Any] = {}
    for item in items:
        name, eq, text = str(item).partition("=")
        if not eq or name not in hints:
            raise ConfigError(f"option `set` item {item!r} is invalid: write field=value with a "
                              f"Config field (e.g. kl_adaptive=true)")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text   # a bare string, e.g. learner
        if typing.get_origin(hints[name]) is tuple:
            value = tuple(value) if isinstance(value, list) else out.get(name, ()) + (value,)
        elif isinstance(value, list):
            value = tuple(value)
        out[name] = value
    return tuple(out.items())


# --- planning ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Setting:
    """One lag setting of a program: a constant lag `lag` = k, or a stochastic one (`lag` None)
    drawn from `profile`; `name` is what every row of its runs says (e.g. `k=8`, `uniform≤8`)."""
    name: str
    lag: int | None
    profile: tuple[float, ...] = ()
    kind: str = ""
    """What its rows say it samples by where a stochastic lag is not the protocol's own (the
    user's lag profile: `user_profile`)."""

    @property
    def capacity(self) -> int:
        return len(self.profile) if self.profile else self.lag + 1

    def sampling(self, proto: Protocol) -> str:
        """What its rows say it samples by: `oldest` for a constant lag (a one-hot profile at age
        k is that computation), else its `kind` or the protocol's sampling."""
        return "oldest" if self.lag is not None else self.kind or proto.sampling


def settings(proto: Protocol, lags) -> list[Setting]:
    """The constant lags `lags` of `proto` as settings (a one-hot lag profile at age k where the
    protocol samples by profile: the same computation as `oldest` with capacity k + 1)."""
    if proto.sampling != "profile":
        return [Setting(f"k={k}", k) for k in lags]
    return [Setting(f"k={k}", k, (0.0,) * k + (1.0,)) for k in lags]


def bench_cells(method: Method, proto: Protocol, lag_profile=(), *,
                learning_rate: float | dict | None = None) -> list[Cell]:
    """The method's cells: per task, the lag axis (one program: every lag × seed) and the
    high-update-frequency setting (another program), each config validated before compiling.
    With a `lag_profile` (`config.read_lag_profile`), also the method acting with it at the
    protocol's shapes (setting `profile`, capacity the profile's length: a program per task).
    A protocol that tunes (`Protocol.tuned`) runs every cell at `learning_rate`, a column of its
    rows (the tasks' own when None, e.g. to plan); per task (`Protocol.per_task`) it is a dict
    env -> the task's chosen configuration (the held-out tasks run as a protocol whose tasks
    they are: `vaco-bench --held-out`)."""
    if not proto.tuned:
        return _v1_cells(method, proto, lag_profile)
    cells = []
    for task in proto.tasks:
        seeds = range(proto.seed, proto.seed + task.seeds)
        if isinstance(learning_rate, dict):   # per-task tuning: the task's chosen configuration
            learning_rate_of = (tuning.run_hparams(learning_rate[task.env],
                                                   method_grid(method, proto))
                                if task.env in learning_rate else None)
        else:
            learning_rate_of = learning_rate
        lag_axis = settings(proto, proto.lags) + [Setting(name, None, profile)
                                                  for name, profile in proto.stochastic]
        cells.append(_cell(method, proto, task, "lag", lag_axis, (), seeds, [learning_rate_of]))
        if proto.forward:
            cells.append(_cell(method, proto, task, "forward", settings(proto, proto.forward_lags),
                               proto.forward, seeds, [learning_rate_of]))
        if lag_profile:
            user = Setting("profile", None, tuple(lag_profile), "user_profile")
            cells.append(_cell(method, proto, task, PROFILE, [user], (), seeds,
                               [learning_rate_of]))
    return cells


def tuning_cells(method: Method, proto: Protocol, grids: dict | None = None) -> list[Cell]:
    """Per task, one program: every learning rate of the grid × design seed, at k = 0. On a
    per-task protocol, `grids` (env -> (variant, configurations)) names each task's
    configurations (default: the method's base grid, variant `tune`)."""
    if not proto.tuned:
        raise ConfigError(f"option `tune` is invalid for protocol {proto.name!r} "
                          f"v{proto.version}: it has no learning-rate grid")
    design = range(proto.design_seed, proto.design_seed + proto.design_seeds)
    tasks = proto.tasks
    if not proto.per_task:
        return [_cell(method, proto, task, "tune", settings(proto, (0,)), (), design,
                      proto.learning_rates) for task in tasks]
    grid = method_grid(method, proto)
    grids = grids if grids is not None else {t.env: ("tune", grid.configs()) for t in tasks}
    return [_cell(method, proto, task, grids[task.env][0], settings(proto, (0,)), (), design,
                  [tuning.run_hparams(c, grid) for c in grids[task.env][1]])
            for task in tasks if task.env in grids]


def method_constraint(method: Method, proto: Protocol) -> tuning.Constraint | None:
    """The key constraint of `method` on `proto`: by its name, else by its objective's."""
    table = dict(proto.constraints)
    objective = algorithms.parse(method.algo).objective.name
    return table.get(method.name, table.get(objective))


def method_grid(method: Method, proto: Protocol) -> tuning.Grid:
    """The grid `method`'s tuning starts from on every task of a per-task protocol."""
    return tuning.base_grid(method_constraint(method, proto), proto.learning_rates, proto.lr_only)


def _task_config(method: Method, proto: Protocol, task: Task, extra) -> Config:
    fields = {**dict(task.config), **dict(extra), **dict(method.overrides)}
    if proto.tuned and "learning_rate" in dict(method.overrides):
        raise ConfigError(f"method {method.name!r}: option `set` item learning_rate is invalid on "
                          f"protocol {proto.name!r} v{proto.version}: the learning rate is chosen "
                          f"by --tune (or given by --learning-rate, recorded as not tuned)")
    if "episode_length" not in fields and proto.version >= 2:
        fields["episode_length"] = Config.for_env(task.env).episode_length
    try:
        return Config(env=task.env, algo=method.algo, **fields)
    except TypeError as error:
        raise ConfigError(f"method {method.name!r}: {error}") from None


def _cell(method: Method, proto: Protocol, task: Task, variant: str, lag_settings, extra, seeds,
          learning_rates) -> Cell:
    """One program of a tuned protocol: every setting × learning rate × seed vmapped, each run
    with its lag profile and learning rate as leaves, and its setting, lag and K in its rows."""
    config = _task_config(method, proto, task, extra)
    widest = max(lag_settings, key=lambda s: s.capacity)
    config = dataclasses.replace(config, snapshot_sampling=proto.sampling, capacity=widest.capacity,
                                 max_capacity=widest.capacity, lag_profile=widest.profile)
    validate(config)
    runs = []
    for setting in lag_settings:
        for lr in learning_rates:
            # A configuration: a learning rate, or (per-task tuning) a dict of the run's fields.
            chosen = dict(lr) if isinstance(lr, dict) else {"learning_rate": lr}
            if chosen["learning_rate"] is None:
                chosen["learning_rate"] = config.learning_rate
            chosen["learning_rate"] = float(chosen["learning_rate"])
            delta = float(chosen.pop("delta", config.delta))
            for seed in seeds:
                hparams = (("lag_profile", setting.profile),) if setting.profile else ()
                runs.append(Run(setting.capacity, delta, seed,
                                hparams + tuple(chosen.items()),
                                tags=(("setting", _setting_name(setting, extra)),
                                      ("lag", setting.lag), ("num_epochs", config.num_epochs),
                                      ("snapshot_sampling", setting.sampling(proto)))))
    for run in runs:
        validate(run.config(config))
    return Cell(STUDY, task.env, method.name, variant, config, tuple(runs))


def _setting_name(setting: Setting, extra) -> str:
    """`k=8`, `uniform≤8`; in the high-update-frequency program with its overrides first
    (`num_epochs=16, k=8`)."""
    return ", ".join([f"{k}={v}" for k, v in extra] + [setting.name])


def _v1_cells(method: Method, proto: Protocol, lag_profile=()) -> list[Cell]:
    """Version 1's cells (unchanged: their fingerprints are those of the committed results)."""
    cells = []
    for task in proto.tasks:
        seeds = range(proto.seed, proto.seed + task.seeds)
        settings = [("lag", proto.lags, ())]
        if proto.forward:
            settings.append(("forward", proto.forward_lags, proto.forward))
        for variant, lags, extra in settings:
            capacities = tuple(k + 1 for k in lags)
            fields = {**dict(task.config), **dict(extra), **dict(method.overrides)}
            fields.update(algo=method.algo, snapshot_sampling="oldest",
                          capacity=max(capacities), max_capacity=max(capacities))
            try:
                config = Config(env=task.env, **fields)
            except TypeError as error:
                raise ConfigError(f"method {method.name!r}: {error}") from None
            validate(config)
            runs = tuple(Run(c, float(config.delta), s) for c in capacities for s in seeds)
            for run in runs:
                validate(dataclasses.replace(config, capacity=run.capacity))
            cells.append(Cell(STUDY, task.env, method.name, variant, config, runs))
        if lag_profile:
            lag = cells[-len(settings)].config   # the lag axis's config, at the profile
            config = with_lag_profile(dataclasses.replace(lag, max_capacity=0), lag_profile)
            validate(config)
            runs = tuple(Run(config.capacity, float(config.delta), s) for s in seeds)
            cells.append(Cell(STUDY, task.env, method.name, PROFILE, config, runs))
    return cells


# --- the code that makes a result ----------------------------------------------------------------
def result_sources() -> dict[str, str]:
    """A hash (12 hex digits) per source file of the package that can change a result
    (`keys.result_files`), by path relative to the package."""
    package = Path(io.__file__).resolve().parent
    return {path.relative_to(package).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()[:12]
            for path in keys.result_files()}


def result_code(sources: dict[str, str]) -> str:
    """One hash of `result_sources()`."""
    return hashlib.sha256(json.dumps(sources, sort_keys=True).encode()).hexdigest()[:16]


def code_difference(ours: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """The files whose code differs between two `result_sources()` (added, removed or edited)."""
    return sorted(name for name in set(ours) | set(theirs) if ours.get(name) != theirs.get(name))


# --- what a result computes: whether two results may be compared --------------------------------
# A cell's key (`keys`): its config and runs, the values its programs receive, what they compute.
def comparability_key(method: Method, proto: Protocol, lag_profile=(),
                      learning_rate: float | None = None, *, log=None) -> dict:
    """What decides whether a result of `method` on `proto` (and `lag_profile`, and on a protocol
    that tunes `learning_rate`) may be compared with another: the protocol and its version, the
    `KEY_LIBRARIES`' versions, and each cell's key (`keys.cell_records`) with its parts and the
    code digest that lets a checkout of the same code check them without lowering."""
    cells = bench_cells(method, proto, lag_profile, learning_rate=learning_rate)
    records = keys.cell_records(cells, log=log)
    return {"scheme": keys.SCHEME, "protocol": proto.name, "protocol_version": proto.version,
            "versions": key_versions(), "code": keys.code_digest(),
            "programs": {cell_id: r["key"] for cell_id, r in records.items()},
            "cells": {cell_id: {"program": r["program"], "inputs": r["inputs"]}
                      for cell_id, r in records.items()}}


def _method_of(info: dict) -> Method:
    overrides = tuple((name, tuple(value) if isinstance(value, list) else value)
                      for name, value in info["overrides"])   # JSON keeps tuples as lists
    return Method(info["algo"], overrides, info["method"] if info["method"] != info["algo"] else "")


def computed_here(info: dict, *, log=None) -> tuple[bool, str]:
    """Whether the result `info` (a `bench.json`) describes is what this checkout computes, and
    why: its protocol version, library versions and every cell's key (`keys`: lowered here
    unless its code digest is this checkout's or the per-user cache has it; `log` says so) are
    this checkout's. A result recorded before programs were keyed is this
    checkout's only if its result code is (`result_sources`)."""
    proto = VERSIONS.get((info["protocol"], info["protocol_version"]))
    if proto is None:
        here = sorted(v for n, v in VERSIONS if n == info["protocol"])
        return False, (f"made on protocol {info['protocol']} v{info['protocol_version']} "
                       f"(here: {', '.join(f'v{v}' for v in here) or 'no such protocol'})")
    key = info.get("comparability")
    versions = (key or {}).get("versions") or {name: value for name, value in
                                               info.get("versions", {}).items()
                                               if name in KEY_LIBRARIES}
    ours = key_versions()
    changed = [name for name in KEY_LIBRARIES   # a library it did not record counts for nothing
               if name in versions and versions[name] != ours[name]]
    if changed:
        return False, "made with " + ", ".join(
            f"{name} {versions[name]} (here {ours[name]})" for name in changed)
    if key is None:
        sources = result_sources()
        if info.get("result_code") == result_code(sources):
            return True, f"same result code, versions and protocol {proto.name} v{proto.version}"
        files = code_difference(sources, info.get("result_sources", {}))
        shown = ", ".join(files[:6]) + (f" and {len(files) - 6} more" if len(files) > 6 else "")
        return False, (f"made before results recorded their programs, by other code (result code "
                       f"{info.get('result_code')} at commit "
                       f"{str(info.get('git_commit') or 'unrecorded')[:7]}, its files differing "
                       f"from this checkout's in {shown})")
    if key.get("scheme") != keys.SCHEME:
        return False, (f"keyed by an older scheme (scheme {key.get('scheme', 1)}: without the values "
                       f"its programs receive), which cannot tell: recompute its keys at commit "
                       f"{str(info.get('git_commit') or 'unrecorded')[:7]} (experiments/rekey.py)")
    try:
        cells = bench_cells(_method_of(info), proto, tuple(info.get("lag_profile", ())),
                            learning_rate=info.get("learning_rate"))
    except ConfigError as error:
        return False, f"its method cannot be planned here ({error})"
    recorded = key.get("programs", {})
    if sorted(recorded) != sorted(cell.cell_id for cell in cells):
        return False, (f"its cells ({', '.join(sorted(recorded))}) are not the ones planned here "
                       f"({', '.join(cell.cell_id for cell in cells)})")
    ours = keys.cell_records(cells, key, log=log)
    for cell in cells:
        if ours[cell.cell_id]["key"] != recorded[cell.cell_id]:
            theirs = key.get("cells", {}).get(cell.cell_id, {})
            what = [part for part in ("program", "inputs")
                    if theirs.get(part) != ours[cell.cell_id][part]] or ["config or runs"]
            return False, f"cell {cell.cell_id} differs ({' and '.join(what)})"
    return True, f"same programs, inputs, versions and protocol {proto.name} v{proto.version}"


def leaderboard_comparability(directory: Path, proto: Protocol, *, log=None) -> str:
    """Said before a run: whether the methods of the leaderboard in `directory` on `proto` are
    what this checkout computes (`computed_here`), so that the scorecard compares with them, and
    why; for those that are not, the two ways to a comparison. `log` is told each method checked
    and each cell lowered (seconds each; none where the results' code digest is this checkout's)."""
    directory = Path(directory)
    entries = []
    paths = sorted(directory.glob(f"*/{BENCH_FILE}")) if directory.is_dir() else []
    for n, path in enumerate(paths, 1):
        info = json.loads(path.read_text())
        if info.get("protocol") != proto.name:
            continue
        if info.get("protocol_version") != proto.version:
            entries.append((info, False, f"made on protocol {proto.name} "
                                         f"v{info.get('protocol_version')} (this run: v{proto.version})"))
        else:
            if log is not None:
                log(f"checking leaderboard method {n}/{len(paths)}: {info['method']}")
            entries.append((info, *computed_here(info, log=log)))
    where = f"leaderboard {directory}"
    if not entries:
        return f"{where}: no method on protocol {proto.name} to compare with"
    reasons = sorted({why for _, _, why in entries})
    if len(reasons) == 1:
        verdict = "comparable" if entries[0][1] else "not comparable"
        line = f"{where} ({len(entries)} methods): {verdict}: {reasons[0]}"
    else:
        ok = [info["method"] for info, same, _ in entries if same]
        head = (f"comparable with {len(ok)} of {len(entries)} methods ({', '.join(ok)}); not with "
                if ok else f"not comparable with any of its {len(entries)} methods: ")
        line = f"{where}: {head}" + "; ".join(
            f"{info['method']}: {why}" for info, same, why in entries if not same)
    commits = sorted({str(info.get("git_commit") or "unrecorded")[:7]
                      for info, same, _ in entries if not same})
    if commits:
        line += (f". To compare, run this benchmark with their code (a git worktree at commit "
                 f"{commits[0]}: docs/benchmark.md, \"Which results are compared\"), or "
                 f"recompute the methods you want beside it with this code")
    return line


# --- running -------------------------------------------------------------------------------------
def record(out: Path, method: Method, proto: Protocol, lag_profile=(), key: dict | None = None,
           *, allow_code_change: bool = False, learning_rate: dict | None = None) -> dict:
    """`<out>/bench.json`: what `out` holds, the code that made it and what it computes (`key`:
    `comparability_key`, computed here if not given). A directory holds one method on one
    protocol, at most one lag profile and (where the protocol tunes) one learning rate
    (`learning_rate`: `{"learning_rate": lr, "tuned": bool}`): another is refused, and so is
    another version of the method's user objective (unless `allow_code_change`)."""
    sources = result_sources()
    data = {"method": method.name, "algo": method.algo,
            "overrides": [list(item) for item in method.overrides],
            "protocol": proto.name, "protocol_version": proto.version,
            "protocol_definition": proto.describe(), **(learning_rate or {}),
            "comparability": (comparability_key(method, proto, lag_profile,
                                                (learning_rate or {}).get("learning_rate"))
                              if key is None else key),
            "result_code": result_code(sources), "result_sources": sources,
            "objective": algorithms.objective_record(algorithms.parse(method.algo).objective,
                                                     dict(method.overrides).get("objective_hparams", ())),
            **io.provenance()}
    if lag_profile:
        data["lag_profile"] = list(lag_profile)
    path = out / BENCH_FILE
    if path.exists():
        old = json.loads(path.read_text())
        if (old["method"], old["protocol"], old["protocol_version"]) != \
                (data["method"], data["protocol"], data["protocol_version"]):
            raise ConfigError(
                f"{out} holds method {old['method']!r} on protocol {old['protocol']} "
                f"v{old['protocol_version']}, not {data['method']!r} on {proto.name} "
                f"v{proto.version}: use another --out directory")
        if old.get("learning_rate") != data.get("learning_rate"):
            raise ConfigError(
                f"{out} holds runs at learning rate {old.get('learning_rate')}, not "
                f"{data.get('learning_rate')}: use another --out directory")
        theirs = (old.get("objective") or {}).get("code")
        ours = data["objective"].get("code")
        if (theirs or ours) and not allow_code_change and (
                (ours or {}).get("fingerprint") is None
                or (theirs or {}).get("fingerprint") != ours["fingerprint"]):
            raise ConfigError(
                f"{out} holds method {old['method']!r} made by another version of its objective "
                f"{data['objective']['name']!r} (fingerprint "
                f"{(theirs or {}).get('fingerprint') or 'not recorded'}; this code's: "
                f"{(ours or {}).get('fingerprint') or 'unknown'}): results of two versions would "
                f"mix under one name. Use another --out directory, or --allow-code-change to add "
                f"to it anyway")
        if lag_profile and old.get("lag_profile", list(lag_profile)) != list(lag_profile):
            raise ConfigError(
                f"{out} holds the method under lag profile {old['lag_profile']}, not "
                f"{list(lag_profile)}: use another --out directory for another profile")
        if lag_profile and "lag_profile" not in old:   # the profile's cells join the others
            old["lag_profile"] = list(lag_profile)
            if "comparability" in old:   # and so do their programs
                old["comparability"]["programs"] = {**data["comparability"]["programs"],
                                                    **old["comparability"]["programs"]}
            io.write_json_atomic(path, old)
        return old   # runs of other code are refused by the sweep (unless allow_code_change)
    out.mkdir(parents=True, exist_ok=True)
    io.write_json_atomic(path, data)
    return data


def random_returns(out: Path, proto: Protocol) -> dict[str, float]:
    """The random policy's mean return per task (the scores' zero), measured once per directory."""
    from vaco_jax.study import references

    path = out / REFERENCES
    table = json.loads(path.read_text()) if path.exists() else {}
    missing = [t for t in proto.tasks if t.env not in table]
    for task in missing:
        episode_length = dict(task.config).get("episode_length")
        if episode_length is None:
            episode_length = (Config.for_env(task.env) if proto.version >= 2 else Config()).episode_length
        table[task.env], _ = references.random_policy_return(
            task.env, episode_length=episode_length, num_episodes=64, seed=0)
    if missing:
        io.write_json_atomic(path, table)
    return table


def learning_rate(out: Path, method: Method, proto: Protocol, given: float | None = None) -> dict:
    """The learning rate of the method's scored runs: `given` (recorded as not tuned), else the
    one `<out>/tuning.json` chose. `ConfigError` when there is neither, or the tuning is another's."""
    if given is not None:
        return {"learning_rate": float(given), "tuned": False}
    path = Path(out) / TUNING_FILE
    if not path.exists():
        raise ConfigError(
            f"option `learning_rate` is required: {path} does not exist. Choose it on the design "
            f"seeds first (vaco-bench --protocol {proto.name} --algo {method.algo} --tune --out "
            f"{out}), or give --learning-rate (recorded as not tuned)")
    tuning = json.loads(path.read_text())
    if (tuning["method"], tuning["protocol"], tuning["protocol_version"]) != \
            (method.name, proto.name, proto.version):
        raise ConfigError(f"{path} chose the learning rate of {tuning['method']!r} on protocol "
                          f"{tuning['protocol']} v{tuning['protocol_version']}, not of "
                          f"{method.name!r} on {proto.name} v{proto.version}")
    if proto.per_task:
        return {"learning_rate": {env: task["chosen"] for env, task in tuning["tasks"].items()},
                "tuned": True}
    return {"learning_rate": float(tuning["chosen"]), "tuned": True}


def run_bench(method: Method, proto: Protocol, out: str | Path, *, shard=None, log=print,
              progress: bool = False, allow_code_change: bool = False,
              max_cells: int | None = None, lag_profile=(),
              learning_rate_given: float | None = None) -> list[str]:
    """Run the method's unfinished cells into `<out>/runs/` (resumable, shardable); returns the
    ids of the cells run now. With a `lag_profile`, its cells too (`bench_cells`). A protocol
    that tunes runs at the learning rate `learning_rate` returns (the tuned one unless
    `learning_rate_given`)."""
    out = Path(out)
    proto.check_requires()
    lr = learning_rate(out, method, proto, learning_rate_given) if proto.tuned else None
    rate = lr and lr["learning_rate"]
    cells = bench_cells(method, proto, lag_profile, learning_rate=rate)
    key = comparability_key(method, proto, lag_profile, rate)
    record(out, method, proto, lag_profile, key, allow_code_change=allow_code_change,
           learning_rate=lr)
    random_returns(out, proto)
    ran = sweep.run_sweep(cells, out / RUNS, log=log, progress=progress, shard=shard,
                          allow_code_change=allow_code_change, max_cells=max_cells,
                          programs=key["programs"])
    compact_when_finished(cells, out / RUNS)
    return ran


def compact_when_finished(cells, runs: Path) -> bool:
    """Once every cell of `cells` has finished in the sweep directory `runs`, store its rows
    compactly (`sweep.compact`: results.parquet, lossless Parquet, read as before), so a
    method's every run × evaluation can be committed; returns whether it did."""
    if not runtime.is_primary() or unfinished([cell.cell_id for cell in cells], runs):
        return False
    sweep.compact(runs)
    return True


def unfinished(cell_ids, runs: Path) -> list[str]:
    """The ids among `cell_ids` with no finished record in the sweep directory `runs`."""
    finished = (set(sweep.load_cells(runs)["cell"]) if io.has_rows(runs / sweep.CELLS)
                else set())
    return [cell for cell in cell_ids if cell not in finished]


# --- the learning rate, chosen on the design seeds -----------------------------------------------
TUNING_FILE = "tuning.json"
TUNING_RUNS = "tuning"
TUNING_RULE = ("per task, each learning rate's mean AUC over the design seeds normalised as "
               "(AUC - random) / (best AUC of the grid - random); the learning rate with the "
               "highest mean over tasks, ties to the protocol's default")


def run_tuning(method: Method, proto: Protocol, out: str | Path, *, shard=None, log=print,
               progress: bool = False, allow_code_change: bool = False,
               max_cells: int | None = None) -> dict | None:
    """Run the learning-rate grid × design seeds at k = 0 (one program per task) into
    `<out>/tuning/`, and once every task is done write `<out>/tuning.json` (returned; None
    before)."""
    out = Path(out)
    proto.check_requires()
    if proto.per_task:
        return run_per_task_tuning(method, proto, out, shard=shard, log=log, progress=progress,
                                   allow_code_change=allow_code_change, max_cells=max_cells)
    cells = tuning_cells(method, proto)
    random = random_returns(out, proto)
    runs = out / TUNING_RUNS
    sweep.run_sweep(cells, runs, log=log, progress=progress, shard=shard,
                    allow_code_change=allow_code_change, max_cells=max_cells)
    compact_when_finished(cells, runs)
    finished = sweep.load_cells(runs)
    if len(finished) == 0 or set(c.cell_id for c in cells) - set(finished["cell"]):
        return None
    tuning = choose_learning_rate(sweep.load_results(runs), random, proto)
    tuning = {"method": method.name, "algo": method.algo, "protocol": proto.name,
              "protocol_version": proto.version, **tuning,
              "design_seeds": list(range(proto.design_seed, proto.design_seed + proto.design_seeds)),
              "cost": {"cells": len(finished),
                       **{k: float(finished[k].sum()) for k in
                          ("wall_seconds", "compile_seconds", "train_seconds")},
                       "env_steps": int(sum(c.config.env_steps * len(c.runs) for c in cells))},
              "result_code": result_code(result_sources()), **io.provenance()}
    io.write_json_atomic(out / TUNING_FILE, tuning)
    return tuning


PER_TASK_RULE = ("per task, the configuration (learning rate × the method's key constraint) with "
                 "the highest mean AUC over the design seeds at k = 0, ties to the smaller "
                 "learning rate, then the smaller constraint; a choice on its grid's edge adds "
                 "the ladder's next value on that side and is made again")


def run_per_task_tuning(method: Method, proto: Protocol, out: Path,
                        **sweep_options) -> dict | None:
    """Per-task tuning (`study.tuning`): each task's base grid × design seeds (variant `tune`),
    then, while a task's choice sits on its grid's edge, the added row or column (`tune-ext1`, ...
    Resumable: each step is decided from finished runs alone. Writes `<out>/tuning.json` once
    every task's choice is inside its grid or at a ladder's end (returned; None before)."""
    grid0 = method_grid(method, proto)
    constraint = method_constraint(method, proto)
    ladder = tuning.FINE_LR_LADDER if grid0.field is None else tuning.LR_LADDER
    tasks = proto.tasks
    random = random_returns(out, proto)
    runs = out / TUNING_RUNS
    state = {t.env: {"grid": grid0, "steps": [], "pending": ("tune", grid0.configs())}
             for t in tasks}
    for step in range(1, 64):
        pending = {env: s["pending"] for env, s in state.items() if s["pending"]}
        if not pending:
            break
        cells = tuning_cells(method, proto, pending)
        sweep.run_sweep(cells, runs, **sweep_options)
        if unfinished([c.cell_id for c in cells], runs):
            return None
        per_run = _tuning_runs(sweep.load_results(runs), random, proto, grid0, constraint)
        for env in pending:
            s = state[env]
            s["chosen"], s["table"] = tuning.choose(per_run[env], s["grid"])
            wider, notes = tuning.extend(s["grid"], s["chosen"], ladder, constraint)
            s["steps"].append({"chosen": s["chosen"], "notes": notes})
            s["pending"] = ((f"tune-ext{step}", tuning.added(s["grid"], wider)) if wider else None)
            s["grid"] = wider or s["grid"]
    compact_when_finished([], runs)
    finished = sweep.load_cells(runs)
    result = {"method": method.name, "algo": method.algo, "protocol": proto.name,
              "protocol_version": proto.version, "rule": PER_TASK_RULE, "per_task": True,
              "base_grid": grid0.describe(),
              "tasks": {env: {"random": float(random[env]), "grid": s["grid"].describe(),
                              "chosen": s["chosen"], "steps": s["steps"],
                              "edge": bool(s["steps"][-1]["notes"]), "configurations": s["table"]}
                        for env, s in state.items()},
              "design_seeds": list(range(proto.design_seed, proto.design_seed + proto.design_seeds)),
              "cost": {"cells": len(finished),
                       **{k: float(finished[k].sum()) for k in
                          ("wall_seconds", "compile_seconds", "train_seconds")}},
              **io.provenance()}
    io.write_json_atomic(out / TUNING_FILE, result)
    return result


def _tuning_runs(results, random: dict[str, float], proto: Protocol, grid: tuning.Grid,
                 constraint: tuning.Constraint | None = None) -> dict:
    """Per task, one dict per tuning run: its configuration's fields, its AUC (the mean of its
    evaluation returns) and final score (the last `last_evals`); a diverged run scores random
    from its divergence on. A field's values are those of `grid` or of the ladders it grows on
    (`constraint`'s)."""
    import numpy as np

    frame = results.assign(value=results["eval_return"].astype(float))
    frame["value"] = frame["value"].fillna(frame["env"].map(random))
    if grid.own:   # the objective's own constraint is the run's "name=value" item
        frame[grid.field] = [float(str(list(v)[0]).split("=", 1)[1])
                             for v in frame["objective_hparams"]]
    fields = ["learning_rate"] + ([grid.field] if grid.field else [])
    # A metric of the same name as a field (PPO-KL logs its coefficient, in float32) overwrites
    # the run's value in its rows: each value is read as the nearest one the grid can hold.
    ladders = {"learning_rate": (*tuning.LR_LADDER, *tuning.FINE_LR_LADDER, *grid.learning_rates)}
    if grid.field:
        ladders[grid.field] = grid.values + (constraint.ladder if constraint else ())
    for name in fields:
        known = np.asarray(sorted(set(ladders[name])), np.float64)
        values = frame[name].astype(float).to_numpy()
        nearest = known[np.abs(np.log(values[:, None] / known[None, :])).argmin(1)]
        frame[name] = np.where(np.abs(nearest / values - 1) < 1e-5, nearest, values)
    out: dict[str, list] = {}
    for (env, *values, _seed), run in frame.sort_values("eval_index").groupby(
            ["env", *fields, "seed"], sort=False):
        curve = run["value"].to_numpy()
        out.setdefault(env, []).append({**dict(zip(fields, map(float, values))),
                                        "auc": float(curve.mean()),
                                        "final": float(curve[-proto.last_evals:].mean())})
    return out


def choose_learning_rate(results, random: dict[str, float], proto: Protocol) -> dict:
    """The tuning's table and choice (`TUNING_RULE`) from its rows: per task and learning rate the
    mean over design seeds of the final score (the last `last_evals` evaluations) and of the AUC
    (the mean over every evaluation); a diverged run scores random from its divergence on."""
    import numpy as np

    frame = results.assign(value=results["eval_return"].astype(float))
    frame["value"] = frame["value"].fillna(frame["env"].map(random))
    tasks, scores = {}, {float(lr): [] for lr in proto.learning_rates}
    for env, rows in frame.groupby("env", sort=False):
        per_run = []
        for (lr, _seed), run in rows.sort_values("eval_index").groupby(["learning_rate", "seed"]):
            values = run["value"].to_numpy()
            per_run.append((float(lr), values[-proto.last_evals:].mean(), values.mean()))
        table = {}
        for lr in scores:
            mine = [(f, a) for r, f, a in per_run if r == lr]
            table[lr] = {"final": float(np.mean([f for f, _ in mine])),
                         "auc": float(np.mean([a for _, a in mine]))}
        best = max(v["auc"] for v in table.values())
        span = best - random[env]
        for lr, value in table.items():
            # A task where no learning rate beats random tells nothing: 0 for every one.
            value["normalised_auc"] = float((value["auc"] - random[env]) / span) if span > 0 else 0.0
            scores[lr].append(value["normalised_auc"])
        tasks[env] = {"random": float(random[env]),
                      "learning_rates": {repr(lr): value for lr, value in table.items()}}
    mean = {lr: float(np.mean(values)) for lr, values in scores.items()}
    top = max(mean.values())
    tied = [lr for lr, value in mean.items() if value >= top - 1e-12]
    chosen = proto.default_learning_rate if proto.default_learning_rate in tied else min(tied)
    return {"grid": list(scores), "rule": TUNING_RULE, "tasks": tasks,
            "score": {repr(lr): value for lr, value in mean.items()}, "chosen": chosen}


# --- the size of a run, before it runs -----------------------------------------------------------
def plan_size(cells: list[Cell], measured: list[dict] = ()) -> dict:
    """The size of `cells`: programs, runs, env steps, evaluation episodes, and the time they
    take where a finished cell of the same task and setting measured its throughput (`measured`:
    records of `cells.jsonl`; steps/s and compile seconds, the latest of each)."""
    by_setting = {}
    for rec in measured:
        _, env, _, variant = rec["cell"].split("#")[0].split("/", 3)
        by_setting[env, variant] = rec
    seconds, unknown = 0.0, []
    for cell in cells:
        rec = by_setting.get((cell.env, cell.variant))
        if rec is None or not rec.get("sps"):
            unknown.append(cell.cell_id)
            continue
        seconds += cell.config.env_steps * len(cell.runs) / rec["sps"] + rec.get("compile_seconds", 0)
    return {"cells": len(cells), "programs": len(cells),
            "runs": sum(len(c.runs) for c in cells),
            "env_steps": sum(c.config.env_steps * len(c.runs) for c in cells),
            "evaluation_episodes": sum(c.config.num_evals * c.config.eval_envs * len(c.runs)
                                       for c in cells),
            "estimated_seconds": None if unknown else seconds, "unmeasured": unknown}


def measured_cells(*directories) -> list[dict]:
    """Every finished cell's record (`cells.jsonl`) in the sweep directories under `directories`."""
    records = []
    for directory in directories:
        for path in sorted(Path(directory).glob(f"**/{sweep.CELLS}")) if Path(directory).is_dir() else ():
            records += io.read_jsonl(path)
    return records
