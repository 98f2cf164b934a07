"""GRPO's vmappable hyper-parameters: `GRPOConfig`'s fields that change no shape, as pytree leaves
(`vaco_jax.llm.config.hparams` makes them, `stack_hparams` stacks settings to vmap over)."""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct


@struct.dataclass
class GRPOHParams:
    """GRPO hyper-parameters that do not change shapes: pytree leaves (vmappable)."""

    objective: jnp.ndarray      # int32 index into the program's objectives (`program_objectives`)
    learning_rate: jnp.ndarray
    clip_eps: jnp.ndarray
    delta: jnp.ndarray
    temperature: jnp.ndarray
    capacity: jnp.ndarray
    decoupled_is_max: jnp.ndarray
    objective_hparams: dict = struct.field(default_factory=dict)
    """Every objective's own hyper-parameters by name (`objective_hparams`), float32 leaves."""
    lag_profile: jnp.ndarray | None = None
    """`[slots]` float32 snapshot-age probabilities (`snapshot_sampling="profile"`, padded with
    zeros); None otherwise, so it adds no leaf to other programs."""
