"""Configuration of the LLM variant (SPEC §6): model, task, warm start, GRPO; presets; validation.

Static fields set shapes or the program (model size, lengths, batch, N, the objective). The GRPO
hyper-parameters that do not (the objective, learning rate, ε, δ, temperature, ring-buffer capacity)
are copied into `GRPOHParams` (`vaco_jax.llm.hparams`), a pytree of scalars, so seeds, objectives
and e.g. a δ sweep can be vmapped in one compiled program. `Experiment` is the lag sweep's
(`vaco-llm`: backward lag k × forward lag N × objective × seed). This module imports no JAX: the
command builds its parser from it.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import TYPE_CHECKING, Annotated, Literal

import tyro

from vaco_jax.errors import ConfigError, invalid, invalid_option
from vaco_jax.llm import tokenizer
from vaco_jax.llm.problems import Difficulty
from vaco_jax.options import LoggerOptions

if TYPE_CHECKING:
    from vaco_jax import algorithms
    from vaco_jax.llm.hparams import GRPOHParams

# The model's compute dtypes (`vaco_jax.llm.model.DTYPES` maps each to JAX's).
DType = Literal["float32", "bfloat16"]
DTYPE_NAMES = typing.get_args(DType)

# The algorithms (`vaco_jax.algorithms` names) the LLM testbed runs: every one whose objective needs
# only token ratios and advantages (no critic, no analytic KL). The first four keep their indices.
ObjectiveName = Literal["ppo_clip", "vaco", "pg", "decoupled_ppo", "spo", "impala", "icepop",
                        "cispo", "dppo_tv", "m2po", "topr", "geppo", "tis", "gspo"]
OBJECTIVES = typing.get_args(ObjectiveName)


# How the sweep's backward lag k picks each batch's behaviour snapshot from a ring buffer of the
# last k + 1 (`vaco_jax.ring_buffer`'s sampling mode): the oldest (a constant lag k), or one drawn
# uniformly (a lag uniform over 0..k). Before k + 1 snapshots exist, from those there are. A lag
# profile (`Experiment.lag_profile`) is a third mode, "profile", with k its oldest age.
LagSampling = Literal["constant", "uniform"]
LAG_SAMPLINGS = typing.get_args(LagSampling)
SNAPSHOT_SAMPLING = {"constant": "oldest", "uniform": "uniform", "profile": "profile"}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Transformer shape (all static)."""

    vocab_size: int = tokenizer.VOCAB_SIZE
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    d_ff: int = 192
    """Hidden width of the SwiGLU feed-forward block."""
    max_len: int = 128
    """Longest sequence (prompt + answer) the model is built for."""
    rope_base: float = 10_000.0
    tie_embeddings: bool = True
    """Share the token embedding with the output projection."""
    dtype: DType = "float32"
    """Compute dtype; parameters stay float32."""

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def validate(self, prefix: str = "model") -> None:
        def bad(field, value, why):
            raise ValueError(f"config field '{prefix}.{field}' = {value!r} is invalid: {why}")
        for field in ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "max_len"):
            if getattr(self, field) < 1:
                bad(field, getattr(self, field), "must be >= 1")
        if self.d_model % self.num_heads:
            bad("num_heads", self.num_heads, f"must divide d_model ({self.d_model})")
        if self.head_dim % 2:
            bad("num_heads", self.num_heads, f"d_model / num_heads = {self.head_dim} must be even "
                "(RoPE rotates pairs of dimensions)")
        if self.dtype not in DTYPE_NAMES:
            bad("dtype", self.dtype, f"one of {DTYPE_NAMES}")


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    source: Literal["procedural", "gsm8k"] = "procedural"
    """`procedural` (the seeded generator) or `gsm8k` (train/test JSONL files in GSM8K format)."""
    difficulty: Difficulty = Difficulty()
    num_train: int = 4096
    """Train problems drawn once (the RL prompts and the warm-start data)."""
    num_test: int = 256
    """Held-out problems for greedy accuracy."""
    prompt_len: int = 76
    answer_len: int = 30
    seed: int = 0
    """Seed of the problem draws (train and test streams are separate and split by arithmetic)."""
    direct_fraction: float = 0.0
    """Fraction of the warm-start demonstrations written as the final answer alone (`#### 9`), the
    rest with their worked steps: the warm start then answers some problems directly and some by
    working, and RL can learn which pays (a seeded, fixed subset of the train problems)."""
    gsm8k_train: str = ""
    gsm8k_test: str = ""


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """The warm start: supervised fine-tuning on worked solutions (saved and reused)."""

    steps: int = 1500
    batch_size: int = 32
    learning_rate: float = 3e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    objective: str = "vaco"
    """The algorithm whose policy objective is used (names as in `vaco_jax.algorithms`): `ppo_clip`
    (token-ratio clipping), `vaco` (the TV filter on token ratios), `pg` (`−E[wÂ]`, no constraint),
    `decoupled_ppo` (clipping around π_T, tokens weighted by min(π_T/β, C); PPO-clip on-policy),
    `spo`, `impala` (its objective), or the stale-data objectives of other systems `icepop`,
    `cispo`, `dppo_tv`, `m2po`, `topr`, `geppo`, `tis` (verl's and slime's truncated importance
    sampling: `decoupled_ppo` under their name) and `gspo` (PPO's clip on each answer's
    sequence-level ratio) (docs/SPEC.md). Advantages are always GRPO's
    group-normalised rewards (there is no critic to realign). Or your own objective, as for the
    MuJoCo trainer (docs/objectives.md): a `register_objective` name or `module:function`; it
    receives token-level `PolicyInputs` with a `mask` and no `kl`."""
    num_prompts: int = 8
    """Prompts per generated batch."""
    group_size: int = 8
    """Answers sampled per prompt (G)."""
    num_minibatches: int = 1
    """N: minibatch updates per generated batch (the forward-lag knob). Must divide the batch."""
    num_epochs: int = 1
    """Passes over each batch (each pass is N minibatch updates)."""
    iterations: int = 32
    """Generated batches per seed."""
    eval_every: int = 8
    """Iterations between held-out greedy evaluations (must divide iterations)."""
    learning_rate: float = 1e-4
    optimizer: Literal["adam", "sgd"] = "adam"
    """`adam` (the step moves every weight by about the learning rate, whatever the gradient's
    size) or `sgd` (the step is the learning rate times the clipped gradient). Static."""
    max_grad_norm: float = 1.0
    adam_eps: float = 1e-8
    clip_eps: float = 0.2
    """PPO ε (and the clip-fraction diagnostic for every objective)."""
    delta: float = 0.005
    """VACO's TV threshold δ (token ratios stay near 1, so much smaller than MuJoCo's 0.2)."""
    decoupled_is_max: float = 2.0
    """Decoupled PPO's cap C on the behavioural weight π_T/β (≥ 1; only backward lag
    makes it differ from 1); as `vaco_jax.config.Config.decoupled_is_max`."""
    objective_hparams: tuple[str, ...] = ()
    """The objectives' own hyper-parameters, as name=value (e.g. `mis_high=5 tv_delta=0.1`): any
    that an objective of `OBJECTIVES` or a user objective of the run declares
    (`vaco_jax.algorithms.Objective.hparams`; the names are distinct across objectives, so one
    setting serves every objective of a sweep). Unset ones keep their defaults."""
    tv_reference: Literal["behavior", "learner"] = "behavior"
    temperature: float = 1.0
    top_p: float = 1.0
    """Nucleus sampling for generation only: the ratios compare the model's full tempered
    distributions (log π_θ, log π_T and log β alike), so w = 1 on-policy at any top_p
    (why: `vaco_jax.llm.grpo`)."""
    scale_advantages: bool = True
    """Divide group-centred rewards by the group's standard deviation (GRPO); off = Dr. GRPO."""
    train_eval_size: int = 256
    """Training problems (the first of the train set, a fixed sample) whose greedy accuracy every
    evaluation measures beside the held-out one (0 = none): both low is an optimisation failure,
    training high and held-out low a generalisation gap. Static."""
    capacity: int = 1
    """Backward lag: generate with a snapshot drawn from the last `capacity` (1 = on-policy)."""
    max_capacity: int = 0
    """Ring-buffer slots allocated (0 = capacity). Static."""
    snapshot_sampling: Literal["uniform", "oldest", "newest", "profile"] = "uniform"
    """How the behaviour snapshot is drawn from the last `capacity` (`vaco_jax.ring_buffer`):
    uniformly, the oldest, the newest, or its age from `lag_profile`."""
    lag_profile: tuple[float, ...] = ()
    """Snapshot-age probabilities p_0 … p_{C−1} (`snapshot_sampling="profile"`; C ≤ capacity),
    as `vaco_jax.config.Config.lag_profile`. Vmappable."""
    num_seeds: int = 3
    seed: int = 0

    @property
    def batch_size(self) -> int:
        return self.num_prompts * self.group_size

    @property
    def slots(self) -> int:
        return self.max_capacity or self.capacity


@dataclasses.dataclass(frozen=True)
class LLMConfig:
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    sft: SFTConfig = SFTConfig()
    grpo: GRPOConfig = GRPOConfig()


def program_objectives(names=()) -> tuple[str, ...]:
    """The objectives one compiled GRPO program can run, in `GRPOHParams.objective`'s order: the
    built-in `OBJECTIVES`, then each user objective of `names` (`register_objective` names or
    `module:function`) in first-seen order."""
    return OBJECTIVES + tuple(dict.fromkeys(n for n in names if n not in OBJECTIVES))


def resolve(name: str, *, field: str = "grpo.objective",
            tv_reference: str = "behavior") -> algorithms.Objective:
    """The objective of `name`: a built-in algorithm's (`OBJECTIVES`), else a user objective
    (`vaco_jax.algorithms.resolve_objective`), traced once on token-shaped inputs with a mask and
    refused before anything compiles if it cannot run here. Raises `ConfigError` naming `field`."""
    from vaco_jax import algorithms

    if name in OBJECTIVES:
        return algorithms.REGISTRY[name].objective
    if ":" not in name and name not in algorithms.registered_objectives():
        _bad(field, name, f"one of {OBJECTIVES}, an objective registered with "
                          f"vaco_jax.register_objective (now: "
                          f"{sorted(algorithms.registered_objectives())}), or module:function")
    objective = algorithms.resolve_objective(name, field=field, value=name)
    if objective.needs_kl:
        _bad(field, name, f"objective {objective.name!r} reads the analytic KL (needs_kl=True), "
                          "which the LLM does not compute (token ratios only); built-in: "
                          f"{OBJECTIVES}")
    algorithms.check_objective(objective, tv_reference=tv_reference, kl=False, field=field,
                               value=name)
    return objective


def objective_hparams(config: GRPOConfig, objectives=None) -> dict[str, float]:
    """The own hyper-parameters of every objective of the program (`program_objectives`; their
    names must be distinct): the defaults, overridden by `config.objective_hparams`
    ("name=value"). Raises `ConfigError` naming `grpo.objective_hparams` for an undeclared name or
    a value that is not a finite number, and naming `grpo.objective` for a user objective that
    declares a name another objective of the program already declares."""
    objectives = program_objectives((config.objective,)) if objectives is None else objectives
    values, owner = {}, {}
    for name in objectives:
        for key, default in resolve(name, tv_reference=config.tv_reference).defaults.items():
            if key in owner:
                _bad("grpo.objective", name,
                     f"its hyper-parameter {key!r} is also declared by {owner[key]!r}, and one "
                     "GRPO program holds every objective's hyper-parameters by name: rename it")
            values[key], owner[key] = default, name
    for item in config.objective_hparams:
        name, eq, value = str(item).partition("=")
        name = name.strip()
        if not eq or name not in values:
            _bad("grpo.objective_hparams", item,
                 f"write each as name=value with a name in {sorted(values)}")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            _bad("grpo.objective_hparams", item, f"{value.strip()!r} is not a finite number")
        values[name] = number
    return values


def hparams(config: GRPOConfig, objectives=None) -> GRPOHParams:
    """The leaves of `config` for a program that runs `objectives` (default:
    `program_objectives((config.objective,))`); `config.objective` must be one of them."""
    import jax.numpy as jnp

    from vaco_jax import ring_buffer
    from vaco_jax.llm.hparams import GRPOHParams

    objectives = program_objectives((config.objective,)) if objectives is None else objectives
    f = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    # The profile is a leaf only when snapshots are drawn from it: other programs are unchanged.
    profile = (ring_buffer.profile_probabilities(config.lag_profile, config.slots)
               if config.snapshot_sampling == "profile" else None)
    return GRPOHParams(jnp.asarray(objectives.index(config.objective), jnp.int32),
                       f(config.learning_rate), f(config.clip_eps), f(config.delta),
                       f(config.temperature), jnp.asarray(config.capacity, jnp.int32),
                       f(config.decoupled_is_max),
                       {k: f(v) for k, v in objective_hparams(config, objectives).items()},
                       profile)


def stack_hparams(items: list[GRPOHParams]) -> GRPOHParams:
    """Stack hyper-parameter sets along a new leading axis (for `jax.vmap`)."""
    import jax
    import jax.numpy as jnp

    return jax.tree.map(lambda *xs: jnp.stack(xs), *items)


def _bad(field, value, why):
    raise invalid(field, value, why)


def validate(config: LLMConfig, objectives=()) -> LLMConfig:
    """Raise `ConfigError` naming the first bad field (before anything compiles). `objectives`:
    the others the config's program also runs (a sweep's), whose hyper-parameters
    `grpo.objective_hparams` may set."""
    try:
        config.model.validate("model")
        config.task.difficulty.validate("task.difficulty")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    t, g = config.task, config.grpo
    if t.source not in ("procedural", "gsm8k"):
        _bad("task.source", t.source, "one of ('procedural', 'gsm8k')")
    if t.source == "gsm8k" and not (t.gsm8k_train and t.gsm8k_test):
        _bad("task.gsm8k_train", t.gsm8k_train, "task.source=gsm8k needs both JSONL paths")
    if not 0.0 <= t.direct_fraction <= 1.0:
        _bad("task.direct_fraction", t.direct_fraction, "must be in [0, 1]")
    for field in ("num_train", "num_test", "prompt_len", "answer_len"):
        if getattr(t, field) < 1:
            _bad(f"task.{field}", getattr(t, field), "must be >= 1")
    if t.prompt_len + t.answer_len > config.model.max_len:
        _bad("model.max_len", config.model.max_len,
             f"must be >= task.prompt_len + task.answer_len = {t.prompt_len + t.answer_len}")
    s = config.sft
    for field in ("steps", "batch_size"):
        if getattr(s, field) < 0 or (field == "batch_size" and s.batch_size < 1):
            _bad(f"sft.{field}", getattr(s, field), "must be positive")
    if g.tv_reference not in ("behavior", "learner"):
        _bad("grpo.tv_reference", g.tv_reference, "one of ('behavior', 'learner')")
    resolve(g.objective, tv_reference=g.tv_reference)
    if g.group_size < 2:
        _bad("grpo.group_size", g.group_size, "must be >= 2 (advantages are relative to the group)")
    if g.train_eval_size < 0:
        _bad("grpo.train_eval_size", g.train_eval_size, "must be >= 0")
    for field in ("num_prompts", "num_minibatches", "num_epochs", "iterations", "eval_every",
                  "num_seeds"):
        if getattr(g, field) < 1:
            _bad(f"grpo.{field}", getattr(g, field), "must be >= 1")
    if g.batch_size % g.num_minibatches:
        _bad("grpo.num_minibatches", g.num_minibatches,
             f"must divide the batch num_prompts * group_size = {g.batch_size}")
    if g.iterations % g.eval_every:
        _bad("grpo.eval_every", g.eval_every, f"must divide grpo.iterations ({g.iterations})")
    if not (g.temperature > 0):
        _bad("grpo.temperature", g.temperature, "must be > 0")
    if not (0 < g.top_p <= 1):
        _bad("grpo.top_p", g.top_p, "must be in (0, 1]")
    if not (g.delta >= 0):
        _bad("grpo.delta", g.delta, "must be >= 0")
    if not (g.decoupled_is_max >= 1):
        _bad("grpo.decoupled_is_max", g.decoupled_is_max, "must be >= 1 (inf = no cap)")
    if not (g.clip_eps > 0):
        _bad("grpo.clip_eps", g.clip_eps, "must be > 0")
    if g.capacity < 1 or g.capacity > g.slots:
        _bad("grpo.capacity", g.capacity, f"must be in 1..max_capacity ({g.slots})")
    if g.snapshot_sampling not in ("uniform", "oldest", "newest", "profile"):
        _bad("grpo.snapshot_sampling", g.snapshot_sampling,
             "one of ('uniform', 'oldest', 'newest', 'profile')")
    if (g.snapshot_sampling == "profile") != bool(g.lag_profile):
        _bad("grpo.lag_profile", g.lag_profile, "must be given exactly when "
             "grpo.snapshot_sampling='profile' (the probabilities of each snapshot age)")
    if g.lag_profile:
        from vaco_jax.config import check_lag_profile

        check_lag_profile(g.lag_profile, field="grpo.lag_profile")
        if len(g.lag_profile) > g.slots:
            _bad("grpo.lag_profile", g.lag_profile,
                 f"holds {len(g.lag_profile)} ages, more than the buffer's {g.slots} slots")
    if g.optimizer not in ("adam", "sgd"):
        _bad("grpo.optimizer", g.optimizer, "one of ('adam', 'sgd')")
    objective_hparams(g, program_objectives((g.objective, *objectives)))   # names and values
    return config


def replace(config: LLMConfig, **sections) -> LLMConfig:
    """`replace(config, grpo=dict(num_minibatches=4))`: a copy with some fields of some sections."""
    updates = {name: dataclasses.replace(getattr(config, name), **fields)
               for name, fields in sections.items()}
    return dataclasses.replace(config, **updates)


PRESETS = {
    # Seconds on a laptop CPU: tests and the notebook's CI run.
    "tiny": LLMConfig(
        model=ModelConfig(d_model=32, num_layers=1, num_heads=2, d_ff=64, max_len=68),
        task=TaskConfig(difficulty=Difficulty(1, 1, 9, ("add", "sub")), num_train=512,
                        num_test=32, prompt_len=52, answer_len=16),
        sft=SFTConfig(steps=60, batch_size=16, learning_rate=3e-3, warmup_steps=10),
        grpo=GRPOConfig(num_prompts=4, group_size=4, iterations=4, eval_every=2, num_seeds=2,
                        learning_rate=1e-4, delta=0.005, train_eval_size=32)),
    # vaco-llm cpu on a 2-core CPU: a 113k-parameter model, 1–2 step problems;
    # half the warm-start demonstrations answer directly, which the model does unreliably, so
    # on-policy RL has something to learn (to work the problem). δ from an N = 8 pilot (seeds
    # 100–102; 0.001 / 0.005 / 0.02 reached 0.785 / 0.773 / 0.777), chosen before the N sweep.
    "cpu": LLMConfig(
        task=TaskConfig(num_train=32_768, num_test=1024, direct_fraction=0.5),
        sft=SFTConfig(steps=3000),
        grpo=GRPOConfig(num_prompts=16, group_size=8, iterations=32, eval_every=8, num_seeds=5,
                        delta=0.001)),
    # A ~0.3B-parameter model for one accelerator (constructed and shape-checked here, not trained).
    "gpu": LLMConfig(
        model=ModelConfig(d_model=1024, num_layers=24, num_heads=16, d_ff=2816, max_len=512,
                          dtype="bfloat16"),
        task=TaskConfig(difficulty=Difficulty(2, 5, 50, ("add", "sub", "mul", "pack")),
                        num_train=100_000, num_test=1024, prompt_len=256, answer_len=128),
        sft=SFTConfig(steps=20_000, batch_size=256, learning_rate=3e-4, warmup_steps=1000),
        grpo=GRPOConfig(num_prompts=64, group_size=16, iterations=500, eval_every=25,
                        learning_rate=1e-6, num_seeds=3)),
}


def with_lags(config: LLMConfig, ks, lag_sampling: str = "constant",
              lag_profile=()) -> LLMConfig:
    """`config` for one program whose runs have the backward lags `ks`: a ring buffer of
    `max(ks) + 1` slots sampled as `lag_sampling` says (`SNAPSHOT_SAMPLING`; "profile": ages drawn
    from `lag_profile`, its oldest age the largest k); each run's own k is its `capacity` leaf,
    k + 1 (`vaco_jax.llm.experiment.sweep_keys`). Every k 0: `config` itself (no buffer: the
    on-policy program)."""
    top = max(ks)
    if not top:
        return config
    profile = {"lag_profile": tuple(lag_profile)} if lag_sampling == "profile" else {}
    return replace(config, grpo=dict(max_capacity=top + 1,
                                     snapshot_sampling=SNAPSHOT_SAMPLING[lag_sampling], **profile))


def validate_lags(config: LLMConfig, ks, lag_sampling: str, lag_profile=()) -> None:
    """Refuse, before anything compiles, backward lags the sweep cannot run: `ks` not integers
    ≥ 0, an unknown `lag_sampling`, with a `lag_profile` (p_0 … p_{C−1}) a `lag_sampling` other
    than the default or a k other than 0 and C − 1, or a config that sets the lag itself
    (`grpo.capacity`, `grpo.max_capacity`, `grpo.snapshot_sampling`, `grpo.lag_profile`: the sweep
    sets them from `--ks`, `--lag-sampling` and `--lag-profile`, and its results record k)."""
    if not ks or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in ks):
        raise invalid_option("--ks", ks, "one or more integers >= 0 (0 = on-policy)")
    if lag_sampling not in LAG_SAMPLINGS:
        raise invalid_option("--lag-sampling", lag_sampling, f"one of {LAG_SAMPLINGS}")
    if lag_profile:
        oldest = len(lag_profile) - 1
        if lag_sampling != "constant":
            raise invalid_option("--lag-sampling", lag_sampling,
                                 "not given with --lag-profile, whose probabilities draw the lag")
        if set(ks) - {0, oldest}:
            raise invalid_option("--ks", ks, f"with --lag-profile, 0 (on-policy, beside the "
                                             f"profile) or its oldest age {oldest}: the profile's "
                                             "runs are recorded at k = its oldest age")
    g, default = config.grpo, GRPOConfig()
    for field in ("capacity", "max_capacity", "snapshot_sampling", "lag_profile"):
        if getattr(g, field) != getattr(default, field):
            _bad(f"grpo.{field}", getattr(g, field),
                 f"must stay {getattr(default, field)!r} in the sweep, which sets the backward "
                 "lag from --ks and --lag-sampling")


def preset(name: str) -> LLMConfig:
    if name not in PRESETS:
        raise invalid("preset", name, f"one of {tuple(PRESETS)}")
    return PRESETS[name]


@dataclasses.dataclass(frozen=True)
class Experiment:
    config: LLMConfig
    ns: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    """Minibatch updates per generated batch (forward lag)."""
    ks: tuple[int, ...] = (0,)
    """Backward lag in learner iterations: each batch is generated by the snapshot k iterations
    old (0 = on-policy; `lag_sampling`). In the first k iterations, before that snapshot exists,
    the oldest there is."""
    lag_sampling: LagSampling = "constant"
    """`constant` (every batch from the snapshot k iterations old) or `uniform` (each batch from
    one drawn uniformly from the last k + 1, ages 0..k)."""
    lag_profile: str = ""
    """A lag profile, a JSON file `{"probabilities": [p_0, ..., p_{C-1}]}` as `vaco-train
    --lag-profile`'s: each batch's snapshot age drawn from it (while fewer than C snapshots exist,
    at most the oldest there is), beside k = 0; its rows record `lag_sampling` "profile" at
    k = C − 1, and the probabilities."""
    objectives: tuple[str, ...] = ("ppo_clip", "vaco")
    """Objectives to compare (any of `vaco_jax.llm.config.OBJECTIVES`: ppo_clip, vaco, pg,
    decoupled_ppo, spo, impala, icepop, cispo, dppo_tv, m2po, topr, geppo, tis, gspo; or your own:
    `module:function` or a `register_objective` name, docs/objectives.md)."""
    out: str = "runs/llm/cpu"
    """Results directory: config.json, results.jsonl (one row per k, N, objective, seed),
    summary.json."""
    plot: bool = True
    """Draw accuracy and the clip/filter fractions against N into `out/forward_lag.png`."""
    cache_dir: str = ""
    """Where the warm-start parameters trained on this machine are kept, keyed by a hash of the
    model, task and SFT config, the data files' contents and the code that makes the data and
    trains on it (`sft.cache_key`) (default: the per-user cache, `vaco_jax.cache.user_dir("llm")`).
    Not read when a warm start is shipped for the configuration (see `train_warm_start`)."""
    train_warm_start: bool = False
    """Use a warm start trained on this machine (loaded from `cache_dir`, or trained and saved
    there) even when one is shipped for this model, task and SFT configuration
    (`vaco_jax/llm/warm_starts/`, loaded without training by default)."""
    compile_cache: str = "default"
    """JAX's persistent compilation cache: default (off if VACO_JAX_COMPILE_CACHE=off; else
    JAX_COMPILATION_CACHE_DIR, else the per-user cache), off, or a directory (used by the command
    line)."""
    throughput: bool = True
    """Also measure sampling (KV cache vs none) and training tokens/s."""
    overwrite: bool = False
    """Start afresh even if `out` holds results of a different configuration."""
    runs_per_call: int = 0
    """At most this many (k, objective, seed) runs in one compiled program (0: all of an N's runs
    in one); the chunks run one after another. A smaller program needs less memory (one run of the
    `cpu` preset holds about 1 GB); each run's results are the same up to floating-point rounding."""
    fast_compile: bool = False
    """Compile with XLA's cheapest optimisation level: about half the compile time, slower to run
    (for tiny runs, where compiling dominates)."""
    logging: Annotated[LoggerOptions, tyro.conf.OmitArgPrefixes,
                       tyro.conf.arg(prefix_name=False)] = LoggerOptions()
    """Where each run's metrics also go when its N finishes: one logged run per (k, N, objective,
    seed), per-iteration metrics at each generated batch (`vaco_jax.loggers`)."""
