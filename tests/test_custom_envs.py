"""The env is a value: env objects, registered factories and `module:factory` names train like the
built-in names, adapted envs (gymnax, MuJoCo Playground) get the built-in envs' time limits and
fresh resets, and what cannot be resolved or fingerprinted is refused or never stored."""

import dataclasses
import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vaco_jax import Config, ConfigError, Trainer, cache, envs, make_train, program, register_env

from test_trainer import TINY

ONE_EVAL = dataclasses.replace(TINY, total_steps=8 * 8, num_evals=1)


def rollout(vec_env, steps, action):
    """`steps` steps of `vec_env` with a constant `action` per env: for every step, the state
    stepped from, its result, and the state after (a fresh episode where one ended)."""
    state = vec_env.reset(jax.random.PRNGKey(0))
    actions = jnp.broadcast_to(jnp.asarray(action), (vec_env.num_envs,) + jnp.shape(action))

    def step(state, key):
        new_state, result = vec_env.step(state, actions, key)
        return new_state, (state, result, new_state)

    return jax.jit(lambda: jax.lax.scan(step, state, jax.random.split(
        jax.random.PRNGKey(1), steps))[1])()


def gymnax_pair(env_id: str):
    gymnax = pytest.importorskip("gymnax")
    return gymnax.make(env_id)


@pytest.mark.parametrize("make,action", [
    (lambda: envs.as_env(gymnax_pair("Pendulum-v1")), np.array([0.5], np.float32)),
    (lambda: envs.as_env(gymnax_pair("CartPole-v1")), np.int32(1)),
    (lambda: envs.make_env("vaco_jax.envs:ToyReach"), np.array([0.5, 0.5], np.float32)),
], ids=["gymnax-pendulum", "gymnax-cartpole", "module-factory"])
def test_time_limits_truncate_and_reset_adapted_envs_like_the_built_in_ones(make, action):
    # tests/test_envs.py's truncation test, on envs that are not built in: the limit sets a
    # truncation flag (not termination), the step keeps the true final observation, and the next
    # episode starts from a fresh draw.
    env = make()
    vec_env = envs.VecEnv(env, num_envs=3, episode_length=4)
    before, result, after = rollout(vec_env, 12, action)
    truncated = np.asarray(result.truncated)
    assert not np.any(result.terminated)
    np.testing.assert_array_equal(truncated, np.repeat([[0, 0, 0, 1] * 3], 3, axis=0).T)
    # next_obs is what the env returns from the state stepped from, at a truncation too.
    stepped = jax.jit(jax.vmap(jax.vmap(env.step), in_axes=(0, None)))(
        before.inner, vec_env.action_space.clip(jnp.broadcast_to(action, (3,) + np.shape(action))))
    np.testing.assert_array_equal(result.next_obs, stepped.obs)
    ended = truncated.astype(bool)
    np.testing.assert_array_equal(np.asarray(after.obs)[~ended], np.asarray(result.next_obs)[~ended])
    starts = np.asarray(after.obs)[ended]
    assert not np.any(np.all(np.isclose(starts, np.asarray(result.next_obs)[ended]), axis=-1))
    assert len(np.unique(starts.round(6), axis=0)) == len(starts) == 9   # each its own draw


def test_a_discrete_gymnax_env_takes_integer_actions_and_a_box_one_is_rescaled():
    cartpole = envs.as_env(gymnax_pair("CartPole-v1"))
    assert cartpole.action_space == envs.spaces.Discrete(2) and cartpole.observation_size == 4
    pendulum = envs.as_env(gymnax_pair("Pendulum-v1")[0])   # an env alone: its default params
    assert pendulum.action_space == envs.spaces.Box(1) and pendulum.time_limit == 200
    torques = jax.vmap(pendulum._theirs)(jnp.array([[-1.0], [0.0], [1.0]]))
    np.testing.assert_allclose(torques.ravel(), [-2.0, 0.0, 2.0])   # Pendulum's [-2, 2]


def test_an_env_object_a_registered_name_and_module_factory_train_like_the_built_in_name():
    key = jax.random.PRNGKey(2)
    by_name = jax.jit(make_train(ONE_EVAL))(key)
    register_env("reach_registered", envs.ToyReach)
    ways = {
        "object": make_train(dataclasses.replace(ONE_EVAL, env="my reach"), env=envs.ToyReach()),
        "registered": make_train(dataclasses.replace(ONE_EVAL, env="reach_registered")),
        "module:factory": make_train(dataclasses.replace(ONE_EVAL, env="vaco_jax.envs:ToyReach")),
    }
    for way, train in ways.items():
        chex.assert_trees_all_equal(jax.jit(train)(key), by_name)


@pytest.mark.parametrize("name,allowed", [
    ("cartpole", "register_env"),
    ("no_such_module_for_vaco:make", "does not import (ModuleNotFoundError"),
    ("vaco_jax.envs:no_such_factory", "has no function 'no_such_factory'"),
    ("gymnax:NoSuchEnv-v0", "gymnax"),
])
def test_an_env_that_cannot_be_resolved_is_refused_naming_env_and_what_is_allowed(name, allowed):
    with pytest.raises(ConfigError) as error:
        make_train(dataclasses.replace(TINY, env=name))
    message = str(error.value)
    assert f"`env` = {name!r} is invalid" in message and allowed in message, message


def test_a_factory_or_object_that_is_no_env_is_refused_naming_what_is_allowed():
    register_env("not_an_env", lambda: 3)
    with pytest.raises(ConfigError, match=r"`env` = 'not_an_env' is invalid: its factory returned "
                                          r"a builtins.int: it has no `reset`, no `step`, .*; "
                                          r"allowed are an env with Brax's interface"):
        make_train(dataclasses.replace(TINY, env="not_an_env"))
    with pytest.raises(ConfigError, match="`env`: the env object .* allowed are an env with Brax's"):
        make_train(TINY, env=object())
    with pytest.raises(ConfigError, match="`env` = .* pass an env object beside the config"):
        make_train(dataclasses.replace(TINY, env=envs.ToyReach()))
    for name in ("toy_reach", "a:b", ""):
        with pytest.raises(ConfigError, match="`env`"):
            register_env(name, envs.ToyReach)


def test_the_command_line_refuses_a_factory_that_does_not_import_before_compiling(tmp_path):
    done = subprocess.run([sys.executable, "-m", "vaco_jax.commands.train", "--env",
                           "no_such_module_for_vaco:make", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "`env` = 'no_such_module_for_vaco:make' is invalid" in done.stderr
    assert "module:factory" in done.stderr and not (tmp_path / "run").exists()


class RecordingStore(cache.ProgramStore):
    """A program store that records what is asked of it and holds nothing."""

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "calls", [])

    def load(self, key, name):
        self.calls.append(("load", name))
        return None

    def save(self, key, name, compiled):
        self.calls.append(("save", name))
        return False


def test_an_env_that_cannot_be_fingerprinted_is_never_served_a_stored_program(tmp_path):
    # A class whose code cannot be hashed (as one defined in a notebook): two such envs under one
    # name may differ in anything, so no program of theirs is loaded from the store or kept there.
    notebook_reach = type("NotebookReach", (envs.ToyReach,), {"__module__": "__main__"})
    config = dataclasses.replace(ONE_EVAL, env="notebook reach")
    store = RecordingStore(tmp_path)
    built = program.TrainProgram.build(config, 1, env=notebook_reach(), store=store)
    assert not program.traced_from(built.trainer).storable
    assert built.store is None and store.calls == []
    # The same env from a module's class is stored and looked up.
    stored = program.TrainProgram.build(config, 1, env=envs.ToyReach(), store=store)
    assert stored.store is store and store.calls == [("load", "learn")]
    program._build.cache_clear()


def test_an_adapted_env_is_fingerprinted_by_its_parameters():
    env, params = gymnax_pair("CartPole-v1")
    config = dataclasses.replace(TINY, env="cartpole")
    fingerprints = [program.traced_from(Trainer(config, env=(env, p)))
                    for p in (params, params, params.replace(gravity=3.0))]
    assert all(f.storable for f in fingerprints)
    assert fingerprints[0] == fingerprints[1] and fingerprints[0].digest != fingerprints[2].digest


# --- per-env defaults ------------------------------------------------------------------------------

def test_the_command_line_gives_each_env_its_defaults_unless_a_flag_is_given():
    from vaco_jax.commands import train

    hopper = train.parse(["--env", "hopper"]).config
    assert hopper == Config.for_env("hopper") == train.parse(["--env=hopper"]).config
    assert (hopper.total_steps, hopper.mjx_solver, hopper.num_evals) == (1_000_000, "fast", 20)
    given = train.parse(["--env", "hopper", "--total-steps", "5000", "--mjx-solver", "default",
                         "--num-envs", "32"]).config
    assert (given.total_steps, given.mjx_solver, given.num_evals) == (5000, "default", 20)
    # inverted_pendulum (the default env) keeps the defaults the seeded tests were written with.
    assert train.parse([]).config == Config.for_env("inverted_pendulum") == Config()
    dmc = Config.for_env("dmc:CartpoleBalance", seed=3)
    assert (dmc.total_steps, dmc.num_envs, dmc.seed) == (1_000_000, 32, 3)


def test_help_shows_the_defaults_of_the_env_given(capsys):
    from vaco_jax.commands import train

    with pytest.raises(SystemExit):
        train.parse(["--env", "hopper", "--help"])
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "(default: hopper)" in text
    assert "whole iterations). (default: 1000000)" in text
    assert "other envs keep the default). (default: fast)" in text


def test_a_registered_env_brings_its_defaults_and_gymnax_envs_their_episode_limit():
    from vaco_jax.commands import train

    register_env("short_reach", envs.ToyReach, defaults=dict(num_envs=8, episode_length=50))
    config = train.parse(["--env", "short_reach", "--num-actors", "2"]).config
    assert (config.num_envs, config.episode_length, config.num_actors) == (8, 50, 2)
    register_env("odd_reach", envs.ToyReach, defaults=dict(warp_factor=9))
    with pytest.raises(ConfigError, match=r"`env` = 'odd_reach' is invalid: .*\['warp_factor'\]"):
        Config.for_env("odd_reach")
    pytest.importorskip("gymnax")
    assert Config.for_env("gymnax:Acrobot-v1").episode_length == 500   # gymnax's own limit
    assert Config.for_env("gymnax:CartPole-v1").episode_length == 500


def test_the_documented_table_of_defaults_is_the_applied_one():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "environments.md").read_text()
    text = text[text.index("## Per-env defaults"):]
    rows = {line.split("|")[1].strip(): line.split("|")[2] for line in text.splitlines()
            if line.startswith("| `")}
    for name, fields in envs.ENV_DEFAULTS.items():
        row = rows["`dmc:<Task>`" if name in envs.DMC_ENVS else next(
            key for key in rows if f"`{name}`" in key.split(", "))]
        for field, value in fields.items():
            if isinstance(value, bool):
                shown = "on" if value else "off"
            else:
                shown = f"{value:,}" if isinstance(value, int) else str(value)
            assert f"`{field}` {shown}" in row, (name, field, row)


REGISTERING_MODULE = '''
import vaco_jax
from vaco_jax.envs import ToyReach


def make_reach():
    return ToyReach()


vaco_jax.register_env("reach_from_module", make_reach)
'''


def forget(monkeypatch, module_name):
    """What a fresh process knows: no registered env, the module not imported."""
    monkeypatch.setattr(envs, "_REGISTRY", {})
    monkeypatch.delitem(sys.modules, module_name, raising=False)


def test_a_run_of_a_registered_env_resumes_and_evaluates_from_the_command_line(
        tmp_path, monkeypatch, capsys):
    import importlib
    import json

    from vaco_jax import Options, driver
    from vaco_jax.commands import evaluate as evaluate_command, train as train_command

    (tmp_path / "reach_envs.py").write_text(REGISTERING_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("reach_envs")
    config = dataclasses.replace(TINY, env="reach_from_module", total_steps=8 * 8 * 2, num_evals=2)
    out = tmp_path / "run"
    driver.run(config, Options(out=str(out), progress=False, checkpoint_budget=1.0), stop_after=1)
    record = json.loads((out / "config.json").read_text())["env_registration"]
    assert record == {"name": "reach_from_module", "module": "reach_envs",
                      "factory": "make_reach", "file": str(tmp_path / "reach_envs.py")}
    # A new process knows nothing of the name: the run's record imports the module that registers it.
    forget(monkeypatch, "reach_envs")
    assert train_command.main(["--resume", str(out), "--no-progress"]) == 0, capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["finished"]
    forget(monkeypatch, "reach_envs")
    assert evaluate_command.main([str(out), "--episodes", "2", "--json", str(tmp_path / "e.json")]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["env"] == "reach_from_module"
    # A factory of a script cannot be imported by another process: refused, saying how to go on.
    with pytest.raises(ConfigError, match=r"`env` = 'reach_from_script' is invalid: the run's env "
                                          r"was registered with vaco_jax.register_env from a "
                                          r"script .*register it again in this process"):
        envs.restore_registration("reach_from_script", {**record, "module": "__main__"})
