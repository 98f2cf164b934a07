"""Spreading a run over devices with `jax.sharding`: the seed axis, or for one seed the env axis.

A vmapped run's train state has a leading seed axis `[num_seeds, ...]`. With several seeds it is
split over a 1-D mesh of devices (`NamedSharding(mesh, P("devices"))`): each device trains its own
seeds and nothing crosses devices. With a single seed the env axis of the env state
(`[1, num_envs, ...]`) is split instead, so the rollout (the expensive part on MJX) runs on every
device, and XLA's partitioner inserts the gathers the learner update needs. Everything else is
replicated.

The mesh uses `d = gcd(size, len(devices))` devices, so the split is always even (5 seeds on 4
devices use 1 device; 8 seeds use 4). After `jax.distributed.initialize()`, `jax.devices()` lists
every device of every host and the same code runs one program over all of them.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vaco_jax.config import Config

AXIS = "devices"


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a run's arrays live: `axis` is "seeds", "envs" or "none" (one device)."""

    mesh: Mesh
    axis: str
    num_envs: int

    @property
    def num_devices(self) -> int:
        return self.mesh.devices.size

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    def state(self, abstract_state):
        """Shardings for a vmapped train state (a pytree of `jax.ShapeDtypeStruct` or arrays)."""
        split_seeds = NamedSharding(self.mesh, P(AXIS))
        split_envs = NamedSharding(self.mesh, P(None, AXIS))
        if self.axis == "seeds":
            return jax.tree.map(lambda _: split_seeds, abstract_state)
        shardings = jax.tree.map(lambda _: self.replicated(), abstract_state)
        if self.axis == "envs":
            env_state = jax.tree.map(
                lambda x: split_envs if len(x.shape) > 1 and x.shape[1] == self.num_envs
                else self.replicated(), abstract_state.env_state)
            shardings = shardings.replace(env_state=env_state)
        return shardings

    def metrics_sharding(self) -> NamedSharding:
        """For every per-seed metric `[num_seeds]`: split like the seeds, else replicated."""
        return NamedSharding(self.mesh, P(AXIS)) if self.axis == "seeds" else self.replicated()

    def with_shardings(self, abstract_state):
        """`abstract_state` with each leaf's sharding attached (an orbax restore target)."""
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            abstract_state, self.state(abstract_state))


def placement(config: Config, devices=None) -> Placement:
    """Split seeds over devices when there are several, else the envs of the one seed."""
    devices = list(jax.devices() if devices is None else devices)
    size = config.num_seeds if config.num_seeds > 1 else config.num_envs
    used = math.gcd(size, len(devices))
    axis = "none" if used == 1 else ("seeds" if config.num_seeds > 1 else "envs")
    mesh = Mesh(np.asarray(devices[:used]), (AXIS,))
    return Placement(mesh, axis, config.num_envs)


def describe(placement_: Placement) -> str:
    """One line for logs: how the run is spread."""
    if placement_.axis == "none":
        return "1 device"
    return f"{placement_.axis} split over {placement_.num_devices} devices"
