"""DeepMind Control Suite tasks (MuJoCo Playground) behind our wrapper: time limits, true final
observations, fresh resets, and the errors for unknown tasks or a missing install.

Every one of the 25 tasks resetting and stepping under `jit(vmap)` is checked by the raw-throughput
benchmark (`python -m benchmarks.dmc_throughput`), not here: compiling all of them takes minutes.
"""

import dataclasses

import jax
import numpy as np
import pytest

from vaco_jax import Config, ConfigError, envs
from vaco_jax.config import validate
from vaco_jax.study import presets, sweep

from test_envs import run

pytest.importorskip("mujoco_playground", reason='needs the dmc extra: pip install -e ".[dmc]"')


@pytest.mark.parametrize("task", ["CartpoleBalance", "ReacherEasy"])
def test_time_limit_truncates_keeps_the_final_observation_and_resets_afresh(task):
    env = envs.make_env(f"dmc:{task}")
    assert isinstance(env, envs.PlaygroundEnv) and env.env.mjx_model.impl.value == "jax"
    vec_env = envs.VecEnv(env, num_envs=3, episode_length=5)
    obs, result, obs_after = jax.jit(lambda: run(vec_env, 10, action_value=0.3))()
    done = np.asarray(result.terminated | result.truncated)
    assert np.asarray(result.truncated)[[4, 9]].all() and not done[:4].any() and not done[5:9].any()
    # The transition keeps the end of the old episode; the env holds a fresh one.
    np.testing.assert_allclose(result.next_obs[3], obs[4])
    assert not np.allclose(result.next_obs[4], obs_after[4])
    # Fresh, independent draws: the three new episodes differ from each other and from the first.
    starts = np.asarray(obs_after[4])
    assert len(np.unique(starts.round(6), axis=0)) == 3 and not np.allclose(starts, obs[0])
    assert np.isfinite(np.asarray(result.reward)).all() and (np.asarray(result.reward) >= 0).all()


def test_an_unknown_task_is_refused_listing_the_suite():
    with pytest.raises(ConfigError, match=r"`env` = 'dmc:CheetahWalk' is invalid: the DM Control "
                                          r"Suite tasks are \['dmc:AcrobotSwingup'"):
        validate(Config(env="dmc:CheetahWalk"))
    validate(Config(env="dmc:CheetahRun"))


def test_a_missing_playground_is_refused_naming_the_install(monkeypatch):
    monkeypatch.setattr(envs, "dmc_available", lambda: False)
    with pytest.raises(ConfigError, match=r'need MuJoCo Playground: pip install -e "\.\[dmc\]"'):
        validate(dataclasses.replace(Config(), env="dmc:CartpoleSwingup"))


def test_the_dmc_presets_plan_playgrounds_settings():
    cpu = sweep.plan(presets.PRESETS["cpu-dmc"], ["main"])
    assert [(c.env, c.algo) for c in cpu] == [
        (env, algo) for env in ("dmc:CartpoleBalance", "dmc:CartpoleSwingup")
        for algo in presets.MAIN_ALGOS]
    assert all(len(c.runs) == 15 and c.config.env_steps >= 990_000 for c in cpu)
    paper = {c.env: c.config for c in sweep.plan(presets.PRESETS["paper-dmc"], ["main"],
                                                 algos=["vaco"])}
    assert sorted(paper) == sorted(envs.DMC_ENVS)
    # Playground's PPO: minibatches of 1024 unrolls of 30 steps, 16 × 32 of them per 983,040 steps.
    config = paper["dmc:CheetahRun"]
    assert config.batch_size // config.num_minibatches == 1024 * 30
    assert config.num_epochs * config.num_minibatches / config.batch_size == 16 * 32 / 983_040
    assert (config.gamma, config.learning_rate, config.ent_coef, config.reward_scale) == (
        0.995, 1e-3, 1e-2, 10.0)
    # Whole evaluation periods: within 2% of 60M (100M for WalkerRun).
    assert config.env_steps >= 0.98 * 60_000_000 and paper["dmc:WalkerRun"].env_steps >= 98_000_000
    assert paper["dmc:BallInCup"].gamma == paper["dmc:FingerSpin"].gamma == 0.95
