"""Checkpoints: resuming is bit-identical, a SIGKILLed run loses at most one chunk, and corrupt or
mismatched checkpoints are refused without touching the run."""

import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from vaco_jax import Config, ConfigError, Options, cache, fingerprint, io, program
from vaco_jax.checkpoint import CheckpointError, RunCheckpoints, check_compatible
from vaco_jax.envs import make_env
from vaco_jax.commands.train import main
from vaco_jax.driver import _output_dir, build_program, checkpoint_due, run
from vaco_jax.options import duration_seconds, validate_options
from vaco_jax.trainer import stack_hparams

from conftest import CACHE_DIR

ROOT = Path(__file__).resolve().parent.parent
# 2 seeds, 6 chunks of 20 iterations, a checkpoint after every chunk whatever it costs (budget 1).
BASE = Config(env="toy_reach", algo="vaco", num_seeds=2, num_envs=8, unroll_length=8, num_epochs=2,
              num_minibatches=2, num_actors=2, episode_length=20, eval_envs=4,
              actor_hidden=(16, 16), critic_hidden=(16, 16), capacity=3, max_capacity=4,
              num_evals=6, total_steps=8 * 8 * 20 * 6)
OPTIONS = Options(progress=False, checkpoint_budget=1.0)


def options(**changes) -> Options:
    return dataclasses.replace(OPTIONS, **changes)


def cli_args(config: Config) -> list[str]:
    """The command line that gives `config` (the fields BASE sets)."""
    args = []
    for name in ["env", "algo", "num_seeds", "num_envs", "unroll_length", "num_epochs",
                 "num_minibatches", "num_actors", "episode_length", "eval_envs", "capacity",
                 "max_capacity", "num_evals", "total_steps", "learning_rate", "ent_coef"]:
        args += ["--" + name.replace("_", "-"), str(getattr(config, name))]
    return args + ["--checkpoint-budget", str(OPTIONS.checkpoint_budget), "--actor-hidden", "16", "16", "--critic-hidden", "16", "16", "--no-progress"]


def final_state(run_dir, config=BASE):
    """The train state of a run's newest checkpoint, and that checkpoint's metadata."""
    checkpoints = RunCheckpoints(run_dir, create=False)
    restored = checkpoints.restore_latest(build_program(config).abstract_state, config)
    checkpoints.close()
    return restored


def assert_same_state(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "uninterrupted"
    summary = run(BASE, options(out=str(out)))
    assert summary["finished"] and summary["chunks_done"] == BASE.num_evals
    return out


def test_resumed_run_is_bit_identical_to_an_uninterrupted_one(uninterrupted, tmp_path):
    out = tmp_path / "resumed"
    partial = run(BASE, options(out=str(out)), stop_after=2)
    assert not partial["finished"] and not (out / "summary.json").exists()
    assert len(io.read_jsonl(out / "metrics.jsonl")) == 2
    summary = run(BASE, options(resume=str(out)))
    assert summary["resumed_from_chunk"] == 2 and summary["finished"]

    # Every metric of every chunk, and the whole final state (params, optimiser, buffer, keys, ...).
    assert io.read_jsonl(out / "metrics.jsonl") == io.read_jsonl(uninterrupted / "metrics.jsonl")
    resumed, reference = final_state(out), final_state(uninterrupted)
    assert_same_state(resumed.state, reference.state)
    assert resumed.meta["sha256"] == reference.meta["sha256"]
    # Only the newest k (= 2 by default) checkpoints are kept.
    assert sorted(int(p.name) for p in (out / "checkpoints").iterdir()) == [5, 6]


def test_sigkilled_run_resumes_at_most_one_chunk_back(uninterrupted, tmp_path):
    out = tmp_path / "killed"
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=CACHE_DIR,
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    process = subprocess.Popen([sys.executable, "-m", "vaco_jax.commands.train", *cli_args(BASE), "--out", str(out)],
                               cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 240
        while not ((out / "metrics.jsonl").exists() and len(io.read_jsonl(out / "metrics.jsonl")) >= 2):
            assert process.poll() is None, process.stderr.read().decode()[-2000:]
            assert time.time() < deadline, "the run wrote no second row in time"
            time.sleep(0.02)
        time.sleep(random.uniform(0.0, 0.3))  # somewhere in the next chunk or checkpoint
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
        process.stderr.close()
    assert process.returncode == -signal.SIGKILL
    rows_at_kill = len(io.read_jsonl(out / "metrics.jsonl"))
    assert rows_at_kill < BASE.num_evals and not (out / "summary.json").exists()

    # A row is written only after its chunk's checkpoint is complete, and the next chunk's results
    # are fetched only after that: the resume point is at most one chunk behind the newest chunk
    # the process had finished.
    assert main(["--resume", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    print(f"rows at kill {rows_at_kill}, resumed from chunk {summary['resumed_from_chunk']}")
    assert rows_at_kill <= summary["resumed_from_chunk"] < BASE.num_evals
    assert io.read_jsonl(out / "metrics.jsonl") == io.read_jsonl(uninterrupted / "metrics.jsonl")
    assert final_state(out).meta["sha256"] == final_state(uninterrupted).meta["sha256"]


@pytest.fixture
def partial_run(uninterrupted, tmp_path):
    """A run stopped after 3 of 6 chunks (checkpoints 2 and 3 on disk)."""
    out = tmp_path / "partial"
    run(BASE, options(out=str(out)), stop_after=3)
    return out


def snapshot_files(directory):
    return {p: p.read_bytes() for p in sorted(Path(directory).rglob("*")) if p.is_file()}


def test_resuming_with_a_different_config_is_refused(partial_run, capsys):
    before = snapshot_files(partial_run)
    assert main(["--resume", str(partial_run), "--learning-rate", "0.001", "--num-epochs", "3"]) == 2
    message = capsys.readouterr().err
    assert "was written by a run with a different config" in message
    assert "`num_epochs` = 3 here but 2 in the checkpoint" in message
    assert "`learning_rate` = 0.001 here but 0.0003 in the checkpoint" in message
    assert snapshot_files(partial_run) == before  # nothing loaded, nothing written


def test_checkpoint_from_other_library_versions_is_refused_unless_allowed(partial_run, uninterrupted):
    meta_file = partial_run / "checkpoints" / "3" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    meta["versions"]["jax"] = "0.0.1"
    meta_file.write_text(json.dumps(meta))
    before = snapshot_files(partial_run)
    with pytest.raises(CheckpointError, match=r"different library versions \(jax 0\.0\.1 in the "
                                              rf"checkpoint, {jax.__version__} here\).*"
                                              r"--allow-version-change"):
        run(BASE, options(resume=str(partial_run)))
    assert snapshot_files(partial_run) == before

    # Allowed: a warning names the change, and the run continues (here the same jax, so exactly).
    with pytest.warns(UserWarning, match=r"other library versions \(jax 0\.0\.1 in the checkpoint"):
        summary = run(BASE, options(resume=str(partial_run), allow_version_change=True))
    assert summary["finished"] and summary["resumed_from_chunk"] == 3
    assert io.read_jsonl(partial_run / "metrics.jsonl") == io.read_jsonl(uninterrupted / "metrics.jsonl")


def test_resuming_on_other_code_is_refused_unless_allowed(uninterrupted, tmp_path, monkeypatch,
                                                          capsys):
    out, other_code = tmp_path / "other_code", "0123456789abcdef"
    monkeypatch.setattr(io, "source_hash", lambda: other_code)   # the code the run started on
    run(BASE, options(out=str(out)), stop_after=3)
    monkeypatch.undo()
    before = snapshot_files(out)
    assert main(["--resume", str(out), "--no-progress"]) == 2
    message = capsys.readouterr().err
    assert (f"was written by other vaco_jax code (source {other_code} in the checkpoint, "
            f"{io.source_hash()} here;") in message and "--allow-code-change" in message
    assert snapshot_files(out) == before

    # Allowed: a warning says so, and config.json and every row name the code that made them.
    with pytest.warns(UserWarning, match=f"other vaco_jax code \\(source {other_code}"):
        summary = run(BASE, options(resume=str(out), allow_code_change=True))
    assert summary["finished"] and summary["resumed_from_chunk"] == 3
    rows = io.read_jsonl(out / "metrics.jsonl")
    assert [row["source"] for row in rows] == [other_code] * 3 + [io.source_hash()] * 3
    sources = json.loads((out / "config.json").read_text())["sources"]
    assert [(s["from_chunk"], s["source"]) for s in sources] == [(0, other_code),
                                                                 (3, io.source_hash())]
    without_source = lambda rows: [{k: v for k, v in r.items() if k != "source"} for r in rows]  # noqa: E731
    assert without_source(rows) == without_source(io.read_jsonl(uninterrupted / "metrics.jsonl"))


def test_a_checkpoint_of_code_before_a_config_field_existed_resumes_as_its_default(
        partial_run, uninterrupted, capsys):
    # What code of before `network` and `kl_reference` wrote: neither field, another source.
    meta_file = partial_run / "checkpoints" / "3" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    for name in ("network", "kl_reference"):
        del meta["config"][name]
    meta["source"] = "0123456789abcdef"
    del meta["sources"]
    meta_file.write_text(json.dumps(meta))
    # An absent field compares as its default: only the code differs, which is allowed here.
    with pytest.warns(UserWarning, match="other vaco_jax code"):
        summary = run(BASE, options(resume=str(partial_run), allow_code_change=True))
    assert summary["finished"] and summary["resumed_from_chunk"] == 3
    without_source = lambda rows: [{k: v for k, v in r.items() if k != "source"} for r in rows]  # noqa: E731
    assert without_source(io.read_jsonl(partial_run / "metrics.jsonl")) == without_source(
        io.read_jsonl(uninterrupted / "metrics.jsonl"))
    # A value other than the default is still a different config, named as such.
    with pytest.raises(CheckpointError, match=r"`network` = 'cnn' here but 'mlp' in the checkpoint "
                                              r"\(absent: its default\)"):
        check_compatible(meta, dataclasses.replace(BASE, network="cnn"), "checkpoints/3",
                         allow_code_change=True, warn=False)


def test_a_run_resumed_on_code_that_logs_more_metrics_records_them_from_there(
        partial_run, uninterrupted):
    # The checkpoint of code that did not log `tv_forward` (written again without it).
    checkpoints = RunCheckpoints(partial_run, create=False)
    restored = checkpoints.restore_latest(build_program(BASE).abstract_state, BASE)
    checkpoints.close()
    history = {k: v for k, v in restored.history.items() if k != "tv_forward"}
    shutil.rmtree(partial_run / "checkpoints" / "3")
    checkpoints = RunCheckpoints(partial_run, create=False)
    checkpoints.save(3, restored.state, history, BASE)
    checkpoints.close()
    assert "tv_forward" not in final_state(partial_run).history
    summary = run(BASE, options(resume=str(partial_run)))
    assert summary["finished"] and summary["resumed_from_chunk"] == 3
    rows, expected = io.read_jsonl(partial_run / "metrics.jsonl"), io.read_jsonl(
        uninterrupted / "metrics.jsonl")
    assert all("tv_forward" not in row for row in rows[:3])     # rewritten from the checkpoint
    assert [row["tv_forward"] for row in rows[3:]] == [row["tv_forward"] for row in expected[3:]]
    assert np.isnan(final_state(partial_run).history["tv_forward"][:3]).all()


def test_a_resume_checks_the_libraries_its_run_computes_with_and_no_others(uninterrupted):
    checkpoints = RunCheckpoints(uninterrupted, create=False)
    meta = checkpoints.read_meta(checkpoints.latest_chunk())
    checkpoints.close()
    # An extra installed (or upgraded) since: the toy env's run uses none of these libraries.
    for name in ("playground", "gymnax", "mujoco", "mujoco-mjx"):
        meta["versions"][name] = "0.0.1"
    check_compatible(meta, BASE, "checkpoints/6")
    # A DM Control task's run computes with MuJoCo Playground and MJX: those are checked.
    dmc = dataclasses.replace(BASE, env="dmc:CartpoleBalance")
    with pytest.raises(CheckpointError, match=r"different library versions \(playground 0\.0\.1 "
                                              r"in the checkpoint.*; mujoco 0\.0\.1 .*; mujoco-mjx "
                                              r"0\.0\.1 in the checkpoint"):
        check_compatible(meta, dmc, "checkpoints/6")
    with pytest.raises(CheckpointError, match=r"\(gymnax 0\.0\.1 in the checkpoint, "):
        check_compatible(meta, dataclasses.replace(BASE, env="gymnax:CartPole-v1"), "checkpoints/6")
    # jax is checked for every run.
    meta["versions"]["jax"] = "0.0.1"
    with pytest.raises(CheckpointError, match=r"\(jax 0\.0\.1 in the checkpoint"):
        check_compatible(meta, BASE, "checkpoints/6")


def test_checkpoint_arrays_are_stored_by_pytree_path(partial_run):
    """Each leaf is stored under its path in the train state, so a checkpoint can be read (e.g.
    with orbax alone) without this code's flattening order."""
    import orbax.checkpoint as ocp

    stored = ocp.StandardCheckpointer().restore((partial_run / "checkpoints/3/arrays").absolute())
    assert set(stored["state"]) >= {"params", "opt_state", "normalizer", "buffer"}, sorted(stored)
    kernel = stored["state"]["params"]["actor"]["MLP_0"]["Dense_0"]["kernel"]
    assert kernel.shape[0] == BASE.num_seeds and kernel.shape[-1] == 16, kernel.shape
    restored = final_state(partial_run)
    np.testing.assert_array_equal(kernel, restored.state.params["actor"]["MLP_0"]["Dense_0"]["kernel"])
    meta = restored.meta
    assert meta["format"] == 2 and ["params/actor/MLP_0/Dense_0/kernel", list(kernel.shape),
                                    "float32"] in meta["leaves"]


def test_a_checkpoint_of_the_previous_format_still_resumes(partial_run, tmp_path, monkeypatch):
    """Format 1 stored leaves by their index in the flattened state; it is still read."""
    from vaco_jax import checkpoint

    restored = final_state(partial_run)
    old = RunCheckpoints(tmp_path / "old")
    monkeypatch.setattr(checkpoint, "FORMAT", 1)
    old.save(restored.chunk, restored.state, restored.history, BASE)
    old.close()
    monkeypatch.undo()
    assert (tmp_path / "old/checkpoints/3/arrays").is_dir()
    again = final_state(tmp_path / "old")
    assert again.meta["format"] == 1 and again.chunk == 3
    assert_same_state(again.state, restored.state)
    assert all(np.array_equal(again.history[k], v, equal_nan=True) for k, v in restored.history.items())


def corrupt(checkpoint_dir):
    """Flip one byte in the middle of each of a checkpoint's array data files (Orbax's OCDBT data
    files live in `ocdbt.process_<i>/d/`; the top-level `d/` holds the B-tree of leaf names)."""
    data_files = [p for p in (checkpoint_dir / "arrays").glob("ocdbt.process_*/d/*") if p.is_file()]
    assert data_files
    for data in data_files:
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    return data_files


def test_a_corrupt_newest_checkpoint_is_set_aside_and_the_one_before_resumes(partial_run,
                                                                              uninterrupted):
    corrupt(partial_run / "checkpoints" / "3")
    newest = snapshot_files(partial_run / "checkpoints" / "3")
    with pytest.warns(UserWarning, match=r"checkpoints/3' (is corrupt|cannot be read).*moved it to "
                                         r".*corrupt_checkpoints/3' and resuming from checkpoint 2"):
        summary = run(BASE, options(resume=str(partial_run)))
    # Found before anything was built, so the run went on from chunk 2, exactly as if uninterrupted.
    assert summary["finished"] and summary["resumed_from_chunk"] == 2
    assert io.read_jsonl(partial_run / "metrics.jsonl") == io.read_jsonl(uninterrupted / "metrics.jsonl")
    assert final_state(partial_run).meta["sha256"] == final_state(uninterrupted).meta["sha256"]
    # Nothing written is lost: the corrupt checkpoint is kept, byte for byte, beside the run.
    aside = partial_run / "corrupt_checkpoints" / "3"
    assert {p.relative_to(aside): b for p, b in snapshot_files(aside).items()} == {
        p.relative_to(partial_run / "checkpoints" / "3"): b for p, b in newest.items()}


def test_a_run_whose_every_checkpoint_is_corrupt_is_refused_and_left_as_it_is(partial_run):
    data_files = corrupt(partial_run / "checkpoints" / "3") + corrupt(partial_run / "checkpoints" / "2")
    before = snapshot_files(partial_run)
    with pytest.raises(CheckpointError, match=r"checkpoints/3' (is corrupt|cannot be read).*"
                                              r"other checkpoints: \[2\]"):
        run(BASE, options(resume=str(partial_run)))
    assert snapshot_files(partial_run) == before

    for data in data_files:  # missing files are refused as well
        data.unlink()
    with pytest.raises(CheckpointError, match="cannot be read|is corrupt"):
        run(BASE, options(resume=str(partial_run)))


def test_a_half_written_checkpoint_is_ignored(uninterrupted, partial_run):
    # What a kill during a save leaves: orbax's temporary directory, never renamed into place.
    torn = partial_run / "checkpoints" / "4.orbax-checkpoint-tmp-1700000000"
    shutil.copytree(partial_run / "checkpoints" / "3", torn)
    next(p for p in torn.rglob("*") if p.is_file()).unlink()
    summary = run(BASE, options(resume=str(partial_run)))
    assert summary["resumed_from_chunk"] == 3 and not torn.exists()
    assert io.read_jsonl(partial_run / "metrics.jsonl") == io.read_jsonl(uninterrupted / "metrics.jsonl")


def test_a_new_run_does_not_clobber_an_unfinished_one(partial_run, tmp_path):
    before = snapshot_files(partial_run)
    with pytest.raises(ConfigError, match=r"holds checkpoints of an unfinished run; continue it with "
                                          r"--resume"):
        run(BASE, options(out=str(partial_run)))
    assert snapshot_files(partial_run) == before
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="has no checkpoints"):
        run(BASE, options(resume=str(tmp_path / "empty")))


def test_overwrite_moves_the_earlier_run_aside_whole(tmp_path, capsys):
    out = tmp_path / "run"
    earlier = {"checkpoints/6/meta/metadata": "{}", "metrics.jsonl": "{}\n", "summary.json": "{}",
               "config.json": "{}", "policy.npz": "npz", "wandb_run_id": "0123abcd",
               "tensorboard/events.out.tfevents.1.host": "events", "evaluation_seed0.json": "{}"}
    for name, text in earlier.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    assert _output_dir(options(out=str(out), overwrite=True), BASE) == out
    assert list(out.iterdir()) == []   # nothing of the earlier run is left to mix with the new one
    (aside,) = [p for p in tmp_path.iterdir() if p != out]
    assert aside.name.startswith("run.old-") and f"moved to {aside}" in capsys.readouterr().err
    assert {str(p.relative_to(aside)): p.read_text() for p in aside.rglob("*") if p.is_file()} == earlier


def test_checkpoint_cadence_keeps_writing_within_its_budget():
    config = options(checkpoint_budget=0.05, checkpoint_every=1)
    # A write of 0.1 s is due once 0.1 · 0.95 / 0.05 = 1.9 s have passed since the last one.
    assert not checkpoint_due(config, 2, last_save_seconds=0.1, seconds_since_save=1.0)
    assert checkpoint_due(config, 2, last_save_seconds=0.1, seconds_since_save=2.0)
    assert checkpoint_due(config, 4, last_save_seconds=0.1, seconds_since_save=0.0, last=True)
    assert checkpoint_due(dataclasses.replace(config, checkpoint_budget=1.0), 2, 5.0, 0.0)
    every_3 = dataclasses.replace(config, checkpoint_every=3)
    assert [c for c in range(1, 7) if checkpoint_due(every_3, c, 0.0, 1.0, last=c == 6)] == [3, 6]
    never = dataclasses.replace(config, checkpoint_every=0)
    assert not any(checkpoint_due(never, c, 0.0, 1.0, last=c == 6) for c in range(1, 7))


def test_the_newest_checkpoint_is_never_older_than_the_maximum_age():
    # Slow writes (5 s each) on a tight 1% budget would wait 495 s; a 2-minute maximum age wins.
    slow = options(checkpoint_budget=0.01, checkpoint_every=1, checkpoint_max_age="2min")
    assert not checkpoint_due(slow, 2, last_save_seconds=5.0, seconds_since_save=119.0)
    assert checkpoint_due(slow, 2, last_save_seconds=5.0, seconds_since_save=120.0)
    # It also overrides checkpoint_every, but not "never" (checkpoint_every = 0).
    every_10 = dataclasses.replace(slow, checkpoint_every=10)
    assert checkpoint_due(every_10, 3, 0.0, 121.0) and not checkpoint_due(every_10, 3, 0.0, 60.0)
    assert not checkpoint_due(dataclasses.replace(slow, checkpoint_every=0), 3, 0.0, 1e6)
    # 0 = no maximum: the budget alone decides.
    assert not checkpoint_due(dataclasses.replace(slow, checkpoint_max_age="0"), 2, 5.0, 400.0)
    assert [duration_seconds(t) for t in ("90", "90s", "10min", "1.5h", "0")] == [
        90.0, 90.0, 600.0, 5400.0, 0.0]
    for bad in ("ten minutes", "10m", "-5s", "inf", ""):
        with pytest.raises(ConfigError, match="checkpoint_max_age"):
            validate_options(Options(checkpoint_max_age=bad))


def test_resuming_a_finished_run_changes_nothing(uninterrupted):
    before = snapshot_files(uninterrupted)
    summary = run(BASE, options(resume=str(uninterrupted)))
    assert summary == json.loads((uninterrupted / "summary.json").read_text())
    assert snapshot_files(uninterrupted) == before



# Last in this module: it empties the in-process cache of built programs.
def test_a_program_loaded_from_the_store_runs_exactly_as_compiled(tmp_path):

    # A program no earlier session has in JAX's cache: only a program compiled in this process is
    # stored (one JAX loaded from its cache could not run again).
    config = dataclasses.replace(BASE, actor_hidden=(random.randrange(17, 500), 16))

    def build():   # as a fresh process would: nothing built in this one
        program._build.cache_clear()
        return program.TrainProgram.build(config, 2, donate=True, store=cache.ProgramStore(tmp_path))

    def first_chunk(built):
        state = built.init_state(program.seed_keys([0, 1]), stack_hparams([config.hparams()] * 2))
        return built.compiled_chunk()[0](state)

    compiled = build()
    expected = first_chunk(compiled)
    assert not compiled.loaded and sorted(p.name.split("-")[1] for p in tmp_path.iterdir()) == [
        "evaluate.program", "learn.program"]
    loaded = build()
    assert loaded.loaded and loaded.compiled is not None      # nothing traced or compiled
    assert_same_state(first_chunk(loaded), expected)
    assert jax.tree.map(lambda x: (x.shape, x.dtype), loaded.abstract_state) == jax.tree.map(
        lambda x: (x.shape, x.dtype), compiled.abstract_state)
    # A damaged file is dropped and the program built again (not compiled yet: no chunk asked).
    learn_file = next(tmp_path.glob("*-learn.program"))
    learn_file.write_bytes(b"not a program")
    assert not build().loaded and not learn_file.exists()
    program._build.cache_clear()


def test_programs_loaded_from_jaxs_cache_are_counted():
    size = random.randrange(100, 100_000)   # a program no earlier session has cached
    threshold = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    try:
        before = cache.xla_cache_hits()
        for _ in range(2):   # a new function each time: only the persistent cache can share them
            jax.jit(lambda x: jax.numpy.sin(x) * 2)(jax.numpy.ones(size)).block_until_ready()
        assert cache.xla_cache_hits() == before + 1
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", threshold)


def test_programs_of_envs_whose_code_cannot_be_read_are_not_stored():
    # The env's code is part of the key (a user's own Brax env can change without any version
    # changing); a class without a source file (e.g. defined in a notebook) keeps the program out.

    class Wrapper:
        def __init__(self, env):
            self.env = env

    def env_source(env):   # the env's part of the key; None: not stored
        traced = fingerprint.fingerprint(env, packages=program.env_packages(env))
        return traced.digest if traced.storable else None

    toy = make_env("toy_reach")
    assert env_source(toy) and env_source(Wrapper(toy)) != env_source(toy)
    unreadable = type("Unreadable", (), {"__module__": "defined_in_a_notebook"})()
    assert env_source(unreadable) is None and env_source(Wrapper(unreadable)) is None
