"""`intervened_fraction` has one meaning for every objective (docs/diagnostics.md): the share of
samples whose gradient one of the objective's rules changed. For PPO's clip that is a sample
whose ratio is outside the band on the side where the `min` picks the clipped term
(`Â > 0` and `r > 1 + ε`, or `Â < 0` and `r < 1 − ε`); outside the band on the other side the
unclipped term is the smaller one and the gradient is unchanged. Checked by hand on one-token
samples, where PPO-Clip and GSPO are the same objective; and the losses and gradients are the
hand-computed ones (the diagnostic changes nothing else)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vaco_jax import algorithms, diagnostics

EPS = 0.2
# Seven one-token samples, written with w = π_θ/β (ε = 0.2):
#   w  = 1.5   1.5   0.5   0.5   1.1   0.7   1.3
#   Â  = 1.0  −1.0   1.0  −1.0   2.0   0.0   0.5
#   |w − 1| > ε:     0, 1, 2, 3, 5, 6  (6 of 7: the clip's band, `clip_fraction`)
#   gradient removed: 0 (Â > 0, w > 1.2), 3 (Â < 0, w < 0.8), 6 (Â > 0, w > 1.2): 3 of 7
RATIO = np.array([1.5, 1.5, 0.5, 0.5, 1.1, 0.7, 1.3])
ADVANTAGES = np.array([1.0, -1.0, 1.0, -1.0, 2.0, 0.0, 0.5], np.float32)
BINDS = np.array([1, 0, 0, 1, 0, 0, 1], bool)
LOG_B = np.log(np.array([0.2, 0.4, 0.5, 0.6, 0.3, 0.5, 0.1])).astype(np.float32)
LOG_P = (LOG_B + np.log(RATIO)).astype(np.float32)


def run(name, log_prob, log_behavior, advantages, *, log_proximal=None, own=(), **params):
    """A registered objective's loss, its gradient w.r.t. log π_θ, its metrics and the
    `intervened_fraction` a run logs of them."""
    objective = algorithms.parse(name).objective
    p = algorithms.ObjectiveParams(**params, own={**objective.defaults, **dict(own)})

    def loss(lp):
        return objective(algorithms.PolicyInputs(
            lp, jnp.asarray(log_behavior), jnp.asarray(advantages),
            log_proximal=None if log_proximal is None else jnp.asarray(log_proximal)), p)
    (value, metrics), grad = jax.value_and_grad(loss, has_aux=True)(jnp.asarray(log_prob))
    metrics = {k: float(v) for k, v in metrics.items()}
    return (float(value), np.asarray(grad), metrics,
            float(diagnostics.intervened_fraction(metrics)["intervened_fraction"]))


def test_ppo_clip_and_gspo_count_the_samples_whose_gradient_the_clip_removed():
    _, _, ppo_metrics, ppo = run("ppo_clip", LOG_P, LOG_B, ADVANTAGES, clip_eps=EPS)
    _, _, _, gspo = run("gspo", LOG_P[:, None], LOG_B[:, None], ADVANTAGES[:, None],
                        own={"gspo_eps_low": EPS, "gspo_eps_high": EPS})
    assert ppo == pytest.approx(3 / 7) == gspo
    # `clip_fraction` keeps its meaning: the ratio outside the band, whichever term the min picks.
    assert ppo_metrics["clip_fraction"] == pytest.approx(6 / 7)


@pytest.mark.parametrize("name", ["decoupled_ppo", "tis", "icepop", "m2po", "gae+geppo_clip",
                                  "geppo"])
def test_every_clip_counts_the_same_samples_when_the_learner_is_the_behaviour(name):
    # π_T = β: no weight is masked, capped or truncated, each clip is PPO's (GePPO's centre is
    # 1), so each intervened on the samples PPO-Clip did.
    own = {"geppo_eps_mult": 1.0} if name == "geppo" else {}
    _, _, _, intervened = run(name, LOG_P, LOG_B, ADVANTAGES, log_proximal=LOG_B, clip_eps=EPS,
                              decoupled_is_max=2.0, own=own)
    assert intervened == pytest.approx(3 / 7)


def test_decoupled_ppo_counts_the_truncated_weights_and_the_binding_clip_once():
    # Six samples (ε = 0.2, C = 2), probabilities:
    #   π_T/β   = 3.0   1.0   0.4   1.25  0.167 1.0    → sample 0's weight truncated at 2
    #   π_θ/π_T = 1.1   1.5   0.85  1.0   1.4   0.5    → outside the band: 1, 4, 5
    #   Â       = 1.0  −2.0   0.5  −1.0   2.0  −0.5    → the clip binds on 4 and 5 only
    behavior = np.array([0.10, 0.40, 0.50, 0.20, 0.30, 0.60])
    proximal = np.array([0.30, 0.40, 0.20, 0.25, 0.05, 0.60])
    learner = np.array([0.33, 0.60, 0.17, 0.25, 0.07, 0.30])
    advantages = np.array([1.0, -2.0, 0.5, -1.0, 2.0, -0.5], np.float32)
    log_b, log_t, log_p = (np.log(p).astype(np.float32) for p in (behavior, proximal, learner))
    value, grad, metrics, intervened = run("decoupled_ppo", log_p, log_b, advantages,
                                           log_proximal=log_t, clip_eps=EPS, decoupled_is_max=2.0)
    assert intervened == pytest.approx(3 / 6)                        # {0} ∪ {4, 5}
    assert metrics["clip_fraction"] == pytest.approx(3 / 6)          # {1, 4, 5}: the band
    assert metrics["behavior_capped_fraction"] == pytest.approx(1 / 6)
    # The loss and its gradient, by hand: weight min(π_T/β, 2), the clip's term where it binds.
    r, weight = learner / proximal, np.minimum(proximal / behavior, 2.0)
    binds = np.array([0, 0, 0, 0, 1, 1], bool)
    clipped = np.clip(r, 1 - EPS, 1 + EPS)
    assert value == pytest.approx(-np.mean(weight * np.where(binds, clipped, r) * advantages),
                                  rel=1e-5)
    np.testing.assert_allclose(grad, -weight * r * advantages * ~binds / 6, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "decoupled_ppo", "icepop", "m2po",
                                  "gae+geppo_clip"])
def test_the_losses_and_gradients_are_the_hand_computed_ones(name):
    # On the seven samples (π_T = β): L = −mean(min(wÂ, clip(w)Â)); its gradient w.r.t. log π_θ
    # is −wÂ/N where the clip does not bind and 0 where it does.
    gspo = name == "gspo"
    value, grad, _, _ = run(
        name, LOG_P[:, None] if gspo else LOG_P, LOG_B[:, None] if gspo else LOG_B,
        ADVANTAGES[:, None] if gspo else ADVANTAGES, log_proximal=None if gspo else LOG_B,
        clip_eps=EPS, decoupled_is_max=2.0,
        own={"gspo_eps_low": EPS, "gspo_eps_high": EPS} if gspo else {})
    clipped = np.clip(RATIO, 1 - EPS, 1 + EPS)
    assert value == pytest.approx(-np.mean(np.minimum(RATIO * ADVANTAGES, clipped * ADVANTAGES)),
                                  rel=1e-5)
    np.testing.assert_allclose(np.ravel(grad), -RATIO * ADVANTAGES * ~BINDS / 7, rtol=1e-5,
                               atol=1e-8)
