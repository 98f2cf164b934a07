"""Action spaces: what an env accepts, and so which head the actor has (`networks.policy_head`).

Two kinds cover every env vaco_jax runs: `Box` (continuous; Brax's and MuJoCo Playground's envs,
gymnax's `spaces.Box`) and `Discrete` (one of n actions; gymnax's `spaces.Discrete`). An env says
which it takes through an `action_space` attribute holding one of them; an env without one (every
Brax and Playground env) takes continuous actions of its `action_size`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Box:
    """`size` continuous numbers in [-1, 1] (an env with other bounds rescales them itself)."""

    size: int

    def clip(self, action):
        """The action the env receives: the policy's unsquashed sample clipped to [-1, 1]."""
        return jnp.clip(action, -1.0, 1.0)

    def sample(self, key, shape=()):
        """Uniform actions in [-1, 1]^size, `shape + (size,)` (the random policy)."""
        return jax.random.uniform(key, tuple(shape) + (self.size,), minval=-1.0, maxval=1.0)


@dataclasses.dataclass(frozen=True)
class Discrete:
    """One of `n` actions, an integer in [0, n)."""

    n: int

    def clip(self, action):
        """The action the env receives: a categorical sample is always in range, as it is."""
        return action

    def sample(self, key, shape=()):
        """Uniform integers in [0, n), `shape` (the random policy)."""
        return jax.random.randint(key, tuple(shape), 0, self.n)


ActionSpace = Box | Discrete


def action_space(env) -> ActionSpace:
    """The action space of `env`: its `action_space` attribute when that is a `Box` or a
    `Discrete`, else (Brax's and Playground's envs) a `Box` of its `action_size`."""
    space = getattr(env, "action_space", None)
    if isinstance(space, (Box, Discrete)):
        return space
    return Box(int(env.action_size))
