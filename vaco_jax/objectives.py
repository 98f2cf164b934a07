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
    """PPO's clipped surrogate `−E[min(wÂ, clip(w, 1±ε)Â)]`. `clip_fraction`: `|w − 1| > ε`;
    `intervened_fraction`: the samples whose gradient the clip took away (`clip_binds`: outside
    the band on the side where the `min` picks the clipped term)."""
    log_prob, log_behavior, advantages = unmasked(mask, log_prob, log_behavior, advantages)
    ratio = jnp.exp(log_ratio(log_prob, log_behavior))
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    loss = -masked_mean(jnp.minimum(unclipped, clipped), mask)
    clipped_active = (jnp.abs(sg(ratio) - 1.0) > clip_eps).astype(ratio.dtype)
    binds = clip_binds(sg(ratio), advantages, 1.0 - clip_eps, 1.0 + clip_eps)
    return loss, {"clip_fraction": masked_mean(clipped_active, mask),
                  "intervened_fraction": masked_mean(binds.astype(ratio.dtype), mask)}


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
    `intervened_fraction`: samples whose gradient the clip took away (`clip_binds`) or whose
    weight was truncated (the union of its rules); `clip_fraction`: `|r − 1| > ε`.
    """
    log_prob, log_behavior, advantages, log_proximal = unmasked(
        mask, log_prob, log_behavior, advantages, log_proximal)
    behavior_ratio = jnp.exp(sg(log_ratio(log_proximal, log_behavior)))
    behavior_weight = jnp.minimum(behavior_ratio, is_max)
    surrogate, clipped_active, binds = _proximal_surrogate(log_prob, log_proximal, advantages,
                                                           clip_eps)
    loss = -masked_mean(behavior_weight * surrogate, mask)
    capped = behavior_ratio > is_max
    return loss, {"clip_fraction": masked_mean(clipped_active, mask),
                  "behavior_capped_fraction": masked_mean(capped.astype(surrogate.dtype), mask),
                  "intervened_fraction": masked_mean((capped | binds).astype(surrogate.dtype),
                                                     mask)}


def _proximal_surrogate(log_prob, log_proximal, advantages, clip_eps):
    """PPO's clipped surrogate of `r = π_θ/π_prox` per sample, `min(rÂ, clip(r, 1±ε)Â)`, where
    `r` is outside the clip's band (`|r − 1| > ε`, as a float) and where the clip takes the
    sample's gradient away (`clip_binds`, boolean): decoupled PPO's, IcePop's and M2PO's."""
    ratio = jnp.exp(log_ratio(log_prob, sg(log_proximal)))
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    clipped_active = (jnp.abs(sg(ratio) - 1.0) > clip_eps).astype(ratio.dtype)
    binds = clip_binds(sg(ratio), advantages, 1.0 - clip_eps, 1.0 + clip_eps)
    return jnp.minimum(unclipped, clipped), clipped_active, binds


def icepop(log_prob, log_behavior, advantages, *, log_proximal, clip_eps, low, high, mask=None):
    """IcePop / masked importance sampling (MIS; slime's `icepop_function`, verl's token-level
    rejection sampling): decoupled PPO whose behavioural weight is zeroed, not truncated, outside
    `[low, high]`:

    ```
    L = −E[ sg(ρ · 1[low ≤ ρ ≤ high]) · min(r Â, clip(r, 1±ε) Â) ],   ρ = π_T/β,  r = π_θ/π_T
    ```
    A sample the behaviour policy drew far from where π_T would (ρ out of range) contributes
    nothing, rather than a capped weight. With β = π_T (ρ = 1) this is `ppo_clip`.
    `intervened_fraction`: samples masked or whose gradient the clip took away (`clip_binds`;
    the union of its two rules); `clip_fraction`: `|r − 1| > ε`.
    """
    log_prob, log_behavior, advantages, log_proximal = unmasked(
        mask, log_prob, log_behavior, advantages, log_proximal)
    behavior_ratio = jnp.exp(sg(log_ratio(log_proximal, log_behavior)))
    inside = (behavior_ratio >= low) & (behavior_ratio <= high)
    behavior_weight = jnp.where(inside, behavior_ratio, 0.0)
    surrogate, clipped_active, binds = _proximal_surrogate(log_prob, log_proximal, advantages,
                                                           clip_eps)
    loss = -masked_mean(behavior_weight * surrogate, mask)
    return loss, {"masked_fraction": masked_mean((~inside).astype(surrogate.dtype), mask),
                  "clip_fraction": masked_mean(clipped_active, mask),
                  "intervened_fraction": masked_mean(
                      ((~inside) | binds).astype(surrogate.dtype), mask)}


def cispo(log_prob, log_behavior, advantages, *, eps_low, eps_high, mask=None):
    """CISPO (MiniMax-M1, arXiv 2506.13585; verl's and slime's `cispo`): the importance weight is
    clipped and its gradient stopped, so every sample keeps its policy-gradient direction:

    ```
    L = −E[ sg(clip(w, 1 − ε_low, 1 + ε_high)) · Â · log π_θ ],   w = π_θ/β
    ```
    `truncated_fraction`: samples whose weight the clip changed."""
    log_prob, log_behavior, advantages = unmasked(mask, log_prob, log_behavior, advantages)
    ratio = jnp.exp(sg(log_ratio(log_prob, log_behavior)))
    weight = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = -masked_mean(weight * advantages * log_prob, mask)
    truncated = (ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high)
    return loss, {"truncated_fraction": masked_mean(truncated.astype(ratio.dtype), mask)}


def dppo_tv(log_prob, log_behavior, advantages, *, delta, penalty, discrete=True, mask=None):
    """DPPO's binary-TV trust region (Qi et al., arXiv 2602.04879; prime-rl's default loss):
    drop a sample whose update already moved its action's probability more than δ in the
    direction its advantage pushes, plus a small `(log w)²` penalty on every sample:

    ```
    g    = π_θ(a) − β(a)                       discrete actions and tokens (probabilities)
    g    = ½ (w − 1)                           continuous actions (densities; see below)
    drop = (Â > 0 ∧ g > δ) ∨ (Â < 0 ∧ g < −δ)
    L    = −E[ (1 − drop) · w · Â ] + τ · E[ (log w)² ],   w = π_θ/β
    ```
    `g` carries no gradient. The discrete `g = β(a)(w − 1)` is the TV distance of the two policies
    coarsened to {a, not a}; a density gives no probability of a single action (every one has
    probability 0, and that coarsening is empty). The continuous `g` is the sample's own term of
    `D_TV = ½ E_β|w − 1|` (which holds for densities as for probabilities), signed: the
    single-sample estimate of the same divergence, positive exactly when the update raised the
    action's likelihood, as the discrete g is. On continuous actions the mask is then VACO's
    per-sample filter (`tv_filter`, `filter_mode="per_sample"`). `discrete` is static
    (`PolicyInputs.discrete`).
    """
    log_prob, log_behavior, advantages = unmasked(mask, log_prob, log_behavior, advantages)
    log_ratio_ = log_ratio(log_prob, log_behavior)
    ratio = jnp.exp(log_ratio_)
    if discrete:
        gap = sg(jnp.exp(log_prob) - jnp.exp(log_behavior))
    else:
        gap = sg(0.5 * (ratio - 1.0))
    drop = ((advantages > 0) & (gap > delta)) | ((advantages < 0) & (gap < -delta))
    keep = (~drop).astype(ratio.dtype)
    loss = (-masked_mean(keep * ratio * advantages, mask)
            + penalty * masked_mean(jnp.square(log_ratio_), mask))
    # prime-rl counts a sample with Â = 0 under the rule for Â < 0 (its `is_masked`); the loss
    # is the same either way (its term is 0), so only the reported fraction reads it.
    masked = jnp.where(advantages > 0, gap > delta, gap < -delta)
    return loss, {"masked_fraction": masked_mean(masked.astype(ratio.dtype), mask)}


def second_moment_mask(log_proximal, log_behavior, tau, mask=None):
    """M2PO's mask (AReaL): leave out the samples with the largest `(log β − log π_T)²` until the
    mean of the rest is at most τ (at least one sample is kept). `mask` entries are neither
    counted nor kept out. One sort, no loop over the data: the suffix means of the sorted values
    fall as the largest are removed, and the first one at most τ says how many to remove.
    Returns `keep`, a boolean array of the inputs' shape."""
    shape = jnp.shape(log_behavior)
    second_moment = jnp.square(sg(log_ratio(log_proximal, log_behavior))).reshape(-1)
    valid = (jnp.ones(second_moment.shape, bool) if mask is None
             else (jnp.asarray(mask) > 0).reshape(-1))
    order = jnp.argsort(jnp.where(valid, -second_moment, jnp.inf), stable=True)  # largest first
    ordered = jnp.where(valid[order], second_moment[order], 0.0)
    count = jnp.sum(valid)
    position = jnp.arange(ordered.shape[0])
    suffix_mean = jnp.cumsum(ordered[::-1])[::-1] / jnp.maximum(count - position, 1)
    small_enough = (suffix_mean <= tau) & (position < count)
    num_removed = jnp.where(jnp.any(small_enough), jnp.argmax(small_enough),
                            jnp.maximum(count - 1, 0))
    rank = jnp.zeros_like(position).at[order].set(position)
    return (rank >= num_removed).reshape(shape)


def m2po(log_prob, log_behavior, advantages, *, log_proximal, clip_eps, tau, cap,
         over_kept=1.0, truncate=0.0, mask=None):
    """M2PO (Zheng et al. 2025, arXiv 2510.01161; AReaL's `m2_threshold`): `second_moment_mask`,
    then AReaL's decoupled PPO loss on the kept samples. As AReaL runs it (the defaults):

    ```
    L = −(1/N_kept) Σ_kept sg(ρ · 1[ρ ≤ cap]) · min(r Â, clip(r, 1±ε) Â),   ρ = π_T/β,  r = π_θ/π_T
    ```
    averaged over the kept samples (AReaL's `loss_mask` count after the M2PO mask) and with a
    weight above `cap` zeroed (AReaL's `behav_imp_weight_cap`: masked, not truncated; a zeroed
    sample still counts in N_kept). `over_kept = 0` averages over all N samples instead (the M2PO
    paper's `1/Σ|o_i|`: a masked sample counts as a zero); `truncate = 1` caps the weight at
    `min(ρ, cap)` instead of zeroing it (decoupled PPO's cap). Both are switches (0 or 1), traced
    leaves like the rest. With nothing masked and nothing above the cap (e.g. β = π_T) this is
    `decoupled_ppo`.

    Metrics: `masked_fraction` (the M2PO mask), `capped_fraction` (weights the cap zeroed or
    truncated), `clip_fraction` (`|r − 1| > ε`) and `intervened_fraction`: the union of the mask,
    the cap and the samples whose gradient the clip took away (`clip_binds`)."""
    log_prob, log_behavior, advantages, log_proximal = unmasked(
        mask, log_prob, log_behavior, advantages, log_proximal)
    keep = second_moment_mask(log_proximal, log_behavior, tau, mask)
    behavior_ratio = jnp.exp(sg(log_ratio(log_proximal, log_behavior)))
    above_cap = behavior_ratio > cap
    behavior_weight = jnp.where(above_cap, jnp.where(truncate > 0, cap, 0.0), behavior_ratio)
    surrogate, clipped_active, binds = _proximal_surrogate(log_prob, log_proximal, advantages,
                                                           clip_eps)
    kept_terms = jnp.where(keep, behavior_weight * surrogate, 0.0)
    valid = jnp.ones(keep.shape, bool) if mask is None else jnp.asarray(mask) > 0
    count = jnp.where(over_kept > 0, jnp.sum(keep & valid), jnp.sum(valid)).astype(surrogate.dtype)
    loss = -jnp.sum(jnp.where(valid, kept_terms, 0.0)) / jnp.maximum(count, 1.0)
    dtype = surrogate.dtype
    return loss, {"masked_fraction": masked_mean((~keep).astype(dtype), mask),
                  "capped_fraction": masked_mean(above_cap.astype(dtype), mask),
                  "clip_fraction": masked_mean(clipped_active, mask),
                  "intervened_fraction": masked_mean(
                      ((~keep) | above_cap | binds).astype(dtype), mask)}


def topr(log_prob, log_behavior, advantages, *, threshold=0.0, mask=None):
    """TOPR (Le Roux et al. 2025, arXiv 2503.14286; Trinity-RFT's `topr`): truncated importance
    weights for the samples to push down, none for those to push up:

    ```
    L = −E[ sg(α) · Â · log π_θ ],   α = clip(π_θ/β, 0, 1) where Â ≤ threshold, else 1
    ```
    `truncated_fraction`: samples with Â ≤ threshold whose weight the clip lowered (w > 1)."""
    log_prob, log_behavior, advantages = unmasked(mask, log_prob, log_behavior, advantages)
    ratio = jnp.exp(sg(log_ratio(log_prob, log_behavior)))
    negative = advantages <= threshold
    alpha = jnp.where(negative, jnp.clip(ratio, 0.0, 1.0), 1.0)
    loss = -masked_mean(alpha * advantages * log_prob, mask)
    truncated = negative & (ratio > 1.0)
    return loss, {"truncated_fraction": masked_mean(truncated.astype(ratio.dtype), mask)}


def geppo(log_prob, log_behavior, advantages, *, log_proximal, clip_eps, eps_mult=None,
          mask=None):
    """GePPO's objective (Queeney, Paschalidis, Cassandras 2021, "Generalized Proximal Policy
    Optimization with Sample Reuse"; the authors' `jqueeney/geppo`, `_get_neg_pg`): PPO's clip of
    `w = π_θ/β`, centred on `π_T/β` instead of 1, so the update stays within ε (in TV terms) of the
    learner π_T whatever the data's staleness:

    ```
    L = −E[ min(w Â, clip(w, c − ε, c + ε) Â) ],   c = sg(π_T/β)
    ```
    With β = π_T (c = 1) this is `ppo_clip`, bit for bit. The algorithm `geppo` adds the rest of
    the authors' method around it (V-trace advantages, `geppo_advantages`,
    `geppo_learning_rate_scale`, ε = `clip_eps · eps_mult`, its `geppo_eps_mult`); `geppo_clip`
    is this alone (no `eps_mult`: ε = `clip_eps`). `clip_fraction`: `|w − c| > ε`;
    `intervened_fraction`: the samples whose gradient the clip took away (`clip_binds`)."""
    if eps_mult is not None:
        clip_eps = clip_eps * eps_mult
    log_prob, log_behavior, advantages, log_proximal = unmasked(
        mask, log_prob, log_behavior, advantages, log_proximal)
    ratio = jnp.exp(log_ratio(log_prob, log_behavior))
    centre = jnp.exp(sg(log_ratio(log_proximal, log_behavior)))
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, centre - clip_eps, centre + clip_eps) * advantages
    loss = -masked_mean(jnp.minimum(unclipped, clipped), mask)
    clipped_active = (jnp.abs(sg(ratio) - centre) > clip_eps).astype(ratio.dtype)
    binds = clip_binds(sg(ratio), advantages, centre - clip_eps, centre + clip_eps)
    return loss, {"clip_fraction": masked_mean(clipped_active, mask),
                  "intervened_fraction": masked_mean(binds.astype(ratio.dtype), mask)}


def geppo_advantages(advantages, log_behavior, log_proximal, mask=None):
    """GePPO's advantage normalisation (the authors' `adv_center`, `adv_scale`), per minibatch:
    centred on the mean weighted by `ρ = π_T/β` and scaled by the standard deviation of `ρ Â`:

    ```
    Â' = (Â − E[ρ Â] / E[ρ]) / (std(ρ Â) + 1e-8)
    ```
    `ρ` carries no gradient. With β = π_T (ρ = 1) this is the plain `(Â − mean) / (std + 1e-8)`."""
    advantages, log_behavior, log_proximal = unmasked(mask, advantages, log_behavior,
                                                      log_proximal)
    ratio = jnp.exp(sg(log_ratio(log_proximal, log_behavior)))
    weighted = ratio * advantages
    centre = masked_mean(weighted, mask) / masked_mean(ratio, mask)
    spread = jnp.sqrt(masked_mean(jnp.square(weighted - masked_mean(weighted, mask)), mask))
    return (advantages - centre) / (spread + 1e-8)


def geppo_learning_rate_scale(scale, tv, *, eps, factor, max_threshold, min_threshold):
    """GePPO's adaptive learning rate (the authors' `adapt_lr`, on by default): after each update,
    divide the actor's learning rate by `1 + factor` when the update's TV from π_T exceeds
    `max_threshold · ε/2`, multiply it by `1 + factor` when the TV is below `min_threshold · ε/2`
    (the authors' defaults 0.03, 1 and 0: it only ever falls), with no bound. `scale` is the
    learning rate relative to the configured one; `tv = ½ E|π_θ/β − π_T/β|` on the whole batch
    after the update (`diagnostics.tv_forward`)."""
    grow = 1.0 + factor
    return jnp.where(tv > max_threshold * 0.5 * eps, scale / grow,
                     jnp.where(tv < min_threshold * 0.5 * eps, scale * grow, scale))


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


def clip_binds(ratio, advantages, low, high):
    """Where PPO's clip takes a sample's gradient away: `clip(ratio, low, high) · Â` is the
    smaller term of the `min`, i.e. `Â > 0` with `ratio > high` or `Â < 0` with `ratio < low`
    (a boolean array; `ratio` should carry no gradient). Outside the range on the other side
    the unclipped term is the smaller one and the gradient is unchanged."""
    return ((advantages > 0) & (ratio > high)) | ((advantages < 0) & (ratio < low))


def gspo(log_prob, log_behavior, advantages, *, eps_low, eps_high, mask=None):
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071; verl's
    `gspo` policy loss): PPO's clip on a sequence-level ratio, the geometric mean of the
    sequence's token ratios, averaged over each sequence's tokens, then over the sequences:

    ```
    s_i  = exp(mean_t log w_it),   w = π_θ/β           (t over sequence i's tokens)
    s_it = sg(s_i) · π_θ(y_it) / sg(π_θ(y_it))        (value s_i, gradient s_i ∇log π_θ(y_it))
    L    = −mean_i mean_t min(s_it Â_it, clip(s_it, 1 − ε_low, 1 + ε_high) Â_it)
    ```
    Arrays are `[..., L]`: the last axis holds one sequence (the LLM's answers `[B, L]`, `mask`
    their tokens); a sequence without tokens is left out. A sequence's term has the gradient of
    `min(s_i Â, clip(s_i) Â)` (for Â shared by its tokens, as GRPO's): its tokens are clipped
    together. With one-token sequences and ε_low = ε_high = ε this is `ppo_clip`.
    `intervened_fraction`: tokens whose gradient the sequence's clip took away (`clip_binds`);
    `clip_fraction`: tokens whose sequence ratio is outside `[1 − ε_low, 1 + ε_high]`.
    """
    log_prob, log_behavior, advantages = unmasked(mask, log_prob, log_behavior, advantages)
    shape = jnp.shape(log_prob)
    keep = (jnp.ones(shape, bool) if mask is None
            else jnp.broadcast_to(jnp.asarray(mask) > 0, shape))
    tokens = jnp.sum(keep, axis=-1)
    mean_log_ratio = (jnp.sum(jnp.where(keep, sg(log_ratio(log_prob, log_behavior)), 0.0), -1)
                      / jnp.maximum(tokens, 1))
    # log π_θ − sg(log π_θ): value 0, gradient ∇log π_θ (clipped to finite, as in `log_ratio`).
    largest = float(jnp.finfo(jnp.result_type(log_prob)).max)
    finite = jnp.clip(log_prob, -largest, largest)
    ratio = jnp.exp(mean_log_ratio[..., None] + (finite - sg(finite)))
    low, high = 1.0 - eps_low, 1.0 + eps_high
    per_token = jnp.minimum(ratio * advantages, jnp.clip(ratio, low, high) * advantages)
    per_sequence = jnp.sum(jnp.where(keep, per_token, 0.0), -1) / jnp.maximum(tokens, 1)
    has_tokens = tokens > 0
    loss = -(jnp.sum(jnp.where(has_tokens, per_sequence, 0.0))
             / jnp.maximum(jnp.sum(has_tokens), 1))
    binds = clip_binds(sg(ratio), advantages, low, high)
    outside = (sg(ratio) < low) | (sg(ratio) > high)
    return loss, {"clip_fraction": masked_mean(outside.astype(per_token.dtype), mask),
                  "intervened_fraction": masked_mean(binds.astype(per_token.dtype), mask)}


def value_loss(values, targets, mask=None):
    """`½ E[(V_φ(s) − v)²]` against fixed targets."""
    values, targets = unmasked(mask, values, targets)
    return 0.5 * masked_mean(jnp.square(values - sg(targets)), mask)
