"""Policy objectives (SPEC §3.2, §4): values, gradients and the TV filter's semantics."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vaco_jax import algorithms, objectives

N = 64


def sample_inputs(seed, spread):
    rng = np.random.default_rng(seed)
    log_behavior = rng.normal(size=N).astype(np.float32) - 1.0
    log_prob = (log_behavior + spread * rng.normal(size=N)).astype(np.float32)
    advantages = rng.normal(size=N).astype(np.float32)
    return log_prob, log_behavior, advantages


def tv_grad(log_prob, log_behavior, advantages, **kwargs):
    def loss(lp):
        return objectives.tv_filter(lp, log_behavior, advantages, **kwargs)[0]
    return jax.grad(loss)(log_prob)


def test_tv_filter_below_delta_drops_nothing():
    log_prob, log_behavior, advantages = sample_inputs(0, spread=0.05)
    ratio = np.exp(log_prob - log_behavior)
    tv = 0.5 * np.mean(np.abs(ratio - 1))
    delta = tv * 1.01
    loss, metrics = objectives.tv_filter(log_prob, log_behavior, advantages, delta=delta)
    assert float(metrics["filter_tv"]) == pytest.approx(tv, rel=1e-5)
    assert float(metrics["filtered_fraction"]) == 0.0
    assert float(loss) == pytest.approx(-np.mean(ratio * advantages), rel=1e-5)
    # d/dlogπ of −mean(w Â) is −w Â / N for every sample: nothing has zero gradient.
    np.testing.assert_allclose(tv_grad(log_prob, log_behavior, advantages, delta=delta),
                               -ratio * advantages / N, rtol=1e-5)


def test_tv_filter_above_delta_zeroes_exactly_the_outward_samples():
    log_prob, log_behavior, advantages = sample_inputs(1, spread=0.5)
    ratio = np.exp(log_prob - log_behavior)
    tv = 0.5 * np.mean(np.abs(ratio - 1))
    delta = tv * 0.99
    outward = np.asarray(advantages) * np.sign(ratio - 1) > 0
    assert 0 < outward.sum() < N
    grad = np.asarray(tv_grad(log_prob, log_behavior, advantages, delta=delta))
    assert np.all(grad[outward] == 0.0)
    np.testing.assert_allclose(grad[~outward], (-ratio * advantages / N)[~outward], rtol=1e-5)
    assert np.all(grad[~outward] != 0.0)
    _, metrics = objectives.tv_filter(log_prob, log_behavior, advantages, delta=delta)
    assert float(metrics["filtered_fraction"]) == pytest.approx(outward.mean())


def test_tv_filter_kept_gradient_moves_ratios_inward():
    # Gradient descent on a kept sample changes log π by −lr·grad; check it reduces |r − 1|.
    log_prob, log_behavior, advantages = sample_inputs(2, spread=0.5)
    grad = tv_grad(log_prob, log_behavior, advantages, delta=0.01)
    ratio = np.exp(log_prob - log_behavior)
    new_ratio = np.exp(log_prob - 1e-3 * grad - log_behavior)
    moved = np.asarray(grad) != 0
    assert np.all(np.abs(new_ratio - 1)[moved] <= np.abs(ratio - 1)[moved] + 1e-7)


def test_tv_filter_per_sample_mode():
    log_prob, log_behavior, advantages = sample_inputs(3, spread=0.6)
    ratio = np.exp(log_prob - log_behavior)
    delta = 0.2
    dropped = (0.5 * np.abs(ratio - 1) > delta) & (np.asarray(advantages) * (ratio - 1) > 0)
    assert 0 < dropped.sum() < N
    grad = np.asarray(tv_grad(log_prob, log_behavior, advantages, delta=delta,
                              filter_mode="per_sample"))
    assert np.all(grad[dropped] == 0.0) and np.all(grad[~dropped] != 0.0)


def test_tv_filter_learner_reference_equals_behavior_when_learner_is_behavior():
    log_prob, log_behavior, advantages = sample_inputs(4, spread=0.4)
    a = objectives.tv_filter(log_prob, log_behavior, advantages, delta=0.1)
    b = objectives.tv_filter(log_prob, log_behavior, advantages, delta=0.1,
                             log_reference=log_behavior)
    np.testing.assert_allclose(a[0], b[0], rtol=1e-6)
    np.testing.assert_allclose(a[1]["filter_tv"], b[1]["filter_tv"], rtol=1e-6)


def test_tv_filter_learner_reference_measures_forward_lag_only():
    # If π_θ equals the start-of-iteration learner, the forward-lag divergence is 0: nothing dropped,
    # even though π_θ is far from β.
    log_prob, log_behavior, advantages = sample_inputs(5, spread=1.0)
    _, metrics = objectives.tv_filter(log_prob, log_behavior, advantages, delta=0.01,
                                      log_reference=log_prob)
    assert float(metrics["filter_tv"]) == pytest.approx(0.0, abs=1e-6)
    assert float(metrics["filtered_fraction"]) == 0.0


def test_tv_filter_is_max_truncates_weights():
    log_prob, log_behavior, advantages = sample_inputs(6, spread=1.0)
    ratio = np.exp(log_prob - log_behavior)
    loss, _ = objectives.tv_filter(log_prob, log_behavior, advantages, delta=np.inf, is_max=1.5)
    assert float(loss) == pytest.approx(-np.mean(np.minimum(ratio, 1.5) * advantages), rel=1e-5)


def test_ppo_clip_value_and_gradient():
    log_prob, log_behavior, advantages = sample_inputs(7, spread=0.4)
    eps = 0.2
    ratio = np.exp(log_prob - log_behavior)
    a = np.asarray(advantages)
    expected = -np.mean(np.minimum(ratio * a, np.clip(ratio, 1 - eps, 1 + eps) * a))
    loss, metrics = objectives.ppo_clip(log_prob, log_behavior, advantages, clip_eps=eps)
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    assert float(metrics["clip_fraction"]) == pytest.approx(np.mean(np.abs(ratio - 1) > eps))
    grad = np.asarray(jax.grad(lambda lp: objectives.ppo_clip(lp, log_behavior, advantages,
                                                              clip_eps=eps)[0])(log_prob))
    clipped = ((ratio > 1 + eps) & (a > 0)) | ((ratio < 1 - eps) & (a < 0))
    assert clipped.any()
    assert np.all(grad[clipped] == 0.0)
    np.testing.assert_allclose(grad[~clipped], (-ratio * a / N)[~clipped], rtol=1e-5)


def test_decoupled_ppo_against_a_hand_computation():
    # loss = −mean(min(π_prox/β, C) · min(rÂ, clip(r, 1±ε)Â)), r = π_θ/π_prox, ε = 0.2, C = 2:
    #   π_prox/β = 1, 2, 0.75, 4 → 2 (capped), 1;   r = 1.1, 1.0, 0.5, 1.5, 1.5;  Â = 1, −1, 2, −0.5, 1
    #   min(rÂ, clip(r)Â) = 1.1, −1, 1.0 (r·Â), −0.75 (r·Â), 1.2 (clipped)
    #   weighted = 1.1, −2, 0.75, −1.5, 1.2 → loss = −(−0.45)/5 = 0.09
    # d loss / d log π_θ = −weight · r · Â / 5 where the unclipped term is the minimum, else 0.
    behavior = np.log([0.5, 0.25, 0.4, 0.1, 0.2]).astype(np.float32)
    proximal = np.log([0.5, 0.5, 0.3, 0.4, 0.2]).astype(np.float32)
    current = np.log([0.55, 0.5, 0.15, 0.6, 0.3]).astype(np.float32)
    advantages = np.array([1.0, -1.0, 2.0, -0.5, 1.0], np.float32)

    def loss(lp):
        return objectives.decoupled_ppo(lp, behavior, advantages, log_proximal=proximal,
                                        clip_eps=0.2, is_max=2.0)
    (value, metrics), grad = jax.value_and_grad(loss, has_aux=True)(current)
    assert float(value) == pytest.approx(0.09, abs=1e-6)
    np.testing.assert_allclose(grad, [-0.22, 0.4, -0.15, 0.3, 0.0], atol=1e-6)
    assert float(metrics["clip_fraction"]) == pytest.approx(0.6)            # |r − 1| > ε
    assert float(metrics["behavior_capped_fraction"]) == pytest.approx(0.2)  # π_prox/β > C
    # The behavioural weight is data: no gradient reaches log π_prox through it, or log β.
    grad_behavior = jax.grad(lambda lb: objectives.decoupled_ppo(
        current, lb, advantages, log_proximal=proximal, clip_eps=0.2, is_max=2.0)[0])(behavior)
    np.testing.assert_array_equal(grad_behavior, 0.0)


@pytest.mark.parametrize("masked", [False, True])
def test_decoupled_ppo_is_ppo_clip_when_the_proximal_policy_is_the_behaviour_one(masked):
    log_prob, log_behavior, advantages = sample_inputs(14, spread=0.4)
    mask = (np.arange(N) % 3 > 0) if masked else None

    def decoupled(lp):
        return objectives.decoupled_ppo(lp, log_behavior, advantages, log_proximal=log_behavior,
                                        clip_eps=0.2, is_max=2.0, mask=mask)[0]

    def ppo(lp):
        return objectives.ppo_clip(lp, log_behavior, advantages, clip_eps=0.2, mask=mask)[0]
    value, grad = jax.value_and_grad(decoupled)(log_prob)
    expected, expected_grad = jax.value_and_grad(ppo)(log_prob)
    np.testing.assert_array_equal(value, expected)
    np.testing.assert_array_equal(grad, expected_grad)
    assert np.any(np.asarray(grad) == 0.0) and np.any(np.asarray(grad) != 0.0)   # some clipped


def test_spo_value():
    log_prob, log_behavior, advantages = sample_inputs(8, spread=0.4)
    ratio = np.exp(log_prob - log_behavior)
    a = np.asarray(advantages)
    expected = -np.mean(ratio * a - np.abs(a) * (ratio - 1) ** 2 / (2 * 0.2))
    loss, _ = objectives.spo(log_prob, log_behavior, advantages, eps=0.2)
    assert float(loss) == pytest.approx(expected, rel=1e-5)


def test_ppo_kl_value():
    log_prob, log_behavior, advantages = sample_inputs(9, spread=0.4)
    kl = np.abs(np.random.default_rng(0).normal(size=N)).astype(np.float32)
    ratio = np.exp(log_prob - log_behavior)
    loss, metrics = objectives.ppo_kl(log_prob, log_behavior, advantages, kl=kl, kl_coef=0.3)
    assert float(loss) == pytest.approx(-np.mean(ratio * advantages) + 0.3 * np.mean(kl), rel=1e-5)
    assert float(metrics["kl_penalty"]) == pytest.approx(np.mean(kl), rel=1e-6)


def test_impala_pg_gradient():
    log_prob, log_behavior, advantages = sample_inputs(10, spread=0.5)
    ratio = np.exp(log_prob - log_behavior)
    grad = jax.grad(lambda lp: objectives.impala_pg(lp, log_behavior, advantages,
                                                    rho_bar=1.0)[0])(log_prob)
    np.testing.assert_allclose(grad, -np.minimum(1.0, ratio) * np.asarray(advantages) / N, rtol=1e-5)


def test_mask_excludes_entries_from_every_mean():
    log_prob, log_behavior, advantages = sample_inputs(11, spread=0.5)
    mask = np.arange(N) < N // 2
    half = slice(0, N // 2)
    for fn, kwargs in [(objectives.ppo_clip, dict(clip_eps=0.2)),
                       (objectives.tv_filter, dict(delta=0.05)),
                       (objectives.spo, dict(eps=0.2))]:
        masked = fn(log_prob, log_behavior, advantages, mask=mask, **kwargs)
        direct = fn(log_prob[half], log_behavior[half], advantages[half], **kwargs)
        np.testing.assert_allclose(masked[0], direct[0], rtol=1e-5)
        for key in masked[1]:
            np.testing.assert_allclose(masked[1][key], direct[1][key], rtol=1e-5)


OBJECTIVES = {
    "ppo_clip": lambda lp, lb, adv: objectives.ppo_clip(lp, lb, adv, clip_eps=0.2),
    "ppo_kl": lambda lp, lb, adv: objectives.ppo_kl(lp, lb, adv, kl=lp - lb, kl_coef=0.1),
    "spo": lambda lp, lb, adv: objectives.spo(lp, lb, adv, eps=0.2),
    "impala_pg": lambda lp, lb, adv: objectives.impala_pg(lp, lb, adv, rho_bar=1.0),
    "decoupled_ppo": lambda lp, lb, adv: objectives.decoupled_ppo(
        lp, lb, adv, log_proximal=-lp, clip_eps=0.2, is_max=2.0),
    "tv_filter": lambda lp, lb, adv: objectives.tv_filter(lp, lb, adv, delta=0.2),
    "tv_filter/learner": lambda lp, lb, adv: objectives.tv_filter(lp, lb, adv, delta=0.2,
                                                                  log_reference=lp + 3.0),
    "diagnostics": lambda lp, lb, adv: (jnp.sum(jnp.stack(list(
        objectives.ratio_diagnostics(lp, lb, clip_eps=0.2).values()))) + jnp.sum(lp), {}),
}


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_every_objective_stays_finite_at_extreme_log_ratios(name):
    # log w = ±1000 (and ±100, 0): exp overflows float32 without the shared cap.
    log_behavior = jnp.zeros(6)
    log_prob = jnp.array([1000.0, -1000.0, 100.0, -100.0, 0.0, 25.0])
    advantages = jnp.array([1.0, -1.0, -1.0, 1.0, 0.5, 2.0])
    loss_fn = lambda lp: OBJECTIVES[name](lp, log_behavior, advantages)[0]  # noqa: E731
    loss, grad = jax.value_and_grad(loss_fn)(log_prob)
    assert np.isfinite(loss), name
    assert np.all(np.isfinite(grad)), (name, grad)
    metrics = OBJECTIVES[name](log_prob, log_behavior, advantages)[1]
    assert all(np.all(np.isfinite(v)) for v in metrics.values()), (name, metrics)


def test_the_cap_changes_nothing_below_it():
    x = jnp.linspace(-50.0, objectives.MAX_LOG_RATIO, 101)
    value, grad = jax.vmap(jax.value_and_grad(lambda v: objectives.log_ratio(v, 0.0)))(x)
    np.testing.assert_array_equal(value, x)
    np.testing.assert_array_equal(grad, np.ones_like(x))
    above, grad_above = jax.value_and_grad(lambda v: objectives.log_ratio(v, 0.0))(1000.0)
    assert above == objectives.MAX_LOG_RATIO and grad_above == 1.0


def test_the_cap_holds_however_far_above_it():
    # Beyond |x| ≈ 2**24 float32 cannot represent x − (x − cap) as cap: the value must still be
    # the cap exactly, and the gradient still 1.
    for x in (1e8, 3e9, 1e30):
        value, grad = jax.value_and_grad(lambda v: objectives.log_ratio(v, 0.0))(jnp.float32(x))
        assert value == objectives.MAX_LOG_RATIO and grad == 1.0, (x, value, grad)
        value, grad = jax.value_and_grad(lambda v: objectives.log_ratio(0.0, v))(jnp.float32(-x))
        assert value == objectives.MAX_LOG_RATIO and grad == -1.0, (x, value, grad)
    # A ratio of 0 (a log-probability of −inf) stays 0, with a finite gradient.
    value, grad = jax.value_and_grad(lambda v: objectives.log_ratio(v, 0.0))(-jnp.inf)
    assert value == -jnp.inf and np.isfinite(grad)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
def test_infinite_log_probabilities_give_the_cap_or_a_zero_ratio_in_every_dtype(dtype):
    # The LLM's bf16 log-probabilities can be ±inf: the value is the cap (log π = +inf or
    # log ref = −inf) or −inf (a ratio of 0), and the gradient 0, in bfloat16 as in float32.
    for log_prob, log_ref, expected in ((jnp.inf, 0.0, objectives.MAX_LOG_RATIO),
                                        (0.0, -jnp.inf, objectives.MAX_LOG_RATIO),
                                        (-jnp.inf, 0.0, -jnp.inf), (0.0, jnp.inf, -jnp.inf)):
        f = lambda v: objectives.log_ratio(v, jnp.asarray(log_ref, dtype)).astype(jnp.float32)  # noqa: E731
        value, grad = jax.value_and_grad(f)(jnp.asarray(log_prob, dtype))
        assert value == expected and grad == 0.0, (log_prob, log_ref, value, grad)


def test_the_filter_divergence_and_the_ratio_diagnostic_have_distinct_names():
    # With a learner reference the filter measures forward lag only (here 0) while the diagnostic
    # still measures the divergence from β: one name each, neither hides the other.
    log_prob, log_behavior, advantages = sample_inputs(5, spread=1.0)
    _, metrics = objectives.tv_filter(log_prob, log_behavior, advantages, delta=0.01,
                                      log_reference=log_prob)
    diagnostics = objectives.ratio_diagnostics(log_prob, log_behavior, clip_eps=0.2)
    assert "tv_estimate" not in metrics and not set(metrics) & set(diagnostics)
    assert float(metrics["filter_tv"]) == pytest.approx(0.0, abs=1e-6)
    assert float(diagnostics["tv_estimate"]) > 0.1


# --- the registry: one signature, one vocabulary ------------------------------------------------
def test_every_registered_objective_is_the_objective_function_it_names():
    log_prob, log_behavior, advantages = sample_inputs(7, spread=0.5)
    kl = jnp.abs(log_prob - log_behavior)
    log_proximal = log_behavior + 0.3 * np.random.default_rng(1).normal(size=N).astype(np.float32)
    inputs = algorithms.PolicyInputs(log_prob, log_behavior, advantages, kl=kl,
                                     log_proximal=log_proximal)
    params = algorithms.ObjectiveParams(clip_eps=0.2, delta=0.05, rho_bar=1.0, kl_coef=0.1,
                                        decoupled_is_max=1.5)
    direct = {
        "tv_filter": objectives.tv_filter(log_prob, log_behavior, advantages, delta=0.05),
        "ppo_clip": objectives.ppo_clip(log_prob, log_behavior, advantages, clip_eps=0.2),
        "ppo_kl": objectives.ppo_kl(log_prob, log_behavior, advantages, kl=kl, kl_coef=0.1),
        "spo": objectives.spo(log_prob, log_behavior, advantages, eps=0.2),
        "impala_pg": objectives.impala_pg(log_prob, log_behavior, advantages, rho_bar=1.0),
        "pg": objectives.is_pg(log_prob, log_behavior, advantages),
        "decoupled_ppo": objectives.decoupled_ppo(log_prob, log_behavior, advantages,
                                                  log_proximal=log_proximal, clip_eps=0.2,
                                                  is_max=1.5),
        # The stale-data objectives of other systems, at their own defaults.
        "icepop": objectives.icepop(log_prob, log_behavior, advantages, log_proximal=log_proximal,
                                    clip_eps=0.2, low=0.5, high=2.0),
        "cispo": objectives.cispo(log_prob, log_behavior, advantages, eps_low=1.0, eps_high=0.28),
        "dppo_tv": objectives.dppo_tv(log_prob, log_behavior, advantages, delta=0.2,
                                      penalty=1e-3),
        "m2po": objectives.m2po(log_prob, log_behavior, advantages, log_proximal=log_proximal,
                                clip_eps=0.2, tau=0.04, cap=5.0),
        "topr": objectives.topr(log_prob, log_behavior, advantages, threshold=0.0),
        "geppo": objectives.geppo(log_prob, log_behavior, advantages, log_proximal=log_proximal,
                                  clip_eps=0.2),
        "gspo": objectives.gspo(log_prob, log_behavior, advantages, eps_low=3e-4, eps_high=4e-4),
        "geppo_clip": objectives.geppo(log_prob, log_behavior, advantages,
                                       log_proximal=log_proximal, clip_eps=0.2),
    }
    assert set(algorithms.OBJECTIVES) == set(direct)
    for name, objective in algorithms.OBJECTIVES.items():
        loss, metrics = objective(inputs, dataclasses.replace(params, own=objective.defaults))
        assert loss == direct[name][0], name
        assert metrics.keys() == direct[name][1].keys(), name
    # The unconstrained IS gradient is the TV filter that never filters.
    never = objectives.tv_filter(log_prob, log_behavior, advantages, delta=jnp.inf)[0]
    np.testing.assert_allclose(direct["pg"][0], never, rtol=1e-6)


def test_one_vocabulary_for_algorithms_in_mujoco_and_the_llm():
    from vaco_jax.llm import config as llm_config
    assert algorithms.REGISTRY["vaco"].objective.name == "tv_filter"
    assert algorithms.REGISTRY["ppo_clip"].objective.name == "ppo_clip"
    assert algorithms.REGISTRY["pg"].objective.name == "pg"
    assert algorithms.REGISTRY["decoupled_ppo"].name == "gae+decoupled_ppo"
    assert algorithms.REGISTRY["appo"].name == "vtrace_once+ppo_clip"   # Sample Factory, RLlib
    # Every LLM choice is an algorithm of the shared registry whose objective needs no critic/KL.
    for name in llm_config.OBJECTIVES:
        assert name in algorithms.REGISTRY and not algorithms.REGISTRY[name].objective.needs_kl
    # Pairings name estimators and objectives; names of earlier versions still resolve.
    assert algorithms.parse("vtrace_once+ppo_clip") == algorithms.parse("vtrace_once+clip")
    assert algorithms.parse("gae+kl") == algorithms.REGISTRY["ppo_kl"]
    # The pairing names IMPALA's estimator and objective; the registry's `impala` also brings its
    # own config defaults (one epoch), which a bare pairing does not.
    assert algorithms.parse("vtrace_every+impala_pg").name == algorithms.REGISTRY["impala"].name
    assert algorithms.parse("vtrace_every+impala_pg").defaults == ()
    for name in algorithms.ABLATIONS:
        assert algorithms.parse(name).name == name


# --- masked entries (padding after an answer's end) ---------------------------------------------
def poisoned_inputs(seed):
    """Inputs whose masked half holds what padding can hold: log β = −inf (outside a top-p
    nucleus), NaN advantages and KL; and the unmasked half alone, for the reference values."""
    log_prob, log_behavior, advantages = sample_inputs(seed, spread=0.3)
    mask = np.arange(N) < N // 2
    kl = np.abs(log_prob - log_behavior)
    poison = lambda x, v: jnp.asarray(np.where(mask, x, v).astype(np.float32))  # noqa: E731
    masked = algorithms.PolicyInputs(
        jnp.asarray(log_prob), poison(log_behavior, -np.inf), poison(advantages, np.nan),
        mask=jnp.asarray(mask), log_reference=poison(log_behavior + 0.1, -np.inf),
        kl=poison(kl, np.nan), log_proximal=poison(log_behavior - 0.2, np.nan))
    half = slice(0, N // 2)
    direct = algorithms.PolicyInputs(
        jnp.asarray(log_prob[half]), jnp.asarray(log_behavior[half]),
        jnp.asarray(advantages[half]), log_reference=jnp.asarray(log_behavior[half] + 0.1),
        kl=jnp.asarray(kl[half]), log_proximal=jnp.asarray(log_behavior[half] - 0.2))
    return masked, direct


def _objective_and_diagnostics(name):
    params = algorithms.ObjectiveParams(clip_eps=0.2, delta=0.05, rho_bar=1.0, kl_coef=0.1)
    if name == "diagnostics":
        return lambda x: (0.0 * jnp.sum(x.log_prob), objectives.ratio_diagnostics(
            x.log_prob, x.log_behavior, clip_eps=0.2, mask=x.mask))
    objective = algorithms.OBJECTIVES[name]
    return lambda x: objective(x, dataclasses.replace(params, own=objective.defaults))


@pytest.mark.parametrize("name", sorted(algorithms.OBJECTIVES) + ["diagnostics"])
def test_masked_entries_cannot_poison_a_loss_or_its_gradient(name):
    # A masked entry must count for nothing: not in the value (NaN · 0 is NaN) and not in the
    # gradient (a `where` over a NaN branch still passes 0 · NaN back unless the input is
    # sanitised first). The masked result equals the unmasked half's, value and gradient.
    fn = _objective_and_diagnostics(name)
    masked, direct = poisoned_inputs(13)

    def loss_of(inputs):
        return lambda lp: fn(dataclasses.replace(inputs, log_prob=lp))[0]
    loss, grad = jax.value_and_grad(loss_of(masked))(masked.log_prob)
    direct_loss, direct_grad = jax.value_and_grad(loss_of(direct))(direct.log_prob)
    assert np.isfinite(loss) and np.all(np.isfinite(grad)), (name, loss, grad)
    np.testing.assert_allclose(loss, direct_loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad[:N // 2], direct_grad, rtol=1e-5, atol=1e-8)
    assert np.all(np.asarray(grad)[N // 2:] == 0.0), name
    metrics, direct_metrics = fn(masked)[1], fn(direct)[1]
    assert metrics.keys() == direct_metrics.keys()
    for key in metrics:
        np.testing.assert_allclose(metrics[key], direct_metrics[key], rtol=1e-5, atol=1e-7,
                                   err_msg=f"{name}: {key}")
