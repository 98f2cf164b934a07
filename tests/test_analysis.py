"""The analysis layer: the run table and its adapters on committed files, each estimand against a
hand computation, Holm, the ancestry check, the report's headline keys, the one check rule."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rliable import metrics as rly_metrics
from scipy import stats as scipy_stats

from vaco_jax.analysis import check, estimands, families, figures, report, schema

ROOT = Path(__file__).resolve().parent.parent
V2 = ROOT / "results" / "lag-bench" / "cpu-v2"


def table(values: dict) -> pd.DataFrame:
    """A run table from (task, method, k) → one value (final and auc) per seed (seeds 0, 1, …)."""
    rows = [{"task": t, "method": m, "k": k, "seed": s, "final": v, "auc": v}
            for (t, m, k), vs in values.items() for s, v in enumerate(vs)]
    return schema.conform(pd.DataFrame(rows), study="synthetic")


def row(estimates: pd.DataFrame, **key) -> pd.Series:
    for column, value in key.items():
        estimates = estimates[estimates[column] == value]
    assert len(estimates) == 1, (key, estimates)
    return estimates.iloc[0]


# --- the run table ------------------------------------------------------------------------------
def test_the_validator_names_a_missing_or_mistyped_column():
    runs = table({("a", "x", 0): [1.0, 2.0]})
    assert schema.validate(runs) is runs and list(runs.columns) == list(schema.COLUMNS)
    with pytest.raises(ValueError, match="no column 'commit'"):
        schema.validate(runs.drop(columns="commit"))
    with pytest.raises(ValueError, match="column 'seed' is object, not int64"):
        schema.validate(runs.assign(seed=runs["seed"].astype(str)))
    with pytest.raises(ValueError, match="runs appear twice"):
        schema.validate(pd.concat([runs, runs], ignore_index=True))


def test_the_bench_adapter_reads_a_leaderboards_scores():
    runs = schema.from_bench(pd.read_csv(V2 / "scores.csv"))
    assert len(runs) == 17 * 5 * 6 * 10 and runs["method"].nunique() == 17
    first = runs.iloc[0]
    assert (first.task, first.method, first.k, first.K, first.lr, first.seed) == (
        "dmc:CartpoleSwingup", "appo", 0, 16, 0.003, 300)
    assert first.final == pytest.approx(0.4220702368018989, abs=1e-15)
    assert first.raw_auc == pytest.approx(136.80668491125107, abs=1e-12)


def test_the_sweeps_adapter_reduces_evaluations_to_the_runs_the_bench_scored():
    runs = schema.from_sweeps(pd.read_parquet(V2 / "vaco" / "runs" / "results.parquet"))
    scored = schema.from_bench(pd.read_csv(V2 / "scores.csv")).query("method == 'vaco'")
    both = runs.merge(scored, on=["task", "k", "sampling", "K", "seed"], suffixes=("", "_bench"))
    assert len(runs) == len(both) == 300 and set(runs["study"]) == {"bench"}
    np.testing.assert_allclose(both["auc"], both["raw_auc"], rtol=1e-12)
    np.testing.assert_allclose(both["final"], both["raw_final"], rtol=1e-12)
    lag = schema.from_sweeps(pd.read_csv(ROOT / "results/lag-cpu/lag_report/runs.csv"), "lag")
    assert lag["k"].max() == 15 and len(lag) == 1440
    first = lag.iloc[0]     # its normalised final score is final; the return a free column
    assert (first.task, first.k, first.seed) == ("dmc:CartpoleSwingup", 0, 100)
    assert (first.final, first.final_return) == pytest.approx((1.2940252234411507,
                                                               726.4244181315104), rel=1e-12)


def test_the_settings_and_llm_adapters_read_their_committed_runs():
    settings = schema.from_settings(pd.read_csv(ROOT / "results/settings_report/runs.csv"))
    assert set(settings["study"]) == {"delta-lag", "forward", "stepsize"}
    assert set(settings["K"]) == {4, 16, 32} and settings["constraint"].notna().all()
    llm = schema.from_llm(pd.read_parquet(ROOT / "results/lag-bench/llm-cpu/vaco/results.parquet"))
    assert set(llm["N"]) == {1, 8} and set(llm["k"]) == {0, 8, 32}
    assert set(llm["sampling"]) == {"oldest", "uniform"}
    first = llm.iloc[0]
    assert first.final == 0.541015625 and first.final_sampled_accuracy == 0.36328125


# --- estimands against hand computations ----------------------------------------------------------
LAGGED = {("a", "base", 0): [1.0, 1.0, 1.0, 1.0], ("a", "base", 8): [0.5, 0.4, 0.6, 0.5],
          ("a", "m", 0): [1.0, 1.2, 0.8, 1.0], ("a", "m", 8): [1.0, 1.1, 0.9, 1.0],
          ("b", "base", 0): [0.4, 0.4, 0.4, 0.4], ("b", "base", 8): [0.2, 0.2, 0.2, 0.2],
          ("b", "m", 0): [0.9, 0.8, 1.0, 0.9], ("b", "m", 8): [0.3, 0.4, 0.5, 0.4]}
SPEC = {"study": "s", "metric": "auc", "at": {"k": 8}, "baseline": "base", "reps": 400}


def test_mean_is_the_seed_mean_and_pooled_the_mean_over_tasks():
    found = estimands.mean(table(LAGGED), {**SPEC, "methods": ["m"]})
    assert row(found, task="a").point == pytest.approx(1.0)
    assert row(found, task="b").point == pytest.approx(0.4)
    pooled = row(found, task="pooled")
    assert pooled.point == pytest.approx(0.7) and pooled.seeds == 8
    assert pooled.low < pooled.point < pooled.high and pooled.setting == "k=8"


def test_retention_is_a_ratio_of_means_flagged_below_half():
    found = estimands.retention(table(LAGGED), {**SPEC, "base": {"k": 0}})
    assert row(found, method="base", task="a").point == pytest.approx(0.5)
    assert row(found, method="m", task="b").point == pytest.approx(0.4 / 0.9)
    assert row(found, method="base", task="pooled").point == pytest.approx((0.5 + 0.5) / 2)
    # base's synchronous mean on b is 0.4: a small denominator, flagged (and so is its pool)
    assert row(found, method="base", task="b").verdict == "denominator below 0.5"
    assert row(found, method="base", task="pooled").verdict == "denominator below 0.5"
    assert row(found, method="m", task="a").verdict == ""


def test_difference_is_paired_by_seed_with_the_exact_sign_flip_test():
    found = estimands.difference(table(LAGGED), SPEC)
    a = row(found, task="a")
    assert a.point == pytest.approx(np.mean([0.5, 0.7, 0.3, 0.5])) and np.isnan(a.p_holm)
    pooled = row(found, task="pooled")       # per seed, the mean over tasks of m − base
    d = (np.array([0.5, 0.7, 0.3, 0.5]) + np.array([0.1, 0.2, 0.3, 0.2])) / 2
    assert pooled.point == pytest.approx(d.mean())
    assert pooled.p == pooled.p_holm == pytest.approx(2 / 16)    # every sign positive, n = 4
    low, high = scipy_stats.t.interval(0.95, 3, d.mean(), scipy_stats.sem(d))
    assert (pooled.low, pooled.high) == pytest.approx((low, high))
    assert pooled.verdict == "Holm p ≥ 0.05" and pooled.baseline == "base"


def test_the_robustness_estimand_is_positive_where_the_method_loses_less_than_the_baseline():
    found = estimands.change_difference(table(LAGGED), {**SPEC, "base": {"k": 0}})
    # a: m changes by (0, −0.1, 0.1, 0) and base by (−0.5, −0.6, −0.4, −0.5)
    assert row(found, task="a").point == pytest.approx(0.5)
    # b: m changes by (−0.6, −0.4, −0.5, −0.5), base by −0.2 each: m loses more
    assert row(found, task="b").point == pytest.approx(-0.3)
    assert row(found, task="pooled").point == pytest.approx(0.1)


def test_a_methods_own_change_is_paired_by_seed():
    spec = {k: v for k, v in SPEC.items() if k != "baseline"}   # a change needs no baseline
    found = estimands.change(table(LAGGED), {**spec, "base": {"k": 0}})
    # m on a: (1.0, 1.1, 0.9, 1.0) − (1.0, 1.2, 0.8, 1.0); base on b: 0.2 − 0.4 on every seed
    assert row(found, method="m", task="a").point == pytest.approx(0.0)
    assert row(found, method="base", task="b").point == pytest.approx(-0.2)
    pooled = row(found, method="base", task="pooled")
    assert pooled.point == pytest.approx((-0.5 - 0.2) / 2) and pooled.baseline == ""


def test_iqm_and_the_mean_of_task_iqms_are_rlibles_and_differ_when_tasks_spread_differently():
    runs = table({("a", "m", 8): [0.0, 1.0, 2.0, 3.0, 100.0, 4.0, 5.0, 6.0],
                  ("b", "m", 8): [10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0]})
    x = np.array([[0.0, 1, 2, 3, 100, 4, 5, 6], [10.0] * 8]).T     # [seeds, tasks]
    iqm = row(estimands.iqm(runs, SPEC), method="m")
    assert iqm.point == pytest.approx(rly_metrics.aggregate_iqm(x)) and iqm.seeds == 16
    per_task = row(estimands.task_iqm_mean(runs, SPEC), method="m")
    assert per_task.point == pytest.approx((np.mean([2, 3, 4, 5]) + 10) / 2)
    assert per_task.point != pytest.approx(iqm.point)
    assert per_task.low <= per_task.point <= per_task.high


def test_probability_of_improvement_is_rlibles():
    found = estimands.improvement(table(LAGGED), SPEC)
    x = np.array([LAGGED["a", "m", 8], LAGGED["b", "m", 8]]).T
    y = np.array([LAGGED["a", "base", 8], LAGGED["b", "base", 8]]).T
    expected = rly_metrics.probability_of_improvement(x, y)
    assert row(found, method="m").point == pytest.approx(expected) == 1.0


def test_split_half_reliability_is_the_rank_correlation_of_the_halves():
    same = {("a", m, 8): [v, v, v, v] for m, v in (("p", 1.0), ("q", 2.0), ("r", 3.0))}
    found = estimands.reliability(table(same), SPEC)
    assert row(found, estimand="reliability").point == pytest.approx(1.0)
    assert row(found, estimand="reliability_spearman_brown").point == pytest.approx(1.0)
    flipped = {("a", m, 8): [v, v, 4 - v, 4 - v] for m, v in (("p", 1.0), ("q", 2.0), ("r", 3.0))}
    assert row(estimands.reliability(table(flipped), SPEC),
               estimand="reliability").point == pytest.approx(-1.0)


def test_stability_of_verdicts_where_the_answer_is_known():
    rng = np.random.default_rng(0)
    values = {}
    for task in ("a", "b", "c"):
        noise = rng.normal(0, 0.01, 10)
        values[task, "base", 8] = list(1 + noise)
        values[task, "clear", 8] = list(2 + noise + rng.normal(0, 0.01, 10))
        values[task, "one_task", 8] = list(1 + noise + (50.0 if task == "a" else 0.0))
    found = estimands.stability(table(values), {**SPEC, "reps": 50})
    for method, loto in (("clear", 1.0), ("one_task", 2 / 3)):
        assert row(found, estimand="stability_bootstrap", method=method).point == 1.0
        # leaving out task a, the only one that differs, leaves every difference 0
        assert row(found, estimand="stability_leave_one_task_out",
                   method=method).point == pytest.approx(loto)
        assert row(found, estimand="stability_bootstrap",
                   method=method).verdict == "Holm p < 0.05, estimate > 0"


def test_argmax_picks_the_setting_with_the_highest_pooled_mean():
    runs = table({("a", "m", k): [v, v + 0.1] for k, v in ((0, 0.3), (2, 0.9), (8, 0.5))}
                 | {("b", "m", k): [v, v] for k, v in ((0, 0.3), (2, 0.4), (8, 0.6))})
    best = row(estimands.argmax(runs, {**SPEC, "at": {}, "over": "k"}), method="m")
    assert best.setting == "k=2" and best.point == pytest.approx((0.95 + 0.4) / 2)


def test_a_study_is_a_toml_file_of_estimand_specs():
    study = tomllib.loads('study = "s"\n[[estimands]]\nestimand = "mean"\nmetric = "auc"\n'
                          'at = {k = 8}\nreps = 200\n[[estimands]]\nestimand = "difference"\n'
                          'at = {k = 8}\nbaseline = "base"\n')
    found = estimands.estimate(table(LAGGED), study)
    assert list(found.columns) == list(estimands.ESTIMATES) and set(found["study"]) == {"s"}
    assert list(dict.fromkeys(found["estimand"])) == ["mean", "difference"]


def test_the_difference_estimand_reproduces_the_committed_v2_leaderboards_family():
    runs = schema.from_bench(pd.read_csv(V2 / "scores.csv"))
    spec = {"at": {"k": 8, "sampling": "oldest", "K": 4}, "baseline": "ppo_clip",
            "pre_registered": True}
    found = estimands.difference(runs, spec).query("task == 'pooled'").set_index("method")
    committed = pd.read_csv(V2 / "comparisons.csv").set_index("method")
    assert len(found) == len(committed) == 16
    for ours, theirs in (("point", "estimate"), ("low", "low"), ("high", "high"), ("p", "p"),
                         ("p_holm", "p_holm")):
        np.testing.assert_allclose(found[ours], committed.loc[found.index, theirs], rtol=1e-9)
    assert (found["verdict"] == committed.loc[found.index, "verdict"]).all()


# --- families -------------------------------------------------------------------------------------
def test_holm_against_a_hand_example_and_the_verdict_words():
    # sorted 0.01, 0.03, 0.04: × 3, × 2, × 1 → 0.03, 0.06, max(0.06, 0.04)
    np.testing.assert_allclose(families.stats.holm([0.01, 0.04, 0.03, np.nan]),
                               [0.03, 0.06, 0.06, np.nan])
    assert families.verdict(-0.2, 0.03, True) == "lower"
    assert families.verdict(0.2, 0.03, True) == "higher"
    assert families.verdict(0.2, 0.06, True) == "no difference shown"


def test_the_ancestry_check_needs_every_runs_commit_to_descend_from_the_registration():
    registration = "r" * 40
    descends = {("a" * 40, registration): True, ("b" * 40, registration): False}
    check_ = lambda commit, ancestor: descends.get((commit, ancestor))  # noqa: E731
    assert families.status(["a" * 40], registration, check_)[0] == "after"
    assert families.status(["a" * 40, "b" * 40], registration, check_)[0] == "before"
    assert families.status(["c" * 40], registration, check_)[0] == "unknown"
    assert families.status([], registration, check_)[0] == "unknown"


# --- reports, figures and the check ---------------------------------------------------------------
def test_headline_rows_are_picked_by_key_and_estimates_csv_reads_back(tmp_path):
    found = estimands.estimate(table(LAGGED), {"study": "s", "estimands": [
        {"estimand": "mean", "at": {"k": 8}, "reps": 200},
        {"estimand": "difference", "at": {"k": 8}, "baseline": "base"}]})
    back = report.read_csv(report.write_csv(found, tmp_path / "estimates.csv"))
    pd.testing.assert_frame_equal(back, found, check_dtype=False)
    pick = report.headline(back, study="s", estimand="difference", metric="auc", method="m",
                           setting="k=8")
    assert pick.point == pytest.approx(row(found, estimand="difference", task="pooled").point)
    with pytest.raises(KeyError, match="2 estimates rows match"):
        report.headline(back, study="s", estimand="mean", metric="auc", setting="k=8")
    text = report.render(back, "A study")
    assert "## difference of auc" in text
    assert ("| m | base | pooled | k=8 | 0.35 [0.24, 0.46] | 4 | 0.125 | 0.125 | Holm p ≥ 0.05 |"
            in text.splitlines())


def test_the_check_names_the_file_and_the_first_number_that_differs(tmp_path):
    found = estimands.mean(table(LAGGED), {**SPEC, "reps": 200})
    made = {"estimates.csv": found[list(estimands.ESTIMATES)].to_csv(index=False),
            "report.md": report.render(found, "A study")}
    for name, text in made.items():
        (tmp_path / name).write_text(text)
    assert check.check_files(tmp_path, made) == []
    point = repr(float(found["point"].iloc[0]))
    edited = made["estimates.csv"].replace(point, "0.123", 1)
    (tmp_path / "estimates.csv").write_text(edited)
    assert check.check_files(tmp_path, made) == [
        f"estimates.csv: row 1, column 'point': '0.123' committed, '{point}' made"]
    shown = report.interval(*found.loc[0, ["point", "low", "high"]])
    (tmp_path / "report.md").write_text(made["report.md"].replace(shown, "9" + shown, 1))
    assert check.check_files(tmp_path, made)[1].startswith("report.md: line ")
    close = made["estimates.csv"].replace(point, repr(float(point) * (1 + 1e-12)), 1)
    assert check.csv_difference(close, made["estimates.csv"]) is None


def test_the_line_figure_draws_each_methods_points_over_the_setting():
    found = estimands.mean(table(LAGGED), {**SPEC, "at": {}, "over": "k", "reps": 200})
    fig = figures.lines(found.query("task == 'pooled'"), "k")
    drawn = {line.get_label(): line.get_ydata() for line in fig.axes[0].get_lines()}
    assert drawn.keys() == {"base", "m"}
    np.testing.assert_allclose(drawn["base"], [0.7, 0.35])
    assert figures.setting_value("k=8, lr=0.0003", "lr") == 0.0003


def test_a_family_across_a_change_and_a_level_is_corrected_once_in_each_estimands_words():
    """Two estimands in one family: Holm's correction counts the pooled test of both (two tests,
    where each alone counts one), and each row keeps its own estimand's words."""
    change = {**SPEC, "estimand": "change_difference", "base": {"k": 0}, "pre_registered": True,
              "words": ["degrades less", "degrades more", "no difference shown"]}
    level = {**SPEC, "estimand": "difference", "pre_registered": True}
    alone = estimands.family_table(table(LAGGED), [level])
    both = estimands.family_table(table(LAGGED), [change, level])
    counted = both[both["p_holm"].notna()]
    assert len(counted) == 2 and set(counted["estimand"]) == {"change_difference", "difference"}
    p = counted["p"].to_numpy()
    assert counted["p_holm"].to_numpy() == pytest.approx(
        families.stats.holm(p))   # one correction over both estimands' rows
    assert row(alone, task="pooled").p_holm == pytest.approx(row(alone, task="pooled").p)
    assert set(counted["verdict"]) <= {"degrades less", "degrades more", "no difference shown",
                                       "higher", "lower"}
    assert row(counted, estimand="change_difference").verdict == "no difference shown"


def test_twenty_seeds_get_the_exact_sign_flip_test_and_an_interval_that_inverts_it():
    d = np.array([0.3, -0.1] * 4 + [0.2] * 12)          # 20 seeds
    exact = families.stats.sign_flip_test(d, exact=True)
    signs = ((np.arange(2 ** 20)[:, None] >> np.arange(20)) & 1) * 2 - 1
    by_hand = np.mean(np.abs(signs @ d) / 20 >= abs(d.mean()) - 1e-12)
    assert exact == pytest.approx(by_hand) and exact < 1e-3
    mean, low, high = families.stats.sign_flip_interval(d, exact=True)
    assert low < mean < high and low > 0           # p < 0.05 at 0: the interval excludes it
    assert families.stats.sign_flip_test(d - low, exact=True) >= 0.05
    assert families.stats.sign_flip_test(d - (low - 1e-3), exact=True) < 0.05
    table_ = families.family([{"method": "m", "differences": d}], exact=True,
                             interval="sign-flip")
    assert table_.iloc[0].p_sign_flip == exact and table_.iloc[0].low == pytest.approx(low)


def test_the_stability_of_a_joint_family_reads_each_estimands_verdict():
    rng = np.random.default_rng(1)
    values = {}
    for task in ("a", "b", "c"):
        noise = rng.normal(0, 0.01, 10)
        for k, drop in ((0, 0.0), (8, 0.5)):
            values[task, "base", k] = list(1 - drop + noise)
            values[task, "robust", k] = list(1 + noise + rng.normal(0, 0.01, 10))
    members = [{**SPEC, "estimand": "change_difference", "base": {"k": 0}},
               {**SPEC, "estimand": "difference"}]
    found = estimands.stability(table(values), {**SPEC, "reps": 20, "members": members})
    boot = found[found["estimand"] == "stability_bootstrap"]
    assert sorted(boot["setting"]) == ["change_difference: k=8", "difference: k=8"]
    assert (boot["point"] == 1.0).all()
    assert set(boot["verdict"]) == {"Holm p < 0.05, estimate > 0"}


def test_entries_with_the_same_runs_within_an_n_are_merged_and_the_baseline_keeps_its_name():
    rows = []
    for n in (1, 8):
        for method in ("pg", "ppo_clip", "vaco"):
            for k in (0, 4):
                for seed in range(3):
                    value = 0.4 + 0.01 * seed - 0.02 * (k > 0)
                    if n == 8 and method != "ppo_clip":   # at N = 8 each differs a little
                        value += 1e-3 * (1 + ("pg", "vaco").index(method)) * (seed + 1)
                    rows.append({"task": "llm", "method": method, "k": k, "N": n, "seed": seed,
                                 "final": value, "auc": value, "sampled": value / 2})
    runs = schema.conform(pd.DataFrame(rows), ("sampled",))
    kept, groups = schema.merge_identical(runs, ("N",), first=("ppo_clip",))
    assert groups == [((1,), ["ppo_clip", "pg", "vaco"])]
    assert sorted(kept.loc[kept.N == 1, "method"].unique()) == ["ppo_clip"]
    assert sorted(kept.loc[kept.N == 8, "method"].unique()) == ["pg", "ppo_clip", "vaco"]
    # One seed apart by more than the tolerance, in a free column only: not merged.
    runs.loc[(runs.method == "vaco") & (runs.N == 1) & (runs.seed == 2), "sampled"] *= 1.001
    _, groups = schema.merge_identical(runs, ("N",), first=("ppo_clip",))
    assert groups == [((1,), ["ppo_clip", "pg"])]
