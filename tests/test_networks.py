"""Networks: the default MLP as it was, your own Flax modules, and the built-in CNN for images.

The default MLP's initial parameters are pinned to the values the code made before networks could
be chosen (same names, same numbers: seeded runs stay bit-identical). A user's torso trains through
the Python API with the heads put on it; the CNN sees the env's image, not the flat vector the env
hands over; a policy of a CNN goes to disk and back; and `cnn` on flat observations is refused
before anything compiles.
"""

import dataclasses
import typing

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vaco_jax import (Config, ConfigError, Policy, Trainer, config as config_lib, envs, load_policy,
                      make_train, networks, policy as policy_lib, program, spaces)
from vaco_jax.commands.train import main

GYMNAX = envs.gymnax_available()
needs_gymnax = pytest.mark.skipif(not GYMNAX, reason='needs the gymnax extra: pip install -e ".[gymnax]"')

TINY = Config(env="toy_reach", num_envs=8, unroll_length=8, num_epochs=2, num_minibatches=2,
              num_actors=2, episode_length=20, total_steps=8 * 8 * 2, num_evals=2, eval_envs=2,
              actor_hidden=(16, 16), critic_hidden=(16, 16))
MINATAR = Config(env="gymnax:Breakout-MinAtar", network="cnn", num_envs=4, unroll_length=4,
                 num_epochs=1, num_minibatches=2, num_actors=2, episode_length=20,
                 total_steps=4 * 4, num_evals=1, eval_envs=2, actor_hidden=(8,),
                 critic_hidden=(8,), activation="relu")


class OneHidden(nn.Module):
    """A user's torso: one hidden layer of `width` units (any observation shape, flattened)."""

    width: int = 8

    @nn.compact
    def __call__(self, obs):
        return nn.tanh(nn.Dense(self.width)(obs))


def test_the_config_field_lists_the_built_in_networks():
    assert typing.get_args(config_lib.Network) == tuple(networks.NETWORKS)


def test_the_default_mlp_keeps_its_parameters():
    """`network="mlp"` (the default) makes the parameters it made before there was a choice:
    the same tree (`MLP_0/Dense_i`, `log_std`) and the same numbers from the same key (values
    recorded with the code before `Config.network` existed)."""
    assert TINY.network == "mlp"
    gaussian = networks.init_params(jax.random.PRNGKey(0), TINY, 5, 2)
    categorical = networks.init_params(jax.random.PRNGKey(0), TINY, 5, spaces.Discrete(3))
    assert set(gaussian["actor"]) == {"MLP_0", "log_std"} and set(categorical["actor"]) == {"MLP_0"}
    assert set(gaussian["actor"]["MLP_0"]) == {"Dense_0", "Dense_1", "Dense_2"}
    np.testing.assert_allclose(gaussian["actor"]["MLP_0"]["Dense_2"]["kernel"][:2, :2],
                               [[-0.00423119, 0.00039496], [-0.00097551, -0.00141781]], rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(categorical["actor"]["MLP_0"]["Dense_2"]["kernel"][:2, :2],
                               [[-0.00513191, 0.00172182], [-0.00133904, -0.00113213]], rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(gaussian["critic"]["MLP_0"]["Dense_0"]["kernel"][0, :3],
                               [-0.35537145, 0.50642604, -0.45659336], rtol=1e-5, atol=1e-8)
    # A Trainer initialises the same networks from the same key as `init_params`.
    trainer = Trainer(TINY)
    params_key, _ = jax.random.split(jax.random.PRNGKey(0))
    state = jax.jit(trainer.init)(jax.random.PRNGKey(0))
    expected = networks.init_params(params_key, TINY, 4, 2)
    jax.tree.map(np.testing.assert_array_equal, state.params, expected)


def test_a_users_module_trains_through_the_python_api():
    """A one-hidden-layer torso of 8 units as the actor's, the built-in MLP as the critic's: the
    parameters are the torso's, under the head, and they train."""
    trainer = Trainer(TINY, networks=(OneHidden(8), None))
    state, metrics = jax.jit(trainer.train)(jax.random.PRNGKey(0))
    actor = jax.tree.map(np.shape, state.params["actor"])
    assert actor == {"torso": {"Dense_0": {"kernel": (4, 8), "bias": (8,)}},
                     "head": {"kernel": (8, 2), "bias": (2,)}, "log_std": (2,)}
    assert set(state.params["critic"]) == {"MLP_0"}   # the config's network where None was given
    initial = jax.jit(trainer.init)(jax.random.PRNGKey(0)).params["actor"]["torso"]
    assert not np.allclose(initial["Dense_0"]["kernel"], state.params["actor"]["torso"]["Dense_0"]["kernel"])
    assert np.all(np.isfinite(metrics["loss"])) and np.all(np.isfinite(metrics["eval_return"]))
    # make_train passes them on, and the trained actor acts as a Policy with its module.
    assert make_train(TINY, networks=(OneHidden(8), None)).__self__.actor == trainer.actor
    policy = Policy.from_state(TINY, state, actor=trainer.actor)
    assert policy.act(jnp.zeros((3, 4))).shape == (3, 2)


def test_networks_other_than_flax_modules_are_refused():
    with pytest.raises(ConfigError, match="(?s)`networks`.*pair"):
        Trainer(TINY, networks=OneHidden(8))
    with pytest.raises(ConfigError, match="(?s)`networks`.*Flax modules"):
        Trainer(TINY, networks=(lambda obs: obs, None))


def test_the_program_key_tells_users_modules_apart():
    """What a program is traced from covers the networks: equal modules share it, another width
    or the built-in MLP does not; a module defined in a file can be stored, one defined in a
    notebook cannot."""
    def traced(torsos):
        return program.traced_from(Trainer(TINY, networks=torsos))

    same, also_same = traced((OneHidden(8), OneHidden(8))), traced((OneHidden(8), OneHidden(8)))
    assert same == also_same and same.storable
    assert traced((OneHidden(16), OneHidden(8))).digest != same.digest
    assert program.traced_from(Trainer(TINY)).digest != same.digest
    # A class whose code cannot be hashed (as one defined in a notebook) is never stored.
    notebook = type("NotebookTorso", (OneHidden,), {"__module__": "__main__"})
    assert not traced((notebook(8), None)).storable


def test_cnn_on_flat_observations_is_refused_before_compiling(tmp_path, capsys):
    with pytest.raises(ConfigError, match="`network` = 'cnn'.*image observations.*toy_reach"):
        Trainer(dataclasses.replace(TINY, network="cnn"))
    assert main(["--env", "toy_reach", "--network", "cnn", "--out", str(tmp_path / "run")]) == 2
    assert "config field `network` = 'cnn' is invalid" in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_cnn_sees_images():
    """The torso maps `[..., H, W, C]` to `[..., hidden[-1]]` (a 3×3 valid convolution: 8×8×16
    features into the dense layer), and an actor on flat observations applies it to the image
    they were flattened from (row-major, as the env flattens)."""
    cnn = networks.CNN(hidden=(32,))
    images = jax.random.bernoulli(jax.random.PRNGKey(0), 0.2, (3, 5, 10, 10, 4)).astype(jnp.float32)
    params = cnn.init(jax.random.PRNGKey(1), images[0, :1])["params"]
    assert params["PatchConv_0"]["kernel"].shape == (3, 3, 4, 16)
    assert params["Dense_0"]["kernel"].shape == (8 * 8 * 16, 32)
    assert cnn.apply({"params": params}, images).shape == (3, 5, 32)

    actor, critic = networks.make_networks(MINATAR, spaces.Discrete(3), (10, 10, 4))
    both = networks.init_networks(jax.random.PRNGKey(2), actor, critic, 400)
    flat = images.reshape(3, 5, 400)
    logits = actor.apply({"params": both["actor"]}, flat)["logits"]
    assert logits.shape == (3, 5, 3) and critic.apply({"params": both["critic"]}, flat).shape == (3, 5)
    features = networks.CNN((8,), "relu").apply({"params": both["actor"]["torso"]}, images)
    head = both["actor"]["head"]
    np.testing.assert_allclose(logits, features @ head["kernel"] + head["bias"], rtol=1e-5, atol=1e-6)


def test_the_patch_convolution_is_flaxs_valid_convolution():
    images = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 10, 10, 4))
    conv = networks.PatchConv(16, 3)
    params = conv.init(jax.random.PRNGKey(1), images)
    reference = nn.Conv(16, (3, 3), padding="VALID").apply(params, images)
    assert reference.shape == (2, 3, 8, 8, 16)
    np.testing.assert_allclose(conv.apply(params, images), reference, rtol=1e-5, atol=1e-5)


@needs_gymnax
def test_a_cnn_policy_goes_to_disk_and_back(tmp_path):
    """A `cnn` policy of two seeds on MinAtar Breakout (images 10×10×4, 3 actions): saved with
    its observation shape, loaded back to the same parameters and the same actions;
    `from_state` rebuilds the CNN from the config by name."""
    config = dataclasses.replace(MINATAR, num_seeds=2)
    trainer = Trainer(config)
    assert trainer.observation_shape == (10, 10, 4)
    states = jax.jit(jax.vmap(trainer.init))(jnp.stack([jax.random.PRNGKey(i) for i in (0, 1)]))
    in_memory = Policy.from_state(config, states, seed=1)
    assert in_memory.actor == trainer.actor
    policy_lib.save_policy(tmp_path, config, states.params["actor"], states.normalizer,
                           env_steps=16, evaluations=1, observation_shape=trainer.observation_shape)
    loaded = load_policy(tmp_path, seed=1)
    assert loaded.meta["observation_shape"] == [10, 10, 4] and loaded.action_space == spaces.Discrete(3)
    jax.tree.map(np.testing.assert_array_equal, loaded.params, in_memory.params)
    obs = jax.random.bernoulli(jax.random.PRNGKey(3), 0.2, (16, 400)).astype(jnp.float32)
    key = jax.random.PRNGKey(4)
    np.testing.assert_array_equal(loaded.act(obs, key), in_memory.act(obs, key))
    np.testing.assert_array_equal(loaded.act(obs), in_memory.act(obs))
    # A file without the shape (written by hand, `observation_shape` not given): from the env's name.
    policy_lib.save_policy(tmp_path, config, states.params["actor"], states.normalizer,
                           env_steps=16, evaluations=1)
    assert "observation_shape" not in load_policy(tmp_path).meta
    np.testing.assert_array_equal(load_policy(tmp_path, seed=1).act(obs), in_memory.act(obs))
