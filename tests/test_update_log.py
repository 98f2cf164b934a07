"""--log-every: rows of the training updates' metrics in updates.jsonl and the loggers, which change
nothing the run computes, and resume without doubled or lost rows."""

import dataclasses
import shutil

import chex
import jax
import numpy as np
import pytest

from vaco_jax import Config, ConfigError, Options, cache, io, loggers, program, update_log
from vaco_jax.checkpoint import RunCheckpoints
from vaco_jax.commands.train import main
from vaco_jax.driver import build_program, init_state, run

# 2 seeds, 3 chunks of 4 iterations; rows of 2 iterations: 6 rows.
SMALL = Config(env="toy_reach", algo="vaco", num_seeds=2, num_envs=8, unroll_length=8,
               num_epochs=2, num_minibatches=2, num_actors=2, episode_length=20, eval_envs=4,
               actor_hidden=(16, 16), critic_hidden=(16, 16), capacity=3, max_capacity=4,
               num_evals=3, total_steps=8 * 8 * 4 * 3)
LOG_EVERY = 2
OPTIONS = Options(progress=False, checkpoint_budget=1.0)
# Each iteration's mean over its minibatch steps, or its own value; the row averages them.
MEANS = ["policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "filtered_fraction",
         "intervened_fraction", "tv_estimate", "tv_forward", "tv_backward", "grad_norm",
         "snapshot_age", "update_age_mean"]


def options(**changes) -> Options:
    return dataclasses.replace(OPTIONS, **changes)


class Recorder:
    """A logger that keeps every call."""

    def __init__(self):
        self.calls = []

    def log(self, step, scalars):
        self.calls.append((step, scalars))

    def close(self):
        pass


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same run without and with --log-every, the second also logged."""
    root = tmp_path_factory.mktemp("updates")
    run(SMALL, options(out=str(root / "off")))
    recorder = Recorder()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loggers, "make", lambda *args, **kwargs: recorder)
        run(SMALL, options(out=str(root / "on"), log_every=LOG_EVERY))
    return root / "off", root / "on", recorder


def final_checkpoint(out):
    """The run's newest checkpoint (its state and metadata)."""
    checkpoints = RunCheckpoints(out, create=False)
    restored = checkpoints.restore_latest(build_program(SMALL).abstract_state, SMALL)
    checkpoints.close()
    return restored


def test_off_the_learner_program_is_the_trainers_own_and_on_it_computes_the_same():
    # Off, the CLI's learner program is `jit(vmap(Trainer.learn_chunk))` as it always was (two
    # outputs); on, it returns every iteration's metrics besides, and the state and chunk metrics
    # are bit for bit the same.
    off, on = build_program(SMALL), build_program(SMALL, per_iteration=True)
    state = init_state(off, SMALL)
    reference = jax.jit(jax.vmap(off.trainer.learn_chunk))(state)
    compiled_off, compiled_on = off.compiled_chunk()[0], on.compiled_chunk()[0]
    assert len(compiled_off.learn.out_info) == 2 and len(compiled_on.learn.out_info) == 3
    chex.assert_trees_all_equal(compiled_off.learn(state), reference)
    state_on, metrics_on, per_iteration = compiled_on.learn(state)
    chex.assert_trees_all_equal((state_on, metrics_on), reference)
    assert per_iteration["policy_loss"].shape == (SMALL.num_seeds, SMALL.iterations_per_eval)
    # Every iteration's own values: the chunk's metric is their mean.
    np.testing.assert_allclose(np.mean(per_iteration["tv_estimate"], axis=1),
                               reference[1]["tv_estimate"], rtol=1e-6)


def test_the_program_store_keeps_the_program_with_and_without_the_iterations_apart(tmp_path,
                                                                                  monkeypatch):
    keys, program_key = [], cache.program_key
    monkeypatch.setattr(cache, "program_key", lambda *parts: keys.append(program_key(*parts))
                        or keys[-1])
    store = cache.ProgramStore(tmp_path)   # empty: each is built (not compiled) and keyed
    for per_iteration in (False, True):
        program.TrainProgram.build(SMALL, SMALL.num_seeds, store=store, per_iteration=per_iteration)
    assert len(keys) == 2 and keys[0] != keys[1]


def test_logging_updates_changes_no_result(runs):
    off, on, _ = runs
    assert io.read_jsonl(on / "metrics.jsonl") == io.read_jsonl(off / "metrics.jsonl")
    with_rows, without = final_checkpoint(on), final_checkpoint(off)
    chex.assert_trees_all_equal(with_rows.state, without.state)
    assert with_rows.meta["sha256"] == without.meta["sha256"]
    assert not (off / update_log.FILE).exists()


def test_a_row_every_log_every_iterations_with_every_metric_per_seed(runs):
    _, on, _ = runs
    rows = io.read_jsonl(on / update_log.FILE)
    assert [row["iteration"] for row in rows] == [2, 4, 6, 8, 10, 12]
    assert [row["step"] for row in rows] == [i * SMALL.batch_size for i in (2, 4, 6, 8, 10, 12)]
    evaluation = io.read_jsonl(on / "metrics.jsonl")[0]
    expected = (set(evaluation) - {"eval_return", "env_steps"}) | {"steps_per_second"}
    for row in rows:
        assert set(row) == expected
        assert row["source"] == evaluation["source"] and row["steps_per_second"] > 0
        for name in MEANS + ["nonfinite_episodes"]:
            assert len(row[name]) == SMALL.num_seeds and np.all(np.isfinite(row[name])), name
    # Episodes of 20 steps, rows of 16 steps per env: a row in which none ended has NaN (null).
    returns = [row["train_return"] for row in rows]
    assert [r[0] is None for r in returns] == [True, False, False, False, False, True]
    assert all(np.isfinite(r[1]) for r in returns[1:5])


def test_a_chunks_rows_average_to_its_evaluation_row(runs):
    _, on, _ = runs
    rows, evaluations = io.read_jsonl(on / update_log.FILE), io.read_jsonl(on / "metrics.jsonl")
    per_chunk = SMALL.iterations_per_eval // LOG_EVERY
    for chunk, evaluation in enumerate(evaluations):
        chunk_rows = rows[chunk * per_chunk:(chunk + 1) * per_chunk]
        for name in MEANS:
            np.testing.assert_allclose(np.mean([r[name] for r in chunk_rows], axis=0),
                                       evaluation[name], rtol=1e-5, err_msg=name)
        np.testing.assert_array_equal(np.sum([r["nonfinite_episodes"] for r in chunk_rows], axis=0),
                                      evaluation["nonfinite_episodes"])


def test_the_loggers_get_the_rows_once_per_step(runs):
    _, on, recorder = runs
    rows, evaluations = io.read_jsonl(on / update_log.FILE), io.read_jsonl(on / "metrics.jsonl")
    steps = [step for step, _ in recorder.calls]
    # W&B keeps only the first call at a step: the evaluation shares its step's call.
    assert steps == [row["step"] for row in rows] == sorted(set(steps))
    logged = dict(recorder.calls)
    for row in rows:
        scalars = logged[row["step"]]
        assert scalars["updates/policy_loss/seed_1"] == pytest.approx(row["policy_loss"][1])
        assert scalars["updates/grad_norm/mean"] == pytest.approx(np.mean(row["grad_norm"]))
        assert scalars["updates/steps_per_second"] == row["steps_per_second"]
    for evaluation in evaluations:
        assert logged[evaluation["step"]]["eval_return/mean"] == pytest.approx(
            np.mean(evaluation["eval_return"]))


def test_a_resumed_run_neither_doubles_nor_loses_rows(runs, tmp_path):
    _, on, _ = runs
    out = tmp_path / "resumed"
    run(SMALL, options(out=str(out), log_every=LOG_EVERY), stop_after=2)
    # As if chunk 2's checkpoint had not been due (its rows are written all the same) and the
    # run was killed while writing a row.
    shutil.rmtree(out / "checkpoints" / "2")
    with open(out / update_log.FILE, "a") as f:
        f.write('{"step": 1024, "iter')
    assert [r["iteration"] for r in io.read_jsonl(out / update_log.FILE)] == [2, 4, 6, 8]
    run(SMALL, options(resume=str(out), log_every=LOG_EVERY))
    measured = lambda rows: [{k: v for k, v in r.items() if k != "steps_per_second"} for r in rows]
    assert measured(io.read_jsonl(out / update_log.FILE)) == measured(
        io.read_jsonl(on / update_log.FILE))
    assert len((out / update_log.FILE).read_text().splitlines()) == 6


def test_rows_average_their_iterations_and_leave_out_a_diverged_seed():
    per_iteration = {"policy_loss": np.array([[1., 2., 3., 4.], [5., 6., 7., np.inf]]),
                     "nonfinite_episodes": np.array([[0., 1., 2., 0.], [0., 0., 0., 0.]]),
                     "episodes": np.array([[0., 0., 1., 3.], [1., 0., 0., 0.]]),
                     "episode_return_sum": np.array([[0., 0., 2., 6.], [4., 0., 0., 0.]])}
    rows = update_log.rows(per_iteration, log_every=2, first_iteration=8, batch_size=10,
                           diverged_at=np.array([-1, 11]), source="abc", steps_per_second=5.0)
    assert [(r["iteration"], r["step"]) for r in rows] == [(10, 100), (12, 120)]
    # Seed 1 diverged in the chunk's last iteration (the run's 12th, 0-based 11): its last row is NaN.
    np.testing.assert_array_equal(rows[0]["policy_loss"], [1.5, 5.5])
    np.testing.assert_array_equal(rows[1]["policy_loss"], [3.5, np.nan])
    np.testing.assert_array_equal([r["nonfinite_episodes"] for r in rows], [[1, 0], [2, np.nan]])
    # Returns of the episodes that ended in the row's iterations; none ended: NaN.
    np.testing.assert_array_equal([r["train_return"] for r in rows], [[np.nan, 4.0], [2.0, np.nan]])
    assert rows[0]["source"] == "abc" and rows[1]["steps_per_second"] == 5.0
    assert set(update_log.scalars(rows[1], [7, 8])) == {
        "updates/policy_loss/mean", "updates/policy_loss/seed_7", "updates/nonfinite_episodes/mean",
        "updates/nonfinite_episodes/seed_7", "updates/train_return/mean",
        "updates/train_return/seed_7", "updates/steps_per_second"}


@pytest.mark.parametrize("log_every,allowed", [
    (-1, "must be an integer >= 0"),
    (3, "must divide the run's 4 learner iterations per evaluation (total_steps // (num_envs * "
        "unroll_length) // num_evals): one of 1, 2, 4 (0 = off)"),
])
def test_a_bad_log_every_is_refused_before_anything_runs(log_every, allowed, tmp_path, capsys):
    with pytest.raises(ConfigError) as error:
        run(SMALL, options(out=str(tmp_path / "run"), log_every=log_every))
    assert f"option `log_every` = {log_every} is invalid: {allowed}" in str(error.value)
    assert not (tmp_path / "run").exists()
    args = ["--env", "toy_reach", "--num-envs", "8", "--unroll-length", "8", "--num-evals", "3",
            "--total-steps", str(SMALL.total_steps), "--num-minibatches", "2", "--num-actors", "2",
            "--out", str(tmp_path / "cli"), "--log-every", str(log_every)]
    assert main(args) == 2
    assert f"option `log_every` = {log_every} is invalid" in capsys.readouterr().err
