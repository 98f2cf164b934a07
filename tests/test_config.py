"""Bad input is refused before compilation with a message naming the field and what is allowed."""

import dataclasses
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
        [sys.executable, "-m", "vaco_jax.commands.train", "--env", "toy_reach", "--capacity", "0",
         "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "`capacity` = 0" in result.stderr and ">= 1" in result.stderr
    assert not (tmp_path / "run").exists()


def test_cli_help_lists_every_field_with_defaults():
    result = subprocess.run([sys.executable, "-m", "vaco_jax.commands.train", "--help"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0
    from vaco_jax import Options
    from vaco_jax.options import LoggerOptions
    from vaco_jax.runtime import Cluster
    # The logger options are a group of their own whose flags are flat (--logger, --wandb-...).
    options = [f for f in dataclasses.fields(Options) if f.name != "logging"]
    for field in [*dataclasses.fields(Config), *options, *dataclasses.fields(LoggerOptions),
                  *dataclasses.fields(Cluster)]:
        assert "--" + field.name.replace("_", "-") in result.stdout, field.name
    assert "default: inverted_pendulum" in result.stdout


# --- every field (issue 6): wrong types and the ranges added with checkpoints -----------------------

@pytest.mark.parametrize("field", [f.name for f in __import__("dataclasses").fields(Config)])
def test_every_field_refuses_a_value_of_the_wrong_type(field):
    # The Python API does not go through tyro's parsing: a wrong type must still be named.
    wrong = {bool: "yes", str: 3}.get(type(getattr(Config(), field)), "three")
    with pytest.raises(ConfigError, match=f"`{field}` = {wrong!r} is invalid"):
        make_train(Config(**{field: wrong}))


@pytest.mark.parametrize("changes,field,allowed", [
    (dict(seed=-1), "seed", "[0, 2**32 - num_seeds]"),
    (dict(seed=2**32), "seed", "[0, 2**32 - num_seeds]"),  # PRNGKey(2**32) == PRNGKey(0)
    (dict(learning_rate=math.inf), "learning_rate", "must be finite"),
    (dict(init_log_std=-math.inf), "init_log_std", "must be finite"),
    (dict(num_envs=True), "num_envs", "must be an integer"),
    (dict(actor_hidden=()), "actor_hidden", "non-empty tuple of positive layer widths"),
    (dict(critic_hidden=(64, 0)), "critic_hidden", "non-empty tuple of positive layer widths"),
    (dict(decoupled_is_max=0.5), "decoupled_is_max", ">= 1"),
])
def test_out_of_range_values_are_refused_naming_field_value_and_allowed(changes, field, allowed):
    with pytest.raises(ConfigError) as error:
        make_train(Config(**changes))
    (name, value), = changes.items()
    assert f"`{field}` = {value!r} is invalid" in str(error.value) and allowed in str(error.value)


@pytest.mark.parametrize("changes,field,allowed", [
    (dict(checkpoint_every=-1), "checkpoint_every", ">= 0"),
    (dict(keep_checkpoints=0), "keep_checkpoints", ">= 1"),
    (dict(checkpoint_budget=0.0), "checkpoint_budget", "(0, 1]"),
    (dict(on_nan="ignore"), "on_nan", "'skip-seed'"),
    (dict(progress="yes"), "progress", "True or False"),
])
def test_bad_options_are_refused_before_anything_runs(changes, field, allowed, tmp_path):
    from vaco_jax import Options
    from vaco_jax.driver import run
    with pytest.raises(ConfigError) as error:
        run(Config(env="toy_reach"), Options(out=str(tmp_path / "run"), **changes))
    (name, value), = changes.items()
    assert f"`{field}` = {value!r} is invalid" in str(error.value) and allowed in str(error.value)
    assert not (tmp_path / "run").exists()


def test_options_are_not_part_of_the_run_config():
    from vaco_jax import Options
    from vaco_jax.config import LEGACY_OPTION_FIELDS, from_json_dict, to_json_dict
    run_fields = {f.name for f in dataclasses.fields(Config)}
    option_fields = {f.name for f in dataclasses.fields(Options)}
    assert not run_fields & option_fields
    assert set(LEGACY_OPTION_FIELDS) <= option_fields
    # A config stored by an older version (with its options inside) still loads.
    assert from_json_dict({**to_json_dict(Config()), "out": "runs/x", "on_nan": "stop"}) == Config()


def test_config_survives_its_json_form_with_infinities():
    from vaco_jax.config import from_json_dict, to_json_dict
    config = Config(delta=math.inf, actor_hidden=(8, 4))
    assert from_json_dict(to_json_dict(config)) == config
    with pytest.raises(ConfigError, match="unknown to this version"):
        from_json_dict({**to_json_dict(config), "warp_speed": 9})


def test_a_grid_sweeps_fields_of_the_given_config_and_validates_every_setting():
    import numpy as np

    from vaco_jax.errors import ConfigError

    base = Config(env="toy_reach", algo="vaco", learning_rate=1e-3, gamma=0.9, max_capacity=16)
    grid, points = base.grid(capacity=(1, 4, 16), delta=(0.1, 0.2))
    assert points == [{"capacity": c, "delta": d} for c in (1, 4, 16) for d in (0.1, 0.2)]
    np.testing.assert_array_equal(grid.capacity, [1, 1, 4, 4, 16, 16])
    np.testing.assert_allclose(grid.delta, [0.1, 0.2] * 3)
    # Fields not swept keep the given config's values, not the class defaults.
    np.testing.assert_allclose(grid.learning_rate, [1e-3] * 6)
    np.testing.assert_allclose(grid.gamma, [0.9] * 6)
    with pytest.raises(ConfigError, match="`max_capacity`"):
        Config(env="toy_reach", max_capacity=4).grid(capacity=(1, 16))
    with pytest.raises(ConfigError, match="`learning_rate` = -1.0 is invalid"):
        base.grid(learning_rate=(3e-4, -1.0))
    with pytest.raises(ConfigError, match="`num_envs`.*cannot be swept in one program"):
        base.grid(num_envs=(8, 16))
    with pytest.raises(ConfigError, match="non-empty sequence"):
        base.grid(delta=0.1)
    # A capacity beyond the program's ring buffer (here max_capacity = 0: capacity's 1 slot).
    with pytest.raises(ConfigError, match="`max_capacity` = 1 is invalid"):
        Config(env="toy_reach").grid(capacity=(1, 4))


def test_a_hand_made_grid_is_validated_with_config_grids_errors():
    import jax

    from vaco_jax import stack_hparams

    config = Config(env="toy_reach", max_capacity=4)
    for bad, field in ((dict(capacity=16), "max_capacity"), (dict(learning_rate=-1.0), "learning_rate")):
        with pytest.raises(ConfigError) as from_grid:
            config.grid(**{name: (value,) for name, value in bad.items()})
        with pytest.raises(ConfigError) as by_hand:
            stack_hparams([config.hparams(), config.hparams().replace(**bad)])
        assert str(by_hand.value) == str(from_grid.value) and f"`{field}`" in str(by_hand.value)
    # Settings made for a larger ring buffer are refused by a trainer with fewer slots (when
    # traced, before anything compiles), not clamped to them.
    larger = dataclasses.replace(config, max_capacity=16, capacity=16).hparams()
    with pytest.raises(ConfigError, match="`max_capacity` = 4 is invalid"):
        jax.eval_shape(make_train(config), jax.random.PRNGKey(0), larger)


# --- lag profiles (--lag-profile FILE): refused before compiling, a leaf only when sampled ----------

PROFILE = Config(env="toy_reach", snapshot_sampling="profile", lag_profile=(0.5, 0.3, 0.2),
                 capacity=3)


@pytest.mark.parametrize("changes,field,allowed", [
    (dict(lag_profile=(0.5, -0.1, 0.6)), "lag_profile", ">= 0"),
    (dict(lag_profile=(0.5, 0.3)), "lag_profile", "sum to 1"),
    (dict(lag_profile=(0.5, math.nan, 0.5)), "lag_profile", "finite"),
    (dict(lag_profile=(0.25,) * 4), "capacity", "at least the lag profile's length 4"),
    (dict(lag_profile=()), "lag_profile", "must be given with snapshot_sampling='profile'"),
    (dict(snapshot_sampling="uniform"), "snapshot_sampling", "must be 'profile'"),
    (dict(lag_profile=(0.25,) * 4, capacity=4, max_capacity=3), "max_capacity", ">= capacity"),
])
def test_bad_lag_profiles_are_refused_naming_the_field(changes, field, allowed):
    with pytest.raises(ConfigError) as error:
        make_train(dataclasses.replace(PROFILE, **changes))
    assert f"`{field}`" in str(error.value) and allowed in str(error.value), str(error.value)


@pytest.mark.parametrize("text,allowed", [
    ('{"probabilities": [0.5, 0.3, 0.1]}', "sum to 1"),
    ('{"probabilities": [0.5, "x", 0.5]}', "numbers only"),
    ('{"probabilities": []}', "at least one"),
    ('{"probabilities": 1.0}', "list of probabilities"),
    ('[0.5, 0.5]', "JSON object"),
    ('{"probabilities": [1.0], "capacity": 4}', "unknown keys ['capacity']"),
    ('{"probabilities": [1.0', "cannot read it as JSON"),
])
def test_a_bad_lag_profile_file_is_refused_naming_the_file(tmp_path, text, allowed):
    from vaco_jax.config import read_lag_profile
    path = tmp_path / "profile.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        read_lag_profile(path)
    assert str(path) in str(error.value) and allowed in str(error.value), str(error.value)


def test_a_lag_profile_file_reads_as_its_probabilities_and_sets_the_capacity(tmp_path):
    from vaco_jax.config import read_lag_profile, validate, with_lag_profile
    path = tmp_path / "profile.json"
    path.write_text('{"probabilities": [0.6, 0.3, 0.1], "description": "a queue of 3"}')
    assert read_lag_profile(path) == (0.6, 0.3, 0.1)
    config = with_lag_profile(Config(env="toy_reach", max_capacity=2), read_lag_profile(path))
    assert (config.snapshot_sampling, config.capacity, config.max_capacity) == ("profile", 3, 3)
    validate(config)


def test_a_lag_profile_is_a_leaf_only_when_snapshots_are_drawn_from_it():
    import jax
    import numpy as np

    from vaco_jax.config import from_json_dict, to_json_dict
    # Other runs' hyper-parameters hold the leaves they held before profiles existed.
    assert Config(env="toy_reach").hparams().lag_profile is None
    assert len(jax.tree.leaves(Config(env="toy_reach").hparams())) == len(
        jax.tree.leaves(PROFILE.hparams())) - 1
    padded = dataclasses.replace(PROFILE, max_capacity=5).hparams().lag_profile
    np.testing.assert_allclose(np.asarray(padded), [0.5, 0.3, 0.2, 0.0, 0.0], rtol=1e-6)
    # Two profiles in one program: a grid stacks them, each checked first.
    grid, _ = dataclasses.replace(PROFILE, capacity=4).grid(
        lag_profile=((1.0,), (0.0, 0.0, 0.0, 1.0)))
    np.testing.assert_array_equal(np.asarray(grid.lag_profile), [[1, 0, 0, 0], [0, 0, 0, 1]])
    with pytest.raises(ConfigError, match="`lag_profile`.*sum to 1"):
        PROFILE.grid(lag_profile=((1.0,), (0.5,)))
    assert from_json_dict(to_json_dict(PROFILE)) == PROFILE
