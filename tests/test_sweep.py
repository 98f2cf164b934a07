"""vaco_jax.study.sweep and vaco_jax.study.references: tidy table, vmapped cells, resume, references."""

import dataclasses
import gzip
import json
import re
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from brax.envs.base import Env, State

from vaco_jax import envs, evaluation, io, networks
from vaco_jax.study import presets, references, sweep
from vaco_jax.config import Config, ConfigError

TINY = presets.PRESETS["tiny"]
ALGOS = ("vaco", "ppo_clip")


@pytest.fixture(scope="module")
def cells():
    return sweep.plan(TINY, ["main"], algos=ALGOS)


@pytest.fixture(scope="module")
def full_sweep(cells, tmp_path_factory):
    """The tiny sweep run once, uninterrupted."""
    out = tmp_path_factory.mktemp("full")
    ran = sweep.run_sweep(cells, out, preset=TINY, log=lambda _: None)
    return out, ran


def test_plan_covers_the_grid_in_one_program_per_env_and_algorithm():
    cells = sweep.plan(presets.PRESETS["cpu"], ["main"])
    assert [(c.env, c.algo) for c in cells] == [
        (env, algo) for env in ("inverted_double_pendulum", "hopper") for algo in presets.MAIN_ALGOS]
    for cell in cells:
        assert len(cell.runs) == 3 * 5 and cell.config.slots == 16 and cell.config.num_evals == 10
        assert {r.capacity for r in cell.runs} == {1, 4, 16} and {r.seed for r in cell.runs} == set(range(5))
    delta = sweep.plan(presets.PRESETS["cpu"], ["delta"])
    assert sorted({r.delta for r in delta[0].runs}) == [0.05, 0.1, 0.4]     # 0.2 comes from main
    ablations = sweep.plan(presets.PRESETS["paper"], ["ablations"])
    assert {(c.algo, c.config.tv_reference, c.config.filter_mode) for c in ablations} == {
        ("gae+tv_filter", "behavior", "batch"), ("vtrace_once+ppo_clip", "behavior", "batch"),
        ("vaco", "learner", "batch"), ("vaco", "behavior", "per_sample")}
    paper = sweep.plan(presets.PRESETS["paper"])
    assert len(paper) == 25 and paper[0].config.env_steps == 100_000_000 // (256 * 32 * 40) * 256 * 32 * 40


def test_bad_plans_fail_before_compiling():
    with pytest.raises(ConfigError, match="unknown study"):
        sweep.plan(TINY, ["nope"])
    with pytest.raises(ConfigError, match="`capacity` = 0"):
        sweep.plan(TINY.with_overrides(capacities=(0, 2)))
    with pytest.raises(ConfigError, match="plan is empty"):
        sweep.plan(TINY, ["main"], algos=["gae+tv_filter"])
    split = sweep.plan(TINY.with_overrides(runs_per_call=4), ["main"], algos=["vaco"])
    assert [len(c.runs) for c in split] == [4, 2] and split[1].cell_id.endswith("#1")


def test_tidy_table(full_sweep, cells):
    out, ran = full_sweep
    assert ran == [c.cell_id for c in cells]
    table = sweep.load_results(out)
    config = TINY.env_base("toy_reach")
    assert len(table) == len(cells) * 2 * 3 * config.num_evals
    assert not table.duplicated(["algo", "capacity", "seed", "eval_index"]).any()
    last = table[table["eval_index"] == config.num_evals - 1]
    assert set(last["step"]) == {config.env_steps} and set(table["budget"]) == {config.env_steps}
    assert np.isfinite(table["eval_return"]).all()
    vaco, ppo = table[table["algo"] == "vaco"], table[table["algo"] == "ppo_clip"]
    assert vaco["filtered_fraction"].between(0, 1).all() and ppo["filtered_fraction"].isna().all()
    # The realised lag follows the capacity: none at C = 1, up to C − 1 otherwise.
    assert (table[table["capacity"] == 1]["snapshot_age_max"] == 0).all()
    assert table[table["capacity"] == 4]["snapshot_age_max"].between(1, 3).all()
    assert (table[table["capacity"] == 1]["behavior_tv"] < 1e-5).all()
    # The lag diagnostics (docs/diagnostics.md) are columns of the table too.
    steps = config.num_epochs * config.num_minibatches
    assert (table[table["capacity"] == 1]["update_age_max"] == steps - 1).all()
    assert (table["tv_backward"] == table["behavior_tv"]).all() and (table["tv_forward"] >= 0).all()
    assert (vaco["intervened_fraction"] == vaco["filtered_fraction"]).all()
    # PPO's intervened samples are those whose gradient the clip took away: a subset of the
    # samples outside the band (`clip_fraction`)
    assert (ppo["intervened_fraction"] <= ppo["clip_fraction"] + 1e-7).all()
    assert (ppo["intervened_fraction"] > 0).any()
    record = sweep.load_cells(out).iloc[0]
    assert record["runs"] == 6 and record["sps"] > 0 and record["fingerprint"] == cells[0].fingerprint()
    plan = json.loads((out / sweep.PLAN).read_text())
    assert plan["cells"][cells[0].cell_id]["config"]["max_capacity"] == 4 and "versions" in plan


def test_each_run_equals_a_single_run_with_its_capacity_and_seed(full_sweep, cells):
    """A run trained in the cell's vmapped batch and the same run alone (a batch of one) are the
    same computation, but XLA may order a batch's float arithmetic differently (it does on some
    CPUs), and training amplifies rounding ~1000× per evaluation chunk. So every metric is
    compared closely after the first chunk, where rounding has not grown: a wrong seed, capacity
    or δ, or runs leaking into each other, differ there by far more than the tolerance."""
    out, _ = full_sweep
    table = sweep.load_results(out)
    cell = cells[0]
    alone = dataclasses.replace(cell, runs=(sweep.Run(4, 0.2, 2),))
    rows, _ = sweep.run_cell(alone)
    assert [r["eval_index"] for r in rows] == list(range(cell.config.num_evals))
    first = table[(table["algo"] == cell.algo) & (table["eval_index"] == 0)].set_index(["capacity", "seed"])
    twin, others = first.loc[(4, 2)], first.drop(index=[(4, 2)])
    metrics = [k for k, v in rows[0].items() if isinstance(v, float) and k != "delta"]
    assert {"eval_return", "behavior_tv", "filtered_fraction", "policy_loss"} <= set(metrics)
    for key in metrics:
        np.testing.assert_allclose(rows[0][key], twin[key], rtol=1e-4, atol=1e-6, err_msg=key)
    # The comparison tells runs apart: every other run of the cell is 100× the tolerance away.
    for index, other in others.iterrows():
        assert not np.allclose(other[metrics].astype(float), twin[metrics].astype(float), rtol=1e-2), index
    assert all(np.isfinite(r["eval_return"]) and not r["diverged"] for r in rows)


def test_interrupted_sweep_resumes_without_redoing_finished_cells(full_sweep, cells, tmp_path):
    full_out, _ = full_sweep
    assert sweep.run_sweep(cells, tmp_path, max_cells=1, log=lambda _: None) == [cells[0].cell_id]
    first = (tmp_path / sweep.RESULTS).read_text()
    # A crash in the middle of the second cell: some of its rows and a torn line, no record.
    partial = [dict(r, cell=cells[1].cell_id, eval_return=-1e9) for r in io.read_jsonl(tmp_path / sweep.RESULTS)[:3]]
    io.append_jsonl(tmp_path / sweep.RESULTS, partial)
    with open(tmp_path / sweep.RESULTS, "a") as f:
        f.write('{"cell": "main/toy_reach/ppo_cl')
    with pytest.warns(UserWarning, match="skipped 1 unreadable line"):    # the torn line
        assert len(sweep.load_results(tmp_path)) == len(first.splitlines())   # partial rows not loaded
        assert sweep.run_sweep(cells, tmp_path, log=lambda _: None) == [cells[1].cell_id]
    assert (tmp_path / sweep.RESULTS).read_text().startswith(first)      # finished cell untouched
    pd.testing.assert_frame_equal(sweep.load_results(tmp_path), sweep.load_results(full_out))
    assert sweep.run_sweep(cells, tmp_path, log=lambda _: None) == []    # nothing left to do


def test_a_compacted_sweep_resumes_without_redoing_finished_cells(full_sweep, cells, tmp_path):
    from vaco_jax.commands import sweep as sweep_command

    full_out, _ = full_sweep
    # The sweep stopped after its first cell, then compacted.
    first = [r for r in io.read_rows(full_out / sweep.RESULTS) if r["cell"] == cells[0].cell_id]
    io.append_jsonl(tmp_path / sweep.RESULTS, first)
    io.append_jsonl(tmp_path / sweep.CELLS, io.read_rows(full_out / sweep.CELLS)[:1])
    (tmp_path / sweep.PLAN).write_bytes((full_out / sweep.PLAN).read_bytes())
    assert sweep.compact(tmp_path) == len(first) and not (tmp_path / sweep.RESULTS).exists()
    packed = io.compact_path(tmp_path / sweep.RESULTS).read_bytes()

    assert sweep.run_sweep(cells, tmp_path, log=lambda _: None) == [cells[1].cell_id]
    assert io.compact_path(tmp_path / sweep.RESULTS).read_bytes() == packed   # left as it was
    pd.testing.assert_frame_equal(sweep.load_results(tmp_path), sweep.load_results(full_out))
    assert sweep_command.main(["--compact", str(tmp_path)]) == 0
    assert not (tmp_path / sweep.RESULTS).exists()
    pd.testing.assert_frame_equal(sweep.load_results(tmp_path), sweep.load_results(full_out))
    assert sweep.run_sweep(cells, tmp_path, log=lambda _: None) == []    # nothing left to do



def test_compact_folds_every_gzip_table_an_earlier_version_wrote_into_parquet(tmp_path, capsys):
    from vaco_jax.commands import sweep as sweep_command

    rows = [{"cell": "c", "seed": seed, "eval_return": 0.5 * seed} for seed in range(3)]
    for table in ("llm", "bench/runs"):   # an LLM sweep's table; a sweep's, under its lock
        (tmp_path / table).mkdir(parents=True)
        (tmp_path / table / "results.jsonl.gz").write_bytes(gzip.compress(io._jsonl(rows).encode()))
    io.append_jsonl(tmp_path / "bench" / "runs" / sweep.CELLS, [{"cell": "c"}])
    plan = {"preset": None, "cells": {"c": {"runs": [{"seed": s} for s in range(3)]}}}
    io.write_json_atomic(tmp_path / "bench" / "runs" / sweep.PLAN, plan)   # indented, as before
    indented = (tmp_path / "bench" / "runs" / sweep.PLAN).stat().st_size
    assert sweep_command.main(["--compact", str(tmp_path)]) == 0
    # The plan is the same JSON without whitespace.
    assert json.loads((tmp_path / "bench" / "runs" / sweep.PLAN).read_text()) == plan
    assert (tmp_path / "bench" / "runs" / sweep.PLAN).stat().st_size < indented / 2
    for table in ("llm", "bench/runs"):
        assert not (tmp_path / table / "results.jsonl.gz").exists()
        assert (tmp_path / table / "results.parquet").exists()
        assert io.read_rows(tmp_path / table / sweep.RESULTS) == rows
    assert capsys.readouterr().out.count("3 rows") == 2


def test_a_logged_cell_gives_each_run_its_own_tensorboard_run_and_changes_no_result(
        full_sweep, cells, tmp_path):
    from tensorboard.backend.event_processing import event_accumulator

    from vaco_jax.options import LoggerOptions

    cell = cells[0]
    lines = []
    assert sweep.run_sweep([cell], tmp_path, log=lines.append,
                           logging=LoggerOptions(logger=("tensorboard",))) == [cell.cell_id]
    # Batch logs: a line when the cell's programs start compiling and one when they are ready.
    label = f"[1/1] {cell.cell_id}: "
    assert lines[1:3] == [
        f"{label}compiling the learner and evaluation programs for 6 runs of vaco on toy_reach "
        f"(first run of this config: seconds to a minute on a CPU; later runs of the same config "
        f"load them from the cache)", lines[2]]
    # Not compiled again: reused from this process, or, when the program store beside JAX's
    # persistent cache already holds it (a second run of the suite on the same code), loaded.
    assert re.fullmatch(re.escape(label) + r"(reused the programs compiled earlier in this "
                                           r"process|loaded from the cache) in \d+\.\d s",
                        lines[2]), lines[2]
    table = sweep.load_results(tmp_path)
    reference = sweep.load_results(full_sweep[0])
    pd.testing.assert_frame_equal(table, reference[reference["cell"] == cell.cell_id]
                                  .reset_index(drop=True))
    # One TensorBoard run per (capacity, δ, seed), named by its coordinates under the cell's.
    root = tmp_path / "tensorboard" / "main" / "toy_reach" / "vaco" / "default"
    assert sorted(p.name for p in root.iterdir()) == sorted(
        f"C={r.capacity},delta=0.2,seed={r.seed}" for r in cell.runs)
    steps = [4096, 8192, 12288, 16384]
    for run in cell.runs:
        events = event_accumulator.EventAccumulator(
            str(root / f"C={run.capacity},delta=0.2,seed={run.seed}"))
        events.Reload()
        assert {"eval_return", "tv_estimate", "filtered_fraction", "snapshot_age", "behavior_tv",
                "diverged"} <= set(events.Tags()["scalars"])
        assert "config/text_summary" in events.Tags()["tensors"]
        rows = table[(table["capacity"] == run.capacity) & (table["seed"] == run.seed)]
        for tag in ("eval_return", "tv_estimate", "snapshot_age"):
            scalars = events.Scalars(tag)
            assert [e.step for e in scalars] == list(rows["step"]) == steps, tag
            np.testing.assert_allclose([e.value for e in scalars], rows[tag], rtol=1e-6)


def test_a_changed_config_is_never_mixed_into_finished_results(full_sweep):
    out, _ = full_sweep
    changed = sweep.plan(TINY.with_overrides(learning_rate=3e-3), ["main"], algos=ALGOS)
    with pytest.raises(sweep.SweepError, match="different config"):
        sweep.run_sweep(changed, out, log=lambda _: None)


class _BlowsUpAfterTheEnd(Env):
    """Reward 1 per step, terminates at step 3; stepped on after that, its 'physics' is NaN."""

    def reset(self, rng):
        zero = jnp.zeros(())
        return State(zero, jnp.zeros(1), zero, zero, {}, {})

    def step(self, state, action):
        t = state.pipeline_state + 1.0
        return state.replace(pipeline_state=t, obs=jnp.full(1, t),
                             reward=jnp.where(t > 3, jnp.nan, 1.0), done=(t >= 3).astype(jnp.float32))

    observation_size, action_size, backend = 1, 1, "jax"


def test_evaluation_ignores_steps_after_the_end():
    env = _BlowsUpAfterTheEnd()
    config = Config(env="toy_bandit")
    actor, _ = networks.make_networks(config, 1)
    params = networks.init_params(jax.random.PRNGKey(0), config, 1, 1)["actor"]
    value = evaluation.evaluate(env, actor, params, networks.init_normalizer(1), jax.random.PRNGKey(1),
                                num_episodes=2, episode_length=10, normalize_obs=False)
    assert float(value) == 3.0
    # The random-policy reference return freezes finished episodes by the same rule.
    act = lambda state, t: jnp.zeros((2, 1))  # noqa: E731
    returns = evaluation.episode_returns(env, act, jax.random.PRNGKey(1), num_episodes=2,
                                         episode_length=10)
    np.testing.assert_array_equal(returns, [3.0, 3.0])


class _BlowsUpAtStep3(_BlowsUpAfterTheEnd):
    """Reward 1 per step until its physics turns NaN at step 3, where the episode ends (as DM
    Control's tasks end one) with a NaN reward and observation."""

    def step(self, state, action):
        t = state.pipeline_state + 1.0
        blown = t >= 3
        return state.replace(pipeline_state=t, obs=jnp.where(blown, jnp.nan, jnp.full(1, t)),
                             reward=jnp.where(blown, jnp.nan, 1.0), done=blown.astype(jnp.float32))


def test_an_evaluation_episode_that_blows_up_ends_there_with_the_return_so_far():
    # As in training (`envs.zero_nonfinite_ends`): the non-finite step adds nothing and ends the
    # episode; the evaluation's mean stays finite.
    act = lambda state, t: jnp.zeros((2, 1))  # noqa: E731
    returns = evaluation.episode_returns(_BlowsUpAtStep3(), act, jax.random.PRNGKey(1),
                                         num_episodes=2, episode_length=10)
    np.testing.assert_array_equal(returns, [2.0, 2.0])


def test_a_seed_vmapped_evaluation_batches_its_env_step_once(monkeypatch):
    # `lax.while_loop` batches its body again until the set of batched carries stops growing; the
    # evaluation starts every carry batched, so its env step (MJX's in real runs, the largest part
    # of the evaluation program's trace) is batched once. Counted where JAX batches a jaxpr afresh
    # (a JAX internal: its cache hits are not counted).
    from jax._src.interpreters import batching
    batched = []
    original = batching._batch_jaxpr_outer

    def counted(fun, *args, **kwargs):
        batched.append(fun.debug_info.func_name)
        return original(fun, *args, **kwargs)

    monkeypatch.setattr(batching, "_batch_jaxpr_outer", counted)
    env = envs.make_env("toy_reach")
    act = lambda state, t: jnp.zeros((3, env.action_size))  # noqa: E731
    returns = lambda key: evaluation.episode_returns(env, act, key, num_episodes=3,  # noqa: E731
                                                     episode_length=5)
    jax.jit(jax.vmap(returns)).trace(jax.random.split(jax.random.PRNGKey(0), 2))
    assert batched.count("step") == 1     # 3 when the episode counters start unbatched


def test_random_policy_return_is_the_analytic_value():
    # toy_bandit: one step per episode, reward −(a − ½)², a ~ U[−1, 1]: E = −(⅓ + ¼) = −7/12.
    mean, sem = references.random_policy_return("toy_bandit", episode_length=5, num_episodes=16384)
    assert abs(mean + 7 / 12) < 4 * sem and sem < 0.01


def test_reference_entry_normalises_the_sweep(full_sweep, tmp_path):
    out, _ = full_sweep
    # The same measurement as notebooks/analysis.ipynb makes (one compiled program, cached).
    entry = references.measure(TINY, "toy_reach", num_seeds=3, random_episodes=16, log=lambda _: None)
    assert entry["budget"] == TINY.env_base("toy_reach").env_steps
    assert entry["ppo_sync_seeds"] == [references.REFERENCE_SEED + s for s in range(3)]
    assert entry["ppo_sync_return"] == pytest.approx(np.mean(entry["ppo_sync_final_returns"]))
    assert entry["config"]["algo"] == "ppo_clip" and entry["config"]["max_capacity"] == 1
    assert "versions" in entry and entry["random_return"] < entry["ppo_sync_return"]
    references.update(tmp_path / "refs.json", entry)
    scored = references.add_scores(sweep.load_results(out), references.load(tmp_path / "refs.json"))
    expected = ((scored["eval_return"] - entry["random_return"])
                / (entry["ppo_sync_return"] - entry["random_return"]))
    np.testing.assert_allclose(scored["score"], expected)


def test_cli_plan_lists_the_cpu_preset(capsys):
    from vaco_jax.commands import sweep as sweep_command

    assert sweep_command.main(["--preset", "cpu", "--plan"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 11 and lines[-1].startswith("10 cells")
    with pytest.raises(SystemExit) as refused:   # tyro refuses it, listing the presets
        sweep_command.main(["--preset", "nope", "--plan"])
    assert refused.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "invalid choice 'nope'" in err and "'tiny', 'smoke', 'cpu', 'hopper-1m', 'paper', 'cpu-dmc', 'paper-dmc'" in err


def test_dry_run_plans_memory_and_splits_a_cell_that_does_not_fit(full_sweep, cells, capsys, tmp_path):
    from vaco_jax.commands import sweep as sweep_command

    vaco = next(c for c in cells if c.algo == "vaco")
    report = sweep.dry_run_cell(vaco, device_memory=None)
    assert report["runs"] == 6 and report["fits"] is None and report["devices"] == "6 runs on 1 device"
    peak = report["memory_per_device"]["peak"]
    assert peak > 0 and report["memory_per_device"]["temp"] > 0
    # A device 1 byte too small for the 6 runs: the dry run halves the runs per program, and the
    # program of 3 runs (the same static config) needs less.
    args = ["--preset", "tiny", "--algos", "vaco", "--dry-run", "--device-memory", str((peak - 1) / 1e9),
            "--out", str(tmp_path / "dry")]
    assert sweep_command.main(args) == 0
    printed = capsys.readouterr().out
    assert "6 runs per program do not fit: trying --runs-per-call 3" in printed
    assert "main/toy_reach/vaco/default#0: 3 runs" in printed and "fits" in printed
    assert "2 programs, --runs-per-call 3" in printed
    assert not (tmp_path / "dry").exists()   # a dry run writes nothing


def test_a_diverged_run_is_marked_scored_as_a_failure_and_plots_still_render(
        full_sweep, cells, tmp_path, monkeypatch):
    from vaco_jax.study import capacity as capacity_sweeps, specs

    def seed_one_at_c1_unstable(hparams_list):   # run index 1 is (C = 1, seed 1) in each cell
        hparams = stack_hparams(hparams_list)
        return hparams.replace(learning_rate=hparams.learning_rate.at[1].set(1e6))

    stack_hparams = sweep.stack_hparams
    monkeypatch.setattr(sweep, "stack_hparams", seed_one_at_c1_unstable)
    assert (cells[0].runs[1].capacity, cells[0].runs[1].seed) == (1, 1)
    sweep.run_sweep(cells, tmp_path, log=lambda _: None)
    table, reference = sweep.load_results(tmp_path), sweep.load_results(full_sweep[0])

    bad = (table["capacity"] == 1) & (table["seed"] == 1)
    assert table.loc[bad, "diverged"].all() and not table.loc[~bad, "diverged"].any()
    assert table.loc[bad, "eval_return"].isna().all() and table.loc[bad, "loss"].isna().all()
    # Its step keeps the schedule (a frozen run's own counter stops), and the others are untouched.
    np.testing.assert_array_equal(table["step"], reference["step"])
    pd.testing.assert_frame_equal(table.loc[~bad].drop(columns="diverged"),
                                  reference.loc[~bad].drop(columns="diverged"))
    for record, cell in zip(sweep.load_cells(tmp_path).to_dict("records"), cells):
        assert record["diverged_runs"] == [{"capacity": 1, "delta": cell.runs[1].delta, "seed": 1,
                                            "iteration": 1, "nonfinite": ["loss", "gradient", "parameters"]}]

    scored = capacity_sweeps.with_methods(table.assign(score=table["eval_return"]))
    matrices = capacity_sweeps.score_matrices(scored)
    # Never dropped: the diverged run scores 0 (a failure), the others keep their returns.
    assert matrices[(1, "vaco")].shape == (3, 1) and matrices[(4, "vaco")].shape == (3, 1)
    assert all(np.isfinite(m).all() for m in matrices.values())
    seeds = sorted(table["seed"].unique())
    assert matrices[(1, "vaco")][seeds.index(1), 0] == 0.0
    assert np.all(matrices[(1, "vaco")][[i for i, s in enumerate(seeds) if s != 1], 0] != 0.0)
    assert capacity_sweeps.diverged_runs(table)[["algo", "capacity", "seed"]].to_dict("records") == [
        {"algo": "vaco", "capacity": 1, "seed": 1}, {"algo": "ppo_clip", "capacity": 1, "seed": 1}]

    written = specs.capacity_report(table.assign(score=table["eval_return"]), tmp_path, reps=50)
    assert all(path.stat().st_size > 0 for path in written)
    summary = (tmp_path / "summary.md").read_text()
    assert "## Diverged runs" in summary and "| toy_reach | vaco | default | 1 | 0.2 | 1 |" in summary


def test_results_of_other_code_are_never_mixed_in(full_sweep, cells, tmp_path, capsys):
    import shutil
    from vaco_jax.commands import sweep as sweep_command

    out = tmp_path / "sweep"
    shutil.copytree(full_sweep[0], out)
    records = io.read_jsonl(out / sweep.CELLS)
    assert {r["source"] for r in records} == {io.source_hash()}
    io.write_jsonl_atomic(out / sweep.CELLS, [dict(r, source="0123456789abcdef") for r in records])
    before = (out / sweep.RESULTS).read_text()
    with pytest.raises(sweep.SweepError, match="made by other code .*0123456789abcdef"):
        sweep.run_sweep(cells, out, log=lambda _: None)
    args = ["--preset", "tiny", "--algos", *ALGOS, "--out", str(out), "--no-progress"]
    assert sweep_command.main(args) == 2 and "--allow-code-change" in capsys.readouterr().err
    assert (out / sweep.RESULTS).read_text() == before
    # Told to, it adds to the directory (here nothing is left to run).
    assert sweep.run_sweep(cells, out, log=lambda _: None, allow_code_change=True) == []
    # A sweep's default directory is under runs/, never the committed results/.
    assert sweep_command.main(["--preset", "tiny", "--plan"]) == 0
    assert "-> runs/sweeps/tiny" in capsys.readouterr().out


def test_cells_of_other_source_text_are_resumed_where_they_computed_this_codes_programs(tmp_path):
    """Finished cells recorded by other source text (a docstring edited since) with the programs
    this code computes, under these library versions, are this code's; a cell of another program
    is refused and named, as is one made under other library versions."""
    cells = sweep.plan(presets.PRESETS["lag-tiny"])
    programs = {cell.cell_id: f"k2:{i:016x}" for i, cell in enumerate(cells)}   # keys.SCHEME 2
    records = [{"cell": cell.cell_id, "fingerprint": cell.fingerprint(), "runs": len(cell.runs),
                **io.provenance(), "source": "0123456789abcdef", "git_commit": "abcdef0",
                "program": programs[cell.cell_id]} for cell in cells]
    out = tmp_path / "sweep"
    out.mkdir()
    io.write_jsonl_atomic(out / sweep.CELLS, records)
    quiet = dict(log=lambda _: None, max_cells=0)
    assert sweep.run_sweep(cells, out, programs=programs, **quiet) == []
    # Without the programs, the source text decides.
    with pytest.raises(sweep.SweepError, match="made by other code .*0123456789abcdef"):
        sweep.run_sweep(cells, out, **quiet)
    # Another program: every such cell named, with both programs.
    other = {cell_id: "k2:" + "f" * 16 for cell_id in programs}
    with pytest.raises(sweep.SweepError, match="made by another program") as refused:
        sweep.run_sweep(cells, out, programs=other, **quiet)
    for cell_id, program in programs.items():
        assert f"{cell_id!r} (program {program}; this code's: k2:{'f' * 16})" in str(refused.value)
    # A key of another scheme says nothing either way: the source text decides.
    older = {cell_id: "f" * 16 for cell_id in programs}
    with pytest.raises(sweep.SweepError, match="made by other code .*0123456789abcdef"):
        sweep.run_sweep(cells, out, programs=older, **quiet)
    # The same program under another JAX: other code.
    io.write_jsonl_atomic(out / sweep.CELLS, [
        dict(r, versions=dict(r["versions"], jax="0.0.1")) for r in records])
    with pytest.raises(sweep.SweepError, match="made by other code"):
        sweep.run_sweep(cells, out, programs=programs, **quiet)
    assert io.read_jsonl(out / sweep.CELLS)[0]["versions"]["jax"] == "0.0.1"   # nothing rewritten


# --- the controlled-lag study ----------------------------------------------------------------------
LAG_TINY = presets.PRESETS["lag-tiny"]


def test_lag_study_plans_constant_lags_in_one_program_per_task_and_method():
    cells = sweep.plan(presets.PRESETS["lag-cpu"])
    methods = [(algo, presets.method_variant(variant)) for algo, variant in presets.LAG_METHODS
               for variant in [variant.name]]
    assert {"decoupled_ppo", "appo", "impala", "ppo_kl"} <= {algo for algo, _ in methods}
    oldest = [c for c in cells if c.config.snapshot_sampling == "oldest"]
    uniform = [c for c in cells if c.config.snapshot_sampling == "uniform"]
    envs_ = presets.PRESETS["lag-cpu"].envs
    assert len(oldest) == len(uniform) == len(envs_) * len(presets.LAG_METHODS)
    assert [(c.env, c.algo, presets.method_variant(c.variant)) for c in oldest] == [
        (env, algo, variant) for env in envs_ for algo, variant in methods]
    for cell in cells:
        seeds = 5 if cell.env in ("hopper", "dmc:CheetahRun") else 10
        capacities = (1, 2, 4, 8, 16) if cell in oldest else (16,)
        assert [(r.capacity, r.seed) for r in cell.runs] == [
            (c, presets.LAG_SEED + s) for c in capacities for s in range(seeds)]
        assert cell.config.slots == 16 and cell.config.eval_envs == 16 and cell.config.num_evals == 20
        assert cell.config.env_steps >= (600_000 if cell.env == "inverted_double_pendulum" else 1_000_000)
    by_variant = {(c.algo, c.variant): c.config for c in cells if c.env == "hopper"}
    assert by_variant[("impala", "epochs=1,oldest")].num_epochs == 1
    assert by_variant[("impala", "oldest")].num_epochs == 4
    assert by_variant[("ppo_kl", "kl_adaptive,oldest")].kl_adaptive
    learner_kl = by_variant[("ppo_kl", "kl_adaptive_learner,oldest")]
    assert learner_kl.kl_adaptive and learner_kl.kl_reference == "learner"
    assert (learner_kl.kl_coef_min, learner_kl.kl_coef_max) == (1 / 35, 35.0)
    assert by_variant[("ppo_kl", "kl_adaptive,oldest")].kl_reference == "behavior"
    # Tables name IMPALA's one-epoch form `impala`, the protocol's 4 epochs a labelled variant.
    assert presets.method_label("impala", "epochs=1,oldest") == "impala"
    assert presets.method_label("impala", "oldest") == "impala [epochs=4]"
    assert presets.method_label("ppo_kl", "kl_adaptive_learner,uniform") == \
        "ppo_kl [kl_adaptive_learner]"
    assert presets.method_label("vaco", "uniform") == "vaco"
    assert by_variant[("vaco", "oldest")].mjx_solver == "fast"
    # Every constant-lag program runs before any uniform one.
    assert max(cells.index(c) for c in oldest if c.env == envs_[0]) < cells.index(uniform[0])
    gpu = sweep.plan(presets.PRESETS["lag-gpu"])
    assert [(c.env, c.algo, {r.capacity for r in c.runs}) for c in gpu] == [
        (env, algo, {1, 8}) for env in ("hopper", "inverted_double_pendulum") for algo in ("ppo_clip", "vaco")]


def test_a_cell_stopped_part_way_resumes_bit_for_bit(tmp_path):
    cell = sweep.plan(LAG_TINY, algos=["ppo_clip"])[0]
    assert cell.cell_id == "lag/toy_reach/ppo_clip/oldest"
    whole = sweep.run_sweep([cell], tmp_path / "whole", log=lambda _: None)
    assert whole == [cell.cell_id]
    part = tmp_path / "part"
    assert sweep.run_sweep([cell], part, stop_after=2, log=lambda _: None) == []
    assert not (part / sweep.RESULTS).exists()
    assert [p.name for p in (part / sweep.PARTIAL / cell.fingerprint() / "checkpoints").iterdir()] == ["2"]
    assert sweep.run_sweep([cell], part, log=lambda _: None) == [cell.cell_id]
    assert not any((part / sweep.PARTIAL).iterdir())            # removed once the cell finished
    assert sweep.load_cells(part)["resumed_from_chunk"].tolist() == [2]
    table = sweep.load_results(part)
    pd.testing.assert_frame_equal(table, sweep.load_results(tmp_path / "whole"))
    # `oldest` sampling holds the lag at C − 1 iterations once the buffer has filled.
    last = table[table["eval_index"] == LAG_TINY.config["num_evals"] - 1]
    np.testing.assert_array_equal(last["snapshot_age"], last["capacity"] - 1)
    assert set(table["sgd_steps_per_iteration"]) == {2 * 2} and set(table["snapshot_sampling"]) == {"oldest"}


def test_a_cell_stopped_part_way_resumes_over_other_source_text_only_with_its_program(
        tmp_path, monkeypatch):
    from vaco_jax import io as io_lib
    from vaco_jax.errors import CheckpointError

    cell = sweep.plan(LAG_TINY, algos=["ppo_clip"])[0]   # compiled by the test above
    part = tmp_path / "part"
    assert sweep.run_sweep([cell], part, stop_after=2, log=lambda _: None,
                           programs={cell.cell_id: "key-a"}) == []
    monkeypatch.setattr(io_lib, "source_hash", lambda *a, **k: "edited-docstring")
    with pytest.raises(CheckpointError, match="written by other vaco_jax code"):
        sweep.run_sweep([cell], part, log=lambda _: None, programs={cell.cell_id: "key-b"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no "may differ" warning: it is the same program
        assert sweep.run_sweep([cell], part, log=lambda _: None,
                               programs={cell.cell_id: "key-a"}) == [cell.cell_id]
    assert sweep.load_cells(part)["resumed_from_chunk"].tolist() == [2]


def test_a_cell_run_again_replaces_what_its_interrupted_attempt_logged(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator

    from vaco_jax.options import LoggerOptions

    cell = sweep.plan(LAG_TINY, algos=["ppo_clip"])[0]   # compiled by the test above
    logging = LoggerOptions(logger=("tensorboard",))
    assert sweep.run_sweep([cell], tmp_path, log=lambda _: None, logging=logging) == [cell.cell_id]
    # Killed after logging every evaluation but before the cell was recorded: it runs again.
    (tmp_path / sweep.CELLS).unlink()
    assert sweep.run_sweep([cell], tmp_path, log=lambda _: None, logging=logging) == [cell.cell_id]
    run = cell.runs[-1]
    events = event_accumulator.EventAccumulator(str(
        tmp_path / "tensorboard" / "lag" / "toy_reach" / "ppo_clip" / "oldest"
        / f"C={run.capacity},delta={run.delta:g},seed={run.seed}"))
    events.Reload()
    rows = sweep.load_results(tmp_path).query("capacity == @run.capacity and seed == @run.seed")
    scalars = events.Scalars("eval_return")
    assert [e.step for e in scalars] == list(rows["step"]) == [4096, 8192, 12288, 16384]
    np.testing.assert_allclose([e.value for e in scalars], rows["eval_return"], rtol=1e-6)


EXAMPLE_PROFILE = Path(__file__).resolve().parent.parent / "docs" / "lag_profiles" / "example.json"


def test_a_lag_profile_runs_every_method_of_the_study_once_at_the_profile(tmp_path, capsys):
    from vaco_jax.commands import sweep as sweep_command

    profile = (0.5, 0.25, 0.25)
    cells = sweep.plan(presets.PRESETS["lag-cpu"], lag_profile=profile)
    envs_ = presets.PRESETS["lag-cpu"].envs
    # The oldest and uniform columns of a method are one cell at the profile.
    assert [(c.env, c.algo, presets.method_variant(c.variant)) for c in cells] == [
        (env, algo, presets.method_variant(variant.name))
        for env in envs_ for algo, variant in presets.LAG_METHODS]
    for cell in cells:
        assert cell.variant.endswith("profile")
        assert (cell.config.snapshot_sampling, cell.config.lag_profile) == ("profile", profile)
        assert cell.config.slots == 3 and {r.capacity for r in cell.runs} == {3}
    assert presets.method_label("impala", "epochs=1,profile") == "impala"
    # On the command line: a file, and no capacities beside it.
    assert sweep_command.main(["--preset", "lag-tiny", "--plan",
                                  "--lag-profile", str(EXAMPLE_PROFILE)]) == 0
    assert "lag/toy_reach/vaco/profile: 2 runs" in capsys.readouterr().out
    assert sweep_command.main(["--preset", "lag-tiny", "--plan", "--capacities", "1", "4",
                                  "--lag-profile", str(EXAMPLE_PROFILE)]) == 2
    assert "`capacities` is invalid with --lag-profile" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"probabilities": [0.5, 0.6]}')
    assert sweep_command.main(["--preset", "lag-tiny", "--plan", "--lag-profile", str(bad)]) == 2
    assert "sum to 1" in capsys.readouterr().err


def test_a_profile_cell_logs_its_snapshot_age_histogram_in_the_table(tmp_path):
    cell, = sweep.plan(LAG_TINY, algos=["ppo_clip"], lag_profile=(0.0, 1.0))
    assert cell.cell_id == "lag/toy_reach/ppo_clip/profile"
    sweep.run_sweep([cell], tmp_path, log=lambda _: None)
    table = sweep.load_results(tmp_path)
    assert set(table["snapshot_sampling"]) == {"profile"} and set(table["capacity"]) == {2}
    # All mass on age 1: every draw after the first iteration has age 1.
    last = table[table["eval_index"] == LAG_TINY.config["num_evals"] - 1]
    np.testing.assert_array_equal(last["snapshot_age_hist_1"], 1.0)
    np.testing.assert_array_equal(last["snapshot_age"], 1.0)
