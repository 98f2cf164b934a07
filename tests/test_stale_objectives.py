"""The stale-data objectives of other asynchronous RL systems (docs/SPEC.md, "Stale-data objectives
of other systems"): IcePop, CISPO, DPPO's binary TV, M2PO, TOPR, GePPO.

Each is checked against a per-sample Python loop over one small batch of six samples, written with
probabilities so the numbers can be read (ε = 0.2):

    β    = 0.10  0.40  0.50  0.20  0.30  0.60      behaviour policy
    π_T  = 0.30  0.40  0.20  0.25  0.05  0.60      learner at the start of the iteration
    π_θ  = 0.33  0.60  0.17  0.25  0.07  0.30      policy being optimised
    Â    = 1.0  −2.0   0.5  −1.0   2.0  −0.5

    π_T/β = 3.0   1.0   0.4   1.25  0.167 1.0     (IcePop masks samples 0, 2, 4)
    π_θ/π_T = 1.1 1.5   0.85  1.0   1.4   0.5     (clip active on 1, 4, 5)
    π_θ/β = 3.3   1.5   0.34  1.25  0.233 0.5
    π_θ − β = 0.23 0.2 −0.33  0.05 −0.23 −0.3     (DPPO drops 0 (Â > 0) and 5 (Â < 0))

then on the on-policy batch each must reduce to (β = π_T, or β = π_T = π_θ), and with padding
entries that hold NaN or −inf.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vaco_jax import Trainer, algorithms, objectives
from vaco_jax.config import Config
from vaco_jax.errors import ConfigError

EPS = 0.2
BEHAVIOR = np.array([0.10, 0.40, 0.50, 0.20, 0.30, 0.60])
PROXIMAL = np.array([0.30, 0.40, 0.20, 0.25, 0.05, 0.60])
LEARNER = np.array([0.33, 0.60, 0.17, 0.25, 0.07, 0.30])
ADVANTAGES = np.array([1.0, -2.0, 0.5, -1.0, 2.0, -0.5], np.float32)
LOG_B, LOG_T, LOG_P = (np.log(p).astype(np.float32) for p in (BEHAVIOR, PROXIMAL, LEARNER))
N = len(ADVANTAGES)
NEW = ("icepop", "cispo", "dppo_tv", "m2po", "topr", "geppo")


def value_and_grad(fn, log_prob=LOG_P, **kwargs):
    """The objective's loss, its gradient w.r.t. log π_θ and its metrics."""
    (loss, metrics), grad = jax.value_and_grad(lambda lp: fn(lp, **kwargs), has_aux=True)(
        jnp.asarray(log_prob))
    return float(loss), np.asarray(grad), {k: float(v) for k, v in metrics.items()}


def ppo_term(r, a, low, high):
    """min(r a, clip(r, low, high) a) and whether the unclipped term is the one taken."""
    clipped = min(max(r, low), high)
    return min(r * a, clipped * a), r * a < clipped * a or low < r < high


def per_sample(loss_terms, grad_terms):
    return sum(loss_terms) / N, np.array(grad_terms) / N


# --- hand computations ----------------------------------------------------------------------------
def weighted_ppo_by_hand(weights):
    """Per-sample loss and gradient of PPO's clipped surrogate around π_T (r = π_θ/π_T), each
    sample scaled by its behavioural weight: decoupled PPO's form, shared by IcePop and M2PO."""
    losses, grads = [], []
    for weight, t, p, a in zip(weights, PROXIMAL, LEARNER, ADVANTAGES):
        r = p / t
        term, unclipped = ppo_term(r, a, 1 - EPS, 1 + EPS)
        losses.append(-weight * term)
        grads.append(-weight * r * a if unclipped else 0.0)
    return per_sample(losses, grads)


def test_icepop_by_hand():
    # zeroed outside the bounds, not capped
    weights = [t / b if 0.5 <= t / b <= 2.0 else 0.0 for b, t in zip(BEHAVIOR, PROXIMAL)]
    masked = sum(w == 0.0 for w in weights)
    expected_loss, expected_grad = weighted_ppo_by_hand(weights)
    loss, grad, metrics = value_and_grad(
        objectives.icepop, log_behavior=LOG_B, advantages=ADVANTAGES, log_proximal=LOG_T,
        clip_eps=EPS, low=0.5, high=2.0)
    assert masked == 3 and metrics["masked_fraction"] == pytest.approx(0.5)
    assert metrics["clip_fraction"] == pytest.approx(3 / 6)          # r = 1.5, 1.4, 0.5
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-7)
    assert np.all(grad[[0, 2, 4]] == 0.0) and np.all(grad[[1, 3]] != 0.0)


def test_cispo_by_hand():
    losses, grads = [], []
    for b, p, a, lp in zip(BEHAVIOR, LEARNER, ADVANTAGES, LOG_P):
        weight = min(max(p / b, 1 - 1.0), 1 + 0.28)
        losses.append(-weight * a * lp)
        grads.append(-weight * a)                  # every sample keeps its gradient
    expected_loss, expected_grad = per_sample(losses, grads)
    loss, grad, metrics = value_and_grad(objectives.cispo, log_behavior=LOG_B,
                                         advantages=ADVANTAGES, eps_low=1.0, eps_high=0.28)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5)
    assert np.all(grad != 0.0)
    assert metrics["truncated_fraction"] == pytest.approx(2 / 6)     # w = 3.3, 1.5 > 1.28
    # A lower bound truncates from below too: w = 0.34, 0.233, 0.5 < 0.8.
    _, _, metrics = value_and_grad(objectives.cispo, log_behavior=LOG_B, advantages=ADVANTAGES,
                                   eps_low=0.2, eps_high=0.28)
    assert metrics["truncated_fraction"] == pytest.approx(5 / 6)


def test_dppo_tv_by_hand_on_probabilities():
    tau, delta = 0.01, 0.2
    losses, grads, dropped = [], [], []
    for b, p, a in zip(BEHAVIOR, LEARNER, ADVANTAGES):
        gap, w = p - b, p / b
        drop = (a > 0 and gap > delta) or (a < 0 and gap < -delta)
        dropped.append(drop)
        losses.append(-(0.0 if drop else w * a) + tau * math.log(w) ** 2)
        grads.append(-(0.0 if drop else w * a) + tau * 2 * math.log(w))
    expected_loss, expected_grad = per_sample(losses, grads)
    assert dropped == [True, False, False, False, False, True]
    loss, grad, metrics = value_and_grad(objectives.dppo_tv, log_behavior=LOG_B,
                                         advantages=ADVANTAGES, delta=delta, penalty=tau)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5)
    assert metrics["masked_fraction"] == pytest.approx(2 / 6)
    # The ratio would have dropped other samples: sample 4's w = 0.23 is far below 1, but its
    # probability moved by 0.23 the way its advantage does not push (Â > 0, g < 0).
    assert grad[4] != 0.0


def test_dppo_tv_on_densities_is_the_per_sample_tv_filter_plus_its_penalty():
    # Log-densities of continuous actions: g = ½(w − 1), VACO's per-sample filter on w = π_θ/β.
    rng = np.random.default_rng(0)
    log_b = rng.normal(size=64).astype(np.float32) + 2.0             # densities above 1
    log_p = (log_b + 0.8 * rng.normal(size=64)).astype(np.float32)
    adv = rng.normal(size=64).astype(np.float32)
    delta = 0.2
    loss, grad, metrics = value_and_grad(objectives.dppo_tv, log_p, log_behavior=log_b,
                                         advantages=adv, delta=delta, penalty=0.0,
                                         discrete=False)
    f_loss, f_grad, f_metrics = value_and_grad(objectives.tv_filter, log_p, log_behavior=log_b,
                                               advantages=adv, delta=delta,
                                               filter_mode="per_sample")
    assert 0.0 < metrics["masked_fraction"] < 1.0
    assert metrics["masked_fraction"] == pytest.approx(f_metrics["filtered_fraction"])
    assert loss == pytest.approx(f_loss, rel=1e-6)
    np.testing.assert_allclose(grad, f_grad, rtol=1e-6)
    # Read as probabilities, these densities (e^2 ≈ 7) would give nonsense gaps: a different mask.
    _, _, as_probabilities = value_and_grad(objectives.dppo_tv, log_p, log_behavior=log_b,
                                            advantages=adv, delta=delta, penalty=0.0)
    assert as_probabilities["masked_fraction"] != metrics["masked_fraction"]


def m2_keep_by_loop(log_t, log_b, tau):
    """M2PO's mask by the definition: remove the largest (log β − log π_T)² one at a time while
    the mean of the rest exceeds τ, keeping at least one."""
    m2 = [(float(b) - float(t)) ** 2 for b, t in zip(log_b, log_t)]
    kept = list(range(len(m2)))
    while len(kept) > 1 and sum(m2[i] for i in kept) / len(kept) > tau:
        kept.remove(max(kept, key=lambda i: m2[i]))
    return np.isin(np.arange(len(m2)), kept)


def test_m2po_by_hand():
    # (log β − log π_T)² = 1.207, 0, 0.840, 0.050, 3.210, 0; suffix means of the sorted values
    # 0.884, 0.419, 0.222, 0.017, 0, 0: τ = 0.3 removes two, τ = 0.04 (AReaL's) three.
    # AReaL's form (the default): the mean over the kept samples, a weight π_T/β above the cap
    # zeroed (π_T/β = 3.0 on sample 0: zeroed by a cap of 2.5, kept by AReaL's 5).
    for tau, removed in ((0.3, [0, 4]), (0.04, [0, 2, 4]), (10.0, []), (0.0, [0, 2, 3, 4])):
        keep = m2_keep_by_loop(LOG_T, LOG_B, tau)
        assert np.flatnonzero(~keep).tolist() == removed
        for cap in (5.0, 2.5):
            weights = [t / b if k and t / b <= cap else 0.0
                       for k, b, t in zip(keep, BEHAVIOR, PROXIMAL)]
            expected_loss, expected_grad = weighted_ppo_by_hand(weights)
            kept = N - len(removed)   # AReaL divides by the kept count, not by N
            loss, grad, metrics = value_and_grad(
                objectives.m2po, log_behavior=LOG_B, advantages=ADVANTAGES, log_proximal=LOG_T,
                clip_eps=EPS, tau=tau, cap=cap)
            assert metrics["masked_fraction"] == pytest.approx(len(removed) / N)
            assert metrics["capped_fraction"] == pytest.approx((cap < 3.0) / N)
            assert loss == pytest.approx(expected_loss * N / kept, rel=1e-5)
            np.testing.assert_allclose(grad, expected_grad * N / kept, rtol=1e-5, atol=1e-7)


def test_m2po_paper_normaliser_and_truncation_are_options():
    # m2_over_kept = 0: the M2PO paper's 1/N (a masked sample counts as a zero); m2_truncate = 1:
    # min(π_T/β, cap) instead of a zero above the cap. Together with cap 2 they are the form
    # this objective had before it took AReaL's (`m2_over_kept=0 m2_truncate=1 m2_cap=2`).
    keep = m2_keep_by_loop(LOG_T, LOG_B, 0.3)                   # removes samples 0 and 4
    for over_kept, truncate in ((0.0, 0.0), (0.0, 1.0), (1.0, 1.0)):
        weights = [(min(t / b, 1.1) if truncate else (t / b if t / b <= 1.1 else 0.0)) if k
                   else 0.0 for k, b, t in zip(keep, BEHAVIOR, PROXIMAL)]
        expected_loss, expected_grad = weighted_ppo_by_hand(weights)
        scale = N / int(keep.sum()) if over_kept else 1.0
        loss, grad, _ = value_and_grad(
            objectives.m2po, log_behavior=LOG_B, advantages=ADVANTAGES, log_proximal=LOG_T,
            clip_eps=EPS, tau=0.3, cap=1.1, over_kept=over_kept, truncate=truncate)
        assert loss == pytest.approx(expected_loss * scale, rel=1e-5)
        np.testing.assert_allclose(grad, expected_grad * scale, rtol=1e-5, atol=1e-7)
    # Sample 3 (π_T/β = 1.25 > 1.1) is zeroed by AReaL's rule and truncated to 1.1 by the other.
    zeroed = value_and_grad(objectives.m2po, log_behavior=LOG_B, advantages=ADVANTAGES,
                            log_proximal=LOG_T, clip_eps=EPS, tau=0.3, cap=1.1)[1]
    truncated = value_and_grad(objectives.m2po, log_behavior=LOG_B, advantages=ADVANTAGES,
                               log_proximal=LOG_T, clip_eps=EPS, tau=0.3, cap=1.1,
                               truncate=1.0)[1]
    assert zeroed[3] == 0.0 and truncated[3] != 0.0


def test_m2po_earlier_form_is_reproduced_by_its_options():
    # The earlier objective: −(1/N) Σ_kept sg(min(π_T/β, 2)) · min(rÂ, clip(r, 1±ε)Â).
    rng = np.random.default_rng(3)
    log_b = (rng.normal(size=(8, 16)) - 2.0).astype(np.float32)
    log_t = (log_b + 0.8 * rng.normal(size=(8, 16))).astype(np.float32)
    log_p = (log_t + 0.3 * rng.normal(size=(8, 16))).astype(np.float32)
    adv = rng.normal(size=(8, 16)).astype(np.float32)

    def earlier(lp):
        keep = objectives.second_moment_mask(log_t, log_b, 0.04)
        weight = jnp.minimum(jnp.exp(log_t - log_b), 2.0)
        surrogate, _, _ = objectives._proximal_surrogate(lp, log_t, adv, EPS)
        return -jnp.mean(jnp.where(keep, weight * surrogate, 0.0))

    loss, grad, _ = value_and_grad(objectives.m2po, log_p, log_behavior=log_b, advantages=adv,
                                   log_proximal=log_t, clip_eps=EPS, tau=0.04, cap=2.0,
                                   over_kept=0.0, truncate=1.0)
    assert loss == pytest.approx(float(earlier(log_p)), rel=1e-6)
    np.testing.assert_allclose(grad, np.asarray(jax.grad(earlier)(jnp.asarray(log_p))),
                               rtol=1e-6, atol=1e-9)
    areal_loss = value_and_grad(objectives.m2po, log_p, log_behavior=log_b, advantages=adv,
                                log_proximal=log_t, clip_eps=EPS, tau=0.04, cap=5.0)[0]
    assert areal_loss != pytest.approx(loss, rel=1e-3)   # the default is another loss


def test_m2po_mask_matches_the_loop_jitted_vmapped_and_on_token_shapes():
    rng = np.random.default_rng(1)
    log_b = rng.normal(size=(4, 16)).astype(np.float32) - 2.0
    log_t = (log_b + rng.gamma(0.5, 0.4, size=(4, 16)) * rng.choice([-1, 1], (4, 16))).astype(
        np.float32)
    taus = np.array([0.0, 0.005, 0.02, 0.05, 0.5], np.float32)
    masks = jax.jit(jax.vmap(objectives.second_moment_mask, in_axes=(None, None, 0)))(
        log_t, log_b, taus)
    for tau, keep in zip(taus, np.asarray(masks)):
        expected = m2_keep_by_loop(log_t.ravel(), log_b.ravel(), tau).reshape(4, 16)
        np.testing.assert_array_equal(keep, expected)
    assert len({int(k.sum()) for k in np.asarray(masks)}) == len(taus)  # every τ keeps a different number


def test_topr_by_hand():
    losses, grads, truncated = [], [], 0
    for b, p, a, lp in zip(BEHAVIOR, LEARNER, ADVANTAGES, LOG_P):
        w = p / b
        alpha = min(max(w, 0.0), 1.0) if a <= 0 else 1.0
        truncated += a <= 0 and w > 1
        losses.append(-alpha * a * lp)
        grads.append(-alpha * a)
    expected_loss, expected_grad = per_sample(losses, grads)
    loss, grad, metrics = value_and_grad(objectives.topr, log_behavior=LOG_B,
                                         advantages=ADVANTAGES)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5)
    assert truncated == 2 and metrics["truncated_fraction"] == pytest.approx(2 / 6)
    # Samples pushed up keep weight 1 whatever their ratio (w = 3.3 with Â = 1).
    assert grad[0] == pytest.approx(-1.0 / N)


def test_geppo_by_hand():
    losses, grads, clipped = [], [], 0
    for b, t, p, a in zip(BEHAVIOR, PROXIMAL, LEARNER, ADVANTAGES):
        w, centre = p / b, t / b
        clipped += abs(w - centre) > EPS
        term, unclipped = ppo_term(w, a, centre - EPS, centre + EPS)
        losses.append(-term)
        grads.append(-w * a if unclipped else 0.0)
    expected_loss, expected_grad = per_sample(losses, grads)
    loss, grad, metrics = value_and_grad(objectives.geppo, log_behavior=LOG_B,
                                         advantages=ADVANTAGES, log_proximal=LOG_T, clip_eps=EPS)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-7)
    assert clipped == 3 and metrics["clip_fraction"] == pytest.approx(3 / 6)
    # Sample 0 (w = 3.3 against 3.0 ± 0.2) is clipped; PPO's clip around 1 would also clip it,
    # but sample 3 (w = 1.25 = π_T/β) would be clipped by PPO and is not here.
    assert grad[0] == 0.0 and grad[3] != 0.0


# --- GePPO as its authors run it -------------------------------------------------------------------
def test_geppo_normalises_advantages_with_the_weights_pi_t_over_beta_by_hand():
    # π_T/β = 3.0, 1.0, 0.4, 1.25, 0.167, 1.0 and Â as above: centre E[ρÂ]/E[ρ], scale std(ρÂ).
    rho = PROXIMAL / BEHAVIOR
    weighted = rho * ADVANTAGES
    centre = weighted.mean() / rho.mean()
    expected = (ADVANTAGES - centre) / (weighted.std() + 1e-8)
    normalised = objectives.geppo_advantages(jnp.asarray(ADVANTAGES), LOG_B, LOG_T)
    np.testing.assert_allclose(normalised, expected, rtol=1e-5)
    plain = (ADVANTAGES - ADVANTAGES.mean()) / (ADVANTAGES.std() + 1e-8)
    assert np.abs(expected - plain).max() > 0.1          # not the plain normalisation
    # On-policy (ρ = 1) it is the plain normalisation, bit for bit.
    assert np.array_equal(objectives.geppo_advantages(jnp.asarray(ADVANTAGES), LOG_B, LOG_B),
                          (jnp.asarray(ADVANTAGES) - jnp.mean(jnp.asarray(ADVANTAGES)))
                          / (jnp.std(jnp.asarray(ADVANTAGES)) + 1e-8))


def test_geppo_learning_rate_rule_by_hand():
    # ε = 0.2: divided by 1.03 above TV = ε/2 = 0.1, unchanged at or below it with the authors'
    # lower threshold 0; with a lower threshold of ½, multiplied by 1.03 below ε/4 = 0.05.
    rule = lambda tv, low=0.0: float(objectives.geppo_learning_rate_scale(
        0.5, tv, eps=0.2, factor=0.03, max_threshold=1.0, min_threshold=low))
    assert rule(0.11) == pytest.approx(0.5 / 1.03, rel=1e-6)
    assert rule(0.1) == rule(0.05) == rule(0.0) == 0.5
    assert rule(0.04, low=0.5) == pytest.approx(0.5 * 1.03, rel=1e-6)
    assert rule(0.06, low=0.5) == 0.5
    # The algorithm's ε is clip_eps · geppo_eps_mult: with 0.5 the threshold is 0.05.
    p = algorithms.ObjectiveParams(clip_eps=0.2, own={**algorithms.OBJECTIVES["geppo"].defaults,
                                                      "geppo_eps_mult": 0.5})
    assert float(algorithms.OBJECTIVES["geppo"].adapt_learning_rate(1.0, 0.06, p)) == \
        pytest.approx(1 / 1.03, rel=1e-6)


def test_geppo_is_vtrace_the_weighted_normalisation_and_an_adaptive_actor_learning_rate():
    geppo = algorithms.parse("geppo")
    assert geppo.estimator is algorithms.ESTIMATORS["vtrace_once"]
    assert geppo.objective.normalize_advantages is not None
    assert geppo.objective.adapt_learning_rate is not None
    # The authors' switch `--no_vtrace` is the pairing with GAE.
    assert algorithms.parse("gae+geppo").objective is geppo.objective


def test_the_actor_lr_scale_scales_the_actors_updates_only():
    from vaco_jax.trainer import actor_lr_scale, make_optimizer, with_actor_lr_scale

    hp = Config(env="toy_reach", algo="geppo").hparams()
    params = {"actor": {"w": jnp.arange(3.0)}, "critic": {"w": jnp.ones(2)}}
    grads = {"actor": {"w": jnp.array([0.1, -0.2, 0.3])}, "critic": {"w": jnp.array([0.5, 1.0])}}
    plain = make_optimizer(hp, 1e-3)
    scaled = make_optimizer(hp, 1e-3, adaptive_actor_lr=True)
    state = scaled.init(params)
    assert float(actor_lr_scale(state)) == 1.0
    state = with_actor_lr_scale(state, 0.25)
    expected, _ = plain.update(grads, plain.init(params), params)
    updates, state = scaled.update(grads, state, params)
    np.testing.assert_allclose(updates["actor"]["w"], 0.25 * expected["actor"]["w"], rtol=1e-6)
    np.testing.assert_array_equal(updates["critic"]["w"], expected["critic"]["w"])
    assert float(actor_lr_scale(state)) == 0.25


def test_geppo_clip_is_the_earlier_geppo_with_gae():
    # `gae+geppo_clip`: GePPO's clip around π_T/β with ε = clip_eps, GAE, the trainer's plain
    # advantage normalisation and a fixed learning rate.
    ablation = algorithms.parse("gae+geppo_clip")
    assert ablation.estimator.name == "gae"
    objective = ablation.objective
    assert objective.hparams == () and objective.normalize_advantages is None
    assert objective.adapt_learning_rate is None
    loss, metrics = call("geppo_clip", LOG_P, LOG_B, LOG_T, ADVANTAGES)
    direct = objectives.geppo(LOG_P, LOG_B, ADVANTAGES, log_proximal=LOG_T, clip_eps=EPS)
    assert float(loss) == float(direct[0]) and metrics.keys() == direct[1].keys()
    # geppo's objective at its default geppo_eps_mult = 1 is the same clip.
    assert float(call("geppo", LOG_P, LOG_B, LOG_T, ADVANTAGES)[0]) == float(loss)
    assert float(call("geppo", LOG_P, LOG_B, LOG_T, ADVANTAGES, geppo_eps_mult=0.5)[0]) != \
        float(loss)


def test_geppos_trainer_loss_uses_vtrace_advantages_normalised_with_the_weights():
    # After two iterations the batch comes from the oldest of two snapshots (β ≠ π_T). At the
    # first step (θ = θ_T) GePPO's policy loss is its clip on the V-trace advantages of the batch
    # (computed with π_T, V_φT), each minibatch normalised with the weights π_T/β.
    from vaco_jax import advantages as adv_lib, ring_buffer, rollout

    trainer = Trainer(dataclasses.replace(CHUNK, algo="geppo", learning_rate=0.05))
    config, state = trainer.config, trainer.init(jax.random.PRNGKey(0))
    for _ in range(2):
        state, _ = jax.jit(trainer.iteration)(state)
    started = trainer.vec_env.start(state.env_state, jax.random.PRNGKey(1))
    snapshots, _ = ring_buffer.sample(state.buffer, jax.random.PRNGKey(2), 1, "oldest")
    _, traj = rollout.collect(trainer.vec_env, trainer.actor, started, snapshots,
                              jax.random.PRNGKey(3), unroll_length=4, num_actors=1,
                              normalize_obs=config.normalize_observations)
    batch, _ = trainer.realign(state.params, state.normalizer, traj, state.hparams)
    values = trainer.critic.apply({"params": state.params["critic"]}, batch.obs)
    next_values = trainer.critic.apply({"params": state.params["critic"]}, batch.next_obs)
    _, vtrace_advantages = adv_lib.vtrace(
        batch.log_learner_start - batch.log_behavior, batch.reward, values, next_values,
        batch.terminated, batch.truncated, gamma=config.gamma, lambda_=config.gae_lambda)
    np.testing.assert_allclose(batch.advantages, vtrace_advantages, rtol=1e-5, atol=1e-6)
    mb = jax.tree.map(lambda x: x[:, :2], batch)
    rho = np.exp(np.asarray(mb.log_learner_start - mb.log_behavior))
    assert np.abs(rho - 1).max() > 0.1                       # stale
    a = np.asarray(mb.advantages)
    weighted_norm = (a - (rho * a).mean() / rho.mean()) / ((rho * a).std() + 1e-8)
    plain_norm = (a - a.mean()) / (a.std() + 1e-8)
    hp = state.hparams
    _, metrics = jax.jit(trainer.loss)(state.params, mb, hp, hp.kl_coef)
    log_prob = trainer.head.distribution(
        trainer.actor.apply({"params": state.params["actor"]}, mb.obs)).log_prob(mb.action)
    expected, other = (float(objectives.geppo(log_prob, mb.log_behavior, jnp.asarray(adv),
                                              log_proximal=mb.log_learner_start,
                                              clip_eps=0.2)[0])
                       for adv in (weighted_norm, plain_norm))
    assert float(metrics["policy_loss"]) == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert abs(expected - other) > 1e-3                       # the weights matter here


def test_a_geppo_run_adapts_the_actors_learning_rate_from_its_updates_tv():
    # A large learning rate moves the policy more than ε/2 = 0.1 in TV: the scale falls by 1.03
    # after each such update; with geppo_adapt_factor = 0 it stays 1.
    config = dataclasses.replace(CHUNK, algo="geppo", learning_rate=0.05,
                                 total_steps=4 * 4 * 3)
    for factor in (0.03, 0.0):
        trainer = Trainer(dataclasses.replace(
            config, objective_hparams=(f"geppo_adapt_factor={factor}",)))
        state, _, steps = jax.jit(lambda s: trainer.learn_chunk(s, per_iteration=True))(
            trainer.init(jax.random.PRNGKey(0)))
        tv, used = np.asarray(steps["update_tv"]), np.asarray(steps["actor_lr_scale"])
        assert np.all(tv > 0.1), tv
        expected = (1.0 + factor) ** -np.arange(4.0)
        np.testing.assert_allclose(used, expected[:3], rtol=1e-6)
        from vaco_jax.trainer import actor_lr_scale
        assert float(actor_lr_scale(state.opt_state)) == pytest.approx(expected[3], rel=1e-6)


# --- reductions on-policy ---------------------------------------------------------------------------
def call(name, log_prob, log_behavior, log_proximal, advantages, mask=None, discrete=True,
         **own):
    objective = algorithms.OBJECTIVES[name]
    params = algorithms.ObjectiveParams(clip_eps=EPS, own={**objective.defaults, **own})
    inputs = algorithms.PolicyInputs(log_prob, log_behavior, advantages, mask=mask,
                                     log_proximal=log_proximal, discrete=discrete)
    return objective(inputs, params)


def grad_of(name, log_prob, log_behavior, log_proximal, advantages, **kwargs):
    return np.asarray(jax.grad(lambda lp: call(name, lp, log_behavior, log_proximal, advantages,
                                               **kwargs)[0])(jnp.asarray(log_prob)))


@pytest.mark.parametrize("name", ["icepop", "geppo", "m2po"])
def test_clipped_objectives_on_on_policy_data_are_ppo_clip(name):
    # β = π_T (no backward lag), π_θ anywhere (forward lag): PPO's clip, loss and gradient.
    ppo_loss, _ = call("ppo_clip", LOG_P, LOG_B, LOG_B, ADVANTAGES)
    ppo_grad = grad_of("ppo_clip", LOG_P, LOG_B, LOG_B, ADVANTAGES)
    loss, metrics = call(name, LOG_P, LOG_B, LOG_B, ADVANTAGES)
    grad = grad_of(name, LOG_P, LOG_B, LOG_B, ADVANTAGES)
    if name == "geppo":   # bit for bit
        assert float(loss) == float(ppo_loss)
        np.testing.assert_array_equal(grad, ppo_grad)
    else:
        assert float(loss) == pytest.approx(float(ppo_loss), rel=1e-6)
        np.testing.assert_allclose(grad, ppo_grad, rtol=1e-6)
    assert metrics.get("masked_fraction", 0.0) == 0.0
    assert np.any(ppo_grad == 0.0) and np.any(ppo_grad != 0.0)   # the clip is active somewhere


def test_m2po_with_nothing_masked_is_its_ratio_loss_decoupled_ppo():
    # Off-policy (β ≠ π_T) but τ above every second moment and the weight truncated at decoupled
    # PPO's C = 2: AReaL's decoupled loss, untouched (π_T/β = 3 on sample 0 is truncated by both).
    own = dict(m2_tau=100.0, m2_truncate=1.0, m2_cap=2.0)
    loss, metrics = call("m2po", LOG_P, LOG_B, LOG_T, ADVANTAGES, **own)
    expected, _ = call("decoupled_ppo", LOG_P, LOG_B, LOG_T, ADVANTAGES)
    assert metrics["masked_fraction"] == 0.0
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)
    np.testing.assert_allclose(grad_of("m2po", LOG_P, LOG_B, LOG_T, ADVANTAGES, **own),
                               grad_of("decoupled_ppo", LOG_P, LOG_B, LOG_T, ADVANTAGES),
                               rtol=1e-6)


@pytest.mark.parametrize("name", ["cispo", "topr", "dppo_tv"])
@pytest.mark.parametrize("discrete", [True, False])
def test_weighted_log_prob_objectives_on_policy_follow_the_policy_gradient(name, discrete):
    # β = π_T = π_θ: the gradient is −E[Â ∇log π], that of the importance-sampled PG at θ = β.
    expected = grad_of("pg", LOG_B, LOG_B, LOG_B, ADVANTAGES)
    np.testing.assert_allclose(expected, -ADVANTAGES / N, rtol=1e-6)
    grad = grad_of(name, LOG_B, LOG_B, LOG_B, ADVANTAGES, discrete=discrete)
    np.testing.assert_allclose(grad, expected, rtol=1e-6)


# --- masking --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NEW)
def test_masked_entries_holding_nan_or_minus_inf_change_nothing(name):
    # Three padding entries (log β = −inf, NaN advantages and log-probs) after the six samples:
    # the loss, the gradient on the six and every metric are those of the six alone, and the
    # padding's gradient is 0.
    pad = np.array([-np.inf, np.nan, np.nan], np.float32)
    log_p = np.concatenate([LOG_P, [np.nan, 0.0, -np.inf]]).astype(np.float32)
    log_b = np.concatenate([LOG_B, pad])
    log_t = np.concatenate([LOG_T, [np.nan, -np.inf, 0.0]]).astype(np.float32)
    adv = np.concatenate([ADVANTAGES, [np.nan, 1.0, np.nan]]).astype(np.float32)
    mask = np.array([1] * N + [0] * 3, np.float32)
    for discrete in (True, False):
        loss, metrics = call(name, log_p, log_b, log_t, adv, mask=mask, discrete=discrete)
        grad = grad_of(name, log_p, log_b, log_t, adv, mask=mask, discrete=discrete)
        alone, alone_metrics = call(name, LOG_P, LOG_B, LOG_T, ADVANTAGES, discrete=discrete)
        alone_grad = grad_of(name, LOG_P, LOG_B, LOG_T, ADVANTAGES, discrete=discrete)
        assert np.isfinite(float(loss)) and float(loss) == pytest.approx(float(alone), rel=1e-6)
        np.testing.assert_allclose(grad[:N], alone_grad, rtol=1e-6, atol=1e-9)
        np.testing.assert_array_equal(grad[N:], 0.0)
        assert metrics.keys() == alone_metrics.keys()
        for key in metrics:
            assert float(metrics[key]) == pytest.approx(float(alone_metrics[key]), abs=1e-7), key


def test_the_intervened_fraction_is_the_union_of_an_objectives_rules():
    # On the hand batch the clip of π_θ/π_T has 1, 4, 5 outside its band and takes the gradient
    # of 4 and 5 away (sample 1's Â < 0 with r > 1 + ε: the unclipped term is the min). IcePop
    # masks 0, 2, 4; M2PO (τ = 0.04) masks 0, 2, 4 and, with a cap of 1.1, zeroes the weights of
    # 0 and 3 (π_T/β = 3.0, 1.25); decoupled PPO truncates the weight of 0 (C = 2). GePPO's clip
    # of π_θ/β around π_T/β has 0, 1, 5 outside its band and takes the gradient of 0 and 5 away.
    from vaco_jax import diagnostics

    cases = (("icepop", {}, 4), ("m2po", {}, 4), ("m2po", {"m2_cap": 1.1}, 5),
             ("decoupled_ppo", {}, 3), ("geppo", {}, 2))
    for name, own, union in cases:
        _, metrics = call(name, LOG_P, LOG_B, LOG_T, ADVANTAGES, **own)
        reported = diagnostics.intervened_fraction(metrics)["intervened_fraction"]
        assert float(reported) == pytest.approx(union / N), (name, own)
    # At the first step of an iteration (π_θ = π_T) nothing is clipped: IcePop's and M2PO's
    # intervention is their mask, not PPO's clip fraction (0).
    for name in ("icepop", "m2po"):
        _, metrics = call(name, LOG_T, LOG_B, LOG_T, ADVANTAGES)
        assert float(metrics["clip_fraction"]) == 0.0
        reported = diagnostics.intervened_fraction(metrics)["intervened_fraction"]
        assert float(reported) == float(metrics["masked_fraction"]) == pytest.approx(3 / N)


def test_dppo_tv_counts_a_zero_advantage_sample_under_the_negative_rule_as_prime_rl():
    # Sample 2 (π_θ − β = −0.33 < −δ) with Â = 0: prime-rl's `is_masked` counts it (its rule
    # for Â ≤ 0); the loss does not change (the sample's term is 0 either way).
    advantages = ADVANTAGES.copy()
    advantages[2] = 0.0
    loss, metrics = call("dppo_tv", LOG_P, LOG_B, LOG_T, advantages)
    assert float(metrics["masked_fraction"]) == pytest.approx(3 / N)     # samples 0, 2 and 5
    kept = [1, 3, 4]
    w = LEARNER / BEHAVIOR
    expected = (-sum(w[i] * advantages[i] for i in kept)
                + 1e-3 * sum(np.log(w) ** 2)) / N
    assert float(loss) == pytest.approx(expected, rel=1e-5)


def test_every_objective_reports_the_fraction_it_intervened_on():
    keys = {"clip_fraction", "masked_fraction", "truncated_fraction", "filtered_fraction"}
    for name in NEW:
        _, metrics = call(name, LOG_P, LOG_B, LOG_T, ADVANTAGES)
        assert keys & set(metrics), name
        assert all(0.0 <= float(metrics[k]) <= 1.0 for k in keys & set(metrics))


# --- registry and configuration -------------------------------------------------------------------
def test_each_is_an_algorithm_with_gae_and_pairs_with_any_estimator():
    for name in NEW:
        algorithm = algorithms.parse(name)
        # GePPO corrects its advantages with V-trace, as its authors' code does by default.
        estimator = "vtrace_once" if name == "geppo" else "gae"
        assert algorithm.estimator.name == estimator and algorithm.objective.name == name
        assert algorithms.parse(f"vtrace_once+{name}").objective is algorithm.objective
    own = [n for name in NEW for n, _ in algorithms.OBJECTIVES[name].hparams]
    assert len(own) == len(set(own))                 # distinct names: the LLM runs them together


def test_objective_hparams_are_set_by_name_and_checked():
    hp = Config(env="toy_reach", algo="icepop", objective_hparams=("mis_high=5",)).hparams()
    assert {k: float(v) for k, v in hp.objective.items()} == {"mis_low": 0.5, "mis_high": 5.0}
    assert Config(env="toy_reach", algo="gae+geppo_clip").hparams().objective == {}
    with pytest.raises(ConfigError, match="m2_tau"):
        Config(env="toy_reach", algo="icepop", objective_hparams=("m2_tau=1",)).hparams()


# --- in the trainer, on both action spaces -------------------------------------------------------
# Two iterations of 4 envs × 4 steps, 2 epochs of 2 minibatches, the oldest of two snapshots: the
# second iteration learns from stale data (β ≠ π_T) and every epoch after the first from moved θ.
CHUNK = Config(env="toy_reach", algo="icepop", num_envs=4, unroll_length=4, num_epochs=2,
               num_minibatches=2, num_actors=1, episode_length=10, total_steps=4 * 4 * 2,
               num_evals=1, eval_envs=2, actor_hidden=(8,), critic_hidden=(8,), capacity=2,
               max_capacity=2, snapshot_sampling="oldest")
FRACTION = {"icepop": "masked_fraction", "cispo": "truncated_fraction",
            "dppo_tv": "masked_fraction", "m2po": "masked_fraction",
            "topr": "truncated_fraction", "geppo": "clip_fraction"}


# Each objective compiles its own program (objectives cannot be vmapped), so each runs one chunk
# on the continuous toy_reach; on discrete actions the objectives see log-probabilities alone
# (checked below through the trainer) and only dppo_tv reads them differently, so it alone trains
# there too.
@pytest.mark.parametrize("name, domain", [(n, "continuous") for n in NEW]
                         + [("dppo_tv", "discrete")])
def test_one_training_chunk_is_finite(name, domain):
    from test_discrete import ToyChoice   # a three-armed bandit: categorical head

    config = dataclasses.replace(CHUNK, algo=name)
    trainer = (Trainer(config) if domain == "continuous"
               else Trainer(dataclasses.replace(config, env="toy_choice"), env=ToyChoice()))

    def chunk(key):
        state = trainer.init(key)
        new_state, metrics = trainer.learn_chunk(state)
        return state.params, new_state.params, metrics

    before, after, metrics = jax.jit(chunk)(jax.random.PRNGKey(0))
    assert int(metrics["iteration"]) == 2
    for key in ("policy_loss", "loss", "grad_norm", FRACTION[name]):
        assert np.isfinite(float(metrics[key])), key
    assert 0.0 <= float(metrics[FRACTION[name]]) <= 1.0
    moved = [np.abs(np.asarray(a) - np.asarray(b)).max()
             for a, b in zip(jax.tree.leaves(after["actor"]), jax.tree.leaves(before["actor"]))]
    assert all(np.isfinite(m) for m in moved) and max(moved) > 0


def test_the_trainer_gives_dppo_tv_probabilities_on_discrete_actions():
    # test_discrete's two samples through the trainer's policy objective (categorical head):
    #   sample 1: π_θ(a) = 0.8438, β(a) = 1/3, Â = 1:     g = 0.510,  ½(w − 1) = 0.766
    #   sample 2: π_θ(a) = 0.5761, β(a) = 0.2119, Â = −½: g = 0.364,  ½(w − 1) = 0.859
    # With δ = 0.6 the probabilities keep sample 1 (0.510 ≤ 0.6); the ratio's form would drop it.
    from test_discrete import ToyChoice, objective

    trainer = Trainer(dataclasses.replace(CHUNK, env="toy_choice"), env=ToyChoice())
    _, metrics = objective(trainer, "dppo_tv", objective_hparams=("tv_delta=0.6",))
    assert float(metrics["masked_fraction"]) == 0.0
    _, metrics = objective(trainer, "dppo_tv", objective_hparams=("tv_delta=0.5",))
    assert float(metrics["masked_fraction"]) == 0.5
    for name in NEW:   # every objective is finite on categorical log-probabilities
        loss, metrics = objective(trainer, name)
        assert np.isfinite(float(loss)) and 0.0 <= float(metrics[FRACTION[name]]) <= 1.0


# --- in the LLM's GRPO ------------------------------------------------------------------------------
def test_grpo_runs_each_objective_on_token_ratios_with_its_own_hyper_parameters():
    from vaco_jax.llm import config as llm_config, grpo
    from test_llm_grpo import token_batch

    assert set(NEW) <= set(llm_config.OBJECTIVES)
    assert llm_config.OBJECTIVES[:4] == ("ppo_clip", "vaco", "pg", "decoupled_ppo")
    log_prob, batch = token_batch(0, spread=0.5)
    # A stale π_T, so that every objective has something to mask, clip or truncate.
    batch = batch.replace(log_learner_start=batch.log_behavior + 0.7 * jnp.asarray(
        np.random.default_rng(1).normal(size=batch.log_behavior.shape), jnp.float32))
    base = llm_config.preset("tiny").grpo
    for name in NEW:
        for own in ((), ("mis_low=0.9", "cispo_eps_low=0.1", "tv_delta=0.05", "m2_tau=1",
                         "topr_threshold=-0.5")):
            hp = llm_config.hparams(dataclasses.replace(base, objective=name,
                                                        objective_hparams=own))
            loss, metrics = jax.jit(grpo.policy_loss)(log_prob, batch, hp)
            expected, expected_metrics = call(
                name, log_prob, batch.log_behavior, batch.log_learner_start, batch.advantages,
                mask=batch.mask, **{k: float(v) for k, v in hp.objective_hparams.items()})
            assert float(loss) == pytest.approx(float(expected), rel=1e-5), (name, own)
            key = FRACTION[name] if FRACTION[name] != "clip_fraction" else None
            if key:
                assert float(metrics[key]) == pytest.approx(float(expected_metrics[key])), name
            assert {"masked_fraction", "truncated_fraction"} <= set(metrics)
        # The overrides reach the objective (none of them is geppo's).
        default_loss = jax.jit(grpo.policy_loss)(log_prob, batch, llm_config.hparams(
            dataclasses.replace(base, objective=name)))[0]
        assert (float(loss) != float(default_loss)) == (name != "geppo"), name


def test_grpo_objective_hparams_are_validated_by_name():
    from vaco_jax.llm import config as llm_config

    tiny = llm_config.preset("tiny")
    llm_config.validate(llm_config.replace(tiny, grpo=dict(objective="m2po",
                                                           objective_hparams=("m2_tau=0.1",))))
    for bad in (("tau=1",), ("m2_tau",), ("m2_tau=x",), ("m2_tau=inf",)):
        with pytest.raises(ConfigError, match="grpo.objective_hparams"):
            llm_config.validate(llm_config.replace(tiny, grpo=dict(objective_hparams=bad)))


def test_a_sweep_made_before_objective_hparams_existed_can_still_be_extended():
    from vaco_jax import io
    from vaco_jax.llm import config as llm_config, experiment

    spec = io.to_jsonable(llm_config.preset("cpu"))
    older = io.to_jsonable(llm_config.preset("cpu"))
    del older["grpo"]["objective_hparams"]
    assert experiment.same_config(older, spec)
    # ... unless the field is set, or any stored field differs.
    assert not experiment.same_config(older, io.to_jsonable(llm_config.replace(
        llm_config.preset("cpu"), grpo=dict(objective_hparams=("m2_tau=1",)))))
    older["grpo"]["delta"] = 0.5
    assert not experiment.same_config(older, spec)
