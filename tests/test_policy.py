"""Saved policies (`policy.npz`, `load_policy`) and `vaco-evaluate`, videos included."""

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vaco_jax import (CheckpointError, ConfigError, Options, driver, load_policy, networks,
                      playback, policy)
from vaco_jax.checkpoint import RunCheckpoints
from vaco_jax.commands import evaluate as evaluate_command
from vaco_jax.config import from_json_dict
from vaco_jax.envs import make_env
from vaco_jax.driver import build_program

# The CLI's tiny toy_reach run (2 seeds), built again for this module.
from test_cli import run_dir  # noqa: E402,F401


def test_a_run_saves_each_seeds_final_policy(run_dir):
    config = from_json_dict(json.loads((run_dir / "config.json").read_text())["config"])
    state = RunCheckpoints(run_dir, create=False).restore_latest(
        build_program(config).abstract_state, config).state
    for seed in (0, 1):
        loaded = load_policy(run_dir, seed)
        assert loaded.env == "toy_reach" and loaded.meta["seeds"] == [0, 1]
        assert loaded.meta["env_steps"] == 768 and loaded.meta["evaluations"] == 3
        final = jax.tree.map(lambda x: np.asarray(x)[seed], state.params["actor"])
        jax.tree.map(np.testing.assert_array_equal, loaded.params, final)
        obs = jax.random.normal(jax.random.PRNGKey(seed), (5, 2 * 2))
        # Deterministic action: the Gaussian mean of the normalised observation, clipped; jittable.
        normalizer = jax.tree.map(lambda x: np.asarray(x)[seed], state.normalizer)
        loc = loaded.actor.apply({"params": final}, networks.normalize(obs, normalizer, True))["loc"]
        np.testing.assert_allclose(jax.jit(loaded.act)(obs), jnp.clip(loc, -1, 1), rtol=1e-5, atol=1e-7)
        sampled = loaded.act(obs, jax.random.PRNGKey(1))
        assert sampled.shape == loc.shape and not np.allclose(sampled, jnp.clip(loc, -1, 1))
    with pytest.raises(ConfigError, match="seed"):
        load_policy(run_dir, 2)


def test_loading_warns_on_other_versions_and_refuses_another_structure(run_dir, tmp_path):
    with np.load(run_dir / policy.FILE_NAME) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays["__meta__"]))

    def write(name, arrays, meta):
        (tmp_path / name).mkdir()
        np.savez(tmp_path / name / policy.FILE_NAME,
                 **{**arrays, "__meta__": np.array(json.dumps(meta))})
        return tmp_path / name

    older = write("older", arrays, {**meta, "versions": {**meta["versions"], "numpy": "1.0.0"}})
    with pytest.warns(UserWarning, match="numpy 1.0.0"):
        loaded = load_policy(older)
    jax.tree.map(np.testing.assert_array_equal, loaded.params, load_policy(run_dir).params)
    kernel = next(k for k in arrays if k.endswith("kernel"))
    missing = write("missing", {k: v for k, v in arrays.items() if k != kernel}, meta)
    with pytest.raises(CheckpointError, match="missing arrays"):
        load_policy(missing)
    renamed = write("renamed", {**arrays, "actor/extra": arrays[kernel]}, meta)
    with pytest.raises(CheckpointError, match="unexpected arrays"):
        load_policy(renamed)
    reshaped = write("reshaped", {**arrays, kernel: arrays[kernel][..., :1]}, meta)
    with pytest.raises(CheckpointError, match="shape"):
        load_policy(reshaped)
    with pytest.raises(CheckpointError, match="no saved policy"):
        load_policy(tmp_path)


def test_a_diverged_seed_is_marked_and_loading_it_warns(run_dir, tmp_path):
    # The run's older checkpoint (chunk 1 or 2 of 3, as its budget let it save), with seed 1's
    # learning rate set to 1e6: it diverges in its next iteration and, with --on-nan skip-seed, is
    # frozen there.
    config = from_json_dict(json.loads((run_dir / "config.json").read_text())["config"])
    checkpoints = RunCheckpoints(run_dir, create=False)
    chunk = min(checkpoints.manager.all_steps())
    restored = checkpoints.restore(chunk, build_program(config).abstract_state, config)
    checkpoints.close()
    hparams = restored.state.hparams
    state = restored.state.replace(hparams=hparams.replace(
        learning_rate=hparams.learning_rate.at[1].set(1e6)))
    out = tmp_path / "unstable"
    checkpoints = RunCheckpoints(out)
    checkpoints.save(chunk, state, restored.history, config)
    checkpoints.close()
    summary = driver.run(config, Options(resume=str(out), on_nan="skip-seed", progress=False))
    assert summary["finished"]

    iteration = chunk * config.iterations_per_eval + 1         # the first after the checkpoint
    diverged = {"seed": 1, "index": 1, "iteration": iteration,
                "nonfinite": ["loss", "gradient", "parameters"]}
    assert summary["diverged_seeds"] == [diverged]
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # the healthy seed loads without a word
        healthy = load_policy(out, 0)
    assert healthy.meta["diverged_seeds"] == [diverged] and healthy.diverged is None
    with pytest.warns(UserWarning, match=rf"seed 1 \(index 1\) of .* diverged: a non-finite loss, "
                                         rf"gradient and parameters in learner iteration "
                                         rf"{iteration}; this is its last good policy, after "
                                         rf"{(iteration - 1) * config.batch_size:,} env steps"):
        frozen = load_policy(out, 1)
    assert frozen.diverged == diverged
    jax.tree.map(np.testing.assert_array_equal, frozen.params,       # frozen where it diverged
                 jax.tree.map(lambda x: np.asarray(x)[1], restored.state.params["actor"]))


def test_evaluate_reports_returns_and_writes_them(run_dir, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert evaluate_command.main([str(run_dir), "--seed", "1", "--episodes", "6", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    returns = np.array(result["returns"])
    assert result["seed"] == 1 and result["episodes"] == 6 and returns.shape == (6,)
    assert result["mean"] == pytest.approx(returns.mean()) and np.all(returns < 0)  # −distance
    assert f"{result['mean']:.1f} ± {result['std']:.1f} over 6 episodes" in capsys.readouterr().out
    # The same key gives the same episodes; the default file is in the run directory.
    assert evaluate_command.main([str(run_dir), "--seed", "1", "--episodes", "6"]) == 0
    steps = load_policy(run_dir, 1).meta["env_steps"]
    again = json.loads((run_dir / f"evaluation_seed1_step{steps}_episodes6_key0.json").read_text())
    assert again["returns"] == result["returns"]
    # Bad input is refused before anything is compiled.
    assert evaluate_command.main([str(run_dir), "--episodes", "0"]) == 2
    assert evaluate_command.main([str(run_dir), "--video", "x.avi"]) == 2
    assert evaluate_command.main([str(run_dir), "--video", "x.gif"]) == 2   # a toy env has no model
    assert "no model to render" in capsys.readouterr().err


@pytest.fixture(scope="module")
def episode():
    """A short rollout of an untrained inverted_pendulum policy, rendered (shared by the writers):
    `(env, joint positions, frames)`."""
    env = make_env("inverted_pendulum")
    config = from_json_dict(dict(env="inverted_pendulum", actor_hidden=[8], critic_hidden=[8]))
    actor, _ = networks.make_networks(config, env.action_size)
    params = actor.init(jax.random.PRNGKey(0), jnp.zeros((1, env.observation_size)))["params"]
    trained = policy.Policy(params, networks.init_normalizer(env.observation_size), actor, config)
    positions = playback.rollout_positions(trained, jax.random.PRNGKey(0), steps=6, env=env)
    assert positions.shape == (7, env.sys.mj_model.nq)
    assert np.all(np.diff(positions, axis=0) != 0, axis=1).any()    # the body moves
    return env, positions, playback.render(env, positions, width=64, height=48)


@pytest.fixture
def frames(episode):
    return episode[2]


def test_a_rollout_renders_one_frame_per_state(frames):
    assert frames.shape == (7, 48, 64, 3) and frames.dtype == np.uint8
    assert len(np.unique(frames.reshape(-1, 3), axis=0)) > 10      # not one colour: a scene


@pytest.mark.parametrize("suffix", [".gif", ".mp4"])
def test_rendered_frames_are_written_as_a_video(frames, tmp_path, suffix):
    import imageio.v3 as iio
    path = tmp_path / f"episode{suffix}"
    playback.write_video(path, frames, fps=25)
    back = iio.imread(path, index=None)
    assert back.shape[0] == len(frames) and back.shape[1:3] == (48, 64)
    assert np.abs(back.astype(float) - frames).mean() < 8          # the same pictures (lossy)


def test_an_episode_is_written_as_brax_s_interactive_viewer(episode, tmp_path):
    import base64
    import re
    import zlib
    env, positions, _ = episode
    path = tmp_path / "episode.html"
    playback.write_html(path, env, positions)
    page = path.read_text()
    encoded = re.search(r'var system = "([A-Za-z0-9+/=]+)"', page)
    system = json.loads(zlib.decompress(base64.b64decode(encoded.group(1))))
    assert len(system["states"]["x"]) == len(positions)                # one state per step
    first, last = system["states"]["x"][0]["pos"], system["states"]["x"][-1]["pos"]
    assert first != last                                               # and they move
