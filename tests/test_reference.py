"""VACO in one screen (`vaco_jax.reference`) computes what the fused trainer computes: from the same
key, the same rollouts under real lag, the same V-trace advantages, the same parameters after each
iteration, and the same whole run (evaluations included)."""

from __future__ import annotations

import chex
import jax
import numpy as np
import pytest

from vaco_jax import reference, ring_buffer
from vaco_jax.config import Config
from vaco_jax.trainer import Trainer

# The oldest of 3 snapshots: from the third iteration on every actor acts with θ_{T−2} (lag 2).
TINY = Config(env="toy_reach", algo="vaco", num_envs=8, unroll_length=8, num_epochs=2,
              num_minibatches=2, num_actors=2, episode_length=20, total_steps=8 * 8 * 3 * 2,
              num_evals=2, eval_envs=4, actor_hidden=(16, 16), critic_hidden=(16, 16),
              capacity=3, snapshot_sampling="oldest")
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}   # float32: the two programs fuse their sums differently


@pytest.fixture(scope="module")
def both():
    return Trainer(TINY), reference.make_train(TINY)


def trainers_advantages(trainer: Trainer, state):
    """The trainer's V-trace advantages of the iteration `state` starts, on its own rollout
    (drawn with the keys `Trainer.iteration` draws), and whether that rollout was off-policy."""
    _, start_key, sample_key, rollout_key, _ = jax.random.split(state.key, 5)
    started = trainer.vec_env.start(state.env_state, start_key)
    snapshots, ages = ring_buffer.sample(state.buffer, sample_key, TINY.num_actors,
                                         TINY.snapshot_sampling)
    _, traj = trainer.act(trainer.vec_env, started, snapshots, rollout_key)
    batch, _ = trainer.realign(state.params, state.normalizer, traj, state.hparams)
    off_policy = jax.numpy.abs(batch.log_learner_start - traj.log_behavior).max()
    return batch.advantages, ages, off_policy


def test_each_iteration_equals_the_trainers_and_so_do_the_vtrace_advantages_under_lag(both):
    trainer, train = both
    key = jax.random.PRNGKey(7)
    ours, theirs = jax.jit(train.init)(key), jax.jit(trainer.init)(key)
    chex.assert_trees_all_close(ours.params, theirs.params, **TOLERANCE)
    step, their_step = jax.jit(train.iteration), jax.jit(trainer.iteration)
    their_advantages = jax.jit(lambda s: trainers_advantages(trainer, s))
    for t in range(3):
        expected, ages, off_policy = their_advantages(theirs)
        ours, info = step(ours)
        theirs, _ = their_step(theirs)
        np.testing.assert_array_equal(info["snapshot_age"], ages)
        np.testing.assert_allclose(info["advantages"], expected, **TOLERANCE)
        chex.assert_trees_all_close(ours.params, theirs.params, **TOLERANCE)
        chex.assert_trees_all_close(ours.normalizer, theirs.normalizer, **TOLERANCE)
        chex.assert_trees_all_close(ours.env_state.obs, theirs.env_state.obs, **TOLERANCE)
        np.testing.assert_array_equal(ours.key, theirs.key)
    # The last iteration acted with θ_{T−2}: β ≠ π_T, so V-trace corrected something.
    np.testing.assert_array_equal(ages, [2, 2])
    assert off_policy > 1e-3


def test_the_whole_run_equals_the_trainers(both):
    trainer, train = both
    key = jax.random.PRNGKey(3)
    ours, metrics = jax.jit(train)(key)
    theirs, their_metrics = jax.jit(trainer.train)(key)
    assert metrics["advantages"].shape == (2, 3, TINY.unroll_length, TINY.num_envs)
    np.testing.assert_allclose(metrics["eval_return"], their_metrics["eval_return"], **TOLERANCE)
    np.testing.assert_allclose(metrics["filtered_fraction"].mean(axis=1),
                               their_metrics["filtered_fraction"], **TOLERANCE)
    chex.assert_trees_all_close(ours.params, theirs.params, **TOLERANCE)
    assert int(ours.iteration) == int(theirs.iteration) == 6
