"""Property tests (hypothesis): numerical safety of advantages and objectives at extreme log-ratios
and edge shapes, the TV filter's defining property, and the ring buffer's age bookkeeping."""

import math

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from vaco_jax import advantages, objectives, ring_buffer

SETTINGS = settings(max_examples=30, deadline=None)
LOG_RATIO_BOUND = 50.0
# Shapes come from small sets so that each compiles once.
SHAPES = st.sampled_from([(1, 1), (1, 4), (2, 3), (5, 1), (5, 4)])


def floats(low, high):
    return st.floats(float(np.float32(low)), float(np.float32(high)), allow_nan=False,
                     allow_infinity=False, width=32)


def arrays(shape, low, high):
    return hnp.arrays(np.float32, shape, elements=floats(low, high))


def log_ratios(shape):
    """Anywhere in [-50, 50], with the extremes themselves drawn often."""
    return hnp.arrays(np.float32, shape, elements=st.one_of(
        st.sampled_from([-LOG_RATIO_BOUND, LOG_RATIO_BOUND, 0.0]), floats(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)))


@st.composite
def rollouts(draw):
    """A time-major `[T, B]` rollout (T = 1 included) with extreme log ρ and every kind of step end."""
    shape = draw(SHAPES)
    terminated = draw(hnp.arrays(bool, shape))
    truncated = draw(hnp.arrays(bool, shape)) & ~terminated
    return dict(log_rhos=draw(log_ratios(shape)), rewards=draw(arrays(shape, -10, 10)),
                values=draw(arrays(shape, -100, 100)), next_values=draw(arrays(shape, -100, 100)),
                terminated=terminated, truncated=truncated,
                gamma=draw(floats(0, 1)), lambda_=draw(floats(0, 1)),
                clip_rho=draw(floats(0.1, 10)), clip_c=draw(floats(0.1, 10)))


gae = jax.jit(advantages.gae)
vtrace = jax.jit(advantages.vtrace)


@SETTINGS
@given(rollouts())
def test_advantages_are_finite_for_extreme_log_ratios(r):
    common = {k: jnp.asarray(r[k]) for k in ["rewards", "values", "next_values", "terminated", "truncated"]}
    gae_advantages = gae(**common, gamma=r["gamma"], lambda_=r["lambda_"])
    targets, vtrace_advantages = vtrace(jnp.asarray(r["log_rhos"]), **common, gamma=r["gamma"],
                                        lambda_=r["lambda_"], clip_rho=r["clip_rho"], clip_c=r["clip_c"])
    for x in (gae_advantages, targets, vtrace_advantages):
        assert x.shape == r["rewards"].shape and np.all(np.isfinite(np.asarray(x)))


OBJECTIVES = {
    "ppo_clip": lambda lp, lb, a, m: objectives.ppo_clip(lp, lb, a, clip_eps=0.2, mask=m),
    "ppo_kl": lambda lp, lb, a, m: objectives.ppo_kl(lp, lb, a, kl=jnp.abs(lp - lb), kl_coef=0.1,
                                                     mask=m),
    "spo": lambda lp, lb, a, m: objectives.spo(lp, lb, a, eps=0.2, mask=m),
    "impala_pg": lambda lp, lb, a, m: objectives.impala_pg(lp, lb, a, rho_bar=1.0, mask=m),
    "tv_filter": lambda lp, lb, a, m: objectives.tv_filter(lp, lb, a, delta=0.2, mask=m),
    "tv_filter_per_sample_is_max": lambda lp, lb, a, m: objectives.tv_filter(
        lp, lb, a, delta=0.05, filter_mode="per_sample", is_max=2.0, mask=m),
    "tv_filter_learner": lambda lp, lb, a, m: objectives.tv_filter(
        lp, lb, a, delta=0.2, log_reference=lb + jnp.flip(lp - lb), mask=m),
    "gspo": lambda lp, lb, a, m: objectives.gspo(lp, lb, a, eps_low=3e-4, eps_high=4e-4, mask=m),
}


def loss_grad_metrics(name, log_prob, log_behavior, advantage, mask):
    def loss(lp):
        value, metrics = OBJECTIVES[name](lp, log_behavior, advantage, mask)
        return value, metrics
    (value, metrics), grad = jax.value_and_grad(loss, has_aux=True)(log_prob)
    metrics.update(objectives.ratio_diagnostics(log_prob, log_behavior, clip_eps=0.2, mask=mask))
    return value, grad, metrics


loss_grad_metrics_jit = jax.jit(loss_grad_metrics, static_argnums=0)


@st.composite
def minibatches(draw):
    shape = draw(SHAPES)
    log_behavior = draw(arrays(shape, -20, 5))
    mask = draw(st.one_of(st.none(), hnp.arrays(np.float32, shape, elements=st.sampled_from([0.0, 1.0]))))
    return dict(log_prob=log_behavior + draw(log_ratios(shape)), log_behavior=log_behavior,
                advantage=draw(arrays(shape, -10, 10)), mask=mask)


@SETTINGS
@given(minibatches(), st.sampled_from(sorted(OBJECTIVES)))
def test_objectives_and_their_gradients_are_finite_for_extreme_log_ratios(mb, name):
    """Log-ratios up to ±50, masks (all-zero ones included), T = 1 and B = 1."""
    value, grad, metrics = loss_grad_metrics_jit(name, mb["log_prob"], mb["log_behavior"],
                                                 mb["advantage"], mb["mask"])
    assert np.isfinite(float(value)), (name, float(value))
    assert np.all(np.isfinite(np.asarray(grad))), name
    for key, metric in metrics.items():
        assert np.all(np.isfinite(np.asarray(metric))), (name, key, metric)
    if mb["mask"] is not None:  # masked-out entries carry no gradient
        assert np.all(np.asarray(grad)[mb["mask"] == 0] == 0), name


@st.composite
def filter_cases(draw):
    """Per-sample log-probabilities θ_i as free parameters (a tabular policy), away from r = 1."""
    n = draw(st.sampled_from([2, 5, 16]))
    magnitude = hnp.arrays(np.float32, n, elements=floats(1e-3, 3.0))
    sign = hnp.arrays(np.float32, n, elements=st.sampled_from([-1.0, 1.0]))
    log_behavior = draw(arrays(n, -5, 0))
    reference = draw(st.sampled_from(["behavior", "learner"]))
    log_reference = (log_behavior + draw(magnitude) * draw(sign)) if reference == "learner" else None
    # The deviation log(r/q) is kept at least 1e-3 away from 0: see the note in the test.
    q = log_behavior if log_reference is None else log_reference
    theta = q + draw(magnitude) * draw(sign)
    advantage = draw(arrays(n, -3, 3))
    mask = draw(st.one_of(st.none(), hnp.arrays(np.float32, n, elements=st.sampled_from([0.0, 1.0]))))
    return dict(theta=theta, log_behavior=log_behavior, log_reference=log_reference, advantage=advantage,
                mask=mask, is_max=draw(st.sampled_from([math.inf, 1.5])))


def divergence(theta, c):
    """The minibatch TV estimate ½ mean |r_i − q_i| / β_i-style (as the filter measures it), float64."""
    r = np.exp(theta.astype(np.float64) - c["log_behavior"])
    q = 1.0 if c["log_reference"] is None else np.exp(c["log_reference"] - c["log_behavior"]).astype(np.float64)
    deviation = np.abs(r - q)
    mask = np.ones_like(deviation) if c["mask"] is None else c["mask"]
    return 0.5 * np.sum(deviation * mask) / max(np.sum(mask), 1.0), (r - q) * mask


@SETTINGS
@given(filter_cases())
def test_tv_filter_step_never_increases_the_tv_estimate(c):
    """With D̂_TV > δ (the filter active), a small step along the filtered loss's negative gradient
    moves no sample's ratio away from its reference, so D̂_TV does not increase (SPEC §3.2).

    Samples with r_i = q_i exactly are excluded: there sign(r − 1) = 0 keeps them whatever Â is, and
    their step moves r_i off the reference, raising D̂_TV at first order (a measure-zero case).
    """
    tv, _ = divergence(c["theta"], c)
    delta = 0.5 * tv  # active filter

    def loss(theta):
        return objectives.tv_filter(theta, jnp.asarray(c["log_behavior"]), jnp.asarray(c["advantage"]),
                                    delta=delta, log_reference=c["log_reference"], is_max=c["is_max"],
                                    mask=c["mask"])[0]

    grad = np.asarray(jax.grad(loss)(jnp.asarray(c["theta"])), np.float64)
    _, deviation = divergence(c["theta"], c)
    # Each sample: d|r_i − q_i| / dη along −g has the sign of (r_i − q_i)·(−g_i); never positive.
    assert np.all(deviation * -grad <= 0), (deviation, grad)
    if np.any(grad):
        # A finite step small enough that no log-ratio crosses its reference.
        gap = np.min(np.abs(c["theta"].astype(np.float64) - (
            c["log_behavior"] if c["log_reference"] is None else c["log_reference"])))
        step = 0.1 * gap / np.max(np.abs(grad))
        new_tv, _ = divergence(c["theta"] - step * grad, c)
        assert new_tv <= tv * (1 + 1e-12), (tv, new_tv)


def snapshot(version):
    return {"actor": jnp.full((2,), version, jnp.float32), "normalizer": jnp.float32(version)}


OPERATIONS = st.lists(st.one_of(
    st.just(("push",)),
    st.tuples(st.just("sample"), st.sampled_from(ring_buffer.SAMPLING_MODES), st.integers(0, 2**16))),
    min_size=1, max_size=25)


@SETTINGS
@given(st.sampled_from([1, 3, 5]), st.data(), OPERATIONS)
def test_ring_buffer_ages_match_the_snapshots_used(max_capacity, data, operations):
    capacity = data.draw(st.integers(1, max_capacity))
    buffer = ring_buffer.init(snapshot(0), max_capacity, capacity)
    pushed = 1  # version 0 is the initial snapshot
    for operation in operations:
        if operation[0] == "push":
            buffer = push(buffer, snapshot(pushed))
            pushed += 1
            continue
        _, mode, seed = operation
        # A lag profile: random probabilities over the buffer's ages (mass on ages not yet
        # held is clamped to the oldest snapshot there is).
        probabilities = (ring_buffer.profile_probabilities(
            np.random.default_rng(seed).dirichlet(np.ones(capacity)), max_capacity)
            if mode == "profile" else None)
        snaps, ages = sample(buffer, jax.random.PRNGKey(seed), mode, probabilities)
        versions, ages = np.asarray(snaps["normalizer"]), np.asarray(ages)
        np.testing.assert_array_equal(versions, pushed - 1 - ages)  # reported age = snapshot used
        np.testing.assert_array_equal(np.asarray(snaps["actor"])[:, 0], versions)
        filled = min(pushed, capacity)
        assert np.all((0 <= ages) & (ages < filled))  # only the newest `capacity` versions
        if mode == "newest":
            assert np.all(ages == 0)
        elif mode == "oldest":
            assert np.all(ages == filled - 1)


push = jax.jit(ring_buffer.push)
sample = jax.jit(lambda buffer, key, mode, probabilities: ring_buffer.sample(
    buffer, key, 4, mode, probabilities), static_argnums=2)
