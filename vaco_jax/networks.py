"""Actor (diagonal Gaussian, distrax) and critic MLPs, plus the observation normaliser.

Actions are sampled from an unsquashed Gaussian and clipped to [-1, 1] only when sent to the
environment, so `log β(a|s)` and the analytic KL/TV diagnostics refer to the exact distribution.
The log standard deviation is a state-independent parameter (the usual choice for MuJoCo PPO).
"""

from __future__ import annotations

from typing import Sequence

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from brax.training.acme import running_statistics

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "silu": nn.silu}


class MLP(nn.Module):
    hidden: Sequence[int]
    out_dim: int
    activation: str = "tanh"
    out_scale: float = 1.0

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        for width in self.hidden:
            x = act(nn.Dense(width, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
        return nn.Dense(self.out_dim, kernel_init=nn.initializers.orthogonal(self.out_scale))(x)


class Actor(nn.Module):
    """`obs [..., obs_dim] -> (loc, scale) [..., action_dim]`."""

    action_dim: int
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    init_log_std: float = 0.0

    @nn.compact
    def __call__(self, obs):
        loc = MLP(self.hidden, self.action_dim, self.activation, out_scale=0.01)(obs)
        log_std = self.param("log_std", nn.initializers.constant(self.init_log_std),
                             (self.action_dim,))
        return loc, jnp.broadcast_to(jnp.exp(log_std), loc.shape)


class Critic(nn.Module):
    """`obs [..., obs_dim] -> V(s) [...]`."""

    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"

    @nn.compact
    def __call__(self, obs):
        return MLP(self.hidden, 1, self.activation, out_scale=1.0)(obs)[..., 0]


def gaussian(loc, scale) -> distrax.MultivariateNormalDiag:
    """The policy distribution; `log_prob` is the joint log-density over action dimensions."""
    return distrax.MultivariateNormalDiag(loc, scale)


def standard_noise(key, shape: tuple[int, ...]) -> jax.Array:
    """The standard-normal draw behind `gaussian(loc, scale).sample(seed=key)` for `loc.shape ==
    shape`: `sample_with_noise` turns it into that sample (the same numbers)."""
    return gaussian(jnp.zeros(shape), jnp.ones(shape)).distribution.sample(seed=key,
                                                                          sample_shape=1)


def sample_with_noise(dist: distrax.MultivariateNormalDiag, noise: jax.Array) -> jax.Array:
    """`dist.sample(seed=key)` from `noise = standard_noise(key, dist.loc.shape)`."""
    return jax.vmap(dist.bijector.forward)(noise)[0]


# --- observation normalisation (Welford running statistics, per seed) ---------------------------

def init_normalizer(obs_size: int):
    return running_statistics.init_state(jnp.zeros((obs_size,), jnp.float32))


def update_normalizer(normalizer, obs, enabled: bool):
    """Fold a batch `[..., obs_dim]` of raw observations into the running statistics."""
    if not enabled:
        return normalizer
    return running_statistics.update(normalizer, obs.reshape(-1, obs.shape[-1]))


def normalize(obs, normalizer, enabled: bool):
    if not enabled:
        return obs
    return jnp.clip(running_statistics.normalize(obs, normalizer), -10.0, 10.0)


def init_params(key, config, obs_size: int, action_size: int):
    """`{"actor": ..., "critic": ...}` parameters for a config."""
    actor, critic = make_networks(config, action_size)
    actor_key, critic_key = jax.random.split(key)
    dummy = jnp.zeros((1, obs_size), jnp.float32)
    return {"actor": actor.init(actor_key, dummy)["params"],
            "critic": critic.init(critic_key, dummy)["params"]}


def make_networks(config, action_size: int):
    actor = Actor(action_size, tuple(config.actor_hidden), config.activation, config.init_log_std)
    critic = Critic(tuple(config.critic_hidden), config.activation)
    return actor, critic
