"""Actor and critic MLPs, plus the observation normaliser.

One policy interface, two heads. The actor maps observations to its distribution's parameters, a
pytree: a diagonal Gaussian's `{"loc", "scale"}` for continuous actions (`Actor`), a categorical's
`{"logits"}` for discrete ones (`CategoricalActor`); `actor.head.distribution(params)` is the
distrax distribution, and everything downstream (rollouts, objectives, diagnostics, evaluation)
calls only its `log_prob / sample / mode / entropy / kl_divergence`, never the action space.

Continuous actions are sampled from an unsquashed Gaussian and clipped to [-1, 1] only when sent to
the environment, so `log β(a|s)` and the analytic KL/TV diagnostics refer to the exact
distribution. The log standard deviation is a state-independent parameter (the usual choice for
MuJoCo PPO).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from brax.training.acme import running_statistics

from vaco_jax import spaces

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
    """The Gaussian actor of continuous actions: `obs [..., obs_dim] -> {"loc", "scale"}
    [..., action_dim]`."""

    action_dim: int
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    init_log_std: float = 0.0

    @property
    def head(self) -> "Gaussian":
        return Gaussian(self.action_dim)

    @nn.compact
    def __call__(self, obs):
        loc = MLP(self.hidden, self.action_dim, self.activation, out_scale=0.01)(obs)
        log_std = self.param("log_std", nn.initializers.constant(self.init_log_std),
                             (self.action_dim,))
        return {"loc": loc, "scale": jnp.broadcast_to(jnp.exp(log_std), loc.shape)}


class CategoricalActor(nn.Module):
    """The categorical actor of discrete actions: `obs [..., obs_dim] -> {"logits"}
    [..., num_actions]` (a small last layer, as the Gaussian's mean: near-uniform at first)."""

    num_actions: int
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"

    @property
    def head(self) -> "Categorical":
        return Categorical(self.num_actions)

    @nn.compact
    def __call__(self, obs):
        return {"logits": MLP(self.hidden, self.num_actions, self.activation, out_scale=0.01)(obs)}


@dataclasses.dataclass(frozen=True)
class Gaussian:
    """The head of continuous actions: a diagonal Gaussian over `size` numbers."""

    size: int

    def distribution(self, params) -> distrax.Distribution:
        return gaussian(params["loc"], params["scale"])

    def noise(self, key, batch_shape: tuple[int, ...]) -> jax.Array:
        """The randomness of `dist.sample(seed=key)` for a batch, drawn ahead (`sample`)."""
        return standard_noise(key, batch_shape + (self.size,))

    def sample(self, dist: distrax.Distribution, noise: jax.Array) -> jax.Array:
        """`dist.sample(seed=key)` from `noise = self.noise(key, batch_shape)` (the same numbers)."""
        return sample_with_noise(dist, noise)


@dataclasses.dataclass(frozen=True)
class Categorical:
    """The head of discrete actions: a categorical over `num_actions` choices."""

    num_actions: int

    def distribution(self, params) -> distrax.Distribution:
        return distrax.Categorical(logits=params["logits"])

    def noise(self, key, batch_shape: tuple[int, ...]) -> jax.Array:
        """The randomness of `dist.sample(seed=key)` for a batch (Gumbel noise), drawn ahead."""
        return jax.random.gumbel(key, batch_shape + (self.num_actions,))

    def sample(self, dist: distrax.Categorical, noise: jax.Array) -> jax.Array:
        """`dist.sample(seed=key)` from `noise = self.noise(key, batch_shape)`: the Gumbel-max
        draw distrax (through `jax.random.categorical`) makes, the same action."""
        return jnp.argmax(dist.logits + noise, axis=-1).astype(jnp.int32)


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


def init_params(key, config, obs_size: int, action_space: "spaces.ActionSpace | int"):
    """`{"actor": ..., "critic": ...}` parameters for a config and an action space (an int: that
    many continuous actions)."""
    actor, critic = make_networks(config, action_space)
    actor_key, critic_key = jax.random.split(key)
    dummy = jnp.zeros((1, obs_size), jnp.float32)
    return {"actor": actor.init(actor_key, dummy)["params"],
            "critic": critic.init(critic_key, dummy)["params"]}


def make_networks(config, action_space: "spaces.ActionSpace | int"):
    """`(actor, critic)` for a config; the actor's head is chosen by the action space (an int:
    that many continuous actions): a `Box` gets the Gaussian actor, a `Discrete` one the
    categorical. (The one place that looks at the action space.)"""
    if isinstance(action_space, int):
        action_space = spaces.Box(action_space)
    if isinstance(action_space, spaces.Discrete):
        actor = CategoricalActor(action_space.n, tuple(config.actor_hidden), config.activation)
    else:
        actor = Actor(action_space.size, tuple(config.actor_hidden), config.activation,
                      config.init_log_std)
    critic = Critic(tuple(config.critic_hidden), config.activation)
    return actor, critic


def action_space_of(actor_params) -> "spaces.ActionSpace":
    """The action space an actor's parameters were made for (`make_networks`): a Gaussian actor
    has a `log_std` per continuous action; a categorical one, an output unit per choice."""
    if "log_std" in actor_params:
        return spaces.Box(int(np.shape(actor_params["log_std"])[-1]))
    mlp = actor_params["MLP_0"]
    last = max(mlp, key=lambda name: int(name.rpartition("_")[2]))
    return spaces.Discrete(int(np.shape(mlp[last]["bias"])[-1]))
