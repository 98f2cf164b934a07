"""The settings studies' report (vaco_jax.study.lag_by_setting, `vaco-report --study settings`) on
synthetic sweeps written by hand, whose answers are known: the same-seed normalisation, retention
against the base setting with the break rule, the pre-registered family, the step-size and δ
tables; and the LLM study's pre-registered tests."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from vaco_jax import io
from vaco_jax.llm import experiment
from vaco_jax.pipeline import tables
from vaco_jax.pipeline import estimates
from vaco_jax.study import lag, lag_by_setting, references, stats, sweep

TASKS = {"task_a": (0.0, 100.0), "task_b": (-50.0, 200.0)}   # random return, scale
BUDGET, EVALS, SEEDS = 4095, 5, tuple(range(100, 110))
SOURCE = "5ca1ab1e5ca1ab1e"
# (method, K, lr) → normalised level per capacity (k = C − 1). PPO-Clip collapses at K = 32,
# k = 0 and keeps its score elsewhere; VACO keeps 0.9 everywhere; APPO keeps 1.0.
FORWARD = {("ppo_clip", 4, 3e-4): {1: 1.0, 16: 0.95}, ("ppo_clip", 4, 3e-3): {1: 1.0, 16: 1.0},
           ("ppo_clip", 32, 3e-4): {1: 0.3, 16: 0.3},
           ("vaco", 4, 3e-4): {1: 0.9, 16: 0.9}, ("vaco", 4, 3e-3): {1: 0.9, 16: 0.9},
           ("vaco", 32, 3e-4): {1: 0.9, 16: 0.9},
           ("appo", 4, 3e-4): {1: 1.0, 16: 1.0}, ("appo", 4, 3e-3): {1: 1.0, 16: 1.0},
           ("appo", 32, 3e-4): {1: 1.0, 16: 1.0}}
DIVERGED = ("task_b", "appo", 4, 3e-3, 16, 104)     # diverges at its evaluation 3


def _rows(study, task, algo, epochs, lr, capacity, delta, seed, level, rng, cell, swept_lr):
    random, scale = TASKS[task]
    seed_effect = 0.02 * (seed - 104.5)
    rows = []
    for e in range(EVALS):
        ramp = min(1.0, (e + 1) / 2)
        diverged = (task, algo, epochs, lr, capacity, seed) == DIVERGED and e >= 3
        score = level * ramp + seed_effect + 0.01 * rng.normal()
        row = {"cell": cell, "study": study, "env": task, "algo": algo, "variant": "v",
               "capacity": capacity, "delta": delta, "seed": seed, "eval_index": e,
               "step": (e + 1) * BUDGET // EVALS, "iteration": e + 1, "budget": BUDGET,
               "snapshot_sampling": "oldest", "sgd_steps_per_iteration": epochs * 8,
               "diverged": diverged, "eval_return": np.nan if diverged else random + scale * score,
               "approx_kl": np.nan if diverged else lr * epochs * (2.0 if algo == "vaco" else 1.0),
               "behavior_tv": 0.01 * capacity}
        if swept_lr:
            row["learning_rate"] = lr
        rows.append(row)
    return rows


def _write(directory, study, programs, task):
    """A finished sweep of `study` on `task`: programs (algo, K, lr list, capacities, deltas,
    level(lr, capacity, delta)), written as `sweep.run_sweep` would."""
    rng = np.random.default_rng(len(task) + len(study))
    rows, records, plan = [], [], {}
    for algo, epochs, rates, capacities, deltas, level in programs:
        cell = f"{study}/{task}/{algo}/K={epochs}"
        swept = len(rates) > 1 or study != "delta-lag"
        plan[cell] = {"fingerprint": cell, "study": study, "env": task, "algo": algo,
                      "variant": "v", "config": {"num_epochs": epochs, "learning_rate": 3e-4},
                      "runs": []}
        for lr in rates:
            for capacity in capacities:
                for delta in deltas:
                    for seed in SEEDS:
                        rows += _rows(study, task, algo, epochs, lr, capacity, delta, seed,
                                      level(lr, capacity, delta), rng, cell, swept)
        records.append({"cell": cell, "fingerprint": cell, "source": SOURCE,
                        "git_commit": "c0ffee" * 6 + "c0ff"})
    directory.mkdir(parents=True)
    io.append_jsonl(directory / sweep.RESULTS, rows)
    io.append_jsonl(directory / sweep.CELLS, records)
    io.write_json_atomic(directory / sweep.PLAN, {"preset": {"name": "synthetic"}, "cells": plan})
    return directory


def _forward(directory, task):
    by_k = {}
    for (algo, epochs, lr), levels in FORWARD.items():
        by_k.setdefault((algo, epochs), []).append(lr)
    programs = [(algo, epochs, rates, (1, 16), (0.2,),
                 lambda lr, c, d, a=algo, k=epochs: FORWARD[(a, k, lr)][c])
                for (algo, epochs), rates in by_k.items()]
    return _write(directory, "forward", programs, task)


def _references(path):
    entries = [{"preset": "synthetic", "env": task, "budget": BUDGET, "random_return": random,
                "ppo_sync_return": 1e9, "last_evals": 3} for task, (random, _) in TASKS.items()]
    io.write_json_atomic(path, {"schema_version": references.SCHEMA_VERSION, "entries": entries})
    return path


@pytest.fixture(scope="module")
def forward(tmp_path_factory):
    root = tmp_path_factory.mktemp("settings")
    dirs = [_forward(root / task, task) for task in TASKS]
    refs = _references(root / "refs.json")
    patch = pytest.MonkeyPatch()
    patch.setattr(lag, "git_descends_from", lambda commit, ancestor: True)
    try:
        report = lag_by_setting.analyse(lag_by_setting.load_study(dirs), references.load(refs), reps=1000)
    finally:
        patch.undo()
    return dirs, refs, report


def _one(frame, **where):
    rows = frame
    for column, value in where.items():
        rows = rows[rows[column] == value]
    assert len(rows) == 1, where
    return rows.iloc[0]


def _final(directory, **where):
    """Per seed, the mean of a run's last 3 evaluation returns, read from results.jsonl."""
    rows = pd.DataFrame(io.read_jsonl(directory / sweep.RESULTS))
    for column, value in where.items():
        rows = rows[np.isclose(rows[column], value)] if isinstance(value, float) else \
            rows[rows[column] == value]
    return rows[rows["eval_index"] >= EVALS - 3].groupby("seed")["eval_return"].mean()


def test_scores_are_normalised_by_synchronous_ppo_clip_on_the_same_seeds(forward):
    dirs, _, report = forward
    sync = _final(dirs[1], algo="ppo_clip", learning_rate=3e-4, capacity=1,
                  sgd_steps_per_iteration=32)
    task = _one(report.tasks, task="task_b")
    assert task.sync_return == pytest.approx(sync.mean()) and task.sync_seeds == len(SEEDS)
    assert task.sync_from == "forward"              # not the references' (1e9)
    final = _final(dirs[1], algo="vaco", learning_rate=3e-3, capacity=16)
    run = _one(report.runs, env="task_b", method="vaco", setting="K=4, lr=0.003", capacity=16,
               seed=103)
    assert run.score == pytest.approx((final[103] + 50.0) / (sync.mean() + 50.0))
    broken = _one(report.runs, env="task_b", method="appo", setting="K=4, lr=0.003", capacity=16,
                  seed=104)
    assert broken.diverged and broken.score == 0.0
    assert broken.auc < 0.7   # its last 2 of 5 evaluations count as 0


def test_retention_against_the_base_setting_with_the_break_rule(forward):
    _, _, report = forward
    r = report.forward_retention
    ppo = _one(r, task=lag.POOLED, method="ppo_clip", setting="K=32, lr=0.0003", capacity=1)
    assert ppo.retention == pytest.approx(0.3, abs=0.03) and ppo.retention_verdict == "breaks"
    vaco = _one(r, task=lag.POOLED, method="vaco", setting="K=32, lr=0.0003", capacity=1)
    assert vaco.retention == pytest.approx(1.0, abs=0.03) and vaco.retention_verdict == "holds"
    assert vaco.retention_low <= vaco.retention <= vaco.retention_high
    # the base setting itself has no retention row; its lag column does
    assert r[(r["setting"] == lag_by_setting.BASE_FORWARD) & (r["capacity"] == 1)].empty
    assert _one(r, task="task_a", method="ppo_clip", setting=lag_by_setting.BASE_FORWARD,
                capacity=16).retention == pytest.approx(0.95, abs=0.03)
    assert "PPO-Clip breaks in" in report.answer
    assert "K=32, lr=0.0003, k = 0: PPO-Clip 0.30" in report.answer
    assert "VACO holds" in report.answer


def test_retention_is_the_pipelines_retention_of_the_same_runs(forward):
    # The report's retention table is `estimates.retention` of its own runs, cell by cell.
    _, _, report = forward
    runs = report.runs.rename(columns={"env": "task"})
    base = {"method": "ppo_clip", "setting": lag_by_setting.BASE_FORWARD, "capacity": 1}
    at = {**base, "setting": "K=32, lr=0.0003"}
    expected = estimates.retention(runs, "score", base, at, reps=1000).set_index("task")
    table = report.forward_retention
    table = table[(table["method"] == "ppo_clip") & (table["setting"] == at["setting"])
                  & (table["capacity"] == 1)].set_index("task")
    assert list(table.index) == ["task_a", "task_b", lag.POOLED]
    for ours, theirs in (("retention", "retention"), ("retention_low", "low"),
                         ("retention_high", "high")):
        np.testing.assert_allclose(table[ours], expected.loc[table.index, theirs], rtol=1e-12)


def test_the_pre_registered_family_is_tested_by_hand(forward):
    dirs, _, report = forward
    p = report.primary
    family = p[p["family"].astype(bool)]
    # 2 settings × 2 baselines × 2 metrics × (2 tasks + pooled)
    assert len(family) == 24 and set(family["task"]) == {"task_a", "task_b", lag.POOLED}
    assert np.allclose(family["p_holm"], stats.holm(family["p"].to_numpy()))
    row = _one(p, comparison="vaco − ppo_clip", task="task_a", setting="k=0, K=32, lr=0.0003",
               metric="final score")
    runs = report.runs[(report.runs["env"] == "task_a") & (report.runs["capacity"] == 1)
                       & (report.runs["setting"] == "K=32, lr=0.0003")]
    d = (runs[runs["method"] == "vaco"].set_index("seed")["score"]
         - runs[runs["method"] == "ppo_clip"].set_index("seed")["score"])
    assert row.estimate == pytest.approx(d.mean())
    assert row.p == pytest.approx(scipy_stats.ttest_1samp(d, 0.0).pvalue)
    assert row.verdict == "higher" and row.analysis == "pre-registered"
    holds = _one(p, comparison="ppo_clip retention", task=lag.POOLED,
                 setting="k=0, K=32, lr=0.0003")
    assert holds.verdict == "breaks"
    assert set(p.loc[p["comparison"] == "vaco retention", "verdict"]) == {"holds"}


def test_a_family_not_yet_whole_gets_no_verdict(forward):
    # Holm over part of the family is not the pre-registered test: with APPO's runs not yet in,
    # the 12 comparisons with PPO-Clip are computed but judged by none.
    _, _, report = forward
    runs = report.runs[report.runs["method"] != "appo"]
    p = lag_by_setting.primary_table(runs, report.forward_retention, pre_registered=True)
    family = p[p["family"].astype(bool)]
    assert len(family) == 12
    assert set(family["verdict"]) == {"no verdict: 12 of the family's 24 comparisons are in "
                                      "(Holm needs them all)"}
    whole = lag_by_setting.primary_table(report.runs, report.forward_retention, pre_registered=True)
    assert "higher" in set(whole["verdict"])


def test_a_planned_task_with_no_runs_yet_counts_as_missing_from_the_family(tmp_path,
                                                                           monkeypatch):
    # Each task fills its own directory: with only task_a's in, the family (planned over task_a,
    # task_b and pooled: 24 comparisons) is a third complete, so no comparison gets a verdict.
    only_a = _forward(tmp_path / "task_a", "task_a")
    plan = json.loads((only_a / sweep.PLAN).read_text())
    plan["preset"] = {"name": "synthetic", "envs": ["task_a"]}
    io.write_json_atomic(only_a / sweep.PLAN, plan)
    monkeypatch.setattr(lag_by_setting.presets, "PRESETS", {
        "synthetic": dataclasses.replace(
            lag_by_setting.presets.PRESETS["forward-cpu"], name="synthetic", envs=("task_a", "task_b"))})
    monkeypatch.setattr(lag, "git_descends_from", lambda commit, ancestor: True)
    sweeps = lag_by_setting.load_study([only_a])
    assert sweeps.forward_tasks == ("task_a", "task_b")
    report = lag_by_setting.analyse(sweeps, references.load(_references(tmp_path / "r.json")),
                              reps=200)
    family = report.primary[report.primary["family"].astype(bool)]
    assert len(family) == 8 and set(family["task"]) == {"task_a"}
    assert set(family["verdict"]) == {"no verdict: 8 of the family's 24 comparisons are in "
                                      "(Holm needs them all)"}
    assert report.answer.endswith(" Not yet run: task_b.")


def test_results_made_before_the_pre_registration_call_no_verdict(forward, monkeypatch):
    dirs, refs, _ = forward
    monkeypatch.setattr(lag, "git_descends_from", lambda commit, ancestor: False)
    report = lag_by_setting.analyse(lag_by_setting.load_study(dirs), references.load(refs), reps=200)
    words = set(report.primary["verdict"]) | set(report.forward_retention["retention_verdict"])
    assert not words & {"holds", "breaks", "undetermined", "higher", "lower"}
    assert set(report.primary["analysis"]) == {"exploratory"}
    assert report.answer.startswith("PPO-Clip has its 95% CI below 0.8 in")


def test_without_synchronous_ppo_clip_the_scores_are_refused(tmp_path):
    only_vaco = _write(tmp_path / "d", "delta-lag", [
        ("vaco", 4, (3e-4,), (1, 16), (0.1, 0.2), lambda lr, c, d: 0.9)], "task_a")
    with pytest.raises(ValueError, match="no synchronous PPO-Clip runs .* on task_a: .* add the "
                                         "sweep directory"):
        lag_by_setting.analyse(lag_by_setting.load_study([only_vaco]), references.load(_references(
            tmp_path / "r.json")), reps=100)


def test_step_size_best_rate_matched_kl_ablations_and_delta(tmp_path):
    rates = (1e-4, 3e-4, 1e-3)
    best = {"ppo_clip": 1e-3, "vaco": 1e-4}
    step = _write(tmp_path / "s", "stepsize", [
        (algo, 4, rates, (1,), (0.2,),
         lambda lr, c, d, a=algo: 1.0 if lr == best[a] else 0.6) for algo in best] + [
        ("gae+tv_filter", 4, (3e-4,), (1,), (0.2,), lambda lr, c, d: 0.4)], "task_a")
    delta = _write(tmp_path / "d", "delta-lag", [
        ("vaco", 4, (3e-4,), (1, 16), (0.1, 0.4),
         lambda lr, c, d: 0.9 if c == 1 or d == 0.1 else 0.45)], "task_a")
    report = lag_by_setting.analyse(lag_by_setting.load_study([step, delta]),
                              references.load(_references(tmp_path / "r.json")), reps=500)
    chosen = report.best_lr.set_index("method")["best"]
    assert chosen["ppo_clip"] == "lr=0.001" and chosen["vaco"] == "lr=0.0001"
    # approx_kl = lr × K × (2 for VACO): VACO at 1e-4 (8e-4) is closest to PPO-Clip at 3e-4 (1.2e-3)
    matched = _one(report.matched, task="task_a")
    assert (matched.vaco_lr, matched.ppo_clip_lr) == ("lr=0.0001", "lr=0.0003")
    # scores are in units of synchronous PPO-Clip at lr 3e-4 (level 0.6 here)
    assert _one(report.tasks, task="task_a").sync_from == "stepsize"
    assert matched.score_difference == pytest.approx((1.0 - 0.6) / 0.6, abs=0.05)
    ablation = _one(report.ablations, task="task_a", method="gae+tv_filter")
    assert ablation.score_minus_vaco == pytest.approx((0.4 - 0.6) / 0.6, abs=0.05)
    kept = _one(report.delta_retention, task="task_a", setting="δ=0.4", capacity=16)
    assert kept.retention == pytest.approx(0.5, abs=0.05)
    assert kept.retention_verdict == "95% CI below 0.8"     # exploratory wording
    assert _one(report.delta_retention, task="task_a", setting="δ=0.1",
                capacity=16).retention_verdict == "95% CI above 0.8"
    assert report.primary.empty and report.forward_retention.empty
    # summary.md gives δ's AUC (and its retention) beside the final score: a capped final score
    # cannot show a slowdown.
    text = lag_by_setting.summary(report, sweeps=["s", "d"], references_path="r.json", figures={})
    section = text.split("## VACO's δ at a constant lag")[1]
    auc = _one(report.delta_scores, task="task_a", setting="δ=0.4", capacity=16)
    assert "| task_a | δ=0.4 | " in section and "AUC retention against the same δ" in section
    assert tables.interval(auc.auc, auc.auc_low, auc.auc_high) in section.split("Normalised AUC")[1]
    # Its KL spans k = 0 and k = 15: the table says it is KL to β, which holds the lag.
    assert lag_by_setting.KL_NOTE in section.split("Mean in-update approx_kl")[1].split("\n|")[0]
    # ... and so does its figure: score, AUC, and the two retentions, one row each.
    fig = lag_by_setting.delta_lag_figure(report.delta_scores, report.delta_retention)
    assert [ax.get_ylabel().split("\n")[0] for ax in fig.axes] == [
        "normalised final score", "normalised AUC", "final-score retention", "AUC retention"]
    k15 = [c.lines[0].get_ydata() for c in fig.axes[1].containers][-1]
    assert k15[-1] == pytest.approx(auc.auc)                 # δ = 0.4, k = 15


def test_the_forward_figure_joins_points_along_one_arm_of_settings_never_across(forward):
    # The settings vary the learning rate at K = 4 or K at lr 3e-4: a line from K=4, lr=3e-3 to
    # K=32, lr=3e-4 would read as a trend that no setting between them measured.
    import matplotlib.pyplot as plt

    _, _, report = forward
    retention = report.forward_retention
    fig = lag_by_setting.forward_figure(retention, ["vaco", "ppo_clip", "appo"], "task_a")
    order = lag_by_setting._setting_order(retention["setting"])
    joined = []
    for ax in fig.axes:
        for container in ax.containers:
            x = np.round(container.lines[0].get_xdata()).astype(int)
            joined.append({order[i].split(",")[0] for i in x})
    assert {"K=4"} in joined and {"K=32"} in joined
    assert all(len(arm) == 1 for arm in joined), joined
    assert any(line.get_xdata()[0] == 1.5 for ax in fig.axes for line in ax.lines
               if line.get_linestyle() == "-" and len(set(line.get_xdata())) == 1)   # the rule
    plt.close(fig)


def test_a_pooled_row_over_fewer_tasks_says_so_in_the_tables_and_the_figure(forward):
    # A method that has run on one task of two (a sweep still filling) pools that task alone: its
    # pooled rows must not read as a mean over both.
    import matplotlib.pyplot as plt

    _, _, report = forward
    def one_task(frame):
        rows = frame[frame["method"] == "vaco"]
        extra = pd.concat([rows[rows["task"] == "task_a"],
                           rows[rows["task"] == "task_a"].assign(task=lag.POOLED, tasks=1)])
        return pd.concat([frame, extra.assign(method="dppo_tv")], ignore_index=True)
    partial = dataclasses.replace(report, forward_retention=one_task(report.forward_retention),
                                  forward_scores=one_task(report.forward_scores))
    text = lag_by_setting.summary(partial, sweeps=["a", "b"], references_path="refs.json", figures={})
    pooled = [line for line in text.splitlines() if line.startswith("| pooled")]
    marked = [line for line in pooled if "(1 of 2 tasks)" in line]
    assert marked and all("| dppo_tv |" in line for line in marked)
    assert {line.split(" | ")[1] for line in marked} == {"dppo_tv"}
    cells = [c for line in marked for c in line.strip("| ").split(" | ")[3:] if c != "—"]
    assert cells and all(c.endswith("(1 of 2 tasks)") or "(1 of 2 tasks) (" in c for c in cells)
    assert not any("| dppo_tv |" in line for line in pooled if line not in marked)
    fig = lag_by_setting.forward_figure(partial.forward_retention, ["vaco", "dppo_tv"], lag.POOLED)
    hollow = {line.get_gid() for ax in fig.axes for line in ax.lines
              if line.get_gid() and line.get_markerfacecolor() == "none"}
    assert hollow == {"dppo_tv"}
    labels = {t.get_text() for t in fig.axes[len(fig.axes) // 2 - 1].get_legend().get_texts()}
    assert labels == {"vaco", "dppo_tv (1 of 2 tasks)"}
    plt.close(fig)
    fig = lag_by_setting.forward_figure(partial.forward_retention, ["vaco", "dppo_tv"], "task_a")
    assert not any(line.get_markerfacecolor() == "none" for ax in fig.axes for line in ax.lines)
    plt.close(fig)


def test_the_forward_kl_table_says_it_is_kl_to_the_behaviour_policy(forward):
    # approx_kl is KL(β ‖ π_θ): under lag it holds the lag itself, so the table spanning k = 0 to
    # k = 15 must say so before a reader compares it as a step size.
    _, _, report = forward
    text = lag_by_setting.summary(report, sweeps=["a"], references_path="r.json", figures={})
    above = text.split("## Forward × backward: mean in-update approx_kl")[1].split("\n|")[0]
    assert lag_by_setting.KL_NOTE in above
    assert "KL(β ‖ π_θ)" in lag_by_setting.KL_NOTE and "not a step size" in lag_by_setting.KL_NOTE


def test_cli_writes_primary_csv_summary_and_figures(forward, tmp_path, capsys, monkeypatch):
    from vaco_jax.commands import report as report_command

    dirs, refs, _ = forward
    monkeypatch.setattr(lag, "git_descends_from", lambda commit, ancestor: True)
    out = tmp_path / "report"
    code = report_command.main(["--study", "settings", "--sweeps", *map(str, dirs), "--references",
                            str(refs), "--out", str(out), "--reps", "200"])
    assert code == 0
    primary = pd.read_csv(out / "primary.csv")
    assert len(primary) == 24 + 2 * 3 * 3     # the family, then the "holds" rows
    text = (out / "summary.md").read_text()
    first_table = text.index("| comparison | task | setting |")
    assert text.index("## Pre-registered tests") < first_table < text.index("## Tasks")
    figures = sorted(p.name for p in out.glob("fig_forward_*.png"))
    assert figures == ["fig_forward_1_pooled.png", "fig_forward_1_task_a.png",
                       "fig_forward_1_task_b.png"]
    assert report_command.main(["--study", "settings", "--sweeps", *map(str, dirs), "--references",
                            str(tmp_path / "none.json")]) == 2
    assert "no reference returns at" in capsys.readouterr().err


def test_llm_objective_table_is_each_objectives_mean_and_paired_difference_by_hand():
    # Three seeds, two objectives, one N; a run at backward lag k = 2 is left out (k = 0 only).
    greedy = {"ppo_clip": [0.50, 0.60, 0.70], "cispo": [0.45, 0.50, 0.70]}
    rows = [{"n": 8, "k": 0, "seed": s, "objective": o, "final_accuracy": acc[s],
             "final_sampled_accuracy": 0.3} for o, acc in greedy.items() for s in range(3)]
    rows.append({"n": 8, "k": 2, "seed": 0, "objective": "cispo", "final_accuracy": 0.0,
                 "final_sampled_accuracy": 0.0})
    table = experiment.objective_table(rows).set_index(["objective", "metric"])
    cispo = table.loc[("cispo", "held-out greedy accuracy")]
    half = 4.302652729911275 * np.std([0.45, 0.50, 0.70], ddof=1) / np.sqrt(3)   # t(0.975, 2)
    assert (cispo["mean"], cispo.low, cispo.high) == pytest.approx((0.55, 0.55 - half, 0.55 + half))
    d = np.array([-0.05, -0.10, 0.0])
    half = 4.302652729911275 * d.std(ddof=1) / np.sqrt(3)
    assert (cispo.minus_ppo_clip, cispo.minus_ppo_clip_low, cispo.minus_ppo_clip_high) == (
        pytest.approx((-0.05, -0.05 - half, -0.05 + half)))
    assert cispo.seeds == 3 and cispo.N == 8
    assert np.isnan(table.loc[("ppo_clip", "held-out greedy accuracy")].minus_ppo_clip)


def test_llm_primary_tests_pair_seeds_and_adjust_over_the_family(monkeypatch):
    monkeypatch.setattr(lag, "git_descends_from", lambda commit, ancestor: True)
    rng = np.random.default_rng(0)
    rows = []
    for n in (1, 8, 16, 32):
        for seed in range(10):
            base = 0.8 + 0.01 * rng.normal()
            gain = 0.0 if n == 1 else 0.03 + 0.003 * rng.normal()
            for objective, shift in (("ppo_clip", 0.0), ("vaco", gain)):
                rows.append({"n": n, "seed": seed, "objective": objective,
                             "final_accuracy": base + shift,
                             "final_sampled_accuracy": base - shift + 0.001 * seed * (n > 1)})
    table = experiment.primary_tests(rows, commit="c0ffee")
    assert len(table) == 8 and set(table["analysis"]) == {"pre-registered"}
    same = _one(table, setting="N=1", metric="held-out greedy accuracy")
    assert same.p == 1.0 and same.verdict == "no difference shown"
    greedy = _one(table, setting="N=16", metric="held-out greedy accuracy")
    assert greedy.estimate == pytest.approx(0.03, abs=0.003) and greedy.verdict == "higher"
    sampled = _one(table, setting="N=16", metric="held-out sampled accuracy")
    assert sampled.verdict == "lower"
    assert np.allclose(table["p_holm"], stats.holm(table["p"].to_numpy()))
    assert set(experiment.primary_tests(rows, commit=None)["analysis"]) == {"exploratory"}
    # Part of the family (N = 32 missing), or fewer seeds than fixed, gets no verdict; an N that
    # was not pre-registered is an exploratory row outside Holm.
    part = experiment.primary_tests([r for r in rows if r["n"] != 32], commit="c0ffee")
    assert set(part["verdict"]) == {"no verdict: 6 of the family's 8 comparisons are in with 10 "
                                    "seeds (Holm needs them all)"}
    few = experiment.primary_tests([r for r in rows if r["seed"] < 5], commit="c0ffee")
    assert set(few["verdict"]) == {"no verdict: 0 of the family's 8 comparisons are in with 10 "
                                   "seeds (Holm needs them all)"}
    extra = experiment.primary_tests(rows + [{**r, "n": 4} for r in rows if r["n"] == 16],
                                     commit="c0ffee")
    outside = extra[extra["setting"] == "N=4"]
    assert len(outside) == 2 and outside["p_holm"].isna().all()
    assert set(outside["verdict"]) == {"exploratory (N not pre-registered)"}
    assert extra[extra["setting"] != "N=4"]["p_holm"].tolist() == table["p_holm"].tolist()


def test_llm_primary_csv_is_written_beside_the_results(tmp_path, monkeypatch):
    monkeypatch.setattr(lag, "git_descends_from", lambda commit, ancestor: False)
    rows = [{"n": 8, "seed": s, "objective": o, "final_accuracy": 0.5 + 0.01 * s * (o == "vaco"),
             "final_sampled_accuracy": 0.4} for s in range(3) for o in ("vaco", "ppo_clip")]
    io.append_jsonl(tmp_path / "results.jsonl", rows)
    (tmp_path / "config.json").write_text(json.dumps({"config": {}, "git_commit": "abc"}))
    path = experiment.write_primary(tmp_path)
    table = pd.read_csv(path)
    assert list(table["setting"]) == ["N=8", "N=8"] and set(table["analysis"]) == {"exploratory"}


def test_provenance_names_the_kinds_of_cpu_that_ran_each_sweep(forward):
    _, _, report = forward
    assert set(report.provenance["cpus"]) == {"unrecorded"}   # these cells predate the record
    cells = pd.DataFrame([
        {"sweep": "a", "source": "s", "git_commit": "c", "host": {"cpu_tag": "x86_64-aaa"}},
        {"sweep": "a", "source": "s", "git_commit": "c", "host": {"cpu_tag": "x86_64-bbb"}},
        {"sweep": "b", "source": "s", "git_commit": "c", "host": {"machine": "x86_64"}}])
    table = lag.provenance(lag.Study(pd.DataFrame(), cells, {}))
    assert list(table["cpus"]) == ["x86_64-aaa, x86_64-bbb", "unrecorded"]
