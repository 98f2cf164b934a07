"""Policy objectives (SPEC §3.2, §4): one pure function each, `(loss, metrics)`.

Every objective takes the log-probabilities of the taken actions under the policy being optimised
(`log_prob`, carries gradient) and under the behaviour policy that generated them (`log_behavior`),
and advantages *as given* (normalisation is the trainer's job). Arrays may have any shape (`[T, B]`
for MuJoCo, `[B, L]` tokens for the LLM); an optional `mask` of the same shape excludes entries
(padding tokens) from every mean. `w = π_θ / β` is always the ratio against the stored behaviour.

A masked entry counts for nothing, whatever it holds (padding may hold log β = −inf or NaN): each
objective first replaces masked inputs by 0 (`unmasked`), then reduces with `masked_mean`, which
selects rather than multiplies (NaN · 0 is NaN). Both are needed: a `where` after a NaN-producing
operation hides the NaN from the value but not from the gradient, which still flows back as 0 · NaN.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

sg = jax.lax.stop_gradient


def unmasked(mask, *arrays):
    """`arrays` with their masked entries (where `mask` is 0) replaced by 0; `None` stays `None`,
    and without a mask the arrays are returned as they are."""
    if mask is None:
        return arrays
    keep = jnp.asarray(mask) > 0
    return tuple(None if x is None else jnp.where(keep, x, jnp.zeros_like(x)) for x in arrays)


def masked_mean(x, mask=None):
    """Mean of `x` over the entries where `mask` is 1 (all entries when `mask` is None); a masked
    entry is left out, not multiplied by 0, so a NaN or inf there cannot reach the mean."""
    if mask is None:
        return jnp.mean(x)
    keep = jnp.asarray(mask) > 0
    count = jnp.sum(keep.astype(x.dtype))
    return jnp.sum(jnp.where(keep, x, jnp.zeros_like(x))) / jnp.maximum(count, 1.0)


# exp(log w) overflows float32 beyond log w ≈ 88 (and SPO's w² beyond 44), turning a loss or its
# gradient into inf/NaN. Every objective and diagnostic reads log w through `log_ratio`: above this
# cap its value is held at the cap while its gradient passes straight through, so losses stay finite
# and an extreme sample is still pulled back; below it (every ratio below 4.85e8) nothing changes.
MAX_LOG_RATIO = 20.0


def log_ratio(log_prob, log_reference):
    """`log(π/ref)`, its value capped at `MAX_LOG_RATIO` (gradient unchanged).

    The value is `min(x, cap)` itself and the gradient rides on `x − sg(x)`, which is exactly 0
    for any finite x (`x − sg(x − cap)` would round to another value beyond |x| ≈ 2**24 in
    float32). That term sees x clipped to its dtype's finite range, so at x = ±inf (where
    `x − sg(x)` is NaN) the value is the cap or −inf (a ratio of 0), with a zero gradient."""
    x = jnp.asarray(log_prob - log_reference)
    largest = float(jnp.finfo(x.dtype).max)
    finite = jnp.clip(x, -largest, largest)
    return sg(jnp.minimum(x, MAX_LOG_RATIO)) + (finite - sg(finite))


def ratio_diagnostics(log_prob, log_behavior, *, clip_eps, mask=None):
    """Diagnostics of `w = π_θ/β` every algorithm logs: TV estimate, clip fraction, KL, max ratio."""
    log_prob, log_behavior = unmasked(mask, log_prob, log_behavior)
    log_ratio_ = sg(log_ratio(log_prob, log_behavior))
    ratio = jnp.exp(log_ratio_)
    return {
        "tv_estimate": 0.5 * masked_mean(jnp.abs(ratio - 1.0), mask),
        "clip_fraction": masked_mean((jnp.abs(ratio - 1.0) > clip_eps).astype(ratio.dtype), mask),
        # k3 estimator of KL(β ‖ π_θ): unbiased and non-negative.
        "approx_kl": masked_mean((ratio - 1.0) - log_ratio_, mask),
        # Ratios are positive, so filling masked entries with 0 leaves any max unchanged (and an
        # all-masked minibatch reports 0, not −inf).
        "max_ratio": jnp.max(jnp.where(jnp.asarray(mask) > 0, ratio, 0.0) if mask is not None
                             else ratio),
    }


def ppo_clip(log_prob, log_behavior, advantages, *, clip_eps, mask=None):
    """PPO's clipped surrogate `−E[min(wÂ, clip(w, 1±ε)Â)]`."""
    log_prob, log_behavior, advantages = unmasked(mask, log_prob, log_behavior, advantages)
    ratio = jnp.exp(log_ratio(log_prob, log_behavior))
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    loss = -masked_mean(jnp.minimum(unclipped, clipped), mask)
    clipped_active = (jnp.abs(sg(ratio) - 1.0) > clip_eps).astype(ratio.dtype)
    return loss, {"clip_fraction": masked_mean(clipped_active, mask)}


def decoupled_ppo(log_prob, log_behavior, advantages, *, log_proximal, clip_eps, is_max,
                  mask=None):
    """Decoupled PPO (Hilton et al. 2021, "Batch size-invariance for policy optimization"; AReaL's
    asynchronous default): PPO's clipped surrogate around a proximal policy π_prox rather than the
    behaviour policy, importance-weighted from β to π_prox:

    ```
    L = −E[ sg(min(π_prox/β, C)) · min(r Â, clip(r, 1±ε) Â) ],     r = π_θ / π_prox
    ```
    Clipping bounds how far the update moves from π_prox (here π_T, the learner at the start of the
    iteration: forward lag), whatever the data's staleness (backward lag), which the behavioural
    weight corrects, truncated at C (`is_max`; truncated importance sampling, as verl's TIS; C ≥ 1).
    With π_prox = β the weight is 1 and this is `ppo_clip`, bit for bit.
    """
    log_prob, log_behavior, advantages, log_proximal = unmasked(
        mask, log_prob, log_behavior, advantages, log_proximal)
    behavior_ratio = jnp.exp(sg(log_ratio(log_proximal, log_behavior)))
    behavior_weight = jnp.minimum(behavior_ratio, is_max)
    ratio = jnp.exp(log_ratio(log_prob, sg(log_proximal)))
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    loss = -masked_mean(behavior_weight * jnp.minimum(unclipped, clipped), mask)
    clipped_active = (jnp.abs(sg(ratio) - 1.0) > clip_eps).astype(ratio.dtype)
    return loss, {"clip_fraction": masked_mean(clipped_active, mask),
                  "behavior_capped_fraction": masked_mean(
                      (behavior_ratio > is_max).astype(ratio.dtype), mask)}


def ppo_kl(log_prob, log_behavior, advantages, *, kl, kl_coef, mask=None):
    """PPO with a KL penalty: `−E[wÂ] + β_KL · E[KL(ref ‖ π_θ)]`; `kl` is the per-sample analytic
    KL from the reference policy: β (the textbook form) or π_T, the policy before the update."""
    log_prob, log_behavior, advantages, kl = unmasked(mask, log_prob, log_behavior, advantages, kl)
    ratio = jnp.exp(log_ratio(log_prob, log_behavior))
    surrogate = masked_mean(ratio * advantages, mask)
    mean_kl = masked_mean(kl, mask)
    loss = -surrogate + kl_coef * mean_kl
    return loss, {"kl_penalty": sg(mean_kl), "kl_coef": kl_coef}


def spo(log_prob, log_behavior, advantages, *, eps, mask=None):
    """Simple Policy Optimization (Xie et al. 2025): `−E[wÂ − |Â|(w − 1)² / (2ε)]`."""
    log_prob, log_behavior, advantages = unmasked(mask, log_prob, log_behavior, advantages)
    ratio = jnp.exp(log_ratio(log_prob, log_behavior))
    objective = ratio * advantages - jnp.abs(advantages) * jnp.square(ratio - 1.0) / (2.0 * eps)
    return -masked_mean(objective, mask), {}


def impala_pg(log_prob, log_behavior, advantages, *, rho_bar, mask=None):
    """IMPALA's policy gradient `−E[sg(min(ρ̄, w) · Â) · log π_θ]`."""
    log_prob, log_behavior, advantages = unmasked(mask, log_prob, log_behavior, advantages)
    clipped_ratio = jnp.minimum(rho_bar, jnp.exp(sg(log_ratio(log_prob, log_behavior))))
    loss = -masked_mean(sg(clipped_ratio * advantages) * log_prob, mask)
    return loss, {}


def is_pg(log_prob, log_behavior, advantages, *, mask=None):
    """The importance-sampled policy gradient with no constraint: `−E[wÂ]`."""
    log_prob, log_behavior, advantages = unmasked(mask, log_prob, log_behavior, advantages)
    ratio = jnp.exp(log_ratio(log_prob, log_behavior))
    return -masked_mean(ratio * advantages, mask), {}


def tv_filter(log_prob, log_behavior, advantages, *, delta, log_reference=None,
              filter_mode="batch", is_max=jnp.inf, mask=None):
    """VACO's TV-filtered importance-sampled policy gradient (SPEC §3.2).

    ```
    r_i   = π_θ/q                      q = β (log_reference None), or
    r_i   = (π_θ − π_ref)/β + 1        the divergence from a reference policy (`tv_reference=learner`)
    D̂_TV = ½ mean_i |r_i − 1|
    batch:      keep_i = 1 if D̂_TV ≤ δ else [Â_i · sign(r_i − 1) ≤ 0]
    per_sample: keep_i = ¬(½|r_i − 1| > δ ∧ Â_i (r_i − 1) > 0)
    L_π  = −mean_i(keep_i · min(w_i, is_max) · Â_i)
    ```
    `r`, `D̂_TV` and `keep` carry no gradient. A dropped sample is exactly one whose gradient step
    would push its ratio further from 1 while the divergence is already above δ.
    """
    log_prob, log_behavior, advantages, log_reference = unmasked(
        mask, log_prob, log_behavior, advantages, log_reference)
    ratio = jnp.exp(log_ratio(log_prob, log_behavior))
    if log_reference is None:
        divergence_ratio = sg(ratio)
    else:
        divergence_ratio = sg(ratio - jnp.exp(log_ratio(log_reference, log_behavior)) + 1.0)
    deviation = divergence_ratio - 1.0
    tv_estimate = 0.5 * masked_mean(jnp.abs(deviation), mask)
    outward = advantages * jnp.sign(deviation) > 0
    if filter_mode == "batch":
        keep = jnp.logical_or(tv_estimate <= delta, ~outward)
    elif filter_mode == "per_sample":
        keep = ~jnp.logical_and(0.5 * jnp.abs(deviation) > delta, outward)
    else:
        raise ValueError(f"filter_mode must be 'batch' or 'per_sample', got {filter_mode!r}")
    keep = keep.astype(ratio.dtype)
    weight = jnp.minimum(ratio, is_max)
    loss = -masked_mean(keep * weight * advantages, mask)
    # `filter_tv` is the divergence the filter compared with δ: the total one (from β, equal to
    # the `tv_estimate` diagnostic) or, with a reference policy, the forward lag only.
    return loss, {
        "filter_tv": tv_estimate,
        "filtered_fraction": 1.0 - masked_mean(keep, mask),
    }


def value_loss(values, targets, mask=None):
    """`½ E[(V_φ(s) − v)²]` against fixed targets."""
    values, targets = unmasked(mask, values, targets)
    return 0.5 * masked_mean(jnp.square(values - sg(targets)), mask)
