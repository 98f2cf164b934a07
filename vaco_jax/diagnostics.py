"""Lag diagnostics every run logs (docs/diagnostics.md): how old the data is when the learner uses
it, the split of the policy lag into its backward and forward parts, and how much of each minibatch
the objective intervened on.

* **Update age** of a sample in a minibatch step: the optimiser steps the policy has taken since
  the sample's behaviour policy, `a · K·M + (e·M + m)` for snapshot age `a` (learner iterations,
  from the ring buffer), epoch `e < K` and minibatch `m < M` of the iteration. Every sample is
  used once per epoch; its minibatch is drawn by the shuffle, so its position in the iteration is
  uniform over its `K·M` steps. The distribution is therefore computed from the per-actor snapshot
  ages alone (not per sample): each actor group's samples spread evenly over the block
  `[a·K·M, (a+1)·K·M)`. Its mean is exact; the histogram and the quantiles are the shuffle's
  average (exact when every actor has the same age, e.g. `oldest` or `newest` sampling, C = 1).
* **TV split** (SPEC §1): `tv_backward` = ½ mean |π_T/β − 1| on the batch (asynchrony, before the
  update), `tv_forward` = ½ mean |π_θ/β − π_T/β| per minibatch step (the update's drift from π_T,
  estimated on β's samples; ½ mean |π_θ/π_T − 1| when β = π_T). By the triangle inequality the
  total `tv_estimate` = ½ mean |π_θ/β − 1| is at most their sum.
* **Snapshot-age histogram** (runs that replay a lag profile): the share of actor groups that
  acted with the snapshot of each age, `snapshot_age_hist_<k>`, to compare with the profile.
* **Intervened fraction**: the share of samples whose gradient the objective's own rules changed
  (clipped, masked, truncated or filtered), under one name. An objective with several rules reports
  their union as `intervened_fraction` itself; one with a single rule reports that rule's fraction,
  the first of `INTERVENTION_KEYS` it reports.
"""

from __future__ import annotations

import numpy as np
import jax.numpy as jnp

from vaco_jax.objectives import log_ratio, masked_mean, sg, unmasked

# The keys an objective reports its own intervention under, in order of precedence (the first one
# it reports is its `intervened_fraction`): the union of its rules when it has several, else the
# fraction of its one rule.
INTERVENTION_KEYS = ("intervened_fraction", "clip_fraction", "masked_fraction",
                     "truncated_fraction", "filtered_fraction")
AGE_QUANTILES = (50, 90)   # percent: update_age_p50, update_age_p90


def intervened_fraction(objective_metrics: dict) -> dict:
    """`{"intervened_fraction": x}` with x the objective's own fraction (the first of
    `INTERVENTION_KEYS` in its metrics: the union of its rules where it reports one), or `{}`
    when it reports none of them."""
    for key in INTERVENTION_KEYS:
        if key in objective_metrics:
            return {"intervened_fraction": objective_metrics[key]}
    return {}


def tv_backward(log_learner_start, log_behavior, mask=None):
    """½ mean |π_T/β − 1| (no gradient): the learner's divergence from the behaviour policy on the
    batch, before the update (the MuJoCo trainer's `behavior_tv`)."""
    log_learner_start, log_behavior = unmasked(mask, log_learner_start, log_behavior)
    ratio = jnp.exp(sg(log_ratio(log_learner_start, log_behavior)))
    return 0.5 * masked_mean(jnp.abs(ratio - 1.0), mask)


def tv_forward(log_prob, log_learner_start, log_behavior, mask=None):
    """½ mean |π_θ/β − π_T/β| (no gradient): the divergence of the policy being optimised from the
    learner at the start of the iteration, estimated on the behaviour policy's samples. It is
    `tv_filter`'s divergence with `tv_reference=learner`, computed the same way."""
    log_prob, log_learner_start, log_behavior = unmasked(mask, log_prob, log_learner_start,
                                                         log_behavior)
    ratio = jnp.exp(sg(log_ratio(log_prob, log_behavior)))
    start_ratio = jnp.exp(sg(log_ratio(log_learner_start, log_behavior)))
    return 0.5 * masked_mean(jnp.abs(ratio - start_ratio), mask)


def age_bins(slots: int, num_epochs: int, num_minibatches: int) -> list[tuple[int, int, str]]:
    """The update-age histogram's bins, `(lo, hi, metric name)` with `lo ≤ age ≤ hi`: 0, 1, 2–3,
    4–7, ... (powers of two) up to the first power of two above the oldest possible age,
    `slots · K·M − 1`. Static: fixed by the config."""
    oldest = slots * num_epochs * num_minibatches - 1
    edges = [0, 1]
    while edges[-1] <= oldest:
        edges.append(2 * edges[-1])
    return [(lo, hi - 1, f"update_age_hist_{lo}_{hi - 1}") for lo, hi in zip(edges, edges[1:])]


def snapshot_age_histogram(snapshot_age, slots: int) -> dict:
    """`snapshot_age_hist_<k>` for every age k < `slots`: the share of actor groups that acted with
    the snapshot of age k this iteration (averaged over a chunk's iterations, the share of
    (iteration, actor group) draws). Logged by runs that replay a lag profile, to compare with it."""
    ages = jnp.asarray(snapshot_age, jnp.int32)
    shares = jnp.zeros(slots, jnp.float32).at[ages].add(1.0) / ages.shape[0]
    return {f"snapshot_age_hist_{k}": shares[k] for k in range(slots)}


def update_age_metrics(snapshot_age, num_epochs: int, num_minibatches: int, slots: int,
                       last_minibatch=None) -> dict:
    """The update-age distribution of one iteration from `snapshot_age [num_actors]` (each actor
    group's snapshot age in iterations, `< slots`; actor groups hold equal shares of the batch).
    `last_minibatch [num_actors]`: the last minibatch of the iteration's last epoch that holds
    samples of each group (None: M − 1, every minibatch holds every group's samples).

    Returns scalars: `update_age_mean`, `update_age_p50`, `update_age_p90` (the smallest age with
    at least that share of the sample uses at or below it), `update_age_max` (the oldest use:
    exact, from `last_minibatch`), and the share of sample uses in each of `age_bins`
    (`update_age_hist_<lo>_<hi>`, summing to 1)."""
    steps = num_epochs * num_minibatches                        # K·M steps per iteration
    ages = jnp.asarray(snapshot_age, jnp.int32)
    num_actors = ages.shape[0]
    uses = num_actors * steps                                   # each actor: one use per step
    actors_by_age = jnp.zeros(slots, jnp.int32).at[ages].add(1)   # [slots]
    last = (num_minibatches - 1 if last_minibatch is None
            else jnp.asarray(last_minibatch, jnp.int32))
    # Steps of block a (ages a·K·M ... a·K·M + K·M − 1) that fall in each bin: static.
    bins = age_bins(slots, num_epochs, num_minibatches)
    lo = np.array([b[0] for b in bins])
    hi = np.array([b[1] for b in bins]) + 1
    block = np.arange(slots)[:, None] * steps
    overlap = np.clip(np.minimum(hi, block + steps) - np.maximum(lo, block), 0, None)
    shares = actors_by_age.astype(jnp.float32) @ jnp.asarray(overlap, jnp.float32) / uses
    metrics = {
        "update_age_mean": jnp.mean(ages.astype(jnp.float32)) * steps + (steps - 1) / 2.0,
        # A group's last use is in its last minibatch of the last epoch, step (K − 1)·M + m.
        "update_age_max": jnp.max(ages * steps + (num_epochs - 1) * num_minibatches
                                  + last).astype(jnp.float32),
    }
    uses_to_block_end = jnp.cumsum(actors_by_age) * steps      # uses with age < (a+1)·K·M
    for percent in AGE_QUANTILES:
        rank = -(-percent * uses // 100)                        # ceil, in integers
        a = jnp.argmax(uses_to_block_end >= rank)
        before = uses_to_block_end[a] - actors_by_age[a] * steps
        # Within block a every step holds actors_by_age[a] uses.
        step = (rank - before + actors_by_age[a] - 1) // actors_by_age[a] - 1
        metrics[f"update_age_p{percent}"] = (a * steps + step).astype(jnp.float32)
    metrics.update({name: shares[i] for i, (_, _, name) in enumerate(bins)})
    return metrics


def behavior_weight_summary(log_learner_start, log_behavior, *, low=0.5, high=2.0, cap=2.0,
                            mask=None) -> dict:
    """How much of a batch the π_T-anchored objectives can use (no gradient): the behavioural
    weights `ρ = π_T/β` that decoupled PPO truncates at `cap` and IcePop zeroes outside
    `[low, high]`. Fractions of samples, and the Kish effective sample size as a fraction of the
    batch, `ESS(w)/N = (Σw)² / (N Σw²)`, of three weightings:

    * `rho_below_low`, `rho_above_high`: `ρ < low`, `ρ > high` (IcePop's masked share is their sum);
    * `ess_rho`: the untruncated `ρ`; `ess_truncated`: `min(ρ, cap)` (decoupled PPO);
      `ess_masked`: `ρ · 1[low ≤ ρ ≤ high]` (IcePop);
    * `mean_truncated_weight`: `E[min(ρ, cap)]`, the scale the truncation leaves the loss at.
    With β = π_T every ρ is 1: both fractions 0, every ESS 1."""
    log_learner_start, log_behavior = unmasked(mask, log_learner_start, log_behavior)
    rho = jnp.exp(sg(log_ratio(log_learner_start, log_behavior)))
    inside = (rho >= low) & (rho <= high)

    def ess(w):
        return masked_mean(w, mask) ** 2 / jnp.maximum(masked_mean(jnp.square(w), mask), 1e-30)

    truncated = jnp.minimum(rho, cap)
    return {"rho_below_low": masked_mean((rho < low).astype(rho.dtype), mask),
            "rho_above_high": masked_mean((rho > high).astype(rho.dtype), mask),
            "ess_rho": ess(rho), "ess_truncated": ess(truncated),
            "ess_masked": ess(jnp.where(inside, rho, 0.0)),
            "mean_truncated_weight": masked_mean(truncated, mask)}
