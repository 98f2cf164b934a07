"""The batched env wrapper (SPEC §5): time limit, true final observation, fresh resets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vaco_jax import envs


def run(vec_env, steps, action_value=0.0, seed=0):
    state = vec_env.reset(jax.random.PRNGKey(seed))
    action = jnp.full((vec_env.num_envs, vec_env.action_size), action_value)

    def step(state, key):
        new_state, result = vec_env.step(state, action, key)
        return new_state, (state.obs, result, new_state.obs)

    keys = jax.random.split(jax.random.PRNGKey(seed + 1), steps)
    return jax.lax.scan(step, state, keys)[1]


def test_time_limit_truncates_and_keeps_the_true_final_observation():
    vec_env = envs.VecEnv(envs.ToyReach(), num_envs=3, episode_length=4)
    obs, result, obs_after = run(vec_env, 12, action_value=0.5)
    truncated = np.asarray(result.truncated)
    assert not np.any(result.terminated)
    np.testing.assert_array_equal(truncated[:, 0], [0, 0, 0, 1] * 3)
    for t in range(12):
        expected_next = obs[t] + np.array([0.05, 0.05, -0.05, -0.05])  # pos moves, target fixed
        np.testing.assert_allclose(result.next_obs[t], expected_next, atol=1e-6)
        if truncated[t, 0]:
            # The env state holds a fresh episode; the transition keeps the final observation.
            assert not np.allclose(obs_after[t], result.next_obs[t])
        else:
            np.testing.assert_allclose(obs_after[t], result.next_obs[t])


def test_resets_are_freshly_randomised():
    vec_env = envs.VecEnv(envs.ToyReach(), num_envs=2, episode_length=3)
    _, result, obs_after = run(vec_env, 30)
    starts = np.asarray(obs_after)[np.asarray(result.truncated)]
    assert len(starts) == 20
    assert len(np.unique(starts.round(6), axis=0)) == len(starts)


def test_termination_is_not_truncation_and_returns_are_reported():
    vec_env = envs.VecEnv(envs.ToyReach(), num_envs=4, episode_length=1000)
    _, result, _ = run(vec_env, 40, action_value=1.0)  # runs out of the box |pos| > 2 by ~step 30
    terminated = np.asarray(result.terminated)
    assert terminated.any() and not np.asarray(result.truncated).any()
    rewards = np.asarray(result.reward)
    for b in range(4):
        end = int(np.argmax(terminated[:, b]))
        assert result.episode_return[end, b] == pytest.approx(rewards[: end + 1, b].sum(), rel=1e-5)
        assert np.all(np.asarray(result.episode_return)[:end, b] == 0.0)


def test_mjx_env_time_limit_on_inverted_pendulum():
    vec_env = envs.VecEnv(envs.make_env("inverted_pendulum"), num_envs=2, episode_length=5)
    obs, result, obs_after = jax.jit(lambda: run(vec_env, 10))()
    done = np.asarray(result.terminated | result.truncated)
    assert done[4].all() and done[9].all() and not done[:4].any()
    # At the truncated step the next observation is the end of the old episode, not a reset state.
    assert not np.allclose(result.next_obs[4], obs_after[4])
    np.testing.assert_allclose(result.next_obs[3], obs[4])


def test_unknown_env_is_refused():
    with pytest.raises(ValueError, match="allowed values"):
        envs.make_env("cartpole_swingup")
