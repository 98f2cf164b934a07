"""Actor and critic networks (built in: an MLP and a small CNN; or your own Flax modules), plus the
observation normaliser.

One policy interface, two heads. The actor maps observations to its distribution's parameters, a
pytree: a diagonal Gaussian's `{"loc", "scale"}` for continuous actions (`Actor`), a categorical's
`{"logits"}` for discrete ones (`CategoricalActor`); `actor.head.distribution(params)` is the
distrax distribution, and everything downstream (rollouts, objectives, diagnostics, evaluation)
calls only its `log_prob / sample / mode / entropy / kl_divergence`, never the action space.

Continuous actions are sampled from an unsquashed Gaussian and clipped to [-1, 1] only when sent to
the environment, so `log β(a|s)` and the analytic KL/TV diagnostics refer to the exact
distribution. The log standard deviation is a state-independent parameter (the usual choice for
MuJoCo PPO).

The networks behind the heads are chosen by `Config.network` (`NETWORKS`): `mlp`, the MLPs of
`actor_hidden` / `critic_hidden`, or `cnn`, a small convolutional torso (`CNN`) for image
observations. Or they are your own: a *torso* is any Flax module mapping observations, in the env's
own shape `[..., *observation_shape]` (normalised; an image `[..., H, W, C]`), to features
`[..., F]`; `make_networks(..., torsos=(actor_torso, critic_torso))` puts the heads on them (a
linear layer to the distribution's parameters, with the Gaussian's state-independent log standard
deviation; a linear layer to V). Envs hand observations over flattened (`envs.GymnaxEnv`), and the
normaliser works on those vectors; the actor and critic reshape them to the env's
`observation_shape` (`envs.observation_shape`) before a torso sees them.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from brax.training.acme import running_statistics

from vaco_jax import spaces
from vaco_jax.errors import ConfigError, invalid

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


class PatchConv(nn.Module):
    """`nn.Conv(features, (k, k), padding="VALID")` (stride 1; the same parameters and numbers),
    computed as one matrix product over the image's k×k patches. Under `vmap` over parameters
    (seeds, and the actor groups' snapshots) XLA makes a convolution a grouped one, which is slow
    on a CPU: a MinAtar learner iteration of 2 seeds took 19 s with `nn.Conv`, 2.3 s with this."""

    features: int
    kernel_size: int = 3
    kernel_init: Callable = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, x):
        k, channels = self.kernel_size, x.shape[-1]
        kernel = self.param("kernel", self.kernel_init, (k, k, channels, self.features))
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,))
        height, width = x.shape[-3] - k + 1, x.shape[-2] - k + 1
        patches = jnp.concatenate([x[..., i:i + height, j:j + width, :]
                                   for i in range(k) for j in range(k)], axis=-1)
        return patches @ kernel.reshape(k * k * channels, self.features) + bias


class CNN(nn.Module):
    """A small convolutional torso for image observations, as the MinAtar paper's network (Young
    & Tian 2019: one 3×3 convolution of 16 channels, stride 1, no padding, then a dense layer):
    `[..., H, W, C] -> [..., hidden[-1]]` (any leading batch axes)."""

    hidden: Sequence[int] = (64, 64)
    activation: str = "relu"
    channels: Sequence[int] = (16,)
    kernel_size: int = 3

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        init = nn.initializers.orthogonal(np.sqrt(2))
        for features in self.channels:
            x = act(PatchConv(features, self.kernel_size, kernel_init=init)(x))
        x = x.reshape(x.shape[:-3] + (-1,))
        for width in self.hidden:
            x = act(nn.Dense(width, kernel_init=init)(x))
        return x


def _torso_outputs(torso: nn.Module, observation_shape, obs, out_dim: int, out_scale: float):
    """`out_dim` numbers from flat observations `obs [..., obs_dim]`: the torso's features of the
    observations in the env's shape, then a linear layer (`head`). Called in a compact method."""
    if observation_shape is not None:
        obs = obs.reshape(obs.shape[:-1] + tuple(observation_shape))
    features = torso(obs)
    return nn.Dense(out_dim, kernel_init=nn.initializers.orthogonal(out_scale), name="head")(
        features)


class Actor(nn.Module):
    """The Gaussian actor of continuous actions: `obs [..., obs_dim] -> {"loc", "scale"}
    [..., action_dim]`; the mean from the MLP of `hidden`, or from `torso` (a Flax module; see
    the module docstring) and a linear layer."""

    action_dim: int
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    init_log_std: float = 0.0
    torso: nn.Module | None = None
    observation_shape: tuple[int, ...] | None = None   # what `torso` sees (None: as given)

    @property
    def head(self) -> "Gaussian":
        return Gaussian(self.action_dim)

    @nn.compact
    def __call__(self, obs):
        if self.torso is None:
            loc = MLP(self.hidden, self.action_dim, self.activation, out_scale=0.01)(obs)
        else:
            loc = _torso_outputs(self.torso, self.observation_shape, obs, self.action_dim, 0.01)
        log_std = self.param("log_std", nn.initializers.constant(self.init_log_std),
                             (self.action_dim,))
        return {"loc": loc, "scale": jnp.broadcast_to(jnp.exp(log_std), loc.shape)}


class CategoricalActor(nn.Module):
    """The categorical actor of discrete actions: `obs [..., obs_dim] -> {"logits"}
    [..., num_actions]` (a small last layer, as the Gaussian's mean: near-uniform at first), from
    the MLP of `hidden` or from `torso` and a linear layer."""

    num_actions: int
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    torso: nn.Module | None = None
    observation_shape: tuple[int, ...] | None = None

    @property
    def head(self) -> "Categorical":
        return Categorical(self.num_actions)

    @nn.compact
    def __call__(self, obs):
        if self.torso is None:
            return {"logits": MLP(self.hidden, self.num_actions, self.activation,
                                  out_scale=0.01)(obs)}
        return {"logits": _torso_outputs(self.torso, self.observation_shape, obs,
                                         self.num_actions, 0.01)}


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
    """`obs [..., obs_dim] -> V(s) [...]`, by the MLP of `hidden` or by `torso` and a linear
    layer."""

    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    torso: nn.Module | None = None
    observation_shape: tuple[int, ...] | None = None

    @nn.compact
    def __call__(self, obs):
        if self.torso is None:
            return MLP(self.hidden, 1, self.activation, out_scale=1.0)(obs)[..., 0]
        return _torso_outputs(self.torso, self.observation_shape, obs, 1, 1.0)[..., 0]


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


def init_params(key, config, obs_size: int, action_space: "spaces.ActionSpace | int",
                observation_shape: tuple[int, ...] | None = None, torsos=None):
    """`{"actor": ..., "critic": ...}` parameters for a config and an action space (an int: that
    many continuous actions); `observation_shape`, `torsos`: as `make_networks`."""
    actor, critic = make_networks(config, action_space, observation_shape, torsos)
    return init_networks(key, actor, critic, obs_size)


def init_networks(key, actor: nn.Module, critic: nn.Module, obs_size: int):
    """`{"actor": ..., "critic": ...}` parameters of the two networks, for flat observations of
    `obs_size` numbers."""
    actor_key, critic_key = jax.random.split(key)
    dummy = jnp.zeros((1, obs_size), jnp.float32)
    return {"actor": actor.init(actor_key, dummy)["params"],
            "critic": critic.init(critic_key, dummy)["params"]}


def _mlp_torsos(config, observation_shape):
    """The MLPs of `actor_hidden` / `critic_hidden`, built into the actor and critic (no torso)."""
    return None, None


def _cnn_torsos(config, observation_shape):
    """`CNN`s with the dense layers of `actor_hidden` / `critic_hidden`, for image observations."""
    if observation_shape is None or len(observation_shape) != 3:
        shape = "[obs_dim] (flat)" if observation_shape is None else list(observation_shape)
        raise invalid("network", config.network,
                      f"`cnn` needs image observations [height, width, channels], and env "
                      f"{config.env!r} has observations of shape {shape}; use `mlp` "
                      f"(allowed: {list(NETWORKS)})")
    return (CNN(tuple(config.actor_hidden), config.activation),
            CNN(tuple(config.critic_hidden), config.activation))


# `Config.network`: the built-in networks by name, each `(config, observation_shape) -> (actor
# torso, critic torso)` (None: the MLP built into the actor or critic).
NETWORKS = {"mlp": _mlp_torsos, "cnn": _cnn_torsos}


def check_torsos(torsos) -> tuple:
    """`torsos` as an `(actor, critic)` pair of Flax modules (None in a place: the config's
    network there), or a `ConfigError` saying what is expected."""
    if (not isinstance(torsos, (tuple, list)) or len(torsos) != 2
            or not all(t is None or isinstance(t, nn.Module) for t in torsos)):
        raise ConfigError(f"argument `networks` = {torsos!r} is invalid: it must be a pair "
                          f"(actor_torso, critic_torso) of Flax modules (`flax.linen.Module`; "
                          f"None for the config's network in that place), each mapping "
                          f"observations [..., *observation_shape] to features [..., F]")
    return tuple(torsos)


def make_networks(config, action_space: "spaces.ActionSpace | int",
                  observation_shape: tuple[int, ...] | None = None, torsos=None):
    """`(actor, critic)` for a config; the actor's head is chosen by the action space (an int:
    that many continuous actions): a `Box` gets the Gaussian actor, a `Discrete` one the
    categorical. (The one place that looks at the action space.) The networks behind the heads are
    `config.network`'s (`NETWORKS`), or `torsos`, an `(actor_torso, critic_torso)` pair of Flax
    modules (see the module docstring; None in a place: the config's network there).
    `observation_shape`: the env's (`envs.observation_shape`), the shape torsos see (None: the
    flat observations)."""
    if isinstance(action_space, int):
        action_space = spaces.Box(action_space)
    own = (None, None) if torsos is None else check_torsos(torsos)
    builtin = (NETWORKS[config.network](config, observation_shape)
               if any(torso is None for torso in own) else (None, None))
    actor_torso, critic_torso = (mine if mine is not None else default
                                 for mine, default in zip(own, builtin))
    shape = None if observation_shape is None else tuple(observation_shape)
    if isinstance(action_space, spaces.Discrete):
        actor = CategoricalActor(action_space.n, tuple(config.actor_hidden), config.activation,
                                 actor_torso, shape)
    else:
        actor = Actor(action_space.size, tuple(config.actor_hidden), config.activation,
                      config.init_log_std, actor_torso, shape)
    critic = Critic(tuple(config.critic_hidden), config.activation, critic_torso, shape)
    return actor, critic


def action_space_of(actor_params) -> "spaces.ActionSpace":
    """The action space an actor's parameters were made for (`make_networks`): a Gaussian actor
    has a `log_std` per continuous action; a categorical one, an output unit per choice (the last
    layer of its MLP, or its `head` on a torso)."""
    if "log_std" in actor_params:
        return spaces.Box(int(np.shape(actor_params["log_std"])[-1]))
    if "head" in actor_params:
        return spaces.Discrete(int(np.shape(actor_params["head"]["bias"])[-1]))
    mlp = actor_params["MLP_0"]
    last = max(mlp, key=lambda name: int(name.rpartition("_")[2]))
    return spaces.Discrete(int(np.shape(mlp[last]["bias"])[-1]))
