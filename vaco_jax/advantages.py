"""Advantage estimators (SPEC §3.1), time-major and batched: every array is `[T, B]`.

Conventions (the same for both estimators):
  * `values[t] = V(s_t)`, `next_values[t] = V(s'_t)`, where `s'_t` is the *true* next observation
    (at a time-limit truncation: the final observation of the episode, not the reset one).
  * `terminated[t]`: step t ended the episode in a terminal state (no bootstrap).
  * `truncated[t]`: step t ended the episode by the time limit (bootstrap from `V(s'_t)`, but the
    recursion must not run into the next episode).
  * `V(s_T)` after the last step is `next_values[T - 1]` (equal to it whenever step T-1 did not end
    the episode, and unused when it did).
  * A terminal step's next value is never read (`where`, not a product with `1 − terminated`): the
    final observation of an episode that ended in a physics blow-up may be NaN, and `0 · NaN`
    would poison every advantage before it.
Both are one reverse `lax.scan` over T on whole `[B]` rows (no per-sequence vmap).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def gae(rewards, values, next_values, terminated, truncated, *, gamma, lambda_):
    """GAE(λ) advantages `[T, B]` with truncation handled by bootstrapping from `V(s'_t)`.

    `A_t = δ_t + γ_t λ (1 − truncated_t) A_{t+1}`, `δ_t = r_t + γ_t V(s'_t) − V(s_t)`,
    `γ_t = γ (1 − terminated_t)`.
    """
    discounts = gamma * (1.0 - terminated.astype(values.dtype))
    deltas = rewards + discounts * bootstrap_values(next_values, terminated) - values
    trace = discounts * lambda_ * (1.0 - truncated.astype(values.dtype))

    def step(next_advantage, xs):
        delta_t, trace_t = xs
        advantage = delta_t + trace_t * next_advantage
        return advantage, advantage

    _, advantages = jax.lax.scan(step, jnp.zeros_like(values[0]), (deltas, trace), reverse=True)
    return advantages


def vtrace(log_rhos, rewards, values, next_values, terminated, truncated, *, gamma, lambda_,
           clip_rho=1.0, clip_c=1.0):
    """V-trace value targets and realigned advantages, both `[T, B]` (SPEC §3.1).

    ```
    ρ_t = min(ρ̄, e^{log ρ_t})        c_t = λ · min(c̄, e^{log ρ_t})
    δ_t = ρ_t (r_t + γ_t V(s'_t) − V(s_t))
    v_t = V(s_t) + δ_t + γ_t c_t (1 − truncated_t)(v_{t+1} − V(s_{t+1}))
    Â_t = r_t + γ_t (λ v'_t + (1 − λ) V(s'_t)) − V(s_t),   v'_t = v_{t+1}, or V(s'_t) after truncation
    ```
    `log_rhos = log π(a_t|s_t) − log β(a_t|s_t)`. With `log_rhos = 0`, `Â` equals `gae(...)`.
    Returns `(targets, advantages)`; neither carries gradient.
    """
    log_rhos, values, next_values = jax.lax.stop_gradient((log_rhos, values, next_values))
    next_values = bootstrap_values(next_values, terminated)
    dtype = values.dtype
    not_truncated = 1.0 - truncated.astype(dtype)
    discounts = gamma * (1.0 - terminated.astype(dtype))
    rhos = jnp.exp(log_rhos)
    clipped_rhos = jnp.minimum(clip_rho, rhos)
    cs = lambda_ * jnp.minimum(clip_c, rhos)
    deltas = clipped_rhos * (rewards + discounts * next_values - values)
    trace = discounts * cs * not_truncated

    def step(next_correction, xs):  # correction_t = v_t − V(s_t)
        delta_t, trace_t = xs
        correction = delta_t + trace_t * next_correction
        return correction, correction

    _, corrections = jax.lax.scan(step, jnp.zeros_like(values[0]), (deltas, trace), reverse=True)
    targets = values + corrections
    # v_{t+1} for t < T-1; v_T = V(s_T) = next_values[T-1].
    next_targets = jnp.concatenate([targets[1:], next_values[-1:]], axis=0)
    bootstrap = jnp.where(truncated.astype(bool), next_values, next_targets)
    advantages = rewards + discounts * (lambda_ * bootstrap + (1.0 - lambda_) * next_values) - values
    return targets, advantages


def bootstrap_values(next_values, terminated):
    """`V(s'_t)` where step t did not terminate, 0 where it did (so a NaN there is never read)."""
    return jnp.where(terminated.astype(bool), 0.0, next_values)
