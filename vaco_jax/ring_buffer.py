"""The policy ring buffer that simulates asynchronous actors (SPEC §2).

It holds the last `capacity` learner snapshots (everything a behaviour policy needs to act: actor
parameters *and* observation-normaliser statistics). `max_capacity` slots are allocated (static
shapes) and `capacity` is a traced scalar, so one compiled program can sweep capacities under vmap.

Push `n` (0-based) writes slot `n mod capacity` with snapshot version `n`: the learner iteration
whose start-of-iteration parameters it holds. The k-th newest snapshot (k = 0 is the newest) lives in
slot `(num_pushed − 1 − k) mod capacity` and has age k. `C = 1` always returns the newest snapshot:
synchronous on-policy training.

A **lag profile** (`mode="profile"`) draws each actor group's age from given probabilities
`p_0 … p_{C−1}`, e.g. the staleness histogram an asynchronous system logs. Before the buffer holds
C snapshots, an age that does not exist yet is clamped to the oldest snapshot there is: an actor
that is k iterations behind a learner that has taken fewer than k steps still acts with the
initial parameters, as in a real system, which starts at lag 0. So a profile that puts all its
mass on age C − 1 is `oldest`, at every iteration.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

SAMPLING_MODES = ("uniform", "oldest", "newest", "profile")


@struct.dataclass
class PolicyRingBuffer:
    snapshots: Any          # pytree, every leaf with a leading [max_capacity] axis
    versions: jax.Array     # [max_capacity] int32: learner iteration of each slot's snapshot
    num_pushed: jax.Array   # int32: snapshots pushed so far (the newest has version num_pushed − 1)
    capacity: jax.Array     # int32: slots in use, 1 ≤ capacity ≤ max_capacity

    @property
    def max_capacity(self) -> int:
        return self.versions.shape[0]

    @property
    def num_filled(self):
        return jnp.minimum(self.num_pushed, self.capacity)


def init(snapshot, max_capacity: int, capacity) -> PolicyRingBuffer:
    """A buffer holding `snapshot` as version 0 (the initial parameters)."""
    snapshots = jax.tree.map(
        lambda x: jnp.broadcast_to(x, (max_capacity,) + jnp.shape(x)).astype(jnp.asarray(x).dtype),
        snapshot)
    return PolicyRingBuffer(snapshots, jnp.zeros((max_capacity,), jnp.int32), jnp.int32(1),
                            jnp.asarray(capacity, jnp.int32))


def push(buffer: PolicyRingBuffer, snapshot) -> PolicyRingBuffer:
    """Write `snapshot` as the newest version, evicting the oldest when full."""
    slot = jnp.mod(buffer.num_pushed, buffer.capacity)
    snapshots = jax.tree.map(lambda slots, x: slots.at[slot].set(x), buffer.snapshots, snapshot)
    versions = buffer.versions.at[slot].set(buffer.num_pushed)
    return buffer.replace(snapshots=snapshots, versions=versions, num_pushed=buffer.num_pushed + 1)


def profile_probabilities(probabilities, max_capacity: int) -> jax.Array:
    """A lag profile `p_0 … p_{C−1}` (C ≤ `max_capacity`, checked by `config.check_lag_profile`) as
    the `[max_capacity]` float32 vector `sample` draws from: rescaled to sum to 1, padded with
    zeros (ages no actor acts with)."""
    values = np.asarray(probabilities, np.float64)
    if values.ndim != 1 or not 0 < len(values) <= max_capacity:
        raise ValueError(f"a lag profile of {max_capacity} slots holds 1 to {max_capacity} "
                         f"probabilities, got shape {values.shape}")
    return jnp.asarray(np.pad(values / values.sum(), (0, max_capacity - len(values))), jnp.float32)


def sample(buffer: PolicyRingBuffer, key, num_groups: int, mode: str = "uniform",
           probabilities=None):
    """One snapshot per actor group.

    `mode="profile"` draws each group's age from `probabilities` `[max_capacity]` (a traced leaf:
    `profile_probabilities`), clamped to the oldest snapshot held while the buffer fills.

    Returns `(snapshots, ages)`: snapshots with a leading `[num_groups]` axis, and each one's age
    (`newest version − its version`; 0 means on-policy).
    """
    if mode == "profile":
        if probabilities is None:
            raise ValueError("snapshot sampling mode 'profile' needs the profile's probabilities")
        drawn = jax.random.choice(key, buffer.max_capacity, (num_groups,), p=probabilities)
        ages = jnp.minimum(drawn, buffer.num_filled - 1)
    elif mode == "uniform":
        ages = jax.random.randint(key, (num_groups,), 0, buffer.num_filled)
    elif mode == "oldest":
        ages = jnp.full((num_groups,), buffer.num_filled - 1)
    elif mode == "newest":
        ages = jnp.zeros((num_groups,), jnp.int32)
    else:
        raise ValueError(f"snapshot sampling mode must be one of {SAMPLING_MODES}, got {mode!r}")
    slots = jnp.mod(buffer.num_pushed - 1 - ages, buffer.capacity)
    snapshots = jax.tree.map(lambda x: x[slots], buffer.snapshots)
    realised_ages = buffer.num_pushed - 1 - buffer.versions[slots]
    return snapshots, realised_ages
