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


def test_cond_any_under_vmap_equals_the_per_member_branch_and_skips_when_none_holds():
    calls = []

    def branch(x):
        jax.debug.callback(lambda: calls.append(1))
        return x + 1.0

    def f(pred, x):
        return envs.cond_any(pred, branch, x)

    xs = jnp.arange(3.0)
    # One member true: the branch runs once for the whole batch; under the documented
    # contract (a branch result is only used where pred holds) the outputs are per member.
    mixed = jax.jit(jax.vmap(lambda p, x: jnp.where(p, f(p, x), x)))(
        jnp.array([False, True, False]), xs)
    np.testing.assert_array_equal(mixed, [0.0, 2.0, 2.0])
    jax.effects_barrier()
    assert len(calls) == 1
    calls.clear()
    none = jax.jit(jax.vmap(f))(jnp.zeros(3, bool), xs)
    jax.effects_barrier()
    np.testing.assert_array_equal(none, xs)
    assert calls == []
    # Nested vmap (seeds × hyper-parameters) and the unbatched call agree with lax.cond.
    preds = jnp.array([[False, True], [False, False]])
    grid = jnp.arange(4.0).reshape(2, 2)
    nested = jax.vmap(jax.vmap(lambda p, x: jnp.where(p, f(p, x), x)))(preds, grid)
    np.testing.assert_array_equal(nested, jnp.where(preds, grid + 1.0, grid))
    assert float(f(jnp.array(True), jnp.float32(2.0))) == 3.0
    assert float(f(jnp.array(False), jnp.float32(2.0))) == 2.0


def test_fast_solver_changes_only_the_checked_settings_and_default_keeps_braxs():
    default = envs.make_env("hopper")
    fast = envs.make_env("hopper", mjx_solver="fast")
    assert int(default.sys.opt.ls_iterations) == 50 and int(fast.sys.opt.ls_iterations) == 4
    assert int(fast.sys.opt.iterations) == int(default.sys.opt.iterations)
    ant_fast = envs.make_env("ant", mjx_solver="fast")   # not in FAST_SOLVER: untouched
    assert int(ant_fast.sys.opt.ls_iterations) == int(envs.make_env("ant").sys.opt.ls_iterations)
    with pytest.raises(ValueError, match="mjx_solver"):
        envs.make_env("hopper", mjx_solver="quick")


def test_reset_pool_hands_each_fresh_state_out_once_and_refills_only_when_overdrawn():
    vec_env = envs.VecEnv(envs.ToyReach(), num_envs=4, episode_length=3)
    state = vec_env.reset(jax.random.PRNGKey(0))
    state = state.replace(step_count=jnp.array([0, 1, 2, 0], jnp.int32))  # staggered episode ends
    action = jnp.zeros((4, vec_env.action_size))

    def step(state, key):
        new_state, result = vec_env.step(state, action, key)
        return new_state, (result.truncated, new_state.obs, state.pool_used, new_state.pool_used)

    _, (ended, obs_after, used_before, used_after) = jax.lax.scan(
        step, state, jax.random.split(jax.random.PRNGKey(1), 30))
    ended, used_before, used_after = map(np.asarray, (ended, used_before, used_after))
    n_ended = ended.sum(axis=1)
    starts = np.asarray(obs_after)[ended]
    assert len(starts) == n_ended.sum() == 40
    assert len(np.unique(starts.round(6), axis=0)) == len(starts)     # no state handed out twice
    refilled = used_after < used_before + n_ended
    # A refill happens exactly when the pool cannot serve this step's ends, and then starts over.
    np.testing.assert_array_equal(refilled, used_before + n_ended > 4)
    np.testing.assert_array_equal(used_after[refilled], n_ended[refilled])
    assert 10 <= refilled.sum() <= 20    # 40 ends, 1–2 per step: at most 4 and at least 2 per refill


def test_a_vmapped_rollout_traces_the_env_reset_once():
    # The refill's reset sits in a branch that `cond_any` builds twice under vmap; tracing the
    # reset twice would double the most expensive trace of a learner program (MJX's forward).
    resets = []

    class CountedToyReach(envs.ToyReach):
        def reset(self, key):
            resets.append(key)
            return super().reset(key)

    vec_env = envs.VecEnv(CountedToyReach(), num_envs=3, episode_length=4)
    keys = jax.random.split(jax.random.PRNGKey(0), 2)

    def rollout(key):   # under vmap, as in the trainer: the pool's refill is batched
        action = jnp.zeros((vec_env.num_envs, vec_env.action_size))
        step = lambda state, key: (vec_env.step(state, action, key)[0], None)
        return jax.lax.scan(step, vec_env.reset(key), jax.random.split(key, 8))[0]

    jax.jit(jax.vmap(rollout)).trace(keys)
    assert len(resets) == 2   # VecEnv.reset (the initial states) and the pool's refill


def test_unstarted_envs_are_reset_by_start_and_started_ones_left_alone():
    vec_env = envs.VecEnv(envs.ToyReach(), num_envs=3, episode_length=4)
    key, other = jax.random.PRNGKey(0), jax.random.PRNGKey(1)
    unstarted = vec_env.unstarted(key)
    reset = vec_env.reset(key)
    assert not bool(unstarted.started) and bool(reset.started)
    assert jax.tree.map(jnp.shape, unstarted) == jax.tree.map(jnp.shape, reset)
    assert not np.any(np.asarray(unstarted.obs))             # shaped, not reset
    started = vec_env.start(unstarted, key)
    for x, y in zip(jax.tree.leaves(started), jax.tree.leaves(reset)):
        np.testing.assert_array_equal(x, y)
    # Under vmap, a member that has started keeps its state while another one starts.
    both = jax.tree.map(lambda a, b: jnp.stack([a, b]), reset, unstarted)
    out = jax.jit(jax.vmap(vec_env.start))(both, jnp.stack([other, other]))
    expected = jax.tree.map(lambda a, b: jnp.stack([a, b]), reset, vec_env.reset(other))
    for x, y in zip(jax.tree.leaves(out), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(x, y)


class BlowUpReach(envs.ToyReach):
    """toy_reach whose episodes end, at the box's edge, in a NaN reward and observation (as a
    physics blow-up ends a DM Control episode)."""

    def step(self, state, action):
        state = super().step(state, action)
        blown = state.done > 0.5
        return state.replace(obs=jnp.where(blown, jnp.nan, state.obs),
                             reward=jnp.where(blown, jnp.nan, state.reward))


def test_an_episode_ending_in_nan_ends_with_zeros_and_is_counted():
    _, result, obs_after = run(envs.VecEnv(BlowUpReach(), num_envs=4, episode_length=1000), 40,
                               action_value=1.0)   # out of the box by ~step 30
    _, plain, _ = run(envs.VecEnv(envs.ToyReach(), num_envs=4, episode_length=1000), 40,
                      action_value=1.0)
    ended = np.asarray(result.terminated)
    assert ended.any()
    np.testing.assert_array_equal(result.nonfinite, ended)
    for values in (result.reward, result.next_obs, result.episode_return, obs_after):
        assert np.all(np.isfinite(values))
    assert np.all(np.asarray(result.next_obs)[ended] == 0.0)
    # Every other step is what the env returned, bit for bit; the episode's return lacks only the
    # final (NaN) reward.
    np.testing.assert_array_equal(result.reward, np.where(ended, 0.0, plain.reward))
    np.testing.assert_array_equal(np.asarray(result.next_obs)[~ended],
                                  np.asarray(plain.next_obs)[~ended])
    np.testing.assert_allclose(np.asarray(result.episode_return)[ended],
                               np.asarray(plain.episode_return - plain.reward)[ended], rtol=1e-6)
