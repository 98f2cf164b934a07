"""Algorithms as data: an algorithm is an (advantage estimator, policy objective) pair — SPEC §4.

Each estimator and each objective is registered once, with one call signature, and the trainers
only call what the registry holds (no `if name == ...` chains):

* `Estimator.fn(log_rhos, rewards, values, next_values, terminated, truncated, hp)
  -> (value_targets, advantages)`, arrays `[T, B]`; `hp` supplies γ, λ, ρ̄, c̄.
* `Objective.fn(x: PolicyInputs, p: ObjectiveParams) -> (loss, metrics)`, any array shape; the
  MuJoCo trainer and the LLM's GRPO (`vaco_jax.llm.grpo`) both call it.

One vocabulary, the same everywhere (MuJoCo and LLM): the **algorithm** names `vaco`, `ppo_clip`,
`ppo_kl`, `spo`, `impala`, `pg`, `decoupled_ppo`, `appo`; the **objective** names `tv_filter`,
`ppo_clip`, `ppo_kl`, `spo`, `impala_pg`, `pg`, `decoupled_ppo`. The LLM testbed has no critic, so
there an algorithm contributes its objective and the advantage is always GRPO's group-normalised
reward.

Adding an algorithm: write its objective in `objectives.py`, register it in `OBJECTIVES`, name the
pair in `REGISTRY`. Any `<estimator>+<objective>` string is accepted too (e.g. the ablations).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax.numpy as jnp

from vaco_jax import advantages as adv_lib
from vaco_jax import objectives
from vaco_jax.errors import ConfigError


# --- advantage estimators ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Estimator:
    name: str
    fn: Callable
    per_minibatch: bool = False
    """Recomputed on every minibatch with the current θ, φ (else once per iteration with π_T, V_φT)."""


def _gae(log_rhos, rewards, values, next_values, terminated, truncated, hp):
    del log_rhos  # GAE ignores the policy lag
    advantages = adv_lib.gae(rewards, values, next_values, terminated, truncated,
                             gamma=hp.gamma, lambda_=hp.gae_lambda)
    return advantages + values, advantages


def _vtrace(log_rhos, rewards, values, next_values, terminated, truncated, hp):
    return adv_lib.vtrace(log_rhos, rewards, values, next_values, terminated, truncated,
                          gamma=hp.gamma, lambda_=hp.gae_lambda, clip_rho=hp.rho_bar,
                          clip_c=hp.c_bar)


ESTIMATORS: dict[str, Estimator] = {e.name: e for e in (
    # GAE(λ) once per iteration with the start-of-iteration critic, no off-policy correction.
    Estimator("gae", _gae),
    # V-trace once per iteration with π_T, V_φT, fixed for all K × M steps (VACO's Align).
    Estimator("vtrace_once", _vtrace),
    # V-trace recomputed on every minibatch with the current θ, φ (IMPALA).
    Estimator("vtrace_every", _vtrace, per_minibatch=True),
)}


# --- policy objectives ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PolicyInputs:
    """What a policy objective sees: per-sample arrays of one shape (`[T, B]` or tokens `[B, L]`)."""

    log_prob: Any                  # log π_θ(a|s), carries the gradient
    log_behavior: Any              # log β(a|s) of the policy that generated the sample
    advantages: Any                # as the objective should use them (normalised or not)
    mask: Any = None               # 1 = counts (e.g. answer tokens), None = every entry
    log_reference: Any = None      # log π_T(a|s) for `tv_reference=learner`, else None
    kl: Any = None                 # per-sample analytic KL(ref ‖ π_θ), for objectives that need
                                   # it: ref = β, or π_T with the config's `kl_reference="learner"`
    log_proximal: Any = None       # log π_prox(a|s) of decoupled PPO: π_T, the learner at the
                                   # start of the iteration (both trainers always pass it)


@dataclasses.dataclass(frozen=True)
class ObjectiveParams:
    """The objectives' hyper-parameters (scalars or traced leaves); each reads what it needs."""

    clip_eps: Any = 0.2            # PPO ε; SPO's ε
    delta: Any = jnp.inf           # TV threshold δ
    is_max: Any = jnp.inf          # cap on the TV filter's importance weight
    rho_bar: Any = 1.0             # IMPALA's ρ̄
    kl_coef: Any = 0.0             # PPO-KL's β_KL
    decoupled_is_max: Any = 2.0    # decoupled PPO's cap C on the behavioural weight π_prox/β
    filter_mode: str = "batch"     # "batch" | "per_sample" (static)
    own: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The objective's own hyper-parameters (`Objective.hparams`, overridden by the config's
    `objective_hparams`), read as attributes: `p.tau` is `p.own["tau"]`."""

    def __getattr__(self, name):
        # Only called when normal lookup fails, i.e. for an objective's own hyper-parameters.
        if name.startswith("__") or name == "own":
            raise AttributeError(name)
        try:
            return self.own[name]
        except KeyError:
            raise AttributeError(
                f"ObjectiveParams has no field {name!r} and the objective declares no "
                f"hyper-parameter of that name (declared: {sorted(self.own)})") from None


@dataclasses.dataclass(frozen=True)
class Objective:
    name: str
    fn: Callable
    needs_kl: bool = False
    """Reads `PolicyInputs.kl` (the per-sample analytic KL(β ‖ π_θ) of the policy's distribution,
    Gaussian or categorical; KL(π_T ‖ π_θ) with the config's `kl_reference="learner"`)."""
    hparams: tuple[tuple[str, float], ...] = ()
    """The objective's own hyper-parameters and their defaults, `(name, default)` pairs: vmappable
    leaves (`HParams.objective`), set with the config's `objective_hparams` ("name=value"), read
    in `fn` as `p.<name>`."""

    @property
    def defaults(self) -> dict[str, float]:
        return dict(self.hparams)


def _required(value, field: str):
    if value is None:
        raise ValueError(f"this objective needs PolicyInputs.{field}")
    return value


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("tv_filter", lambda x, p: objectives.tv_filter(
        x.log_prob, x.log_behavior, x.advantages, delta=p.delta, log_reference=x.log_reference,
        filter_mode=p.filter_mode, is_max=p.is_max, mask=x.mask)),
    Objective("ppo_clip", lambda x, p: objectives.ppo_clip(
        x.log_prob, x.log_behavior, x.advantages, clip_eps=p.clip_eps, mask=x.mask)),
    Objective("ppo_kl", lambda x, p: objectives.ppo_kl(
        x.log_prob, x.log_behavior, x.advantages, kl=x.kl, kl_coef=p.kl_coef, mask=x.mask),
        needs_kl=True),
    Objective("spo", lambda x, p: objectives.spo(
        x.log_prob, x.log_behavior, x.advantages, eps=p.clip_eps, mask=x.mask)),
    Objective("impala_pg", lambda x, p: objectives.impala_pg(
        x.log_prob, x.log_behavior, x.advantages, rho_bar=p.rho_bar, mask=x.mask)),
    Objective("pg", lambda x, p: objectives.is_pg(
        x.log_prob, x.log_behavior, x.advantages, mask=x.mask)),
    Objective("decoupled_ppo", lambda x, p: objectives.decoupled_ppo(
        x.log_prob, x.log_behavior, x.advantages,
        log_proximal=_required(x.log_proximal, "log_proximal"), clip_eps=p.clip_eps,
        is_max=p.decoupled_is_max, mask=x.mask)),
)}
# Names used by earlier versions, still accepted in stored configs.
_OBJECTIVE_ALIASES = {"clip": "ppo_clip", "kl": "ppo_kl"}


# --- algorithms ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Algorithm:
    estimator: Estimator
    objective: Objective
    defaults: tuple[tuple[str, Any], ...] = ()
    """Config fields the algorithm runs with unless set, `(field, value)` pairs: its usual form
    where that differs from the shared protocol (`Config.for_env` and the command line apply them
    over the env's defaults; explicit values win)."""

    @property
    def name(self) -> str:
        return f"{self.estimator.name}+{self.objective.name}"


def pair(estimator: str, objective: str) -> Algorithm:
    return Algorithm(ESTIMATORS[estimator], OBJECTIVES[objective])


REGISTRY: dict[str, Algorithm] = {
    "vaco": pair("vtrace_once", "tv_filter"),
    "ppo_clip": pair("gae", "ppo_clip"),
    "ppo_kl": pair("gae", "ppo_kl"),
    "spo": pair("gae", "spo"),
    # IMPALA (Espeholt et al. 2018) as its authors and Stoix run it: one pass over each batch.
    "impala": dataclasses.replace(pair("vtrace_every", "impala_pg"), defaults=(("num_epochs", 1),)),
    "pg": pair("gae", "pg"),
    # Decoupled PPO (Hilton et al. 2021; AReaL): clipped around π_T, weighted by min(π_T/β, C).
    "decoupled_ppo": pair("gae", "decoupled_ppo"),
    # APPO (Sample Factory; RLlib): V-trace targets and advantages, PPO's clipped objective — the
    # pairing also listed below as the ablation "Align without Filter".
    "appo": pair("vtrace_once", "ppo_clip"),
}
# Ablations that separate Align from Filter (written as pairings).
ABLATIONS = ("gae+tv_filter", "vtrace_once+ppo_clip")


def defaults(name: str) -> dict[str, Any]:
    """The config fields algorithm `name` runs with unless set (`Algorithm.defaults`); none for a
    pairing or a name that is not registered (validation reports those)."""
    algorithm = REGISTRY.get(name)
    return dict(algorithm.defaults) if algorithm is not None else {}


def objective_hparams(objective: Objective, overrides=()) -> dict[str, float]:
    """The objective's own hyper-parameters: its defaults, overridden by `overrides`, a sequence
    of "name=value" strings (the config's `objective_hparams`). Raises `ConfigError` naming the
    field for a name the objective does not declare or a value that is not a number."""
    values = objective.defaults
    for item in overrides:
        name, eq, value = str(item).partition("=")
        name = name.strip()
        if not eq or name not in values:
            raise ConfigError(
                f"config field `objective_hparams` item {item!r} is invalid: objective "
                f"{objective.name!r} declares the hyper-parameters {sorted(values) or 'none'}; "
                f"write each as name=value")
        try:
            values[name] = float(value)
        except ValueError:
            raise ConfigError(f"config field `objective_hparams` item {item!r} is invalid: "
                              f"{value!r} is not a number") from None
    return values


def parse(name: str) -> Algorithm:
    """Resolve a registry name or an `<estimator>+<objective>` pairing."""
    if name in REGISTRY:
        return REGISTRY[name]
    estimator, plus, objective = name.partition("+")
    objective = _OBJECTIVE_ALIASES.get(objective, objective)
    if plus and estimator in ESTIMATORS and objective in OBJECTIVES:
        return pair(estimator, objective)
    raise ConfigError(
        f"config field `algo` = {name!r} is invalid: allowed values are {sorted(REGISTRY)} or a "
        f"pairing '<estimator>+<objective>' with estimator in {list(ESTIMATORS)} and objective in "
        f"{list(OBJECTIVES)} (e.g. {', '.join(ABLATIONS)})")
