"""The env contract: what docs/environments.md says an env of your own is, is exactly what runs —
duck-typed envs with Brax's interface, discrete actions declared by `action_space` — and anything
else is refused before compiling, naming what is wrong: a wrong observation size, a factory that
raises, Brax's training wrappers. A user's env brings its own episode limit, a non-finite reward
from the env is named as the env's, every env renders or is refused before its episodes run, and
no evaluation result replaces another."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from brax.envs.base import State

from vaco_jax import (Config, ConfigError, DivergenceError, Options, Trainer, envs, make_train,
                      playback, policy, register_env, spaces)
from vaco_jax.commands import evaluate as evaluate_command

from test_custom_envs import ONE_EVAL
from test_trainer import TINY


class DuckReach:
    """toy_reach with Brax's interface, not subclassing Brax's `Env` and without `backend`."""

    observation_size = 4
    action_size = 2

    def __init__(self):
        self._reach = envs.ToyReach()

    def reset(self, rng):
        return self._reach.reset(rng)

    def step(self, state, action):
        return self._reach.step(state, action)


class DuckChoice:
    """Three discrete choices declared by `action_space` only; choice 2 is rewarded."""

    observation_size = 1
    action_space = spaces.Discrete(3)

    def reset(self, rng):
        zero = jnp.zeros(())
        return State(jnp.zeros(1), jnp.ones(1), zero, zero, {}, {})

    def step(self, state, action):
        return state.replace(reward=(action == 2).astype(jnp.float32), done=jnp.ones(()))


class WrongSize(DuckReach):
    observation_size = 5


class NanAfterThree:
    """A reward that turns NaN at the 4th step of every episode, which never ends by itself."""

    observation_size = 1
    action_size = 1

    def reset(self, rng):
        zero = jnp.zeros(())
        return State(jnp.zeros(()), jnp.ones(1), zero, zero, {}, {})

    def step(self, state, action):
        t = state.pipeline_state + 1
        reward = jnp.where(t > 3, jnp.nan, -jnp.sum(jnp.square(action)))
        return state.replace(pipeline_state=t, reward=reward, done=jnp.zeros(()))


def broken_factory():
    raise FileNotFoundError("corridor.xml")


def make_cartpole():
    gymnax = pytest.importorskip("gymnax")
    return gymnax.make("CartPole-v1")


# --- what runs -------------------------------------------------------------------------------------

def test_a_duck_typed_env_trains_exactly_like_the_brax_env_it_mirrors():
    key = jax.random.PRNGKey(2)
    by_name = jax.jit(make_train(ONE_EVAL))(key)
    duck = jax.jit(make_train(dataclasses.replace(ONE_EVAL, env="duck reach"), env=DuckReach()))(key)
    chex.assert_trees_all_equal(duck, by_name)
    assert np.isfinite(duck[1]["eval_return"]).all() and duck[1]["eval_return"] < 0   # −distance


def test_a_discrete_env_declares_its_choices_by_action_space_alone():
    trainer = Trainer(dataclasses.replace(TINY, env="choice"), env=DuckChoice())
    assert trainer.vec_env.action_space == spaces.Discrete(3) and trainer.env.action_size == 3
    params = trainer.init(jax.random.PRNGKey(0)).params["actor"]
    logits = trainer.actor.apply({"params": params}, jnp.ones((1, 1)))["logits"]
    assert logits.shape == (1, 3)


# --- what is refused before compiling ----------------------------------------------------------------

def test_a_wrong_observation_size_is_refused_naming_both_shapes():
    with pytest.raises(ConfigError) as error:
        make_train(dataclasses.replace(TINY, env="wrong"), env=WrongSize())
    assert str(error.value) == (
        "config field `env` = 'wrong' is invalid: reset(rng) returns an observation of shape (4,), "
        "but its `observation_size` is 5: the observation must be a vector of shape (5,)")


def test_an_object_without_the_interface_is_refused_naming_what_it_lacks():
    no_step = type("NoStep", (), {"reset": lambda self, rng: None, "observation_size": 4,
                                  "action_size": 2})
    with pytest.raises(ConfigError, match=r"it has no `step`; allowed are an env with Brax's"):
        make_train(dataclasses.replace(TINY, env="no step"), env=no_step())
    odd = type("OddSpace", (DuckReach,), {"action_space": ("box", 2)})
    with pytest.raises(ConfigError, match=r"its `action_space` is a tuple .*spaces.Discrete\(n\)"):
        make_train(dataclasses.replace(TINY, env="odd"), env=odd())


def test_a_factory_that_raises_is_refused_naming_the_env_and_the_exception():
    register_env("broken", broken_factory)
    expected = ("config field `env` = {!r} is invalid: its factory broken_factory raised "
                "FileNotFoundError: corridor.xml")
    for name in ("broken", "test_env_contract:broken_factory"):
        with pytest.raises(ConfigError) as error:
            make_train(dataclasses.replace(TINY, env=name))
        assert str(error.value) == expected.format(name)


def test_the_command_line_refuses_a_factory_that_raises_before_compiling(tmp_path):
    tests = str(Path(__file__).resolve().parent)
    done = subprocess.run(
        [sys.executable, "-m", "vaco_jax.commands.train", "--env", "test_env_contract:broken_factory",
         "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=120,
        env=dict(os.environ, JAX_PLATFORMS="cpu",
                 PYTHONPATH=os.pathsep.join([os.environ.get("PYTHONPATH", ""), tests])))
    assert done.returncode == 2, done.stderr[-2000:]
    assert ("`env` = 'test_env_contract:broken_factory' is invalid: its factory broken_factory "
            "raised FileNotFoundError: corridor.xml") in done.stderr
    assert "compiling" not in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()


def test_an_env_inside_brax_training_wrappers_is_refused_with_the_way_out():
    from brax import envs as brax_envs

    brax_envs.register_environment("vaco_test_reach", envs.ToyReach)
    created = brax_envs.create("vaco_test_reach", episode_length=50)   # episode limit, auto-reset
    with pytest.raises(ConfigError) as error:
        make_train(dataclasses.replace(TINY, env="created"), env=created)
    message = str(error.value)
    assert "Brax's training wrappers (AutoResetWrapper, EpisodeWrapper)" in message
    assert "brax.envs.get_environment(name), not brax.envs.create(name)" in message
    bare = brax_envs.get_environment("vaco_test_reach")
    assert Trainer(dataclasses.replace(TINY, env="bare"), env=bare).config.episode_length == 20


# --- the episode limit follows the env ---------------------------------------------------------------

def test_a_gymnax_env_given_any_way_keeps_its_own_episode_limit_unless_one_is_set():
    env, params = make_cartpole()
    default = Config(env="cartpole", num_envs=8, unroll_length=8)
    assert default.episode_length == 1000   # Config's own default
    for given in [env, (env, params)]:
        trainer = Trainer(default, env=given)
        assert trainer.config.episode_length == trainer.vec_env.episode_length == 500
    register_env("cartpole_registered", make_cartpole)
    for name in ("cartpole_registered", "test_env_contract:make_cartpole"):
        assert Trainer(dataclasses.replace(default, env=name)).vec_env.episode_length == 500
        assert Config.for_env(name).episode_length == 500   # the command line's default
    # A value set wins; so do gymnax's own params, and a registered default.
    assert Trainer(dataclasses.replace(default, episode_length=50), env=env).vec_env.episode_length == 50
    shorter = (env, params.replace(max_steps_in_episode=200))
    assert Trainer(default, env=shorter).vec_env.episode_length == 200
    register_env("cartpole_300", make_cartpole, defaults=dict(episode_length=300))
    assert Config.for_env("cartpole_300").episode_length == 300
    # The built-in name keeps Config's meaning (Config.for_env gives it its limit).
    assert Trainer(dataclasses.replace(default, env="gymnax:CartPole-v1")).vec_env.episode_length == 1000


# --- a non-finite reward is the env's ----------------------------------------------------------------

def test_a_non_finite_reward_from_the_env_is_named_as_the_envs_not_the_learning_rate(tmp_path):
    register_env("nan_after_three", NanAfterThree)
    config = dataclasses.replace(TINY, env="nan_after_three", num_evals=2, episode_length=50)
    with pytest.raises(DivergenceError) as error:
        vaco_jax_run(config, Options(out=str(tmp_path / "run"), progress=False))
    message = str(error.value)
    # The 4th step of every env is in the first iteration's rollout (8 envs × 8 steps).
    assert (f"seed 0 (index 0 of 1): the env produced a non-finite reward in the middle of an "
            f"episode, at one of env steps 1 to 64 (the rollout of learner iteration 1 of "
            f"{config.num_iterations})" in message), message
    assert "Check the env's reset and step" in message and "learning-rate" not in message


def vaco_jax_run(config, options):
    from vaco_jax import driver

    return driver.run(config, options)


# --- rendering and evaluation results ----------------------------------------------------------------

def saved_policy(run_dir: Path, config: Config, env=None) -> Path:
    """A run directory holding the untrained policy of `config` (no training: evaluate's input)."""
    trainer = Trainer(config, env=env)
    run_dir.mkdir(parents=True)
    state = jax.jit(trainer.init)(jax.random.PRNGKey(0))
    batched = jax.tree.map(lambda x: np.asarray(x)[None], (state.params["actor"], state.normalizer))
    policy.save_policy(run_dir, config, *batched, env_steps=0, evaluations=0)
    return run_dir


def test_a_gymnax_video_has_a_frame_per_step_or_is_refused_before_any_episode(tmp_path, capsys):
    pytest.importorskip("gymnax")
    config = dataclasses.replace(TINY, env="gymnax:CartPole-v1", episode_length=500)
    run_dir = saved_policy(tmp_path / "run", config)
    video = tmp_path / "cartpole.gif"
    code = evaluate_command.main([str(run_dir), "--episodes", "1", "--video", str(video),
                          "--max-steps", "8", "--width", "64", "--height", "48"])
    if importlib_find("pygame") is None:   # gymnasium's classic-control renderer needs it
        assert code == 2 and not video.exists() and not list(run_dir.glob("evaluation_*.json"))
        assert (
            f"error: config field `video` = {str(video)!r} is invalid: gymnax draws CartPole-v1 "
            f"with gymnasium's classic-control renderer, which needs pygame: pip install pygame") in capsys.readouterr().err
        return
    assert code == 0
    import imageio.v3 as iio

    frames = iio.imread(video)
    states = playback.rollout_states(policy.load_policy(run_dir), jax.random.PRNGKey(0), steps=8)
    episode = len(states.reward)   # the states of the episode, its reset's first
    assert frames.shape[0] == episode and frames.shape[1:3] == (48, 64)
    assert frames.std() > 0   # something is drawn


def importlib_find(name):
    import importlib.util

    return importlib.util.find_spec(name)


def test_an_env_that_cannot_draw_itself_is_refused_before_any_episode_runs(tmp_path, capsys):
    run_dir = saved_policy(tmp_path / "run", TINY)
    assert evaluate_command.main([str(run_dir), "--video", str(tmp_path / "x.gif")]) == 2
    assert "'toy_reach' is a pure-JAX test env with no model to render; an MJX env" in (
        capsys.readouterr().err)
    assert not list(run_dir.glob("evaluation_*.json"))   # no episode ran
    pytest.importorskip("gymnax")
    deep_sea = envs.as_env(__import__("gymnax").make("DeepSea-bsuite"))
    with pytest.raises(ConfigError, match="'deep sea' .gymnax's DeepSea-bsuite. has no renderer"):
        playback.renderer(deep_sea, "deep sea", "x.gif")
    with pytest.raises(ConfigError, match="'duck' cannot draw itself .it has no render method."):
        playback.renderer(envs.as_env(DuckReach()), "duck", "x.gif")


def test_an_env_with_a_render_method_draws_one_frame_per_state():
    class DrawnReach(DuckReach):
        def render(self, states, *, width, height):
            # One frame per state, its brightness the point's x coordinate.
            return np.stack([np.full((height, width, 3), 100 + 50 * float(s.pipeline_state[0]),
                                     np.uint8) for s in states])

    env = envs.as_env(DrawnReach())
    states = jax.vmap(env.reset)(jax.random.split(jax.random.PRNGKey(0), 3))
    frames = playback.renderer(env, "drawn", "x.gif")(states, 8, 6)
    assert frames.shape == (3, 6, 8, 3)
    np.testing.assert_array_equal(frames[:, 0, 0, 0],
                                  (100 + 50 * np.asarray(states.pipeline_state[:, 0])).astype(np.uint8))


def test_evaluations_with_other_settings_never_replace_each_other(tmp_path):
    run_dir = saved_policy(tmp_path / "run", TINY)
    assert evaluate_command.main([str(run_dir), "--episodes", "5"]) == 0
    assert evaluate_command.main([str(run_dir), "--episodes", "2"]) == 0
    assert evaluate_command.main([str(run_dir), "--episodes", "2", "--stochastic"]) == 0
    files = {path.name: json.loads(path.read_text()) for path in run_dir.glob("evaluation_*.json")}
    assert sorted(files) == ["evaluation_seed0_step0_episodes2_key0.json",
                             "evaluation_seed0_step0_episodes2_key0_stochastic.json",
                             "evaluation_seed0_step0_episodes5_key0.json"]
    assert len(files["evaluation_seed0_step0_episodes5_key0.json"]["returns"]) == 5
    assert files["evaluation_seed0_step0_episodes2_key0_stochastic.json"]["stochastic"]
