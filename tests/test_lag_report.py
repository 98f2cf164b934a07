"""vaco_jax.study.lag and vaco-report: the controlled-lag study's analysis on synthetic
sweeps with known answers, the stratified BCa bootstrap against SciPy, references' `last_evals`."""

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from vaco_jax import io
from vaco_jax.errors import SweepError
from vaco_jax.pipeline import estimates
from vaco_jax.study import lag, presets, references, stats, sweep

# --- the stratified BCa bootstrap -----------------------------------------------------------------
RATIO_DATA = np.random.default_rng(3).normal([0.6, 1.0], [0.3, 0.2], size=(10, 2))


def _ratio(x, y, axis=-1):
    # Summed in sorted order: a resample that permutes the rows has the data's value to the last
    # bit, so SciPy counts it as a tie, as we count any value equal up to rounding.
    return np.sort(x, axis).mean(axis) / np.sort(y, axis).mean(axis)


def _scipy_bca(reps, seed):
    return scipy.stats.bootstrap(tuple(RATIO_DATA.T), _ratio, paired=True, vectorized=True,
                                 method="BCa", n_resamples=reps,
                                 rng=np.random.default_rng(seed)).confidence_interval


@pytest.mark.parametrize("vectorized", [True, False])
def test_bca_on_one_stratum_is_scipys_paired_bca(vectorized):
    statistic = ((lambda s: _ratio(s[0][..., 0], s[0][..., 1])) if vectorized
                 else (lambda s: _ratio(s[0][:, 0], s[0][:, 1])))
    # Same seed: SciPy draws its paired indices as Generator.integers(0, n, (reps, n)), as we do,
    # so the resamples are the same and only the order of float sums may differ.
    point, low, high = stats.stratified_bca([RATIO_DATA], statistic, reps=4000, seed=5,
                                            vectorized=vectorized)
    expected = _scipy_bca(4000, 5)
    assert point == pytest.approx(_ratio(*RATIO_DATA.T))
    np.testing.assert_allclose([low, high], [expected.low, expected.high], rtol=1e-10)
    # Independent resamples: 20,000 each put an endpoint's Monte Carlo standard error at ≈ 0.5% of
    # the interval's width (sd of a 2.5% quantile ≈ √(.025·.975/B)/φ(1.96)·σ ≈ 0.02σ; width 4σ),
    # so the two agree within 3% of the width (≈ 4 standard errors of their difference).
    point, low, high = stats.stratified_bca([RATIO_DATA], statistic if vectorized else
                                            (lambda s: _ratio(s[0][..., 0], s[0][..., 1])),
                                            reps=20_000, seed=11, vectorized=True)
    expected = _scipy_bca(20_000, 12)
    width = expected.high - expected.low
    assert abs(low - expected.low) < 0.03 * width and abs(high - expected.high) < 0.03 * width


def test_bca_resamples_within_each_stratum_and_covers_the_mean():
    # Rows never move between strata: stratum 1 is all ones in every resample.
    boot = stats.stratified_bootstrap([np.zeros(5), np.ones(7)], lambda s: s[1].mean(-1),
                                      reps=200, vectorized=True)
    assert np.all(boot.distribution == 1.0) and boot.interval(0.95) == (1.0, 1.0)
    # Coverage of the mean over two strata of skewed data (true value 1.5): BCa's 95% interval
    # with 12 and 8 seeds should cover it in ≈ 90–95% of 300 data sets (± 2.5% standard error).
    rng = np.random.default_rng(0)
    covered = 0
    for trial in range(300):
        strata = [rng.exponential(1.0, 12), rng.exponential(2.0, 8)]
        _, low, high = stats.stratified_bca(
            strata, lambda s: (s[0].mean(-1) + s[1].mean(-1)) / 2, reps=1000, seed=trial,
            vectorized=True)
        covered += low <= 1.5 <= high
    assert 0.85 <= covered / 300 <= 0.99


# --- references measured by another rule are refused ----------------------------------------------
def test_references_must_average_the_same_number_of_evaluations():
    results = pd.DataFrame({"env": ["a"], "budget": [10], "eval_return": [5.0]})
    old = {"schema_version": 1, "entries": [
        {"env": "a", "budget": 10, "random_return": 0.0, "ppo_sync_return": 10.0, "preset": "p"}]}
    assert references.add_scores(results, old)["score"].tolist() == [0.5]   # as before
    with pytest.raises(ValueError, match=r"averages the last 1 evaluation.*last 3.*--last-evals 3"):
        references.add_scores(results, old, last_evals=3)
    new = {**old, "entries": [{**old["entries"][0], "last_evals": 3}]}
    assert references.add_scores(results, new, last_evals=3)["score"].tolist() == [0.5]
    with pytest.raises(ValueError, match=r"averages the last 3 evaluation.*last 1"):
        references.lookup(new, "a", 10)


def test_reference_measurement_averages_each_seeds_last_evaluations(monkeypatch):
    preset = presets.PRESETS["lag-tiny"]                      # 4 evaluations per run

    def run_cell(cell):   # seed 10000 returns 0, 1, 2, 3; seed 10001 returns 10, 11, 12, 13
        rows = [{"seed": run.seed, "eval_index": e, "eval_return": 10.0 * i + e}
                for e in range(cell.config.num_evals) for i, run in enumerate(cell.runs)]
        return rows, {"wall_seconds": 0.0}

    monkeypatch.setattr(references.sweep, "run_cell", run_cell)
    monkeypatch.setattr(references, "random_policy_return", lambda *a, **k: (-5.0, 0.1))
    entry = references.measure(preset, "toy_reach", num_seeds=2, last_evals=3, log=lambda _: None)
    assert entry["last_evals"] == 3 and entry["ppo_sync_final_returns"] == [2.0, 12.0]
    assert entry["ppo_sync_return"] == 7.0
    old = references.measure(preset, "toy_reach", num_seeds=2, log=lambda _: None)
    assert old["last_evals"] == 1 and old["ppo_sync_final_returns"] == [3.0, 13.0]   # as before
    with pytest.raises(ValueError, match="last_evals = 5 is invalid"):
        references.measure(preset, "toy_reach", num_seeds=2, last_evals=5)


# --- a synthetic lag study ------------------------------------------------------------------------
TASKS = {"task_a": (0.0, 100.0), "task_b": (-50.0, 50.0)}    # random, sync PPO-Clip returns
BUDGET, EVALS, SEEDS = 4095, 5, tuple(range(100, 106))   # evaluations every 819 steps
CAPACITIES = (1, 2, 4, 8, 16)
# Method → normalised final score per constant lag k: PPO-Clip keeps its score until k = 3 and
# halves from k = 7; VACO keeps it; IMPALA (one epoch: its row, named `impala`) fails at k = 0
# (below random).
LEVELS = {("vaco", "oldest"): {0: 0.9, 1: 0.9, 3: 0.9, 7: 0.9, 15: 0.9},
          ("ppo_clip", "oldest"): {0: 1.0, 1: 1.0, 3: 1.0, 7: 0.5, 15: 0.5},
          ("impala", "epochs=1,oldest"): {0: -0.1, 1: -0.1, 3: -0.1, 7: -0.1, 15: -0.1}}
UNIFORM_LEVEL = 0.7
DIVERGED = ("task_b", "vaco", 4, 103)        # task, algo, capacity, seed: diverges at eval 3
SOURCE = "5ca1ab1e5ca1ab1e"


def _rows(task, algo, variant, capacity, seed, level, rng):
    random, sync = {**TASKS, "task_c": (0.0, 10.0)}[task]
    seed_effect = 0.05 * (seed - 102.5)               # shared by every lag and method: CRN
    rows = []
    for e in range(EVALS):
        ramp = min(1.0, (e + 1) / 2)                  # learns in 2 evaluations, then flat
        score = level * ramp + seed_effect + 0.01 * rng.normal()
        diverged = (task, algo, capacity, seed) == DIVERGED and e >= 3
        sampling = variant.rpartition(",")[2]
        rows.append({
            "cell": f"lag/{task}/{algo}/{variant}", "study": "lag", "env": task, "algo": algo,
            "variant": variant, "capacity": capacity, "delta": 0.2, "seed": seed, "eval_index": e,
            "step": (e + 1) * BUDGET // EVALS, "iteration": e + 1, "budget": BUDGET,
            "snapshot_sampling": sampling, "sgd_steps_per_iteration": 32, "diverged": diverged,
            "eval_return": np.nan if diverged else random + (sync - random) * score,
            "snapshot_age": np.nan if diverged else (
                (capacity - 1) * min(1.0, (e + 1) / 2) if sampling == "oldest" else 7.5),
            "behavior_tv": np.nan if diverged else 0.01 * capacity,
            "clip_fraction": 0.1, "filtered_fraction": np.nan})
    return rows


def _write_sweep(directory, task, *, source=SOURCE, skip=()):
    """A finished lag sweep of one task written by hand, as `sweep.run_sweep` would have; the
    programs in `skip` are planned but not finished."""
    rng = np.random.default_rng(len(task))
    programs = [(algo, variant, CAPACITIES) for algo, variant in
                [("vaco", "oldest"), ("ppo_clip", "oldest"), ("impala", "epochs=1,oldest"),
                 ("spo", "oldest")]] + [("vaco", "uniform", (16,)), ("ppo_clip", "uniform", (16,))]
    rows, records, plan = [], [], {}
    for algo, variant, capacities in programs:
        cell = f"lag/{task}/{algo}/{variant}"
        plan[cell] = {"fingerprint": cell, "study": "lag", "env": task, "algo": algo,
                      "variant": variant,
                      "config": {"snapshot_sampling": variant.rpartition(",")[2]},
                      "runs": [{"capacity": c, "delta": 0.2, "seed": s}
                               for c in capacities for s in SEEDS]}
        if (algo, variant) in skip:
            continue
        levels = LEVELS.get((algo, variant), {})
        for capacity in capacities:
            level = UNIFORM_LEVEL if variant == "uniform" else levels[capacity - 1]
            for seed in SEEDS:
                rows += _rows(task, algo, variant, capacity, seed, level, rng)
        records.append({"cell": cell, "fingerprint": cell, "runs": len(capacities) * len(SEEDS),
                        "env_steps_per_run": BUDGET, "source": source, "git_commit": "c0ffee" * 6})
    io.append_jsonl(directory / sweep.RESULTS, rows)
    io.append_jsonl(directory / sweep.CELLS, records)
    preset = {"name": "lag-synthetic", "envs": [task], "capacities": list(CAPACITIES),
              "algos": ["vaco", "ppo_clip", "impala", "spo"], "studies": ["lag"]}
    io.write_json_atomic(directory / sweep.PLAN, {"preset": preset, "cells": plan,
                                                  "source": source})
    return directory


def _references(path, last_evals=lag.FINAL_EVALS):
    entries = [{"preset": "lag-synthetic", "env": task, "budget": BUDGET, "random_return": random,
                "ppo_sync_return": sync, "last_evals": last_evals,
                "ppo_sync_seeds": [10_000, 10_001, 10_002]}
               for task, (random, sync) in TASKS.items()]
    io.write_json_atomic(path, {"schema_version": references.SCHEMA_VERSION, "entries": entries})
    return path


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp("lag")
    sweeps = [_write_sweep(root / "a", "task_a", skip=[("spo", "oldest")]),
              _write_sweep(root / "b", "task_b", skip=[("spo", "oldest")])]
    refs = _references(root / "refs.json")
    study = lag.load_study(sweeps)
    return sweeps, refs, study, lag.analyse(study, references.load(refs), reps=1000)


def _one(frame, **where):
    rows = frame
    for column, value in where.items():
        rows = rows[rows[column] == value]
    assert len(rows) == 1, where
    return rows.iloc[0]


def test_a_score_is_the_mean_of_the_last_three_evaluations_and_a_diverged_run_scores_0(synthetic):
    _, _, study, report = synthetic
    runs = report.runs
    assert len(runs) == 2 * 3 * 5 * len(SEEDS) + 2 * 2 * len(SEEDS)   # nothing dropped
    raw = study.results
    run = raw[(raw["env"] == "task_a") & (raw["method"] == "ppo_clip") & (raw["capacity"] == 8)
              & (raw["seed"] == 101)].sort_values("eval_index")
    expected = (run["eval_return"].iloc[-3:].mean() - 0.0) / (100.0 - 0.0)
    assert _one(runs, env="task_a", method="ppo_clip", capacity=8, seed=101,
                sampling="oldest")["score"] == pytest.approx(expected)
    bad = _one(runs, env="task_b", method="vaco", capacity=4, seed=103)
    assert bad["diverged"] and bad["score"] == 0.0
    assert bad["diverged_at_step"] == 4 * BUDGET // EVALS
    # Its AUC counts evaluations 0–2 and 0 from the divergence on.
    curve = study.results[(study.results["env"] == "task_b") & (study.results["method"] == "vaco")
                          & (study.results["capacity"] == 4) & (study.results["seed"] == 103)]
    assert bad["auc"] == pytest.approx(((curve["eval_return"].iloc[:3] + 50) / 100).sum() / EVALS)
    assert report.diverged[["task", "method", "lag", "seed"]].to_dict("records") == [
        {"task": "task_b", "method": "vaco", "lag": "k=3", "seed": 103}]
    assert _one(report.scores, task="task_b", method="vaco", lag="k=3")["seeds"] == len(SEEDS)


def test_degradation_break_lag_and_interaction_have_the_known_answers(synthetic):
    _, _, _, report = synthetic
    d = report.degradation
    for task in ("task_a", "task_b", lag.POOLED):
        halved = _one(d, task=task, method="ppo_clip", lag="k=7")
        assert halved["degradation"] == pytest.approx(0.5, abs=0.01)
        assert halved["low"] <= halved["degradation"] <= halved["high"] < 0.8
        assert _one(d, task=task, method="ppo_clip", lag="k=3")["degradation"] == pytest.approx(
            1.0, abs=0.02)
        assert _one(d, task=task, method="vaco", lag="uniform C=16")["degradation"] == \
            pytest.approx(0.7 / 0.9, abs=0.02)
    # The diverged run counts as 0: degradation at k=3 is the mean with it over the mean at k=0.
    runs = report.runs[(report.runs["env"] == "task_b") & (report.runs["method"] == "vaco")]
    by_lag = runs[runs["sampling"] == "oldest"].groupby("capacity")["score"].mean()
    assert _one(d, task="task_b", method="vaco", lag="k=3")["degradation"] == pytest.approx(
        by_lag[4] / by_lag[1])
    assert by_lag[4] / by_lag[1] == pytest.approx(5 / 6, abs=0.02)
    pooled = _one(d, task=lag.POOLED, method="vaco", lag="k=3")
    assert pooled["degradation"] == pytest.approx(np.mean(
        [_one(d, task=t, method="vaco", lag="k=3")["degradation"] for t in TASKS]))
    # A synchronous score below random leaves the ratio undefined, never a number.
    assert np.isnan(_one(d, task="task_a", method="impala", lag="k=7")["degradation"])

    b = report.break_lag
    assert _one(b, task="task_a", method="ppo_clip")[["break_lag", "confidently_broken"]].tolist() \
        == ["7", "7"]
    assert _one(b, task=lag.POOLED, method="vaco")["break_lag"] == "none"

    i = report.interaction
    m = len(i)
    assert m == 3 * 2 * 4 and set(i["family_size"]) == {m}   # (2 tasks + pooled) × 2 baselines × 4
    assert set(i["reps"]) == {lag.family_reps(1000, m)}
    at7 = _one(i, task=lag.POOLED, baseline="ppo_clip", lag="k=7")
    assert at7["interaction"] == pytest.approx(0.5, abs=0.02)
    assert 0 < at7["simultaneous_low"] <= at7["low"] <= at7["interaction"] <= at7["high"] \
        <= at7["simultaneous_high"]
    at1 = _one(i, task="task_a", baseline="ppo_clip", lag="k=1")
    assert abs(at1["interaction"]) < 0.03 and at1["simultaneous_low"] < 0 < at1["simultaneous_high"]


def test_degradation_is_the_pipelines_retention_and_the_sanity_interval_the_score_tables(
        synthetic):
    # score(k)/score(0) is `estimates.retention` of the report's runs, and the sanity check's
    # interval at k = 0 is the score table's there: one estimate, not a second bootstrap.
    _, _, _, report = synthetic
    runs = report.runs.rename(columns={"env": "task"})
    base = {"method": "ppo_clip", "sampling": "oldest", "capacity": 1}
    expected = estimates.retention(runs, "score", base, {**base, "capacity": 8},
                                   reps=1000).set_index("task")
    d = report.degradation
    d = d[(d["method"] == "ppo_clip") & (d["lag"] == "k=7")].set_index("task")
    assert list(d.index) == [*TASKS, lag.POOLED]
    for ours, theirs in (("degradation", "retention"), ("low", "low"), ("high", "high")):
        np.testing.assert_allclose(d[ours], expected.loc[d.index, theirs], rtol=1e-12)
    sync = report.scores[report.scores["lag"] == "k=0"].set_index(["task", "method"])
    for row in report.sanity.itertuples():
        assert (row.score, row.low, row.high) == tuple(sync.loc[(row.task, row.method),
                                                                ["mean", "low", "high"]])


def test_sanity_realised_lag_and_missing_cells(synthetic):
    sweeps, _, _, report = synthetic
    s = report.sanity
    ppo = _one(s, task="task_a", method="ppo_clip")
    assert ppo["clears_random"] and ppo["reaches_fraction"] and ppo["fails"] == ""
    assert (ppo["random_return"], ppo["sync_return"]) == (0.0, 100.0)
    failing = _one(s, task="task_b", method="impala")
    assert not failing["clears_random"] and "does not clear random" in failing["fails"]
    # Realised age: C − 1 once the buffer has filled (here after the first of 5 evaluations).
    r = report.realised_lag
    row = _one(r, task="task_a", method="vaco", lag="k=7")
    assert row["snapshot_age"] == pytest.approx(7 * (0.5 + 4) / 5)
    assert row["snapshot_age_sgd_steps"] == pytest.approx(32 * row["snapshot_age"])
    assert _one(r, task="task_a", method="vaco", lag="uniform C=16")["snapshot_age"] == 7.5
    missing = report.missing
    assert set(zip(missing["task"], missing["method"])) == {
        (t, m) for t in TASKS for m in ("spo", "impala [epochs=4]", "impala")}
    assert _one(missing, task="task_a", method="impala")["lags"] == "uniform C=16"
    spo = missing[(missing["task"] == "task_a") & (missing["method"] == "spo")]
    assert spo[["lags", "status"]].to_dict("records") == [
        {"lags": "k=0, k=1, k=3, k=7, k=15", "status": f"planned in {sweeps[0]}, not finished"},
        {"lags": "uniform C=16", "status": "not run"}]
    assert _one(missing, task="task_b", method="impala [epochs=4]")["status"] == "not run"


def test_cells_of_other_code_are_refused_unless_allowed(synthetic, tmp_path):
    sweeps, _, _, _ = synthetic
    other = _write_sweep(tmp_path / "other", "task_c", source="0123456789abcdef",
                         skip=[("spo", "oldest")])
    with pytest.raises(SweepError, match=r"different vaco_jax source: .*0123456789abcdef"):
        lag.load_study([*sweeps, other])
    assert len(lag.load_study([*sweeps, other], allow_code_change=True).results)
    with pytest.raises(SweepError, match="more than one sweep directory"):
        lag.load_study([sweeps[0], sweeps[0]])


def test_cli_writes_figures_tables_and_summary(synthetic, tmp_path, capsys):
    from vaco_jax.commands import report as report_command

    sweeps, refs, _, _ = synthetic
    out = tmp_path / "report"
    args = ["--sweeps", *map(str, sweeps), "--out", str(out), "--reps", "300"]
    assert report_command.main([*args, "--references", str(refs)]) == 0
    for name in ("fig_a_score_vs_lag.png", "fig_b_sync_curves.png", "fig_c_degradation.png",
                 "fig_d_auc_retention.png"):
        assert (out / name).stat().st_size > 10_000
    for name in ("degradation", "interaction", "break_lag", "sanity", "realised_lag", "missing",
                 "auc_retention", "primary"):
        assert len(pd.read_csv(out / f"{name}.csv")) > 0
    summary = (out / "summary.md").read_text()
    for heading in ("## Provenance", "## Missing cells", "## Diverged runs", "## Sanity check",
                    "## Degradation", "## Break lag", "## VACO's degradation minus",
                    "## Realised lag", "## AUC retention",
                    "## The pre-registered tests, computed on these results (exploratory: not "
                    "known to follow the pre-registration)"):
        assert heading in summary
    assert "## Pre-registered tests" not in summary
    assert "| p (sign-flip) | what it shows (exploratory) |" in summary
    assert "at most 4 methods to a panel" in summary
    assert "the references (VACO, PPO-Clip, APPO) — vaco, ppo_clip" in summary
    assert "m = 24 comparisons" in summary and SOURCE in summary and "100–105" in summary
    assert "| task_b | vaco | k=3 | 103 |" in summary
    assert "| task_a | impala †" in summary
    # References measured by the final evaluation only are refused, naming both rules.
    one = _references(tmp_path / "r1.json", last_evals=1)
    assert report_command.main([*args, "--references", str(one)]) == 2
    assert "averages the last 1 evaluation(s)" in capsys.readouterr().err


def test_a_non_finite_evaluation_return_fails_the_run_from_that_evaluation_on():
    # Physics that blows up during an evaluation (not in training: the run is not marked
    # diverged) gives a NaN return; the run then fails like a diverged one instead of carrying
    # a NaN score into every mean.
    rows = _rows("task_a", "vaco", "oldest", 2, 100, 0.9, np.random.default_rng(0))
    rows += _rows("task_a", "vaco", "oldest", 2, 101, 0.9, np.random.default_rng(1))
    rows[2]["eval_return"] = np.nan                   # seed 100, evaluation 2 of 5
    results = lag.with_columns(pd.DataFrame(rows).sample(frac=1.0, random_state=0))
    failed = results.sort_values(["seed", "eval_index"])["diverged"].tolist()
    assert failed == [False, False, True, True, True] + [False] * 5


def test_the_pre_registered_family_is_tested_by_hand():
    """primary.csv: paired t-tests with Holm over the family, the sign-flip test beside, tasks
    with fewer than 10 seeds left out, "holds" by the retention interval."""
    import numpy as np
    import pandas as pd
    from scipy import stats as scipy_stats

    from vaco_jax.study import lag, stats

    rng = np.random.default_rng(0)
    rows = []
    shift = {"vaco": 0.3, "ppo_clip": 0.0, "appo": 0.25}
    for env, seeds in (("a", 10), ("b", 10), ("c", 5)):
        for method, offset in shift.items():
            noise = rng.normal(0, 0.1, seeds)
            for s in range(seeds):
                for capacity in (1, 16):
                    value = 1.0 + (offset + noise[s] if capacity == 16 else 0.0)
                    rows.append({"env": env, "method": method, "sampling": "oldest",
                                 "capacity": capacity, "seed": s, "score": value,
                                 "auc": value / 2})
    runs = pd.DataFrame(rows)
    degradation = pd.DataFrame([
        {"task": "a", "method": "vaco", "sampling": "oldest", "capacity": 16, "degradation": 0.95,
         "low": 0.85, "high": 1.0, "seeds": 10},
        {"task": "a", "method": "ppo_clip", "sampling": "oldest", "capacity": 16,
         "degradation": 0.7, "low": 0.6, "high": 0.79, "seeds": 10},
        {"task": "c", "method": "appo", "sampling": "oldest", "capacity": 16, "degradation": 0.9,
         "low": 0.85, "high": 0.95, "seeds": 5},
    ])
    table = lag.primary_table(runs, degradation, target=lag.TARGET)
    family = table[table["family"]]
    # 2 baselines × 2 metrics × (tasks a, b, pooled); task c (5 seeds) is reported, left out.
    assert len(family) == 12
    assert set(table[table.task == "c"]["verdict"]) == {"left out (fewer than 10 seeds)"}
    row = family[(family.comparison == "vaco − ppo_clip") & (family.task == "a")
                 & (family.metric == "final score")].iloc[0]
    d = runs[(runs.env == "a") & (runs.capacity == 16) & (runs.method == "vaco")].score.to_numpy() \
        - runs[(runs.env == "a") & (runs.capacity == 16) & (runs.method == "ppo_clip")].score.to_numpy()
    assert row.estimate == pytest.approx(d.mean()) and row.seeds == 10
    assert row.p == pytest.approx(scipy_stats.ttest_1samp(d, 0.0).pvalue)
    assert row.p_sign_flip == pytest.approx(stats.sign_flip_test(d))
    np.testing.assert_allclose(family.p_holm, stats.holm(family.p.to_numpy()))
    assert row.verdict == "higher"   # +0.3 against noise of 0.1 per seed
    pooled = family[(family.task == lag.POOLED) & (family.comparison == "vaco − appo")].iloc[0]
    assert pooled.seeds == 10
    holds = table[table.test.str.startswith("non-inferiority")].set_index(["comparison", "task"])
    assert holds.loc[("vaco retention", "a"), "verdict"] == "holds"
    assert holds.loc[("ppo_clip retention", "a"), "verdict"] == "breaks"
    assert holds.loc[("appo retention", "c"), "verdict"] == "left out (fewer than 10 seeds)"
    assert set(table["analysis"]) == {"pre-registered"}
    # On results made before the tests were written: the same numbers, no verdict.
    exploratory = lag.primary_table(runs, degradation, target=lag.TARGET, pre_registered=False)
    assert set(exploratory["analysis"]) == {"exploratory"}
    pd.testing.assert_frame_equal(exploratory.drop(columns=["verdict", "analysis"]),
                                  table.drop(columns=["verdict", "analysis"]))
    said = dict(zip(zip(exploratory.comparison, exploratory.task, exploratory.metric),
                    exploratory.verdict))
    assert said[("vaco − ppo_clip", "a", "final score")] == "Holm p < 0.05, estimate > 0"
    assert said[("vaco retention", "a", "final score retention")] == "95% CI above 0.8"
    assert said[("ppo_clip retention", "a", "final score retention")] == "95% CI below 0.8"
    assert said[("appo retention", "c", "final score retention")] == \
        "left out (fewer than 10 seeds)"


def test_the_method_under_study_is_a_parameter_of_the_statistics():
    """The study declares its target (VACO); the tables compare whichever method they are given
    with the baselines, and swapping target and baseline negates the interaction."""
    import numpy as np
    import pandas as pd

    from vaco_jax.study import lag

    rng = np.random.default_rng(1)
    rows = [{"env": env, "method": method, "sampling": "oldest", "capacity": capacity, "seed": s,
             "score": 1.0 - (drop + rng.normal(0, 0.05) if capacity == 8 else 0.0),
             "auc": 0.5}
            for env in ("a", "b") for method, drop in (("vaco", 0.1), ("ppo_clip", 0.4),
                                                       ("appo", 0.2))
            for capacity in (1, 8) for s in range(10)]
    runs = pd.DataFrame(rows)
    assert lag.TARGET == "vaco"
    table = lag.primary_table(runs, pd.DataFrame(columns=["task", "method", "sampling",
                                                          "capacity"]), target="appo")
    assert set(table["comparison"]) == {"appo − ppo_clip"}   # the target is no baseline of its own
    ours = lag.interaction_table(runs, "vaco", reps=100).set_index(["task", "baseline", "capacity"])
    theirs = lag.interaction_table(runs, "ppo_clip", reps=100).set_index(
        ["task", "baseline", "capacity"])
    assert theirs.loc[("a", "vaco", 8), "interaction"] == pytest.approx(
        -ours.loc[("a", "ppo_clip", 8), "interaction"])


# --- the figures ----------------------------------------------------------------------------------
def _figure_tables():
    """Hand-made score and retention tables: two tasks and pooled, the three references, five
    methods whose pooled retention at k = 15 is 0.5 (one of them, spo, run on task_a only) and
    one at 0.9."""
    kept = {"vaco": 1.0, "ppo_clip": 1.0, "appo": 1.0, "ppo_kl": 0.5, "spo": 0.5,
            "decoupled_ppo": 0.5, "impala": 0.5, "impala [epochs=4]": 0.5,
            "ppo_kl [kl_adaptive]": 0.9}
    scores, retention = [], []
    for method, level in kept.items():
        tasks = ["task_a"] if method == "spo" else ["task_a", "task_b"]
        for task in [*tasks, lag.POOLED]:
            for sampling, capacity in [("oldest", c) for c in CAPACITIES] + [("uniform", 16)]:
                value = 1.0 if capacity == 1 else level
                cell = {"task": task, "method": method, "sampling": sampling,
                        "capacity": capacity, "tasks": len(tasks) if task == lag.POOLED else 1}
                scores.append({**cell, "mean": value, "low": value - 0.1, "high": value + 0.1,
                               "snapshot_age": 7.5 if sampling == "uniform" else capacity - 1})
                if (sampling, capacity) != lag.SYNC:
                    retention.append({**cell, "degradation": value, "low": value - 0.1,
                                      "high": value + 0.1})
    return pd.DataFrame(scores), pd.DataFrame(retention)


def _panels(fig):
    """(panel, the methods it draws) per panel (its lines tagged with their method, the panel
    with its task), row by row."""
    return [(ax, {line.get_gid() for line in ax.get_lines() if line.get_gid()})
            for ax in fig.axes if ax.axison]


def test_figures_put_at_most_four_methods_in_a_panel_and_mark_what_pools_fewer_tasks():
    import matplotlib.pyplot as plt

    scores, retention = _figure_tables()
    groups = lag.lag_method_groups(scores["method"].unique(), retention)
    assert [members for _, members in groups] == [
        ["vaco", "ppo_clip", "appo"],
        ["ppo_kl", "decoupled_ppo", "spo", "impala"], ["impala [epochs=4]"],   # five: 4 + 1
        ["ppo_kl [kl_adaptive]"]]
    assert "below 0.8" in groups[1][0] and groups[1][0].endswith("(1 of 2)")
    assert "ppo_kl, decoupled_ppo, spo, impala" in lag.lag_rule_caption(groups)
    figures = {"score": lag.lag_score_figure(scores, groups),
               "retention": lag.lag_retention_figure(retention, scores, groups),
               "auc": lag.lag_retention_figure(retention, scores, groups, auc=True)}
    colours = {}
    for name, fig in figures.items():
        panels = _panels(fig)
        assert len(panels) == len(groups) * 3                  # task_a, task_b, pooled per row
        for (ax, methods), (_, members) in zip(panels, [g for g in groups for _ in range(3)]):
            assert len(methods) <= lag.LAG_PER_PANEL
            assert methods <= set(members)
            for line in ax.get_lines():
                if line.get_gid():                         # one colour per method, everywhere
                    assert colours.setdefault(line.get_gid(), line.get_color()) == \
                        line.get_color()
        pooled = [(ax, ms) for ax, ms in panels if ax.get_gid() == lag.POOLED]
        assert len(pooled) == len(groups)
        hollow = {line.get_gid() for ax, _ in pooled for line in ax.get_lines()
                  if line.get_gid() and line.get_markerfacecolor() == "none"}
        assert hollow == {"spo"}                            # pooled over 1 of 2 tasks
        others = {line.get_gid() for ax, _ in panels if ax not in dict(pooled)
                  for line in ax.get_lines() if line.get_markerfacecolor() == "none"}
        assert others == set()
        texts = [t.get_text() for t in fig.texts]
        assert any("spo: 1 of 2 tasks" in t for t in texts)
        assert any(t.get_text() == "not run: spo" for ax, _ in panels for t in ax.texts)
        plt.close(fig)
    ylabels = {ax.get_ylabel() for ax in figures["auc"].axes if ax.get_ylabel()}
    assert ylabels == {"AUC(k) / AUC(0)"}
    assert figures["auc"].get_suptitle().startswith("AUC retention vs constant lag")
    # Without a method missing a task, nothing is marked.
    full = scores[scores["method"] != "spo"]
    fig = lag.lag_score_figure(full, lag.lag_method_groups(
        full["method"].unique(), retention[retention["method"] != "spo"]))
    assert not [line for ax in fig.axes for line in ax.get_lines()
                if line.get_markerfacecolor() == "none"]
    plt.close(fig)


def test_results_made_before_the_pre_registration_are_exploratory(synthetic, monkeypatch):
    _, _, study, report = synthetic
    # The synthetic cells' commit (c0ffee…) is in no git history: nothing is pre-registered.
    assert report.pre_registration == "unknown"
    assert "cannot be checked" in report.pre_registration_detail
    assert set(report.primary["analysis"]) == {"exploratory"}
    assert not set(report.primary["verdict"]) & {"holds", "breaks", "undetermined", "higher",
                                                 "lower", "no difference shown"}
    monkeypatch.setattr(lag, "git_descends_from", lambda commit, ancestor: False)
    assert lag.pre_registration(study.cells) == (
        "before", f"made at c0ffeec, before the pre-registration ({lag.PRE_REGISTRATION[:7]})")
    monkeypatch.setattr(lag, "git_descends_from", lambda commit, ancestor: True)
    assert lag.pre_registration(study.cells)[0] == "after"
    assert lag.pre_registration(study.cells.drop(columns="git_commit"))[0] == "unknown"



def test_git_tells_which_commit_came_first():
    made, registered = "b62c8ce6a82dd4f59388b5175be8f9193d59e348", lag.PRE_REGISTRATION
    if lag.git_descends_from(registered, registered) is None:
        pytest.skip("no git history of vaco_jax here")
    assert lag.git_descends_from(registered, made) is True     # the lag study, then the tests
    assert lag.git_descends_from(made, registered) is False
    assert lag.git_descends_from("c0ffee" * 6 + "c0ff", registered) is None
