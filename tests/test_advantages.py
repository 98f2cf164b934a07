"""GAE and V-trace (SPEC §3.1) against rlax, a plain-Python loop, and each other."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from vaco_jax.advantages import gae, vtrace

T, B = 12, 5
GAMMA, LAMBDA = 0.97, 0.9


def random_batch(seed, *, p_terminated=0.1, p_truncated=0.1, rho_scale=0.7):
    """A consistent rollout: `next_values[t] == values[t + 1]` unless step t ended an episode."""
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(T, B)).astype(np.float32)
    values = rng.normal(size=(T, B)).astype(np.float32)
    terminated = rng.random((T, B)) < p_terminated
    truncated = (rng.random((T, B)) < p_truncated) & ~terminated
    done = terminated | truncated
    final_values = rng.normal(size=(T, B)).astype(np.float32)   # V of the true final obs
    bootstrap = rng.normal(size=(B,)).astype(np.float32)        # V(s_T)
    following = np.concatenate([values[1:], bootstrap[None]], axis=0)
    next_values = np.where(done, final_values, following).astype(np.float32)
    log_rhos = (rho_scale * rng.normal(size=(T, B))).astype(np.float32)
    return dict(log_rhos=log_rhos, rewards=rewards, values=values, next_values=next_values,
                terminated=terminated, truncated=truncated)


def loop_vtrace(log_rhos, rewards, values, next_values, terminated, truncated, *, gamma, lambda_,
                clip_rho=1.0, clip_c=1.0):
    """SPEC §3.1 written literally, one sequence and one step at a time."""
    targets = np.zeros_like(values)
    advantages = np.zeros_like(values)
    for b in range(values.shape[1]):
        v_next = next_values[-1, b]  # v_T = V(s_T)
        value_next = next_values[-1, b]  # V(s_T)
        for t in reversed(range(values.shape[0])):
            rho = np.exp(log_rhos[t, b])
            discount = gamma * (1.0 - terminated[t, b])
            delta = min(clip_rho, rho) * (rewards[t, b] + discount * next_values[t, b] - values[t, b])
            c = lambda_ * min(clip_c, rho)
            targets[t, b] = values[t, b] + delta + discount * c * (1.0 - truncated[t, b]) * (
                v_next - value_next)
            bootstrap = next_values[t, b] if truncated[t, b] else v_next
            advantages[t, b] = rewards[t, b] + discount * (
                lambda_ * bootstrap + (1 - lambda_) * next_values[t, b]) - values[t, b]
            v_next, value_next = targets[t, b], values[t, b]
    return targets, advantages


def loop_gae(rewards, values, next_values, terminated, truncated, *, gamma, lambda_):
    advantages = np.zeros_like(values)
    for b in range(values.shape[1]):
        running = 0.0
        for t in reversed(range(values.shape[0])):
            discount = gamma * (1.0 - terminated[t, b])
            delta = rewards[t, b] + discount * next_values[t, b] - values[t, b]
            running = delta + discount * lambda_ * (1.0 - truncated[t, b]) * running
            advantages[t, b] = running
    return advantages


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("clip_rho,clip_c", [(1.0, 1.0), (2.0, 0.5), (np.inf, np.inf)])
def test_vtrace_matches_python_loop(seed, clip_rho, clip_c):
    batch = random_batch(seed)
    targets, advantages = vtrace(**batch, gamma=GAMMA, lambda_=LAMBDA, clip_rho=clip_rho,
                                 clip_c=clip_c)
    ref_targets, ref_advantages = loop_vtrace(**batch, gamma=GAMMA, lambda_=LAMBDA,
                                              clip_rho=clip_rho, clip_c=clip_c)
    chex.assert_shape((targets, advantages), (T, B))
    chex.assert_trees_all_close((targets, advantages), (ref_targets, ref_advantages), rtol=1e-5,
                                atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("lambda_", [1.0, 0.9, 0.0])
def test_vtrace_matches_rlax(seed, lambda_):
    # rlax has no truncation flag (and c̄ = 1): compare on rollouts with terminations only.
    batch = random_batch(seed, p_truncated=0.0)
    targets, advantages = vtrace(**batch, gamma=GAMMA, lambda_=lambda_, clip_rho=1.0, clip_c=1.0)
    discounts = GAMMA * (1.0 - batch["terminated"].astype(np.float32))

    def one_sequence(v_tm1, v_t, r_t, discount_t, log_rho):
        out = rlax.vtrace_td_error_and_advantage(v_tm1, v_t, r_t, discount_t, jnp.exp(log_rho),
                                                 lambda_=lambda_)
        return out.errors + v_tm1, out.q_estimate - v_tm1

    ref_targets, ref_advantages = jax.vmap(one_sequence, in_axes=1, out_axes=1)(
        batch["values"], batch["next_values"], batch["rewards"], discounts, batch["log_rhos"])
    chex.assert_trees_all_close((targets, advantages), (ref_targets, ref_advantages), rtol=1e-5,
                                atol=1e-5)


@pytest.mark.parametrize("seed", [0, 3])
def test_vtrace_on_policy_equals_gae(seed):
    batch = random_batch(seed, p_terminated=0.15, p_truncated=0.15)
    batch["log_rhos"] = np.zeros_like(batch["log_rhos"])
    targets, advantages = vtrace(**batch, gamma=GAMMA, lambda_=LAMBDA)
    gae_kwargs = {k: v for k, v in batch.items() if k != "log_rhos"}
    expected = gae(**gae_kwargs, gamma=GAMMA, lambda_=LAMBDA)
    np.testing.assert_allclose(advantages, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(targets, expected + batch["values"], rtol=1e-5, atol=1e-5)


def test_gae_matches_python_loop():
    batch = random_batch(4, p_terminated=0.2, p_truncated=0.2)
    kwargs = {k: v for k, v in batch.items() if k != "log_rhos"}
    np.testing.assert_allclose(gae(**kwargs, gamma=GAMMA, lambda_=LAMBDA),
                               loop_gae(**kwargs, gamma=GAMMA, lambda_=LAMBDA), rtol=1e-5, atol=1e-5)


def test_truncation_bootstraps_from_true_final_observation():
    # One env, three steps, the middle one truncated: its advantage must be r + γ V(s'_final) − V(s)
    # and must not see the next episode's rewards; a termination must not bootstrap at all.
    rewards = np.array([[1.0], [2.0], [100.0]], np.float32)
    values = np.array([[0.5], [0.25], [3.0]], np.float32)
    final_value = 7.0
    next_values = np.array([[0.25], [final_value], [4.0]], np.float32)
    truncated = np.array([[False], [True], [False]])
    terminated = np.array([[False], [False], [True]])
    advantages = gae(rewards, values, next_values, terminated, truncated, gamma=0.9, lambda_=1.0)
    assert advantages[1, 0] == pytest.approx(2.0 + 0.9 * final_value - 0.25)
    assert advantages[2, 0] == pytest.approx(100.0 - 3.0)
    assert advantages[0, 0] == pytest.approx(1.0 + 0.9 * 0.25 - 0.5 + 0.9 * advantages[1, 0])
    targets, vt_advantages = vtrace(np.zeros((3, 1), np.float32), rewards, values, next_values,
                                    terminated, truncated, gamma=0.9, lambda_=1.0)
    np.testing.assert_allclose(vt_advantages, advantages, rtol=1e-6)
    assert targets[1, 0] == pytest.approx(2.0 + 0.9 * final_value)


def test_vtrace_clips_importance_weights():
    # A huge ratio is clipped at ρ̄ = 1, so the target equals the on-policy one; a tiny ratio cuts.
    batch = random_batch(5, p_terminated=0.0, p_truncated=0.0)
    huge = dict(batch, log_rhos=np.full((T, B), 5.0, np.float32))
    on_policy = dict(batch, log_rhos=np.zeros((T, B), np.float32))
    np.testing.assert_allclose(vtrace(**huge, gamma=GAMMA, lambda_=LAMBDA)[0],
                               vtrace(**on_policy, gamma=GAMMA, lambda_=LAMBDA)[0], rtol=1e-6)
    tiny = dict(batch, log_rhos=np.full((T, B), -30.0, np.float32))
    np.testing.assert_allclose(vtrace(**tiny, gamma=GAMMA, lambda_=LAMBDA)[0], batch["values"],
                               atol=1e-6)


def test_a_terminal_steps_next_value_is_never_read():
    # An episode that ends in a physics blow-up may leave a NaN final observation, hence a NaN
    # V(s'_t); multiplying it by the zero discount (0 · NaN = NaN) poisoned every advantage before.
    batch = random_batch(3, p_terminated=0.3)
    terminated = batch["terminated"]
    assert terminated.any()
    poisoned = dict(batch, next_values=np.where(terminated, np.nan, batch["next_values"]))
    zeroed = dict(batch, next_values=np.where(terminated, 0.0, batch["next_values"]))
    gae_args = {k: v for k, v in poisoned.items() if k != "log_rhos"}
    advantages = gae(**gae_args, gamma=GAMMA, lambda_=LAMBDA)
    assert np.all(np.isfinite(advantages))
    np.testing.assert_array_equal(advantages, gae(**{k: v for k, v in zeroed.items() if k != "log_rhos"},
                                                  gamma=GAMMA, lambda_=LAMBDA))
    # Nor by V-trace; and where no NaN is, the results are bit for bit those of the product.
    targets, advantages = vtrace(**poisoned, gamma=GAMMA, lambda_=LAMBDA)
    assert np.all(np.isfinite(targets)) and np.all(np.isfinite(advantages))
    chex.assert_trees_all_equal((targets, advantages), vtrace(**batch, gamma=GAMMA, lambda_=LAMBDA))
