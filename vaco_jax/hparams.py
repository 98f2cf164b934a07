"""The vmappable hyper-parameters of a run: `Config`'s fields that change no shape, as pytree leaves
(`Config.hparams()` makes them; `Config.grid` stacks settings of them to vmap over)."""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct


@struct.dataclass
class HParams:
    """Hyper-parameters that do not change shapes: pytree leaves, so they can be vmapped."""

    learning_rate: jnp.ndarray
    gamma: jnp.ndarray
    gae_lambda: jnp.ndarray
    delta: jnp.ndarray
    clip_eps: jnp.ndarray
    kl_coef: jnp.ndarray
    kl_target: jnp.ndarray
    kl_coef_min: jnp.ndarray
    kl_coef_max: jnp.ndarray
    rho_bar: jnp.ndarray
    c_bar: jnp.ndarray
    is_max: jnp.ndarray
    decoupled_is_max: jnp.ndarray
    reward_scale: jnp.ndarray
    vf_coef: jnp.ndarray
    ent_coef: jnp.ndarray
    max_grad_norm: jnp.ndarray
    adam_eps: jnp.ndarray
    capacity: jnp.ndarray = struct.field(metadata={"dtype": jnp.int32})
    objective: dict = struct.field(default_factory=dict)
    """The objective's own hyper-parameters by name (`Objective.hparams`), float32 leaves."""
    lag_profile: jnp.ndarray | None = None
    """`[max_capacity]` float32 snapshot-age probabilities (`snapshot_sampling="profile"`, padded
    with zeros); None otherwise, so it adds no leaf to other runs."""
    slots: int = struct.field(pytree_node=False, default=0)
    """The ring-buffer slots of the config that made these (static; 0: not known): the largest
    capacity they may hold, and the fewest slots a program running them may have."""
