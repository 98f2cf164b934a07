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
