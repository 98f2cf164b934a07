"""vaco_jax.loggers: several backends at once; the LLM experiment's logged runs (no compilation:
training is replaced by a stub)."""

import time

import numpy as np
import pytest

from vaco_jax import ConfigError, loggers
from vaco_jax.llm import experiment
from vaco_jax.llm.config import preset
from vaco_jax.options import LoggerOptions, validate_logging
from vaco_jax.commands.train import parse

TINY = preset("tiny")


def stub_rows(config, n, objectives, params, train_set, test_set, log=print, compiler_options=None,
              program=None, runs_per_call=0):
    """What `train_one_n` returns for 4 iterations evaluated after the 2nd and the 4th."""
    return [{"n": n, "objective": o, "seed": seed, "eval_iterations": [2, 4],
             "eval_accuracy": [0.4, 0.5 + seed], "final_accuracy": 0.5 + seed,
             "eval_sampled_accuracy": [0.3, 0.4], "final_sampled_accuracy": 0.4,
             "train_greedy_accuracy": [0.5, 0.6], "final_train_greedy_accuracy": 0.6,
             "reward": np.array([0.1, 0.2, 0.3, 0.4]) + seed,
             "clip_fraction_mean": np.array([0.0, 0.1, 0.2, 0.3]),
             "max_ratio_max": np.array([1.0, 1.1, float("nan"), 1.3]),
             "filtered_fraction_mean": np.zeros(4), "tv_estimate_mean": np.full(4, 0.01),
             "tv_estimate_max": np.full(4, 0.02), "approx_kl_mean": np.zeros(4),
             "tv_estimate_by_step": np.zeros(4 * n), "compile_seconds": 1.0, "run_seconds": 2.0}
            for o in objectives for seed in range(config.grpo.num_seeds)]


@pytest.fixture
def stubbed_training(monkeypatch, stub_warm_start):
    monkeypatch.setattr(experiment, "train_one_n", stub_rows)
    stub_warm_start(TINY.model)


def test_the_llm_experiment_logs_one_run_per_n_objective_and_seed(stubbed_training, tmp_path):
    from tensorboard.backend.event_processing import event_accumulator

    out = tmp_path / "llm"
    run = experiment.Experiment(TINY, ns=(1, 4), out=str(out), throughput=False, plot=False,
                                logging=LoggerOptions(logger=("tensorboard",)))
    experiment.run(run, log=lambda _: None)
    root = out / "tensorboard"
    assert sorted(str(p.relative_to(root)) for p in root.glob("N=*/*/seed=*")) == [
        f"N={n}/{o}/seed={s}" for n in (1, 4) for o in ("ppo_clip", "vaco") for s in (0, 1)]
    events = event_accumulator.EventAccumulator(str(root / "N=4" / "vaco" / "seed=1"))
    events.Reload()
    # Per-iteration metrics at each generated batch, evaluations at theirs, a NaN left out.
    assert [(e.step, e.value) for e in events.Scalars("reward")] == [
        (1, pytest.approx(1.1)), (2, pytest.approx(1.2)), (3, pytest.approx(1.3)),
        (4, pytest.approx(1.4))]
    assert [e.step for e in events.Scalars("max_ratio_max")] == [1, 2, 4]
    assert [(e.step, e.value) for e in events.Scalars("eval_accuracy")] == [
        (2, pytest.approx(0.4)), (4, pytest.approx(1.5))]
    assert {"train_greedy_accuracy", "eval_sampled_accuracy", "tv_estimate_max"} <= set(
        events.Tags()["scalars"])
    assert not {"tv_estimate_by_step", "eval_iterations", "compile_seconds"} & set(
        events.Tags()["scalars"])


def test_wandb_offline_records_the_group_and_the_coordinates_as_tags(stubbed_training, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "llm_run"
    options = LoggerOptions(logger=("tensorboard", "wandb"), wandb_tags=("pilot",),
                            wandb_project="test")
    run = experiment.Experiment(TINY, ns=(2,), objectives=("vaco",), out=str(out),
                                throughput=False, plot=False, logging=options)
    experiment.run(run, log=lambda _: None)
    ids = loggers.wandb_run_id(out, "N=2/vaco/seed=0"), loggers.wandb_run_id(out, "N=2/vaco/seed=1")
    records = [next((out / "wandb").glob(f"offline-run-*-{i}/run-{i}.wandb")) for i in ids]
    # What `wandb sync` uploads; W&B's service process may write it after `finish` returns.
    wanted = [b"llm_run", b"pilot", b"n:2", b"objective:vaco", b"seed:1", b"eval_accuracy"]
    deadline = time.monotonic() + 60
    while (not all(w in records[1].read_bytes() for w in wanted)
           and time.monotonic() < deadline):
        time.sleep(0.5)
    for want in wanted:   # the group (the output directory's name), the tags, a metric
        assert want in records[1].read_bytes(), want
    assert b"seed:0" in records[0].read_bytes()
    # Both backends at once: TensorBoard got the same runs.
    assert (out / "tensorboard" / "N=2" / "vaco" / "seed=1").is_dir()
    # The same logged run again (a resumed experiment) keeps its W&B id.
    assert loggers.wandb_run_id(out, "N=2/vaco/seed=0") == ids[0] != ids[1]


def test_logger_flags_take_several_backends_and_the_wandb_options():
    argv = ["--logger", "tensorboard", "wandb", "--wandb-entity", "lab", "--wandb-project", "p",
            "--wandb-group", "g", "--wandb-tags", "a", "b", "--wandb-mode", "offline"]
    assert parse(argv).options.logging == LoggerOptions(
        logger=("tensorboard", "wandb"), wandb_entity="lab", wandb_project="p", wandb_group="g",
        wandb_tags=("a", "b"), wandb_mode="offline")
    assert parse([]).options.logging == LoggerOptions()
    from vaco_jax.commands import sweep as sweep_command
    import tyro

    args = tyro.cli(sweep_command.Args, args=argv)
    assert args.logging == parse(argv).options.logging
    # No backend: nothing is made, opened or imported.
    assert loggers.make(LoggerOptions(), "unused", {}) is None


@pytest.mark.parametrize("options, message", [
    (LoggerOptions(logger="wandb"), r"`logger` = 'wandb' is invalid: must be a tuple of strings"),
    (LoggerOptions(logger=("mlflow",)), r"`logger` = 'mlflow' is invalid: allowed values are"),
    (LoggerOptions(wandb_mode="on"), r"`wandb_mode` = 'on' is invalid: allowed values are"),
    (LoggerOptions(wandb_tags=("x" * 65,)), r"`wandb_tags` = 'x+' is invalid: each tag"),
])
def test_bad_logger_options_are_refused_naming_the_field(options, message):
    with pytest.raises(ConfigError, match=message):
        validate_logging(options)
    with pytest.raises(ConfigError, match=message):
        experiment.run(experiment.Experiment(TINY, ns=(1, 4), logging=options),
                       log=lambda _: None)
