"""The policy ring buffer (SPEC §2): ages, eviction, sampling modes, traced capacity."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vaco_jax import ring_buffer


def snapshot(version):
    # A snapshot whose contents encode its version, so a sample can be checked against its age.
    version = jnp.float32(version)
    return {"actor": {"w": jnp.full((3, 2), version)}, "normalizer": version}


def filled_buffer(capacity, max_capacity, pushes):
    buffer = ring_buffer.init(snapshot(0), max_capacity, capacity)
    for version in range(1, pushes + 1):
        buffer = ring_buffer.push(buffer, snapshot(version))
    return buffer


@pytest.mark.parametrize("capacity,pushes", [(1, 0), (1, 5), (3, 1), (3, 7), (4, 4)])
@pytest.mark.parametrize("mode", ["uniform", "oldest", "newest"])
def test_sample_returns_the_snapshot_of_the_age_it_reports(capacity, pushes, mode):
    buffer = filled_buffer(capacity, max_capacity=5, pushes=pushes)
    newest = pushes
    for seed in range(5):
        snaps, ages = ring_buffer.sample(buffer, jax.random.PRNGKey(seed), 16, mode)
        chex.assert_shape(ages, (16,))
        chex.assert_tree_shape_prefix(snaps, (16,))     # every leaf: one snapshot per draw
        versions = newest - np.asarray(ages)
        np.testing.assert_array_equal(np.asarray(snaps["normalizer"]), versions)
        np.testing.assert_array_equal(np.asarray(snaps["actor"]["w"])[:, 0, 0], versions)
        filled = min(pushes + 1, capacity)
        assert np.all((0 <= np.asarray(ages)) & (np.asarray(ages) < filled))
        if mode == "newest":
            assert np.all(np.asarray(ages) == 0)
        if mode == "oldest":
            assert np.all(np.asarray(ages) == filled - 1)


def test_uniform_sampling_covers_every_filled_slot_evenly():
    buffer = filled_buffer(4, max_capacity=8, pushes=10)
    _, ages = ring_buffer.sample(buffer, jax.random.PRNGKey(0), 40_000, "uniform")
    counts = np.bincount(np.asarray(ages), minlength=8)
    assert np.all(counts[4:] == 0)
    np.testing.assert_allclose(counts[:4] / 40_000, 0.25, atol=0.01)


def test_capacity_one_is_always_on_policy():
    buffer = filled_buffer(1, max_capacity=4, pushes=9)
    snaps, ages = ring_buffer.sample(buffer, jax.random.PRNGKey(1), 8, "uniform")
    assert np.all(np.asarray(ages) == 0)
    assert np.all(np.asarray(snaps["normalizer"]) == 9)


def test_capacity_is_vmappable_below_max_capacity():
    def oldest_version(capacity):
        buffer = ring_buffer.init(snapshot(0), 6, capacity)
        buffer = jax.lax.fori_loop(1, 10, lambda v, b: ring_buffer.push(b, snapshot(v)), buffer)
        snaps, ages = ring_buffer.sample(buffer, jax.random.PRNGKey(0), 2, "oldest")
        return snaps["normalizer"][0], ages[0]

    versions, ages = jax.jit(jax.vmap(oldest_version))(jnp.arange(1, 7))
    np.testing.assert_array_equal(ages, np.arange(0, 6))
    np.testing.assert_array_equal(versions, 9 - np.arange(0, 6))


# --- lag profiles: each actor group's age drawn from given probabilities ---------------------------

SKEWED = (0.5, 0.25, 0.125, 0.0, 0.125)   # a zero inside, and ages of every weight


def profile_ages(buffer, probabilities, draws, seed=0):
    p = ring_buffer.profile_probabilities(probabilities, buffer.max_capacity)
    return ring_buffer.sample(buffer, jax.random.PRNGKey(seed), draws, "profile", p)


def test_profile_sampling_follows_the_profile():
    draws = 200_000
    buffer = filled_buffer(5, max_capacity=8, pushes=12)
    snaps, ages = profile_ages(buffer, SKEWED, draws)
    counts = np.bincount(np.asarray(ages), minlength=8)
    assert counts[3] == 0 and np.all(counts[5:] == 0)       # zero probability: never drawn
    p = np.pad(SKEWED, (0, 3))
    # 5 binomial standard deviations: a wrong age order or a flat draw is off by hundreds of them.
    np.testing.assert_array_less(np.abs(counts / draws - p), 5 * np.sqrt(p * (1 - p) / draws) + 1e-12)
    np.testing.assert_array_equal(np.asarray(snaps["normalizer"]), 12 - np.asarray(ages))


@pytest.mark.parametrize("pushes", range(0, 7))
def test_a_one_hot_profile_at_the_last_age_is_oldest_sampling(pushes):
    # At every fill level, the filling iterations included: the missing ages fall to the oldest.
    buffer = filled_buffer(4, max_capacity=6, pushes=pushes)
    oldest = ring_buffer.sample(buffer, jax.random.PRNGKey(3), 16, "oldest")
    profile = profile_ages(buffer, (0.0, 0.0, 0.0, 1.0), 16, seed=3)
    chex.assert_trees_all_equal(profile, oldest)


def test_a_uniform_profile_samples_as_uniform_sampling_does():
    draws = 100_000
    buffer = filled_buffer(4, max_capacity=8, pushes=10)
    _, uniform = ring_buffer.sample(buffer, jax.random.PRNGKey(1), draws, "uniform")
    _, profile = profile_ages(buffer, (0.25,) * 4, draws, seed=2)
    a, b = (np.bincount(np.asarray(x), minlength=8) / draws for x in (uniform, profile))
    assert np.all(a[4:] == 0) and np.all(b[4:] == 0)
    bound = 5 * np.sqrt(0.25 * 0.75 / draws)
    np.testing.assert_array_less(np.abs(b[:4] - 0.25), bound)
    np.testing.assert_array_less(np.abs(a[:4] - b[:4]), 2 * bound)


def test_while_the_buffer_fills_missing_ages_fall_to_the_oldest_snapshot():
    draws = 100_000
    buffer = filled_buffer(4, max_capacity=4, pushes=1)      # ages 0 and 1 exist so far
    _, ages = profile_ages(buffer, (0.1, 0.2, 0.3, 0.4), draws)
    shares = np.bincount(np.asarray(ages), minlength=4) / draws
    np.testing.assert_allclose(shares, [0.1, 0.9, 0.0, 0.0], atol=0.006)


def test_profiles_are_vmappable_beside_capacity():
    # Two profiles (and their capacities) as traced leaves of one compiled program.
    profiles = jnp.stack([ring_buffer.profile_probabilities(p, 6)
                          for p in [(1.0,), (0.0, 0.5, 0.0, 0.5)]])

    def ages(capacity, probabilities):
        buffer = ring_buffer.init(snapshot(0), 6, capacity)
        buffer = jax.lax.fori_loop(1, 10, lambda v, b: ring_buffer.push(b, snapshot(v)), buffer)
        snaps, ages = ring_buffer.sample(buffer, jax.random.PRNGKey(0), 4000, "profile",
                                         probabilities)
        return ages, snaps["normalizer"]

    ages, versions = jax.jit(jax.vmap(ages))(jnp.array([1, 4]), profiles)
    assert np.all(np.asarray(ages[0]) == 0)
    assert set(np.unique(np.asarray(ages[1]))) == {1, 3}
    assert abs(float(jnp.mean(ages[1] == 1)) - 0.5) < 0.05
    np.testing.assert_array_equal(np.asarray(versions), 9 - np.asarray(ages))


def test_a_profile_is_padded_to_the_slots_and_rescaled_to_sum_to_one():
    p = ring_buffer.profile_probabilities((0.6, 0.3, 0.1004), 5)
    chex.assert_shape(p, (5,))
    np.testing.assert_allclose(np.asarray(p), np.array([0.6, 0.3, 0.1004, 0, 0]) / 1.0004, rtol=1e-6)
    with pytest.raises(ValueError, match="1 to 2 probabilities"):
        ring_buffer.profile_probabilities((0.5, 0.25, 0.25), 2)
