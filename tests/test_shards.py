"""Many processes fill one sweep directory together (`--shard i/n`, SLURM job arrays, or any
processes sharing a file system): no row lost or doubled, no cell run twice."""

import collections
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vaco_jax import io
from vaco_jax.errors import ConfigError
from vaco_jax.study import presets, sweep

ROOT = Path(__file__).resolve().parent.parent


def test_shards_partition_the_plan_and_are_validated():
    assert sweep.parse_shard("") is None
    assert sweep.parse_shard("1/3") == (1, 3)
    for bad in ("3/3", "-1/2", "1", "a/b", "0/0"):
        with pytest.raises(ConfigError, match="option `shard`"):
            sweep.parse_shard(bad)
    assert sweep.shard_from_env({}) is None
    assert sweep.shard_from_env({"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "4",
                                 "SLURM_ARRAY_TASK_COUNT": "3"}) == (1, 3)
    cells = sweep.plan(presets.PRESETS["lag-tiny"])
    taken = [c.cell_id for i in range(3) for c in cells[i::3]]
    assert sorted(taken) == sorted(c.cell_id for c in cells) and len(set(taken)) == len(cells)


def test_two_concurrent_processes_fill_one_directory_without_losing_or_doubling_rows(tmp_path):
    """Two shards and a third process that takes every cell, all at once on one directory."""
    out = tmp_path / "sweep"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "experiments.mujoco_lag_sweep", "--preset", "lag-tiny",
               "--out", str(out), "--no-progress"]
    procs = [subprocess.Popen(command + extra, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for extra in (["--shard", "0/2"], ["--shard", "1/2"], [])]
    logs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], logs

    cells = sweep.plan(presets.PRESETS["lag-tiny"])
    records = io.read_jsonl(out / sweep.CELLS)
    ran = collections.Counter(r["cell"] for r in records)
    assert ran == collections.Counter(c.cell_id for c in cells)     # every cell once, none twice
    rows = io.read_jsonl(out / sweep.RESULTS)
    keys = collections.Counter((r["cell"], r["capacity"], r["seed"], r["eval_index"]) for r in rows)
    expected = {(c.cell_id, run.capacity, run.seed, i) for c in cells for run in c.runs
                for i in range(c.config.num_evals)}
    assert set(keys) == expected and max(keys.values()) == 1        # no row lost or doubled
    # A process that found a cell finished or held by another says so and moves on.
    assert "finished or running in another process" in "".join(logs) or len(records) == len(cells)
    # Run again: nothing left to do, nothing rewritten.
    again = subprocess.run(command + ["--shard", "1/2"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0 and "running 0" in again.stdout, again.stdout + again.stderr
    assert io.read_jsonl(out / sweep.RESULTS) == rows


def test_the_committed_lag_study_keeps_its_cell_fingerprints():
    """Planning the lag-cpu preset again gives every committed cell its recorded fingerprint, so
    the study resumes (and later Config fields at their defaults change no fingerprint)."""
    planned = {c.cell_id: c.fingerprint() for c in sweep.plan(presets.preset("lag-cpu"))}
    recorded = [r for path in sorted((ROOT / "results" / "lag-cpu").glob("*/cells.jsonl"))
                for r in io.read_jsonl(path)]
    assert len(recorded) == 60
    assert {r["cell"]: r["fingerprint"] for r in recorded} == \
        {r["cell"]: planned[r["cell"]] for r in recorded}


def test_a_variant_sweeps_the_learning_rate_inside_its_program():
    cells = sweep.plan(presets.preset("forward-cpu"))
    k4 = next(c for c in cells if c.variant == "K=4,oldest" and c.algo == "ppo_clip")
    assert k4.config.num_epochs == 4 and k4.config.snapshot_sampling == "oldest"
    assert {dict(r.hparams)["learning_rate"] for r in k4.runs} == {3e-4, 1e-3, 3e-3}
    assert len(k4.runs) == 3 * 3 * 10   # capacities × learning rates × seeds
    run = k4.runs[-1]
    assert run.config(k4.config).learning_rate == dict(run.hparams)["learning_rate"]
    k32 = next(c for c in cells if c.variant == "K=32,oldest" and c.algo == "vaco")
    assert {dict(r.hparams)["learning_rate"] for r in k32.runs} == {3e-4, 3e-3}
