"""Bad input is refused before compilation with a message naming the field and what is allowed."""

import math
import subprocess
import sys

import pytest

from vaco_jax import Config, ConfigError, make_train


@pytest.mark.parametrize("changes,field,allowed", [
    (dict(env="cartpole"), "env", "inverted_pendulum"),
    (dict(algo="ppo2"), "algo", "vaco"),
    (dict(algo="gae+adam"), "algo", "tv_filter"),
    (dict(capacity=0), "capacity", ">= 1"),
    (dict(capacity=4, max_capacity=2), "max_capacity", ">= capacity"),
    (dict(num_envs=32, num_minibatches=3), "num_minibatches", "must divide num_envs"),
    (dict(num_envs=32, num_actors=5), "num_actors", "must divide num_envs"),
    (dict(delta=0.0), "delta", "> 0"),
    (dict(delta=-0.1), "delta", "> 0"),
    (dict(learning_rate=math.nan), "learning_rate", "not NaN"),
    (dict(gamma=1.5), "gamma", "[0, 1]"),
    (dict(snapshot_sampling="random"), "snapshot_sampling", "uniform"),
    (dict(filter_mode="token"), "filter_mode", "per_sample"),
    (dict(total_steps=10), "total_steps", "at least"),
])
def test_bad_config_is_refused_naming_the_field(changes, field, allowed):
    with pytest.raises(ConfigError) as error:
        make_train(Config(**changes))
    message = str(error.value)
    assert f"`{field}`" in message and allowed in message


def test_infinite_delta_is_allowed():
    make_train(Config(env="toy_reach", delta=math.inf))  # no error


def test_cli_reports_bad_input_without_compiling(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "vaco_jax.train", "--env", "toy_reach", "--capacity", "0",
         "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "`capacity` = 0" in result.stderr and ">= 1" in result.stderr
    assert not (tmp_path / "run").exists()


def test_cli_help_lists_every_field_with_defaults():
    result = subprocess.run([sys.executable, "-m", "vaco_jax.train", "--help"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0
    import dataclasses
    for field in dataclasses.fields(Config):
        assert "--" + field.name.replace("_", "-") in result.stdout, field.name
    assert "default: inverted_pendulum" in result.stdout
