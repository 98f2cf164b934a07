"""An algorithm is a pairing (advantage estimator, policy objective) — SPEC §4.

Adding an algorithm is adding an objective function (in `objectives.py`) and a line here; the trainer
is shared. Any `<estimator>+<objective>` string is also accepted, so every pairing is runnable.
"""

from __future__ import annotations

import dataclasses

from vaco_jax.errors import ConfigError

# When the advantages and value targets are computed:
#   gae           — GAE(λ) once per iteration with the start-of-iteration critic, no correction;
#   vtrace_once   — V-trace once per iteration with π_T, V_φT, fixed for all K × M steps (VACO's Align);
#   vtrace_every  — V-trace recomputed on every minibatch with the current θ, φ (IMPALA).
ESTIMATORS = ("gae", "vtrace_once", "vtrace_every")
OBJECTIVES = ("tv_filter", "clip", "kl", "spo", "impala_pg")


@dataclasses.dataclass(frozen=True)
class Algorithm:
    estimator: str
    objective: str

    @property
    def name(self) -> str:
        return f"{self.estimator}+{self.objective}"


REGISTRY: dict[str, Algorithm] = {
    "vaco": Algorithm("vtrace_once", "tv_filter"),
    "ppo_clip": Algorithm("gae", "clip"),
    "ppo_kl": Algorithm("gae", "kl"),
    "spo": Algorithm("gae", "spo"),
    "impala": Algorithm("vtrace_every", "impala_pg"),
}
# Ablations that separate Align from Filter (written as pairings).
ABLATIONS = ("gae+tv_filter", "vtrace_once+clip")


def parse(name: str) -> Algorithm:
    """Resolve a registry name or an `<estimator>+<objective>` pairing."""
    if name in REGISTRY:
        return REGISTRY[name]
    estimator, plus, objective = name.partition("+")
    if plus and estimator in ESTIMATORS and objective in OBJECTIVES:
        return Algorithm(estimator, objective)
    raise ConfigError(
        f"config field `algo` = {name!r} is invalid: allowed values are {sorted(REGISTRY)} or a "
        f"pairing '<estimator>+<objective>' with estimator in {list(ESTIMATORS)} and objective in "
        f"{list(OBJECTIVES)} (e.g. {', '.join(ABLATIONS)})")
