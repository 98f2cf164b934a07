"""Run configuration: static fields (shapes, program structure) and vmappable hyper-parameters.

`Config` is the one typed description of a run; the CLI exposes every field. Fields that change
array shapes or the structure of the compiled program are *static*. Everything else is copied into
`HParams` (`vaco_jax.hparams`), a pytree of scalars that lives in the train state, so `jax.vmap`
can sweep seeds, δ, the learning rate or the buffer capacity (below `max_capacity`) in one compiled
program.

This module imports no JAX: a command builds its parser (and its `--help`) from `Config` alone.
Envs and algorithms are imported when a config is validated or made into arrays.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import TYPE_CHECKING, Annotated, Literal

import tyro

from vaco_jax import catalog
from vaco_jax.errors import ConfigError, check_types, did_you_mean, invalid

if TYPE_CHECKING:
    from vaco_jax.hparams import HParams

__all__ = ["Config", "ConfigError", "validate", "to_json_dict", "from_json_dict",
           "read_lag_profile", "check_lag_profile", "with_lag_profile"]


SnapshotSampling = Literal["uniform", "oldest", "newest", "profile"]
TVReference = Literal["behavior", "learner"]
KLReference = Literal["behavior", "learner"]
FilterMode = Literal["batch", "per_sample"]
MjxSolver = Literal["default", "fast"]
Network = Literal["mlp", "cnn"]   # `vaco_jax.networks.NETWORKS`


# --- lag profiles: the snapshot-age distribution of an asynchronous system (SPEC §2) -------------
PROFILE_TOLERANCE = 1e-3   # how far a profile's sum may be from 1 (it is then rescaled to 1)


def check_lag_profile(probabilities, field: str = "lag_profile") -> tuple[float, ...]:
    """`probabilities` as a tuple of floats, refused (`ConfigError` naming `field`) unless it is a
    non-empty sequence of finite, non-negative numbers summing to 1 within `PROFILE_TOLERANCE`.
    Entry k is the share of actor groups acting with the snapshot of age k (0 = the newest)."""
    problem = _profile_problem(probabilities)
    if problem:
        raise invalid(field, probabilities, problem)
    return tuple(float(p) for p in probabilities)


def _profile_problem(probabilities) -> str | None:
    """What is wrong with a lag profile, or None."""
    if isinstance(probabilities, (str, bytes, dict)) or not hasattr(probabilities, "__len__"):
        return "must be a list of probabilities [p_0, ..., p_{C-1}], one per snapshot age"
    if not len(probabilities):
        return "must hold at least one probability (age 0)"
    if not all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in probabilities):
        return "must hold numbers only"
    values = [float(p) for p in probabilities]
    if not all(math.isfinite(p) and p >= 0 for p in values):
        return "every probability must be finite and >= 0"
    if abs(sum(values) - 1.0) > PROFILE_TOLERANCE:
        return (f"the probabilities must sum to 1 (within {PROFILE_TOLERANCE}); they sum to "
                f"{sum(values):.6g} (divide counts by their total)")
    return None


def read_lag_profile(path) -> tuple[float, ...]:
    """The lag profile in the JSON file `path`, `{"probabilities": [p_0, ..., p_{C-1}]}` (and
    optionally a `"description"`), checked by `check_lag_profile`. Raises `ConfigError` naming the
    file and what is wrong with it."""
    import json
    from pathlib import Path

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"option `lag_profile` = {str(path)!r} is invalid: cannot read it as "
                          f"JSON ({type(error).__name__}: {error})") from None
    if not isinstance(data, dict) or "probabilities" not in data:
        raise ConfigError(f"option `lag_profile` = {str(path)!r} is invalid: it must hold a JSON "
                          f"object {{\"probabilities\": [p_0, ..., p_{{C-1}}]}}")
    unknown = sorted(set(data) - {"probabilities", "description"})
    if unknown:
        raise ConfigError(f"option `lag_profile` = {str(path)!r} is invalid: unknown keys {unknown} "
                          f"(allowed: probabilities, description)")
    problem = _profile_problem(data["probabilities"])
    if problem:
        raise ConfigError(f"option `lag_profile` = {str(path)!r} is invalid: its probabilities "
                          f"{data['probabilities']!r} {problem}" if problem.startswith("must")
                          else f"option `lag_profile` = {str(path)!r} is invalid: {problem} "
                               f"(probabilities {data['probabilities']!r})")
    return check_lag_profile(data["probabilities"])


def with_lag_profile(config: "Config", probabilities, *, sampling: bool = True,
                     capacity: bool = True) -> "Config":
    """`config` acting with the lag profile `probabilities`: with `sampling`,
    `snapshot_sampling="profile"`; with `capacity`, a buffer as long as the profile
    (`capacity = len(probabilities)`, raising `max_capacity` to it if it was set lower). The
    command line leaves alone what its flags set."""
    values = check_lag_profile(probabilities)
    fields = {"lag_profile": values}
    if sampling:
        fields["snapshot_sampling"] = "profile"
    if capacity:
        fields["capacity"] = len(values)
        if config.max_capacity:
            fields["max_capacity"] = max(config.max_capacity, len(values))
    return dataclasses.replace(config, **fields)


# `--lag-profile FILE` on the command line: the file is read (and checked) as the flags are parsed.
_LAG_PROFILE_FLAG = tyro.constructors.PrimitiveConstructorSpec(
    nargs=1, metavar="FILE", instance_from_str=lambda args: read_lag_profile(args[0]),
    is_instance=lambda value: isinstance(value, tuple),
    str_from_instance=lambda value: [str(list(value))] if value else ["none"])


@dataclasses.dataclass(frozen=True)
class Config:
    """A training run. Defaults: a small VACO run on inverted_pendulum that learns in minutes on CPU
    (`Config.for_env` and the command line give other envs their own)."""

    # --- what to run ------------------------------------------------------------------------
    env: str = "inverted_pendulum"
    """Environment: ant, halfcheetah, hopper, humanoid, humanoidstandup, inverted_pendulum,
    inverted_double_pendulum, pusher, reacher, walker2d (Brax on MJX); dmc:<Task>, a DeepMind
    Control Suite task of MuJoCo Playground (dmc:CheetahRun, ... — all 25 in the README; the dmc
    extra); gymnax:<id> (gymnax:CartPole-v1, gymnax:Pendulum-v1, ...; the gymnax extra); toy_reach,
    toy_bandit (for tests); a name given to vaco_jax.register_env; or module:factory, a function
    returning a Brax Env, a Playground MjxEnv or a gymnax (env, params) pair. Each env brings
    defaults for the other fields (what learns on a 2-core CPU; docs/environments.md), which
    `--env <name> --help`
    shows."""
    algo: str = "vaco"
    """Algorithm: vaco, ppo_clip, ppo_kl, spo, impala, pg, decoupled_ppo, appo, the stale-data
    objectives of other systems icepop, cispo, dppo_tv, m2po, topr, geppo, tis (decoupled_ppo
    under verl's and slime's name), or any `<estimator>+<objective>` pairing (estimators gae,
    vtrace_once, vtrace_every; objectives tv_filter, ppo_clip, ppo_kl, spo, impala_pg, pg,
    decoupled_ppo, those six and geppo_clip, GePPO's clip alone; e.g. the ablations
    gae+tv_filter, vtrace_once+ppo_clip, gae+geppo_clip); gspo (a sequence-level ratio) is the
    LLM's only. The objective may be your own: a name given
    to vaco_jax.register_objective, or module:function (e.g. gae+my_objectives:my_loss;
    docs/objectives.md)."""
    seed: int = 0
    """Seed of the first run; seed i of a multi-seed run uses `seed + i`."""
    num_seeds: int = 1
    """Independent seeds trained together in one vmapped call."""
    total_steps: int = 300_000
    """Environment steps per seed (rounded down to whole iterations)."""
    mjx_solver: MjxSolver = "default"
    """MJX constraint-solver settings: `default` (Brax's, the reference physics) or `fast` (4
    line-search steps instead of 50, for the envs where it was checked against the default physics:
    `vaco_jax.envs.FAST_SOLVER`; other envs keep the default)."""

    # --- asynchrony (SPEC §2) ---------------------------------------------------------------
    capacity: int = 1
    """Policy ring-buffer capacity C (1 = synchronous on-policy). Vmappable below max_capacity."""
    max_capacity: int = 0
    """Slots allocated for the ring buffer (0 = same as capacity). Static: sets array shapes."""
    snapshot_sampling: SnapshotSampling = "uniform"
    """How each actor group picks its behaviour snapshot: uniform over filled slots, oldest, newest,
    or profile (its age drawn from lag_profile)."""
    lag_profile: Annotated[tuple[float, ...], _LAG_PROFILE_FLAG] = ()
    """Snapshot-age probabilities p_0 … p_{C−1} (snapshot_sampling=profile): the share of actor
    groups acting with the snapshot of each age, e.g. the staleness histogram an asynchronous system
    logs. On the command line a JSON file {"probabilities": [...]}; it sets snapshot_sampling=profile
    and capacity = its length unless those are given (docs/configuration.md). Vmappable."""
    num_actors: int = 4
    """Actor groups; each draws one snapshot per iteration. Must divide num_envs."""

    # --- rollout and update shapes (static) -------------------------------------------------
    num_envs: int = 32
    """Parallel environments per seed."""
    unroll_length: int = 32
    """Steps per environment per iteration (T)."""
    num_epochs: int = 4
    """Passes over each batch (K)."""
    num_minibatches: int = 8
    """Minibatches per epoch (M); each is num_envs / M whole trajectory segments."""
    episode_length: int = 1000
    """Time limit: episodes are truncated (not terminated) after this many steps."""

    # --- networks (static) ------------------------------------------------------------------
    network: Network = "mlp"
    """The actor's and critic's networks: `mlp` (layers of actor_hidden / critic_hidden) or `cnn`
    (for image observations [height, width, channels], e.g. gymnax's MinAtar envs: a 3×3
    convolution of 16 channels, then dense layers of actor_hidden / critic_hidden). From Python,
    any Flax modules (`Trainer(config, networks=(actor_torso, critic_torso))`)."""
    actor_hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the policy network."""
    critic_hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the value network."""
    activation: Literal["tanh", "relu", "silu"] = "tanh"
    """Activation of both networks' hidden layers."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy (state-independent)."""
    normalize_observations: bool = True
    """Per-seed running observation normalisation (the statistics travel in each snapshot)."""

    # --- objective switches (static) --------------------------------------------------------
    tv_reference: TVReference = "behavior"
    """TV filter reference: `behavior` (total divergence from the data) or `learner` (forward lag only)."""
    filter_mode: FilterMode = "batch"
    """TV filter rule: `batch` (drop outward samples when the minibatch TV exceeds δ) or `per_sample`."""
    normalize_advantages: bool = True
    """Normalise advantages per minibatch."""
    kl_adaptive: bool = False
    """PPO-KL: adapt β_KL towards kl_target (×2 / ÷2 rule) instead of keeping it fixed."""
    kl_reference: KLReference = "behavior"
    """PPO-KL: the policy its KL penalty (and the adaptive rule) measures from: `behavior` (β, the
    data's policy: the textbook form) or `learner` (π_T, the learner at the start of the iteration:
    PPO's "old" policy, the one before the update, under asynchrony). Identical penalty when C = 1."""
    anneal_lr: bool = False
    """Linearly anneal the learning rate to zero over the run."""
    objective_hparams: tuple[str, ...] = ()
    """The objective's own hyper-parameters, as name=value (e.g. `--objective-hparams tau=0.04`):
    those an objective declares (`vaco_jax.algorithms.Objective.hparams`; a user objective's too),
    vmappable leaves like the fields below. Unset ones keep the objective's defaults."""

    # --- hyper-parameters (vmappable pytree leaves) -----------------------------------------
    learning_rate: float = 3e-4
    """Adam learning rate (one optimiser over actor and critic)."""
    gamma: float = 0.99
    """Discount factor γ."""
    gae_lambda: float = 0.95
    """λ of GAE and of V-trace's traces."""
    delta: float = 0.2
    """VACO TV threshold δ (> 0; inf disables filtering)."""
    clip_eps: float = 0.2
    """PPO clip range ε (also SPO's ε and the clip-fraction diagnostic)."""
    kl_coef: float = 0.1
    """PPO-KL β_KL (initial value when kl_adaptive)."""
    kl_target: float = 0.01
    """PPO-KL adaptive target KL."""
    kl_coef_min: float = 0.0
    """PPO-KL adaptive: β_KL is kept at or above this (0 = unbounded; 1/35 in the bounded form)."""
    kl_coef_max: float = math.inf
    """PPO-KL adaptive: β_KL is kept at or below this (inf = unbounded; 35 in the bounded form)."""
    rho_bar: float = 1.0
    """V-trace ρ̄ (truncation of the TD-error importance weight; IMPALA's policy-gradient ρ̄)."""
    c_bar: float = 1.0
    """V-trace c̄ (truncation of the trace-cutting weight)."""
    is_max: float = math.inf
    """VACO truncation of the importance weight w (inf = none)."""
    decoupled_is_max: float = 2.0
    """Decoupled PPO's cap C on the behavioural weight min(π_T/β, C) (≥ 1; inf = none). 2 as in
    truncated importance sampling's write-up (verl's `tis_imp_ratio_cap`, off by default there);
    AReaL's `behav_imp_weight_cap` (also off by default) drops tokens above its cap instead."""
    reward_scale: float = 0.1
    """Multiply rewards by this before computing advantages and value targets (returns are logged
    unscaled). Keeps value losses from dominating the shared, norm-clipped gradient."""
    vf_coef: float = 0.5
    """Weight of the value loss in the total loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    max_grad_norm: float = 0.5
    """Clip the global gradient norm to this before each Adam step."""
    adam_eps: float = 1e-5
    """Adam's ε."""

    # --- evaluation ---------------------------------------------------------------------------
    num_evals: int = 10
    """Deterministic evaluations over the run (the run is split into this many equal chunks).
    Each costs up to `episode_length` sequential env steps, whatever the budget: on a CPU, 10
    evaluations of 8 episodes take ~1/3 of a 200k-step inverted_pendulum run (20 of 16: ~3/5)."""
    eval_envs: int = 8
    """Episodes per evaluation (one per environment, until it ends or reaches the time limit)."""
    # ------------------------------------------------------------------------------------------
    @classmethod
    def for_env(cls, env: str, **fields) -> "Config":
        """A config for `env` with the env's own defaults (`envs.defaults`: what learns on a
        2-core CPU, e.g. hopper's 1M steps with `mjx_solver="fast"`) and then the algorithm's
        (`algorithms.defaults` of `fields["algo"]`: its usual form, e.g. IMPALA's one epoch) for
        every field not given in `fields`: class < env < algorithm < `fields`. The command line
        starts from it, so `--env hopper --algo impala` runs (and `--help` shows) those defaults;
        `Config(env=...)` keeps the class defaults (inverted_pendulum's), as every stored config
        and preset was written against."""
        catalog.check_names(env, fields.get("algo", cls.algo))   # a misspelt name, before JAX
        names = {f.name for f in dataclasses.fields(cls)}
        if env in catalog.ENV_NAMES:   # a built-in env: its row of the table
            env_defaults = dict(catalog.ENV_DEFAULTS.get(env, {}))
        else:                          # gymnax's or the user's: its episode limit too
            from vaco_jax import envs

            env_defaults = envs.defaults(env)
        unknown = sorted(set(env_defaults) - names)
        if unknown:
            raise invalid("env", env, f"its defaults name fields {unknown} that Config does not have")
        algo = fields.get("algo", cls.algo)
        algo_defaults = dict(catalog.ALGORITHM_DEFAULTS.get(algo, {}))   # algorithms.defaults
        unknown = sorted(set(algo_defaults) - names)
        if unknown:
            raise invalid("algo", algo, f"its defaults name fields {unknown} that Config does not have")
        return cls(env=env, **{**env_defaults, **algo_defaults, **fields})

    @property
    def slots(self) -> int:
        """Ring-buffer slots allocated (static)."""
        return self.max_capacity or self.capacity

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.unroll_length

    @property
    def num_iterations(self) -> int:
        """Learner iterations per seed, a whole number of evaluation chunks."""
        per_eval = self.iterations_per_eval
        return per_eval * self.num_evals

    @property
    def iterations_per_eval(self) -> int:
        return max(1, self.total_steps // self.batch_size // self.num_evals)

    @property
    def env_steps(self) -> int:
        """Environment steps per seed actually taken (training only)."""
        return self.num_iterations * self.batch_size

    def grid(self, **values) -> tuple["HParams", list[dict]]:
        """Hyper-parameter settings of *this* config, stacked to vmap `train` over them: every
        combination of `values` (field → sequence of values; the last field varies fastest), each
        other field keeping this config's value. Only `HParams` fields can be swept in one
        program (a field that changes shapes or the program needs a config of its own); every
        setting is validated like the command line's (`ConfigError` naming the field) before
        anything compiles. Returns the stacked `HParams` and the settings, in order.

        `config.grid(capacity=(1, 4, 16), delta=(0.1, 0.2))` → 6 settings."""
        import itertools

        import jax
        import jax.numpy as jnp

        from vaco_jax.hparams import HParams

        leaves = {f.name for f in dataclasses.fields(HParams)} - {"objective", "slots"}
        fields = [f.name for f in dataclasses.fields(self)]
        for name, options in values.items():
            if name not in fields:
                raise ConfigError(f"config field `{name}` does not exist: sweep one of "
                                  f"{sorted(leaves)}" + did_you_mean(name, fields))
            if name not in leaves:
                raise invalid(name, options, f"cannot be swept in one program (it changes shapes "
                                             f"or the program): sweep one of {sorted(leaves)}, or "
                                             f"make a Config per value")
            if isinstance(options, (str, bytes)) or not hasattr(options, "__iter__") or not len(options):
                raise invalid(name, options, "must be a non-empty sequence of values to sweep")
        points = [dict(zip(values, combination))
                  for combination in itertools.product(*values.values())]
        # Every setting runs in this config's program: its ring buffer holds `self.slots`.
        configs = [dataclasses.replace(self, max_capacity=self.slots, **point) for point in points]
        for config in configs:
            validate(config)
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[c.hparams() for c in configs])
        return stacked, points

    def hparams(self) -> "HParams":
        """The vmappable hyper-parameters of this config (every `HParams` field, by name)."""
        import jax.numpy as jnp

        from vaco_jax import algorithms
        from vaco_jax.hparams import HParams

        from vaco_jax import ring_buffer

        objective = algorithms.parse(self.algo).objective
        own = algorithms.objective_hparams(objective, self.objective_hparams)
        # The profile is a leaf only when snapshots are drawn from it: other runs' HParams (and so
        # their programs) hold exactly the leaves they held before profiles existed.
        lag_profile = (ring_buffer.profile_probabilities(self.lag_profile, self.slots)
                       if self.snapshot_sampling == "profile" else None)
        return HParams(**{f.name: jnp.asarray(getattr(self, f.name), f.metadata.get("dtype", jnp.float32))
                          for f in dataclasses.fields(HParams)
                          if f.name not in ("objective", "lag_profile", "slots")},
                       objective={k: jnp.asarray(v, jnp.float32) for k, v in own.items()},
                       lag_profile=lag_profile, slots=self.slots)


# Floats that may be infinite (inf disables the mechanism); every other float must be finite.
INFINITE_ALLOWED = ("delta", "is_max", "decoupled_is_max", "kl_coef_max")


def _fail(field: str, value, allowed: str) -> None:
    raise invalid(field, value, allowed)


def validate(config: Config, *, env_given: bool = False) -> None:
    """Check every field before anything is compiled; raise `ConfigError` naming the field, the
    value and what is allowed. `env_given`: an env object runs beside the config, so `config.env`
    only names it (any non-empty string)."""
    from vaco_jax import algorithms, envs

    if not isinstance(config.env, str):
        _fail("env", config.env, "must be a string naming the env; pass an env object beside the "
                                 "config (Trainer(config, env=...), make_train(config, env=...)) or "
                                 "register it by name (vaco_jax.register_env)")
    check_types(config)
    hints = typing.get_type_hints(Config)
    if env_given:
        if not config.env:
            _fail("env", config.env, "must name the env object passed beside the config (any "
                                     "non-empty string)")
    else:
        envs.check_name(config.env)   # raises ConfigError naming `env` and what is allowed
    algorithm = algorithms.parse(config.algo)  # raises ConfigError naming `algo`
    if algorithm.objective.sequences:
        _fail("algo", config.algo,
              f"objective {algorithm.objective.name!r} clips a sequence-level ratio (GSPO: the "
              f"geometric mean of a sequence's token ratios), which needs sequences of tokens: "
              f"it runs in the LLM's GRPO (vaco-llm --objectives {algorithm.objective.name}). "
              f"Here each sample is one action, not a sequence; allowed: the algorithms "
              f"{sorted(n for n, a in algorithms.REGISTRY.items() if not a.objective.sequences)}"
              f" or a pairing of an objective other than {algorithm.objective.name!r}")
    # Names the objective does not declare, and values that are not numbers, name the field.
    for name, value in algorithms.objective_hparams(algorithm.objective,
                                                    config.objective_hparams).items():
        if not math.isfinite(value):
            _fail("objective_hparams", config.objective_hparams,
                  f"{name} must be a finite number, got {value}")
    if not algorithms.is_builtin(algorithm.objective):   # a user's: traced once, on a tiny batch
        algorithms.check_objective(algorithm.objective, tv_reference=config.tv_reference,
                                   filter_mode=config.filter_mode, value=config.algo)

    positive_ints = ["num_seeds", "total_steps", "num_envs", "unroll_length", "num_epochs",
                     "num_minibatches", "num_actors", "episode_length", "num_evals", "eval_envs"]
    for name in positive_ints:
        if getattr(config, name) < 1:
            _fail(name, getattr(config, name), "must be an integer >= 1")
    # PRNGKey takes the seed modulo 2**32: a larger seed would silently repeat seed 0, 1, ...
    if not 0 <= config.seed <= 2**32 - config.num_seeds:
        _fail("seed", config.seed, f"must be an integer in [0, 2**32 - num_seeds] = "
                                   f"[0, {2**32 - config.num_seeds}]")
    if config.capacity < 1:
        _fail("capacity", config.capacity, "must be an integer >= 1 (1 = synchronous on-policy)")
    if config.max_capacity < 0 or (config.max_capacity and config.max_capacity < config.capacity):
        _fail("max_capacity", config.max_capacity,
              f"must be 0 (= capacity) or an integer >= capacity ({config.capacity})")
    if config.snapshot_sampling == "profile" or config.lag_profile:
        _check_profile(config)
    if config.num_envs % config.num_minibatches:
        _fail("num_minibatches", config.num_minibatches,
              f"must divide num_envs ({config.num_envs}): minibatches are whole trajectory segments; "
              f"allowed: {[m for m in range(1, config.num_envs + 1) if config.num_envs % m == 0]}")
    if config.num_envs % config.num_actors:
        _fail("num_actors", config.num_actors,
              f"must divide num_envs ({config.num_envs}); "
              f"allowed: {[a for a in range(1, config.num_envs + 1) if config.num_envs % a == 0]}")
    if config.total_steps < config.batch_size * config.num_evals:
        _fail("total_steps", config.total_steps,
              f"must be at least num_envs * unroll_length * num_evals = "
              f"{config.batch_size * config.num_evals} (one iteration per evaluation)")

    floats = {name: float(getattr(config, name)) for name, hint in hints.items() if hint is float}
    for name, value in floats.items():
        if math.isnan(value):
            _fail(name, getattr(config, name), "must be a number (not NaN)")
        if math.isinf(value) and name not in INFINITE_ALLOWED:
            _fail(name, getattr(config, name),
                  f"must be finite (only {' and '.join(INFINITE_ALLOWED)} may be inf)")
    if not 0 < config.delta:
        _fail("delta", config.delta, "must be > 0 (use inf to disable filtering)")
    if not 0 <= config.gamma <= 1:
        _fail("gamma", config.gamma, "must be in [0, 1]")
    if not 0 <= config.gae_lambda <= 1:
        _fail("gae_lambda", config.gae_lambda, "must be in [0, 1]")
    for name in ["learning_rate", "clip_eps", "rho_bar", "c_bar", "is_max", "max_grad_norm", "reward_scale",
                 "adam_eps", "kl_target"]:
        if not floats[name] > 0:
            _fail(name, getattr(config, name), "must be > 0")
    if not floats["decoupled_is_max"] >= 1:
        _fail("decoupled_is_max", config.decoupled_is_max,
              "must be >= 1 (inf = no cap): a cap below 1 would shrink on-policy samples' weight")
    for name in ["kl_coef", "vf_coef", "ent_coef", "kl_coef_min"]:
        if floats[name] < 0:
            _fail(name, getattr(config, name), "must be >= 0")
    if not floats["kl_coef_min"] <= floats["kl_coef"] <= floats["kl_coef_max"]:
        _fail("kl_coef_max" if floats["kl_coef"] > floats["kl_coef_max"] else "kl_coef_min",
              config.kl_coef_max if floats["kl_coef"] > floats["kl_coef_max"] else config.kl_coef_min,
              f"must bound the initial β_KL: kl_coef_min <= kl_coef ({config.kl_coef}) <= kl_coef_max")
    if config.kl_reference == "learner" and not algorithm.objective.needs_kl:
        _fail("kl_reference", config.kl_reference,
              f"'learner' applies to objectives with a KL penalty (ppo_kl), not to "
              f"{algorithm.objective.name!r} of algo {config.algo!r}; allowed: 'behavior'")
    for name in ["actor_hidden", "critic_hidden"]:
        widths = getattr(config, name)
        if not widths or min(widths) < 1:
            _fail(name, widths, "must be a non-empty tuple of positive layer widths")


def _check_profile(config: Config) -> None:
    """A lag profile goes with `snapshot_sampling="profile"`, and fits the buffer: one age per
    slot in use (`len(lag_profile) <= capacity`; `capacity = len` unless told otherwise)."""
    if not config.lag_profile:
        _fail("lag_profile", config.lag_profile,
              "must be given with snapshot_sampling='profile' (--lag-profile FILE: a JSON file "
              "{\"probabilities\": [p_0, ..., p_{C-1}]})")
    if config.snapshot_sampling != "profile":
        _fail("snapshot_sampling", config.snapshot_sampling,
              "must be 'profile' when a lag_profile is given (snapshot ages are drawn from it); "
              "drop the lag profile to sample 'uniform', 'oldest' or 'newest'")
    check_lag_profile(config.lag_profile)
    if len(config.lag_profile) > config.capacity:
        _fail("capacity", config.capacity,
              f"must be at least the lag profile's length {len(config.lag_profile)} (ages 0 to "
              f"{len(config.lag_profile) - 1}; the command line sets it to that length)")


def validate_hparams(hparams: "HParams", slots: int = 0) -> None:
    """Check concrete `HParams` (one setting, or settings stacked on a leading axis), made by hand
    as well as by `Config.hparams`, with `validate`'s errors: each setting is checked as a config
    holding its values, with the ring buffer's slots (`slots`, else `hparams.slots`) as
    `max_capacity`. Traced values (inside `jit` or `vmap`) cannot be read and are not checked."""
    import jax
    import numpy as np

    from vaco_jax.hparams import HParams

    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(hparams)):
        return
    # A lag profile is a config's (checked with it by `validate`), not a scalar of the setting.
    names = [f.name for f in dataclasses.fields(HParams)
             if f.name not in ("objective", "lag_profile", "slots")]
    columns = [np.atleast_1d(np.asarray(getattr(hparams, name))) for name in names]
    settings = {tuple(column[i].item() for column in columns) for i in range(len(columns[0]))}
    for setting in sorted(settings):
        values = dict(zip(names, setting))
        values["capacity"] = int(values["capacity"])
        validate(Config(max_capacity=slots or hparams.slots, **values))
    for name, value in hparams.objective.items():
        if not np.all(np.isfinite(np.asarray(value))):
            _fail("objective_hparams", {name: np.asarray(value).tolist()},
                  f"{name} must be a finite number")


# Options of the command line that versions before 0.2 kept in `Config` (now `vaco_jax.options`).
LEGACY_OPTION_FIELDS = ("out", "progress", "overwrite", "resume", "checkpoint_every",
                        "checkpoint_budget", "keep_checkpoints", "on_nan")


# --- a lossless JSON form (checkpoints store the config; inf is not valid JSON) -------------------

def to_json_dict(config: Config) -> dict:
    """Every field, JSON-safe: non-finite floats as the strings 'inf', '-inf', tuples as lists."""
    def encode(value):
        if isinstance(value, float) and not math.isfinite(value):
            return repr(value)
        return list(value) if isinstance(value, tuple) else value
    return {f.name: encode(getattr(config, f.name)) for f in dataclasses.fields(Config)}


def from_json_dict(data: dict) -> Config:
    """The inverse of `to_json_dict`; unknown fields raise `ConfigError`, missing ones keep defaults.

    Process options that older versions stored with the config (`out`, `resume`, ...) are ignored."""
    hints = typing.get_type_hints(Config)
    data = {k: v for k, v in data.items() if k not in LEGACY_OPTION_FIELDS}
    unknown = sorted(set(data) - set(hints))
    if unknown:
        raise ConfigError(f"config fields {unknown} are unknown to this version of vaco_jax")
    values = {}
    for name, value in data.items():
        if hints[name] is float and isinstance(value, (str, int)):
            value = float(value)
        elif typing.get_origin(hints[name]) is tuple:
            value = tuple(value)
        values[name] = value
    return Config(**values)


def read_config_file(path) -> Config:
    """The config stored in `path`: a run's `config.json` (or its run directory), or a JSON object
    of config fields. Raises `ConfigError` naming the file and what is wrong with it."""
    import json
    from pathlib import Path

    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"option `config` = {str(path)!r} is invalid: cannot read it as JSON "
                          f"({type(error).__name__}: {error})") from None
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        data = data["config"]   # a run's config.json: {"config": ..., "options": ..., "versions": ...}
    if not isinstance(data, dict):
        raise ConfigError(f"option `config` = {str(path)!r} is invalid: it holds no JSON object of "
                          f"config fields")
    try:
        return from_json_dict(data)
    except (ConfigError, TypeError) as error:
        raise ConfigError(f"option `config` = {str(path)!r} is invalid: {error}") from None

