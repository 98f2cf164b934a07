"""Real asynchrony (`vaco-train --async`): measured ages, every segment taken once, the lag-profile
round trip, the synchronous handover equal to the fused trainer at C = 1, bad flags refused."""

import dataclasses
import json
import os
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest

from vaco_jax import Config, ConfigError, Trainer, io, policy
from vaco_jax.config import to_json_dict
from vaco_jax.actor_learner import lag_profile, run_async
from vaco_jax.commands import train as train_command
from vaco_jax.config import read_lag_profile, with_lag_profile
from vaco_jax.options import AsyncOptions, Cluster, Options, validate_async

from conftest import CACHE_DIR

# 6 iterations of 8 envs × 8 steps, two evaluations.
TINY = Config(env="toy_reach", algo="vaco", num_envs=8, unroll_length=8, num_epochs=2,
              num_minibatches=2, num_actors=1, episode_length=20, total_steps=8 * 8 * 6,
              num_evals=2, eval_envs=4, actor_hidden=(16, 16), critic_hidden=(16, 16))


def _run(tmp_path, name, config=TINY, **asynchrony):
    out = tmp_path / name
    summary = run_async(config, Options(out=str(out), progress=False),
                        AsyncOptions(asynchronous=True, **asynchrony), log=lambda line: None)
    return summary, io.read_jsonl(out / "batches.jsonl"), out


def _check_every_segment_taken_once(batches, config, summary):
    segments = [s for b in batches for s in b["segments"]]
    assert [b["iteration"] for b in batches] == list(range(config.num_iterations))
    assert all(len(b["segments"]) == config.num_actors for b in batches)
    assert len(segments) == summary["segments_made"] == config.num_iterations * config.num_actors
    ids = [(s["group"], s["index"]) for s in segments]
    assert len(set(ids)) == len(ids)   # no segment twice
    for group in range(config.num_actors):   # and none left out: each group's 0, 1, 2, ...
        assert sorted(i for g, i in ids if g == group) == list(range(
            summary["segments_per_group"][group]))
    for batch in batches:
        for s in batch["segments"]:
            assert s["age"] == batch["iteration"] - s["version"] >= 0
    return [s["age"] for s in segments]


SYNC = dataclasses.replace(TINY, num_seeds=2, seed=3)


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("async"), "sync", SYNC, async_handover="sync")


def test_sync_handover_with_one_actor_group_equals_the_fused_trainer_at_capacity_one(sync_run):
    config = SYNC
    summary, batches, out = sync_run
    ages = _check_every_segment_taken_once(batches, config, summary)
    assert set(ages) == {0} and summary["ages"]["counts"] == [config.num_iterations]
    # The fused trainer, C = 1, the same seeds: its iterations without the evaluations (which
    # draw from the fused run's key chain; the async run's draw from a chain of their own).
    trainer = Trainer(config)
    keys = np.stack([jax.random.PRNGKey(s) for s in (3, 4)])
    state = jax.jit(jax.vmap(trainer.init))(keys)
    iterate = jax.jit(jax.vmap(trainer.iteration))
    per_iteration = []
    for _ in range(config.num_iterations):
        state, metrics = iterate(state)
        per_iteration.append(metrics)
    saved = policy.load_policy(out, seed=0), policy.load_policy(out, seed=1)
    for i, loaded in enumerate(saved):
        chex.assert_trees_all_close(loaded.params,
                                    jax.tree.map(lambda x: x[i], state.params["actor"]),
                                    rtol=1e-4, atol=1e-5)
    rows = io.read_jsonl(out / "metrics.jsonl")
    for chunk, row in enumerate(rows):
        fused = per_iteration[chunk * config.iterations_per_eval:
                              (chunk + 1) * config.iterations_per_eval]
        for name in ("policy_loss", "value_loss", "behavior_tv", "approx_kl"):
            np.testing.assert_allclose(row[name], np.mean([m[name] for m in fused], axis=0),
                                       rtol=1e-4, atol=1e-6, err_msg=name)
        assert row["snapshot_age"] == [0.0, 0.0]


def test_one_group_and_a_queue_of_one_gives_ages_zero_or_one(tmp_path):
    summary, batches, _ = _run(tmp_path, "queued", async_queue=1)
    ages = _check_every_segment_taken_once(batches, TINY, summary)
    assert set(ages) <= {0, 1} and ages[0] == 0   # the first batch is made with version 0


def test_a_straggling_actor_group_makes_older_batches(tmp_path):
    # Group 0 acts at once, group 1 waits 0.25 s before acting: the learner learns on group 0's
    # segments meanwhile, so group 1's are several updates old when taken.
    config = dataclasses.replace(TINY, num_actors=2, total_steps=8 * 8 * 16, num_evals=1)
    summary, batches, out = _run(tmp_path, "straggler", config, async_queue=4,
                                 async_actor_delay=(0.0, 0.25), async_delay_distribution="fixed")
    _check_every_segment_taken_once(batches, config, summary)
    by_group = {g: [s["age"] for b in batches for s in b["segments"] if s["group"] == g]
                for g in (0, 1)}
    assert max(by_group[1]) >= 2 and np.mean(by_group[1]) > np.mean(by_group[0])
    # The measured histogram is a lag profile the fused trainer replays.
    profile = read_lag_profile(out / "lag_profile.json")
    ages = [s["age"] for b in batches for s in b["segments"]]
    assert abs(sum(profile) - 1.0) < 1e-9 and len(profile) == max(ages) + 1
    assert profile == pytest.approx(np.bincount(ages) / len(ages))
    assert profile == pytest.approx(lag_profile(ages))
    replay = with_lag_profile(dataclasses.replace(TINY, num_actors=2, num_evals=1), profile)
    assert replay.capacity == len(profile) and replay.snapshot_sampling == "profile"
    _, metrics = jax.jit(Trainer(replay).train)(jax.random.PRNGKey(0))
    realised = [float(metrics[f"snapshot_age_hist_{k}"][0]) for k in range(len(profile))]
    assert sum(realised) == pytest.approx(1.0)
    assert all(r == 0 for r, p in zip(realised, profile) if p == 0)   # never an age it lacks
    # The command line reads the file too.
    command = train_command.parse(["--env", "toy_reach", "--lag-profile",
                                   str(out / "lag_profile.json")])
    assert command.config.lag_profile == profile
    assert "vaco-train --async" in json.loads((out / "lag_profile.json").read_text())["description"]


@pytest.mark.parametrize("argv, field", [
    (["--async", "--capacity", "4"], "capacity"),
    (["--async", "--resume", "runs/x"], "resume"),
    (["--async", "--async-queue", "0"], "async_queue"),
    (["--async", "--async-handover", "sync", "--async-queue", "2"], "async_queue"),
    (["--async", "--async-actor-delay", "-1"], "async_actor_delay"),
    (["--async", "--log-every", "2"], "log_every"),
    (["--async-queue", "4"], "async_queue"),   # an --async-* flag without --async
])
def test_bad_async_flags_fail_early_naming_the_flag(argv, field, capsys):
    assert train_command.main(["--env", "toy_reach", *argv]) == 2
    assert f"`{field}`" in capsys.readouterr().err


def test_actor_devices_beyond_the_machine_are_refused_before_compiling(tmp_path):
    with pytest.raises(ConfigError, match="async_actor_devices"):
        run_async(TINY, Options(out=str(tmp_path / "x"), progress=False),
                  AsyncOptions(asynchronous=True, async_actor_devices=(0, 99)))
    assert not (tmp_path / "x").exists()
    validate_async(AsyncOptions(asynchronous=True), TINY, Options(), Cluster())   # accepted


def test_actors_on_one_device_and_the_learner_on_another_compute_the_same(sync_run, tmp_path):
    # Two host devices (a process of its own: XLA reads the flag at start-up); the synchronous
    # handover makes the run deterministic, so it must equal the one-device run.
    _, _, one_device = sync_run
    (tmp_path / "config.json").write_text(json.dumps({"config": to_json_dict(SYNC)}))
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_COMPILATION_CACHE_DIR=CACHE_DIR)
    done = subprocess.run(
        [sys.executable, "-m", "vaco_jax.commands.train", "--config", str(tmp_path / "config.json"),
         "--async", "--async-handover", "sync", "--async-actor-devices", "0",
         "--async-learner-device", "1", "--out", str(tmp_path / "run"), "--no-progress"],
        capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "learner on TFRT_CPU_1" in summary["devices"] and "actors on TFRT_CPU_0" in summary["devices"]
    for seed in (0, 1):
        chex.assert_trees_all_close(policy.load_policy(tmp_path / "run", seed=seed).params,
                                    policy.load_policy(one_device, seed=seed).params,
                                    rtol=1e-5, atol=1e-6)
