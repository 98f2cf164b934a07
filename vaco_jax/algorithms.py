"""Algorithms as data: an algorithm is an (advantage estimator, policy objective) pair — SPEC §4.

Each estimator and each objective is registered once, with one call signature, and the trainers
only call what the registry holds (no `if name == ...` chains):

* `Estimator.fn(log_rhos, rewards, values, next_values, terminated, truncated, hp)
  -> (value_targets, advantages)`, arrays `[T, B]`; `hp` supplies γ, λ, ρ̄, c̄.
* `Objective(x: PolicyInputs, p: ObjectiveParams) -> (loss, metrics)`, any array shape; the
  MuJoCo trainer and the LLM's GRPO (`vaco_jax.llm.grpo`) both call it. A built-in's entry names
  its function in `objectives.py` and the inputs and hyper-parameters that function takes.

One vocabulary, the same everywhere (MuJoCo and LLM): the **algorithm** names `vaco`, `ppo_clip`,
`ppo_kl`, `spo`, `impala`, `pg`, `decoupled_ppo`, `appo`, and the stale-data objectives of other
systems `icepop`, `cispo`, `dppo_tv`, `m2po`, `topr`, `geppo`, `tis`, `gspo`; the **objective**
names `tv_filter`, `ppo_clip`, `ppo_kl`, `spo`, `impala_pg`, `pg`, `decoupled_ppo`, `icepop`,
`cispo`, `dppo_tv`, `m2po`, `topr`, `geppo`, `gspo` (`tis` is another name of `decoupled_ppo`),
`geppo_clip` (GePPO's clip alone, without the rest of its method).
The LLM testbed has no critic, so there an algorithm contributes its objective and the advantage
is always GRPO's group-normalised reward. `gspo` clips a sequence's ratio: only the LLM runs it.

Adding an algorithm: write its objective in `objectives.py`, register it in `OBJECTIVES` with the
inputs and hyper-parameters it takes, name the pair in `REGISTRY`. Any `<estimator>+<objective>`
string is accepted too (e.g. the ablations).

A user's objective is a value, like a user's env: a function with the same signature, given a name
with `register_objective` or named as `module:function` (`gae+my_objectives:my_loss`), its own
hyper-parameters declared with the `objective` decorator. `resolve_objective` finds any of them;
`check_objective` traces one once on a tiny batch and refuses it, before anything compiles, when it
would not run in a trainer.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import inspect
import math
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from vaco_jax import advantages as adv_lib
from vaco_jax import fingerprint as fingerprint_lib
from vaco_jax import objectives
from vaco_jax import catalog
from vaco_jax.catalog import ALGORITHM_DEFAULTS
from vaco_jax.errors import ConfigError, invalid


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
    discrete: bool = True          # log_prob are log-probabilities (tokens, categorical actions);
                                   # False: log-densities of continuous actions (static)


@dataclasses.dataclass(frozen=True)
class ObjectiveParams:
    """The objectives' hyper-parameters (scalars or traced leaves); each reads what it needs."""

    clip_eps: Any = 0.2            # PPO ε; SPO's ε
    delta: Any = jnp.inf           # TV threshold δ
    is_max: Any = jnp.inf          # cap on the TV filter's importance weight
    rho_bar: Any = 1.0             # IMPALA's ρ̄
    kl_coef: Any = 0.0             # PPO-KL's β_KL
    decoupled_is_max: Any = 2.0    # decoupled PPO's cap C on the weight π_prox/β
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
            raise UndeclaredHParam(name, sorted(self.own)) from None


class UndeclaredHParam(AttributeError):
    """An objective read `p.<name>`, which is neither an `ObjectiveParams` field nor declared."""

    def __init__(self, name: str, declared: list[str]):
        super().__init__(f"ObjectiveParams has no field {name!r} and the objective declares no "
                         f"hyper-parameter of that name (declared: {declared})")
        self.name = name


@dataclasses.dataclass(frozen=True)
class Objective:
    """A policy objective: call it, `objective(x: PolicyInputs, p: ObjectiveParams) -> (loss,
    metrics)`. A built-in one runs its `objectives.py` function, `fn`, on the fields of `x` and
    `p` it names in `inputs` and `params`; yours runs your `fn(x, p)` as it is."""

    name: str
    fn: Callable
    needs_kl: bool = False
    """Reads `PolicyInputs.kl` (the per-sample analytic KL(β ‖ π_θ) of the policy's distribution,
    Gaussian or categorical; KL(π_T ‖ π_θ) with the config's `kl_reference="learner"`)."""
    hparams: tuple[tuple[str, float], ...] = ()
    """The objective's own hyper-parameters and their defaults, `(name, default)` pairs: vmappable
    leaves (`HParams.objective`), set with the config's `objective_hparams` ("name=value"), read
    in `fn` as `p.<name>`."""
    sequences: bool = False
    """Reads the inputs' last axis as the tokens of one sequence (GSPO's sequence ratio): the LLM's
    answers `[B, L]` only. The control trainer's samples are single actions, and it refuses it."""

    normalize_advantages: Callable | None = None
    """`(advantages, log_behavior, log_proximal, p: ObjectiveParams) -> advantages`: the
    objective's own advantage normalisation, which the MuJoCo trainer uses on each minibatch in
    place of its plain one when the config's `normalize_advantages` is on (None: the plain one)."""
    adapt_learning_rate: Callable | None = None
    """`(scale, tv, p: ObjectiveParams) -> scale`: the actor's learning rate, relative to the
    configured one, after an iteration whose update moved the policy `tv = ½ E|π_θ/β − π_T/β|`
    from π_T on the batch. The MuJoCo trainer keeps `scale` in the optimiser state only for an
    objective that has this rule (None: the learning rate is the configured one)."""

    inputs: tuple[str, ...] = ()
    """A built-in's `PolicyInputs` fields beyond `log_prob`, `log_behavior` and `advantages` (which
    `fn` takes first, in that order), each passed to `fn` as the keyword of its name."""
    params: Mapping[str, str] | None = dataclasses.field(default=None, compare=False)
    """A built-in's keywords read from `ObjectiveParams`, `{keyword of fn: field of p}`, an own
    hyper-parameter's included; None: `fn` takes `(x, p)` itself, as yours does. (Not compared:
    an objective stays hashable, and `fn` and `name` tell built-ins apart.)"""

    def __call__(self, x: PolicyInputs, p: ObjectiveParams):
        if self.params is None:
            return self.fn(x, p)
        for name in self.inputs:
            if getattr(x, name) is None and name in _REQUIRED_INPUTS:
                raise ValueError(f"objective {self.name!r} needs PolicyInputs.{name}")
        return self.fn(x.log_prob, x.log_behavior, x.advantages,
                       **{name: getattr(x, name) for name in self.inputs},
                       **{keyword: getattr(p, field) for keyword, field in self.params.items()})

    @property
    def defaults(self) -> dict[str, float]:
        return dict(self.hparams)


# Inputs a built-in objective cannot do without (the others may be None: no mask, no reference).
_REQUIRED_INPUTS = frozenset({"log_proximal", "kl"})


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    # VACO's TV filter (SPEC §3.2).
    Objective("tv_filter", objectives.tv_filter, inputs=("log_reference", "mask"),
              params={"delta": "delta", "filter_mode": "filter_mode", "is_max": "is_max"}),
    Objective("ppo_clip", objectives.ppo_clip, inputs=("mask",),
              params={"clip_eps": "clip_eps"}),
    Objective("ppo_kl", objectives.ppo_kl, inputs=("kl", "mask"),
              params={"kl_coef": "kl_coef"}, needs_kl=True),
    Objective("spo", objectives.spo, inputs=("mask",), params={"eps": "clip_eps"}),
    Objective("impala_pg", objectives.impala_pg, inputs=("mask",),
              params={"rho_bar": "rho_bar"}),
    Objective("pg", objectives.is_pg, inputs=("mask",), params={}),
    Objective("decoupled_ppo", objectives.decoupled_ppo, inputs=("log_proximal", "mask"),
              params={"clip_eps": "clip_eps", "is_max": "decoupled_is_max"}),
    # The stale-data objectives of other asynchronous RL systems (docs/SPEC.md, "Stale-data
    # objectives of other systems"); their own hyper-parameters' names are distinct, since the
    # LLM runs them side by side. Defaults: IcePop's bounds verl's, CISPO's Trinity-RFT's (no
    # lower bound, as MiniMax-M1), DPPO's prime-rl's, M2PO's AReaL's, TOPR's Trinity-RFT's.
    Objective("icepop", objectives.icepop, inputs=("log_proximal", "mask"),
              params={"clip_eps": "clip_eps", "low": "mis_low", "high": "mis_high"},
              hparams=(("mis_low", 0.5), ("mis_high", 2.0))),
    Objective("cispo", objectives.cispo, inputs=("mask",),
              params={"eps_low": "cispo_eps_low", "eps_high": "cispo_eps_high"},
              hparams=(("cispo_eps_low", 1.0), ("cispo_eps_high", 0.28))),
    Objective("dppo_tv", objectives.dppo_tv, inputs=("discrete", "mask"),
              params={"delta": "tv_delta", "penalty": "tv_penalty"},
              hparams=(("tv_delta", 0.2), ("tv_penalty", 1e-3))),
    Objective("m2po", objectives.m2po, inputs=("log_proximal", "mask"),
              params={"clip_eps": "clip_eps", "tau": "m2_tau", "cap": "m2_cap",
                      "over_kept": "m2_over_kept", "truncate": "m2_truncate"},
              # AReaL's form: mean over the kept samples, weights above 5 zeroed. The M2PO paper's
              # normaliser is `m2_over_kept=0`; the earlier form of this objective (mean over all
              # N, weights truncated at 2) is `m2_over_kept=0 m2_truncate=1 m2_cap=2`.
              hparams=(("m2_tau", 0.04), ("m2_cap", 5.0), ("m2_over_kept", 1.0),
                       ("m2_truncate", 0.0))),
    Objective("topr", objectives.topr, inputs=("mask",),
              params={"threshold": "topr_threshold"}, hparams=(("topr_threshold", 0.0),)),
    # GePPO as its authors run it (`jqueeney/geppo`): its clip with ε = clip_eps · geppo_eps_mult,
    # advantages normalised with the weights π_T/β, and the actor's learning rate divided by
    # 1 + geppo_adapt_factor after an update whose TV from π_T exceeds geppo_adapt_max · ε/2
    # (docs/SPEC.md lists what differs from their code and why).
    Objective("geppo", objectives.geppo, inputs=("log_proximal", "mask"),
              params={"clip_eps": "clip_eps", "eps_mult": "geppo_eps_mult"},
              hparams=(("geppo_eps_mult", 1.0), ("geppo_adapt_factor", 0.03),
                       ("geppo_adapt_max", 1.0), ("geppo_adapt_min", 0.0)),
              normalize_advantages=lambda advantages, log_behavior, log_proximal, p:
                  objectives.geppo_advantages(advantages, log_behavior, log_proximal),
              adapt_learning_rate=lambda scale, tv, p: objectives.geppo_learning_rate_scale(
                  scale, tv, eps=p.clip_eps * p.geppo_eps_mult, factor=p.geppo_adapt_factor,
                  max_threshold=p.geppo_adapt_max, min_threshold=p.geppo_adapt_min)),
    # GePPO's clip alone, with the shared protocol's advantages and learning rate: what `geppo`
    # was before it took the rest of the authors' method (`gae+geppo_clip` reproduces it).
    Objective("geppo_clip", objectives.geppo, inputs=("log_proximal", "mask"),
              params={"clip_eps": "clip_eps"}),
    # GSPO's clip range: the GSPO paper's (§5.1) and verl's GSPO recipe's.
    Objective("gspo", objectives.gspo, inputs=("mask",),
              params={"eps_low": "gspo_eps_low", "eps_high": "gspo_eps_high"},
              hparams=(("gspo_eps_low", 3e-4), ("gspo_eps_high", 4e-4)), sequences=True),
)}
# Names used by earlier versions, still accepted in stored configs; and `tis`, verl's and slime's
# truncated importance sampling, which is decoupled PPO with C = 2 (docs/SPEC.md).
_OBJECTIVE_ALIASES = {"clip": "ppo_clip", "kl": "ppo_kl", "tis": "decoupled_ppo"}


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
    # IMPALA (Espeholt et al. 2018) as its authors and Stoix run it: one pass over each batch
    # (its defaults are a table of `vaco_jax.catalog`, which the command line reads).
    "impala": dataclasses.replace(pair("vtrace_every", "impala_pg"),
                                  defaults=tuple(ALGORITHM_DEFAULTS["impala"].items())),
    "pg": pair("gae", "pg"),
    # Decoupled PPO (Hilton et al. 2021; AReaL): clipped around π_T, weighted by min(π_T/β, C).
    "decoupled_ppo": pair("gae", "decoupled_ppo"),
    # APPO (Sample Factory; RLlib): V-trace targets and advantages, PPO's clipped objective — the
    # pairing also listed below as the ablation "Align without Filter".
    "appo": pair("vtrace_once", "ppo_clip"),
    # What other asynchronous RL systems use for stale data, each with GAE (any other estimator
    # through `<estimator>+<objective>`).
    **{name: pair("gae", name) for name in ("icepop", "cispo", "dppo_tv", "m2po", "topr")},
    # GePPO corrects its advantages with V-trace, once per iteration with π_T (the authors'
    # default; their `--no_vtrace` is `gae+geppo`).
    "geppo": pair("vtrace_once", "geppo"),
    # Truncated importance sampling (verl's and slime's correction of stale rollouts) is decoupled
    # PPO with C = 2: one algorithm under two names, the same program.
    "tis": pair("gae", "decoupled_ppo"),
    # GSPO's sequence ratio (the LLM only: `vaco_jax.config.validate` refuses it in control).
    "gspo": pair("gae", "gspo"),
}
# Ablations that separate Align from Filter (written as pairings); `gae+geppo_clip` is GePPO's
# clip alone.
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
    """Resolve a registry name or an `<estimator>+<objective>` pairing, where the objective may be
    a user's (a `register_objective` name or `module:function`)."""
    if name in REGISTRY:
        return REGISTRY[name]
    estimator, plus, objective = name.partition("+")
    if plus and estimator in ESTIMATORS and objective:
        return Algorithm(ESTIMATORS[estimator], resolve_objective(objective, field="algo",
                                                                  value=name))
    if not plus and (name in _USER_OBJECTIVES or ":" in name):
        raise invalid("algo", name, f"a user objective runs with an advantage estimator: write "
                                    f"'<estimator>+{name}' with estimator in {list(ESTIMATORS)} "
                                    f"(e.g. 'gae+{name}')")
    raise catalog.unknown_algo(name)


# --- your own objectives -------------------------------------------------------------------------
_USER_OBJECTIVES: dict[str, Objective] = {}   # the names given to `register_objective`
_USER_ALLOWED = ("a name given to vaco_jax.register_objective, or 'module:function' naming a "
                 "function `fn(x: PolicyInputs, p: ObjectiveParams) -> (loss, metrics)` in an "
                 "importable module")
# `p.<name>` of these reads the shared field, never an objective's own hyper-parameter.
_SHARED_PARAMS = frozenset(f.name for f in dataclasses.fields(ObjectiveParams))


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What the `objective` decorator attaches to a function (`fn.vaco_objective`)."""

    hparams: tuple[tuple[str, float], ...] = ()
    needs_kl: bool = False


def _declared(owner: str, hparams, needs_kl) -> Declaration:
    """`hparams` ({name: default} or (name, default) pairs) and `needs_kl` checked for `owner`."""
    items = tuple((hparams or {}).items() if isinstance(hparams, Mapping) else hparams or ())
    for item in items:
        name, default = item if isinstance(item, tuple) and len(item) == 2 else (item, None)
        if not (isinstance(name, str) and name.isidentifier()) or name in _SHARED_PARAMS:
            raise ConfigError(
                f"{owner}: hyper-parameter name {name!r} is invalid: it must be a Python identifier "
                f"that is not a shared ObjectiveParams field ({sorted(_SHARED_PARAMS)})")
        if (isinstance(default, bool) or not isinstance(default, (int, float))
                or not math.isfinite(default)):
            raise ConfigError(f"{owner}: hyper-parameter {name!r} has default {default!r}: it must "
                              f"be a finite number")
    names = [name for name, _ in items]
    if len(set(names)) < len(names):
        raise ConfigError(f"{owner}: hyper-parameters {names} name one twice")
    if not isinstance(needs_kl, bool):
        raise ConfigError(f"{owner}: needs_kl = {needs_kl!r} must be True or False")
    return Declaration(tuple((name, float(default)) for name, default in items), needs_kl)


def objective(*, hparams: Mapping[str, float] | None = None, needs_kl: bool = False):
    """Decorator declaring a user objective's own hyper-parameters (`{name: default}`, read in the
    function as `p.<name>`, set with the config's `objective_hparams`) and whether it reads
    `x.kl` (computed for it only if `needs_kl`): what `module:function` and `register_objective`
    then run it with.

        @vaco_jax.objective(hparams={"tau": 0.04})
        def my_loss(x, p): ...
    """
    declared = _declared("vaco_jax.objective(...)", hparams, needs_kl)

    def attach(fn):
        fn.vaco_objective = declared
        return fn
    return attach


def register_objective(name: str, fn: Callable, *, hparams: Mapping[str, float] | None = None,
                       needs_kl: bool = False) -> Objective:
    """Make `<estimator>+<name>` (e.g. `Config(algo="gae+my_loss")`) run the policy objective
    `fn(x: PolicyInputs, p: ObjectiveParams) -> (loss, metrics)`, with its own hyper-parameters
    `hparams` ({name: default}) and `x.kl` computed for it if `needs_kl` (both default to what the
    `objective` decorator declared on `fn`). Registering a name again replaces the earlier
    function; built-in names cannot be taken. The program store keys on the function's code, so an
    edited function never reuses a compiled program; a run records the name and the function's
    source file, which a resumed run must register again unchanged."""
    if (not isinstance(name, str) or not name.isidentifier() or name in OBJECTIVES
            or name in _OBJECTIVE_ALIASES or name in REGISTRY or name in ESTIMATORS):
        raise ConfigError(
            f"register_objective({name!r}, ...): the name must be a Python identifier that is not "
            f"a built-in objective's, algorithm's or estimator's ({sorted(OBJECTIVES)}, "
            f"{sorted(REGISTRY)}, {sorted(ESTIMATORS)})")
    if not callable(fn):
        raise ConfigError(f"register_objective({name!r}, ...): fn must be callable, got "
                          f"{type(fn).__qualname__}")
    declared = getattr(fn, "vaco_objective", Declaration())
    declared = _declared(f"register_objective({name!r}, ...)",
                         declared.hparams if hparams is None else hparams,
                         needs_kl or declared.needs_kl)
    _USER_OBJECTIVES[name] = Objective(name, fn, declared.needs_kl, declared.hparams)
    return _USER_OBJECTIVES[name]


def registered_objectives() -> dict[str, Objective]:
    """The names given to `register_objective` in this process, and what they run."""
    return dict(_USER_OBJECTIVES)


def resolve_objective(name: str, *, field: str = "objective", value=None) -> Objective:
    """A built-in objective (or an earlier name of one), a `register_objective` name, or
    `module:function` (imported now; declared with the `objective` decorator, or with no
    hyper-parameters and no KL). Raises `ConfigError` naming `field` = `value` (default: `name`)."""
    value = name if value is None else value
    name = _OBJECTIVE_ALIASES.get(name, name)
    if name in OBJECTIVES:
        return OBJECTIVES[name]
    if name in _USER_OBJECTIVES:
        return _USER_OBJECTIVES[name]
    if ":" not in name:
        raise invalid(field, value, f"objective {name!r} is unknown: the objectives are "
                                    f"{list(OBJECTIVES)} (registered now: "
                                    f"{sorted(_USER_OBJECTIVES)}), or {_USER_ALLOWED}")
    module_name, _, attribute = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 -- any failure to import is the user's to see
        raise invalid(field, value, f"module {module_name!r} does not import "
                                    f"({type(error).__name__}: {error}); {_USER_ALLOWED}") from error
    fn = getattr(module, attribute, None) if attribute.isidentifier() else None
    if not callable(fn):
        raise invalid(field, value, f"module {module_name!r} has no function {attribute!r}; "
                                    f"{_USER_ALLOWED}")
    declared = getattr(fn, "vaco_objective", Declaration())
    return Objective(name, fn, declared.needs_kl, declared.hparams)


def is_builtin(objective: Objective) -> bool:
    return OBJECTIVES.get(objective.name) is objective


def source_of(objective: Objective) -> dict | None:
    """A user objective's code as a run records it: its `fingerprint` (`objective_fingerprint`:
    what resumes, sweeps and the benchmark compare), and for reading its function, module, source
    file and the SHA-256 (16 hex digits) of that file's bytes (`file` and `source` None where it
    has none, e.g. a function defined in a notebook); None for a built-in (the package's own
    source covers it)."""
    if is_builtin(objective):
        return None
    fn = unwrapped(objective.fn)
    try:
        path = inspect.getsourcefile(fn)
    except TypeError:
        path = None
    record = {"function": getattr(fn, "__qualname__", repr(fn)),
              "module": getattr(fn, "__module__", None), "file": path, "source": None,
              "fingerprint": objective_fingerprint(objective)}
    if path and Path(path).is_file():
        record["file"] = str(Path(path).resolve())
        record["source"] = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    return record


def unwrapped(fn):
    """The function under `functools.partial`s and decorators such as `jax.jit`."""
    while True:
        fn = inspect.unwrap(fn)
        if not isinstance(fn, functools.partial):
            return fn
        fn = fn.func


def objective_fingerprint(objective: Objective) -> str | None:
    """What `objective` computes, as a hash (24 hex digits): the StableHLO, without source
    locations, of its loss, metrics and gradient with respect to `log_prob`, traced on `[4, 3]`
    inputs in every setting a trainer passes (mask or none, a learner reference or none, discrete
    or continuous actions, both filter modes), and its declared hyper-parameters and `needs_kl`.

    Everything its program depends on counts — helper modules, installed packages, constants,
    arguments bound by `functools.partial`, code under `jax.jit` or a `custom_vjp` — and nothing
    else does: a comment, a docstring or a moved line keeps it. A function defined in a notebook
    or by `exec` is fingerprinted like any other. Python branches on inputs the trainers never
    pass are not seen. None when it cannot be traced in any setting (`check_objective` says why)."""
    digest = hashlib.sha256(repr((objective.hparams, objective.needs_kl)).encode())
    traced_once = False
    for settings in _FINGERPRINT_SETTINGS:
        try:
            text = _lowered_objective(objective, *settings)
        except Exception as error:  # noqa: BLE001 -- a setting it cannot run in is part of it
            text = f"raises {type(error).__name__}"
        else:
            traced_once = True
        digest.update(repr(settings).encode() + b"\0" + text.encode() + b"\0")
    return digest.hexdigest()[:24] if traced_once else None


_FINGERPRINT_SETTINGS = tuple((mask, reference, discrete, filter_mode)
                              for mask in (False, True) for reference in (False, True)
                              for discrete in (True, False)
                              for filter_mode in ("batch", "per_sample"))


def _lowered_objective(objective: Objective, mask: bool, reference: bool, discrete: bool,
                       filter_mode: str) -> str:
    shaped = jax.ShapeDtypeStruct(_CHECK_SHAPE, jnp.float32)
    scalar = jax.ShapeDtypeStruct((), jnp.float32)
    given = {"log_behavior": shaped, "advantages": shaped, "log_proximal": shaped,
             "kl": shaped if objective.needs_kl else None, "log_reference": shaped if reference
             else None, "mask": shaped if mask else None}
    shared = {f.name: scalar for f in dataclasses.fields(ObjectiveParams)
              if f.name not in ("filter_mode", "own")}
    own = {name: scalar for name in objective.defaults}

    def objective_program(log_prob, inputs, shared, own):
        p = ObjectiveParams(**shared, filter_mode=filter_mode, own=own)

        def loss(log_prob):
            return objective(PolicyInputs(log_prob=log_prob, discrete=discrete, **inputs), p)

        return jax.value_and_grad(loss, has_aux=True)(log_prob)

    lowered = jax.jit(objective_program).trace(shaped, given, shared, own).lower(
        lowering_platforms=("cpu",))
    return fingerprint_lib.stablehlo_text(lowered)


def objective_record(objective: Objective, overrides=()) -> dict:
    """What a run records of its objective (config.json, checkpoints): its name, its own
    hyper-parameters as resolved (defaults and overrides), whether it reads the KL, and for a
    user objective its code (`source_of`)."""
    record = {"name": objective.name, "hparams": objective_hparams(objective, overrides),
              "needs_kl": objective.needs_kl}
    code = source_of(objective)
    return record if code is None else {**record, "code": code}


# --- checking a user's objective before anything compiles -----------------------------------------
_CHECK_SHAPE = (4, 3)


class _WatchedInputs(PolicyInputs):
    """`PolicyInputs` that remember which absent (None) inputs the objective read."""

    def __getattribute__(self, name):
        value = object.__getattribute__(self, name)
        if value is None and name in _INPUT_FIELDS:
            object.__getattribute__(self, "absent_read").append(name)
        return value


_INPUT_FIELDS = frozenset(f.name for f in dataclasses.fields(PolicyInputs))
_WHY_ABSENT = {
    "kl": "it is computed only for an objective declared needs_kl=True "
          "(@vaco_jax.objective(needs_kl=True) or register_objective(..., needs_kl=True))",
    "log_reference": "it is given only with tv_reference='learner'",
    "mask": "the MuJoCo trainer passes no mask (every entry counts); the LLM passes one",
}


def check_objective(objective: Objective, *, tv_reference: str = "behavior",
                    filter_mode: str = "batch", kl: bool | None = None, field: str = "algo",
                    value=None) -> None:
    """Trace `objective` once, on a tiny batch `[4, 3]`, with and without a mask, given the inputs
    a trainer gives it (`log_proximal` always, `kl` if it `needs_kl` (or `kl`), `log_reference` if
    `tv_reference` is `learner`) and its own hyper-parameters at their defaults. Raises
    `ConfigError` naming what is wrong: a loss that is not a scalar, metrics that are not a dict
    of scalars, an input it read that is not given, a hyper-parameter it does not declare, or an
    exception inside it (its message and where it was raised), naming `field` = `value` (default:
    the objective's name). Nothing is compiled."""
    kl = objective.needs_kl if kl is None else kl
    try:
        hash(objective)
        check = _check
    except TypeError:   # e.g. a callable object that is not hashable: checked every time
        check = _check.__wrapped__
    try:
        check(objective, tv_reference, filter_mode, kl)
    except _Refused as refused:
        raise invalid(field, objective.name if value is None else value,
                      f"objective {objective.name!r} cannot be used: {refused}") from None


@functools.lru_cache(maxsize=64)
def _check(objective: Objective, tv_reference: str, filter_mode: str, kl: bool) -> None:
    shaped = jax.ShapeDtypeStruct(_CHECK_SHAPE, jnp.float32)
    scalar = jax.ShapeDtypeStruct((), jnp.float32)
    given = {"log_prob": shaped, "log_behavior": shaped, "advantages": shaped,
             "log_proximal": shaped, "kl": shaped if kl else None,
             "log_reference": shaped if tv_reference == "learner" else None}
    shared = {f.name: scalar for f in dataclasses.fields(ObjectiveParams)
              if f.name not in ("filter_mode", "own")}
    own = {name: scalar for name in objective.defaults}
    for mask in (None, shaped):
        absent_read: list[str] = []

        def traced(inputs, shared, own):
            x = _WatchedInputs(**inputs)
            object.__setattr__(x, "absent_read", absent_read)
            p = ObjectiveParams(**shared, filter_mode=filter_mode, own=own)
            problem = _output_problem(objective(x, p))
            if problem:
                raise _BadOutput(problem)

        with_mask = "with a mask" if mask is not None else "without a mask"
        try:
            jax.eval_shape(traced, {**given, "mask": mask}, shared, own)
        except _BadOutput as error:
            raise _Refused(f"{error} (traced on [4, 3] inputs {with_mask})") from None
        except UndeclaredHParam as error:
            raise _Refused(
                f"it reads p.{error.name}, a hyper-parameter it does not declare (declared: "
                f"{sorted(objective.defaults) or 'none'}); declare it with "
                f"@vaco_jax.objective(hparams={{{error.name!r}: <default>}}) or "
                f"register_objective(..., hparams=...){_where(objective, error)}") from None
        except Exception as error:  # noqa: BLE001 -- whatever it raised is the user's to see
            why = "".join(f"; it read PolicyInputs.{name}, which is None here: {_WHY_ABSENT[name]}"
                          for name in dict.fromkeys(absent_read) if name in _WHY_ABSENT)
            raise _Refused(f"it raised {type(error).__name__}: {error}{_where(objective, error)} "
                           f"when traced on [4, 3] inputs {with_mask}{why}") from None


class _BadOutput(Exception):
    pass


class _Refused(Exception):
    pass


def _output_problem(result) -> str | None:
    """What is wrong with an objective's return value, or None."""
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        return (f"it returned a {type(result).__name__}, not a pair (loss, metrics) "
                f"(the contract: fn(x: PolicyInputs, p: ObjectiveParams) -> (loss, metrics))")
    loss, metrics = result
    if not _is_number(loss) or jnp.shape(loss) != () or not jnp.issubdtype(
            jnp.result_type(loss), jnp.floating):
        return (f"its loss must be a scalar float (shape ()), got "
                f"{_describe_value(loss)}: reduce it to one number, e.g. with jnp.mean")
    if not isinstance(metrics, Mapping):
        return (f"its metrics must be a dict of scalars ({{name: value}}), got "
                f"{type(metrics).__name__}")
    for name, value in metrics.items():
        if not isinstance(name, str):
            return f"its metrics must be a dict with string keys, got key {name!r}"
        if not _is_number(value) or jnp.shape(value) != ():
            return (f"its metric {name!r} must be a scalar (shape ()), got "
                    f"{_describe_value(value)}")
    return None


def _is_number(value) -> bool:
    return isinstance(value, (jax.Array, int, float)) or (
        hasattr(value, "shape") and hasattr(value, "dtype"))   # numpy arrays and scalars


def _describe_value(value) -> str:
    if _is_number(value):
        return f"an array of shape {tuple(jnp.shape(value))} and dtype {jnp.result_type(value)}"
    return f"a {type(value).__name__}"


def _where(objective: Objective, error: BaseException) -> str:
    """` at file:line in function` of the innermost frame of the objective's own source file (else
    of any frame outside JAX and this module)."""
    frames = traceback.extract_tb(error.__traceback__)
    try:
        own_file = inspect.getsourcefile(inspect.unwrap(objective.fn))
    except TypeError:
        own_file = None
    mine = [f for f in frames if own_file and f.filename == own_file] or [
        f for f in frames if f.filename != __file__ and "/jax/" not in f.filename]
    if not mine:
        return ""
    frame = mine[-1]
    line = f": `{frame.line.strip()}`" if frame.line else ""
    return f" (at {Path(frame.filename).name}:{frame.lineno} in {frame.name}{line})"
