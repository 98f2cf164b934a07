"""A study as one TOML file (`vaco_jax.analysis.study`, `studies/*.toml`): the v2 leaderboard's
family reproduced from its file, verdict words only for runs made after the registration, the
committed estimates and reports current, `vaco-report --study-file`; each study file's row of
RESULTS.md and the README's results table, and `vaco-report --all --check` of its files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vaco_jax.analysis import families, study
from vaco_jax.commands import report as report_command

ROOT = Path(__file__).resolve().parent.parent
LEVEL = ROOT / "studies" / "leaderboard-v2-level.toml"
ROBUSTNESS = ROOT / "studies" / "leaderboard-v2-robustness.toml"
V2 = ROOT / "results" / "lag-bench" / "cpu-v2"


@pytest.fixture(scope="module")
def level():
    return study.load(LEVEL, root=ROOT)


def test_the_level_study_file_reproduces_the_committed_v2_family(level):
    if families.descends_from(level.family["registration"], level.family["registration"]) is None:
        pytest.skip("this checkout's git history cannot check the runs' ancestry")
    found, words = study.estimate(level, ROOT)
    assert words.startswith("pre-registered: made at 0a5f72c, after the pre-registration (a5f50b2)")
    pooled = found.query("task == 'pooled'").set_index("method")
    committed = pd.read_csv(V2 / "comparisons.csv").set_index("method")
    assert sorted(pooled.index) == sorted(committed.index) and len(pooled) == 16
    for ours, theirs in (("point", "estimate"), ("low", "low"), ("high", "high"), ("p", "p"),
                         ("p_holm", "p_holm")):
        np.testing.assert_allclose(pooled[ours], committed.loc[pooled.index, theirs], rtol=1e-9,
                                   atol=1e-12)
    assert (pooled["verdict"] == committed.loc[pooled.index, "verdict"]).all()
    assert set(pooled["baseline"]) == {"ppo_clip"} and set(pooled["seeds"]) == {10}


def test_verdict_words_only_for_runs_made_after_the_registration_and_the_whole_family(level):
    found, words = study.estimate(level, ROOT, descends=lambda commit, ancestor: False)
    assert words.startswith("exploratory: made at 0a5f72c, before the pre-registration (a5f50b2)")
    pooled = found.query("task == 'pooled'")
    assert not pooled["verdict"].isin(families.WORDS).any()
    assert set(pooled["verdict"]) <= {"Holm p ≥ 0.05", "Holm p < 0.05, estimate < 0",
                                      "Holm p < 0.05, estimate > 0"}
    fewer = dataclasses.replace(level, family={**level.family, "size": 15})
    found, words = study.estimate(fewer, ROOT, descends=lambda commit, ancestor: True)
    assert "16 tests here where the registration names 15" in words
    assert not found["verdict"].isin(families.WORDS).any()


def test_the_committed_study_files_are_current_and_a_changed_study_is_not(level):
    for path in (LEVEL, ROBUSTNESS):
        assert study.check_study(study.load(path, root=ROOT), ROOT) == []
    t_test = dataclasses.replace(level, estimands=[{**level.estimands[0], "test": "t"}])
    stale = study.check_study(t_test, ROOT)
    assert stale[0].startswith("results/studies/leaderboard-v2-level/estimates.csv: row 1, "
                               "column 'p': ")
    assert stale[1].startswith("results/studies/leaderboard-v2-level/report.md: line ")


def test_the_second_study_is_one_file_labelled_exploratory():
    robustness = study.load(ROBUSTNESS, root=ROOT)
    assert robustness.family is None and robustness.path == Path("studies") / ROBUSTNESS.name
    text = (ROOT / robustness.output / "report.md").read_text()
    assert "Tests: exploratory, not pre-registered: chosen after the v2 leaderboard's runs" in text
    estimates = pd.read_csv(ROOT / robustness.output / "estimates.csv")
    assert set(estimates["estimand"]) == {"change_difference"}
    assert not estimates["verdict"].isin(families.WORDS).any()


@pytest.mark.parametrize("text, problem", [
    ('study = "s"\nquestion = "q"\nexploratory = "x"\nrun = {}\n', "unknown keys ['run']"),
    ('study = "s"\nquestion = "q"\nexploratory = "x"\nruns = {table = "t.csv"}\n'
     '[[estimands]]\nestimand = "medain"\n', "estimand 'medain' is not one of"),
    ('study = "s"\nquestion = "q"\nruns = {table = "t.csv"}\n[[estimands]]\nestimand = "mean"\n',
     "says why it is exploratory"),
    ('study = "s"\nquestion = "q"\nruns = {table = "t.csv"}\n[family]\nregistration = "a"\n'
     'correction = "bonferroni"\n[[estimands]]\nestimand = "mean"\n', "correction = \"holm\""),
    ('study = "s"\nquestion = "q"\nruns = {table = "t.csv"}\n[family]\nregistration = "a"\n'
     '[[estimands]]\nestimand = "mean"\n', "mark each in_family = true"),
])
def test_a_study_file_names_what_is_wrong(tmp_path, text, problem):
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"{path}: .*" + problem.replace("[", r"\[")
                       .replace("]", r"\]").replace("(", r"\(")):
        study.load(path)


def test_vaco_report_writes_and_checks_a_study_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert report_command.main(["--study-file", str(LEVEL), "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["estimates.csv", "report.md"]
    committed = ROOT / "results" / "studies" / "leaderboard-v2-level"
    assert (tmp_path / "report.md").read_text() == (committed / "report.md").read_text()
    assert report_command.main(["--study-file", "studies/leaderboard-v2-level.toml",
                                "--check"]) == 0
    assert "leaderboard-v2-level/ in" in capsys.readouterr().out
    assert report_command.main(["--study-file", str(tmp_path / "none.toml")]) == 2
    assert "none.toml" in capsys.readouterr().err


def _estimate_on_a_synthetic_v3_board(tmp_path, name, loss, rng, seed_noise=0.0, reps=10):
    """The pending cpu v3 study `name` on a synthetic board (6 tasks, seeds 400-419, k = 0 and 4):
    each method's score 1 at k = 0 and 1 − `loss[method]` at k = 4, plus noise of sd 0.02, and
    (`seed_noise`) a shared draw per task and seed; every run made after the registration. Its
    stability entries take `reps` bootstraps (the file's 2,000, fewer to keep a test short)."""
    import dataclasses
    import json

    import pandas as pd

    from vaco_jax.analysis import study

    rows = []
    for task in range(6):
        for seed in range(400, 420):
            noise = rng.normal(0, seed_noise) if seed_noise else 0.0
            for method, drop in loss.items():
                for k in (0, 4):
                    score = 1.0 + noise - (drop if k else 0.0) + rng.normal(0, 0.02)
                    rows.append({"task": f"t{task}", "method": method, "k": k,
                                 "sampling": "oldest", "K": 4, "lr": 1e-3, "seed": seed,
                                 "diverged": False, "raw_final": score, "raw_auc": score,
                                 "final_score": score, "auc_score": score})
    board = tmp_path / "results" / "lag-bench" / "cpu-v3"
    (board / "ppo_clip" / "runs").mkdir(parents=True)
    pd.DataFrame(rows).to_csv(board / "scores.csv", index=False)
    (board / "ppo_clip" / "runs" / "cells.jsonl").write_text(json.dumps({"git_commit": "c" * 40}))
    loaded = study.load(ROOT / "studies" / "pending" / f"{name}.toml")
    for entry in loaded.estimands:
        if entry["estimand"] == "stability":
            entry["reps"] = reps
    loaded = dataclasses.replace(loaded, path=Path(f"studies/{name}.toml"))
    return study.estimate(loaded, tmp_path, descends=lambda commit, ancestor: True)


def test_the_v3_paper_study_is_one_family_of_six_over_a_change_and_a_level(tmp_path):
    """The pending cpu v3 study files on a synthetic board whose answer is known: PPO-Clip and
    APPO lose 0.3 from k = 0 to 4, the TV filter alone 0.1, VACO nothing. Family P counts six
    tests under one Holm's correction, each in its estimand's words, with their stability."""
    import numpy as np

    loss = {"ppo_clip": 0.3, "appo": 0.3, "gae+tv_filter": 0.1, "vaco": 0.0}
    table, words = _estimate_on_a_synthetic_v3_board(
        tmp_path, "cpu-v3-paper", loss, np.random.default_rng(0), seed_noise=0.02)
    assert words.startswith("pre-registered") and "over 6 tests" in words
    family = table[table["p_holm"].notna()]
    assert len(family) == 6
    p = family["p"].to_numpy()
    assert family["p_holm"].to_numpy() == pytest.approx(
        np.minimum(1, np.maximum.accumulate((6 - np.arange(6)) * np.sort(p)))[np.argsort(np.argsort(p))])
    verdict = family.set_index(["estimand", "method"])["verdict"]
    assert verdict["change_difference", "vaco"] == "degrades less than PPO-Clip"
    assert verdict["change_difference", "gae+tv_filter"] == "degrades less than PPO-Clip"
    assert verdict["change_difference", "appo"] == "no difference shown"
    assert verdict["difference", "vaco"] == "higher than PPO-Clip at k = 4"
    vaco = family.set_index(["estimand", "method"]).loc[("change_difference", "vaco")]
    assert vaco.point == pytest.approx(0.3, abs=0.02) and vaco.low > 0
    stable = table[table["estimand"] == "stability_bootstrap"]
    assert len(stable) == 6 and (stable.loc[stable["method"] == "vaco", "point"] == 1.0).all()


def test_the_settings_studys_registered_family_is_one_study_file_to_1e9():
    """Migration: studies/settings-forward-family.toml gives every estimate, interval, p, Holm p
    and verdict of the forward × backward lag study's pre-registered family of 24
    (results/settings_report/primary.csv) within 1e-9."""
    import numpy as np
    import pandas as pd

    from vaco_jax.analysis import study

    loaded = study.load(ROOT / "studies" / "settings-forward-family.toml", root=ROOT)
    table, words = study.estimate(loaded, ROOT, descends=lambda commit, ancestor: True)
    assert "over 24 tests" in words
    family = table[table["p_holm"].notna()]
    family = family.assign(k=family["setting"].str.extract(r"k=(\d+)")[0].astype(int))
    ref = pd.read_csv(ROOT / "results" / "settings_report" / "primary.csv")
    ref = ref[ref["family"]].assign(
        method=lambda f: f["comparison"].str.split(" − ").str[0],
        baseline=lambda f: f["comparison"].str.split(" − ").str[1],
        metric=lambda f: f["metric"].map({"final score": "final", "AUC": "auc"}),
        k=lambda f: f["setting"].str.extract(r"k=(\d+)")[0].astype(int))
    both = ref.merge(family, on=["method", "baseline", "task", "metric", "k"],
                     suffixes=("_ref", ""))
    assert len(both) == len(ref) == 24
    for theirs, ours in (("estimate", "point"), ("low_ref", "low"), ("high_ref", "high"),
                         ("p_ref", "p"), ("p_holm_ref", "p_holm")):
        assert np.max(np.abs(both[theirs] - both[ours])) < 1e-9, theirs
    assert (both["verdict_ref"] == both["verdict"]).all()


def test_the_settings_studys_break_rule_is_in_the_same_study_file_to_1e9():
    """Migration: the retention rows of studies/settings-forward-family.toml give the final-score
    retention, its 95% BCa interval and the break rule's verdict (docs/preregistrations.md,
    section 3) of VACO, PPO-Clip and APPO at k = 15 and at K = 32, per task and pooled: the 18
    retention rows of results/settings_report/primary.csv, within 1e-9; results not known to
    follow the registration say where the interval lies instead."""
    loaded = study.load(ROOT / "studies" / "settings-forward-family.toml", root=ROOT)
    key = ["method", "task", "k"]

    def retention(after: bool) -> pd.DataFrame:
        table, words = study.estimate(loaded, ROOT, descends=lambda commit, ancestor: after)
        assert ("over 24 tests" in words) == after   # the break rule adds verdicts, not tests
        rows = table[table["estimand"] == "retention"]
        return rows.assign(k=rows["setting"].str.extract(r"k=(\d+)")[0].astype(int))

    ref = pd.read_csv(ROOT / "results" / "settings_report" / "primary.csv")
    ref = ref[ref["metric"] == "final score retention"].assign(
        method=lambda f: f["comparison"].str.removesuffix(" retention"),
        k=lambda f: f["setting"].str.extract(r"k=(\d+)")[0].astype(int))
    both = ref.merge(retention(True), on=key, suffixes=("_ref", ""))
    assert len(both) == len(ref) == 18
    for theirs, ours in (("estimate", "point"), ("low_ref", "low"), ("high_ref", "high")):
        assert np.max(np.abs(both[theirs] - both[ours])) < 1e-9, theirs
    assert (both["verdict_ref"] == both["verdict"]).all()
    assert set(both["verdict"]) == set(families.BREAK_WORDS)
    tasks = both[both["task"] != "pooled"]   # pooled: the fewest seeds of a task, not their sum
    assert (tasks["seeds_ref"] == tasks["seeds"]).all()
    exploratory = both[key].merge(retention(False), on=key)["verdict"]
    assert set(exploratory) == {"95% CI above 0.8", "95% CI below 0.8", "95% CI spans 0.8"}


def test_the_break_rule_gives_the_v1_leaderboards_verdicts_on_its_committed_intervals():
    """The v1 leaderboard (results/lag-bench/cpu) keeps each method's retention intervals, not its
    runs, so they cannot be recomputed; on its final-score retention at k = 15 the break rule gives
    each method the verdict the leaderboard counts (a confirmed break-lag breaks, a lower end
    above 0.8 holds): 9 break, 6 hold, 2 undetermined."""
    from vaco_jax.study import specs

    board = ROOT / "results" / "lag-bench" / "cpu"
    table = pd.read_csv(board / "leaderboard.csv")
    ours = [families.break_verdict(r.lag_low, r.lag_high, True) for r in table.itertuples()]
    legacy = ["breaks" if r.confirmed else "holds" if r.lag_low >= families.BREAK_LEVEL
              else "undetermined" for r in table.itertuples()]
    assert ours == legacy and len(ours) == 17
    counted = (f"break rule: {ours.count('breaks')} break, {ours.count('holds')} hold, "
               f"{ours.count('undetermined')} undetermined")
    assert specs._break_rule_verdict(board) == counted == "break rule: 9 break, 6 hold, 2 undetermined"


@pytest.mark.parametrize("name, size", [("F1", 48), ("F2", 52)])
def test_the_llm_boards_families_are_one_study_file_each_to_1e9(name, size):
    """Migration: studies/llm-cpu-f1.toml and -f2.toml, over the LLM board's per-run files (a
    glob), give every row of their family in results/lag-bench/llm-cpu/primary.csv within 1e-9,
    verdicts too (F1: each objective − PPO-Clip at k = 32; F2: each objective's own change from
    k = 0 to 32)."""
    import numpy as np
    import pandas as pd

    from vaco_jax.analysis import study

    loaded = study.load(ROOT / "studies" / f"llm-cpu-{name.lower()}.toml", root=ROOT)
    table, words = study.estimate(loaded, ROOT, descends=lambda commit, ancestor: True)
    assert f"over {size} tests" in words
    family = table[table["p_holm"].notna()]
    family = family.assign(N=family["setting"].str.extract(r"N=(\d+)")[0].astype(int),
                           objective=family["method"],
                           metric=family["metric"].replace({"final": "final_accuracy"}))
    ref = pd.read_csv(ROOT / "results" / "lag-bench" / "llm-cpu" / "primary.csv")
    ref = ref[ref["family"] == name]
    both = ref.merge(family, on=["objective", "N", "metric"], suffixes=("_ref", ""))
    assert len(both) == len(ref) == size
    for theirs, ours in (("mean", "point"), ("ci_low", "low"), ("ci_high", "high"),
                         ("p_ref", "p"), ("p_holm_ref", "p_holm")):
        assert np.max(np.abs(both[theirs] - both[ours])) < 1e-9, theirs
    assert (both["verdict_ref"] == both["verdict"]).all()


def test_the_llm_v2_families_merge_identical_entries_and_test_the_distinct_ones(tmp_path):
    """The pending LLM v2 study files on a synthetic board whose answer is known: at N = 1 every
    entry but VACO gives PG's runs (one update per batch); at N = 8 PPO-Clip and `vaco_learner`
    lose 0.06 under the profile, VACO nothing, the others 0.03 with noise."""
    import dataclasses
    import json

    import numpy as np
    import pandas as pd

    from vaco_jax.analysis import study
    from vaco_jax.llm.config import OBJECTIVES

    rng = np.random.default_rng(1)
    entries = [o for o in OBJECTIVES if o != "tis"] + ["vaco_learner"]
    loss8 = {"ppo_clip": 0.06, "vaco_learner": 0.06, "vaco": 0.0}
    board = tmp_path / "results" / "lag-bench" / "llm-cpu-v2"
    base = {(n, s): 0.38 + rng.normal(0, 0.01) for n in (1, 8) for s in range(10)}
    shared = {(n, s): rng.normal(0, 0.01) for n in (1, 8) for s in range(10)}
    for entry in entries:
        rows = []
        for n in (1, 8):
            own = {s: rng.normal(0, 0.01) for s in range(10)}
            for k, sampling in ((0, "constant"), (12, "profile")):
                for s in range(10):
                    if n == 1 and entry != "vaco":     # PG's runs, exactly
                        value = base[n, s] + (k > 0) * (-0.02 + shared[n, s])
                    elif n == 1:
                        value = base[n, s] + (k > 0) * (0.0 + own[s])
                    else:
                        value = base[n, s] + (k > 0) * (-loss8.get(entry, 0.03) + own[s] / 3)
                    rows.append({"n": n, "k": k, "lag_sampling": sampling, "seed": s,
                                 "method": entry, "objective": entry.split("_learner")[0],
                                 "lr": 1e-4, "constraint": np.nan, "final_accuracy": value + 0.1,
                                 "final_sampled_accuracy": value, "final_sampled_auc": value,
                                 "filtered_fraction": 0.1 if entry == "vaco" else 0.0,
                                 "eval_accuracy": [value + 0.1], "eval_iterations": [200]})
        (board / entry).mkdir(parents=True)
        pd.DataFrame(rows).to_parquet(board / entry / "runs.parquet")
        (board / entry / "bench.json").write_text(json.dumps({"git_commit": "c" * 40}))
    results = {}
    for name in ("lag", "board", "anchor"):
        loaded = study.load(ROOT / "studies" / "pending" / f"llm-cpu-v2-{name}.toml")
        loaded = dataclasses.replace(loaded, path=Path(f"studies/llm-cpu-v2-{name}.toml"))
        results[name] = study.estimate(loaded, tmp_path, descends=lambda commit, ancestor: True)
    # Family L: 28 registered tests; at N = 1 twelve entries merge into PG's entry (PPO-Clip
    # keeps no name there: it is not a baseline of this family), so 2 + 14 are distinct.
    table, words = results["lag"]
    assert words.startswith("pre-registered") and "the 16 distinct tests of the 28" in words, words
    assert "N = 1: " in words and "reported once as `cispo`" in words
    family = table[table["p_holm"].notna()].set_index(["method", "setting"])
    assert len(family) == 16
    assert family.loc[("ppo_clip", "k=12, sampling=profile, N=8"), "verdict"] == "lag lowers it"
    assert family.loc[("vaco", "k=12, sampling=profile, N=8"), "verdict"] == "no change shown"
    # Family R: PPO-Clip keeps its name as the baseline; at N = 1 only VACO differs from it.
    table, words = results["board"]
    assert "the 14 distinct tests of the 26" in words and "reported once as `ppo_clip`" in words
    family = table[table["p_holm"].notna()].set_index(["method", "setting"])
    assert family.loc[("vaco", "k=12, sampling=profile, N=8"), "verdict"] == \
        "degrades less than PPO-Clip"
    assert family.loc[("vaco_learner", "k=12, sampling=profile, N=8"), "verdict"] == \
        "no difference shown"
    # Family A: both tests, the β anchor degrading less at N = 8; the filtered fractions beside.
    table, words = results["anchor"]
    assert "over 2 tests" in words
    family = table[table["p_holm"].notna()].set_index("setting")
    assert family.loc["k=12, sampling=profile, N=8", "verdict"] == "the β anchor degrades less"
    fractions = table[(table.estimand == "mean") & (table.method == "vaco_learner")]
    assert (fractions.point == 0.0).all() and len(fractions) > 0


ARCHIVE = ROOT / "results" / "archive"
LEGACY = ARCHIVE / "minatar-cnn" / "legacy_estimates.json"


@pytest.mark.parametrize("name", ["minatar-long", "minatar-space-invaders"])
def test_the_minatar_tests_are_one_study_file_each_to_1e9(name):
    """Migration: studies/minatar-long.toml and -space-invaders.toml, over each network's
    committed metrics.jsonl (the train adapter), give the pre-registered Welch test of the CNN
    against the MLP that the legacy report printed (frozen under results/archive/minatar-cnn/):
    its estimate, interval, p, Holm's p over its family of one and verdict within 1e-9 of the
    legacy computation's full-precision numbers (legacy_estimates.json beside the reports), and
    each network's per-seed final returns, mean final return and mean return over the curve
    (exploratory); and every number the archived report.md prints, at its printed precision."""
    import json
    import re

    legacy = json.loads(LEGACY.read_text())["studies"][name]
    committed = (ARCHIVE / legacy["report"]).read_text()
    primary = legacy["primary"]
    treated, base = primary["method"], primary["baseline"]

    loaded = study.load(ROOT / "studies" / f"{name}.toml", root=ROOT)
    assert loaded.family["registration"] == legacy["registration"]
    table, words = study.estimate(loaded, ROOT, descends=lambda commit, ancestor: True)
    assert words.startswith("pre-registered") and "over 1 tests" in words
    family = table[table["p_holm"].notna()]
    assert len(family) == 1
    row = family.iloc[0]
    assert (row.estimand, row.metric, row.method, row.baseline, row.seeds) == (
        "welch", primary["metric"], treated, base, primary["seeds"])
    differences = {"point": row.point - primary["estimate"], "low": row.low - primary["low"],
                   "high": row.high - primary["high"], "p": row.p - primary["p"],
                   "p_holm": row.p_holm - primary["p_holm"]}
    assert max(map(abs, differences.values())) < 1e-9, differences
    assert row.verdict == primary["verdict"]
    means = table[table["estimand"] == "mean"].set_index(["metric", "method"])["point"]
    runs = study.runs(loaded, ROOT)
    finals = {arm: runs[runs["method"] == arm].sort_values("seed")["final"].to_numpy()
              for arm in (base, treated)}
    for arm in (base, treated):
        assert abs(means["final", arm] - legacy["mean_final"][arm]) < 1e-9
        assert abs(means["curve_mean", arm] - legacy["mean_curve_mean"][arm]) < 1e-9
        np.testing.assert_allclose(finals[arm], legacy["final_per_seed"][arm], rtol=0, atol=1e-9)

    # the archived report's numbers, as printed
    lines = committed.splitlines()
    per_seed = ", ".join(f"{arm} {finals[arm].round(2).tolist()} (mean {means['final', arm]:.2f})"
                         for arm in (base, treated))
    assert lines[0] == f"final return at {legacy['steps']:,} steps, per seed: {per_seed}"
    printed = re.fullmatch(rf"primary: {treated} - {base} = (\S+), 95% Welch interval "
                           r"\[(\S+), (\S+)\] \(p = (\S+)\): (.+)", lines[1])
    assert list(printed.groups()) == [f"{row.point:+.2f}", f"{row.low:+.2f}", f"{row.high:+.2f}",
                                      f"{row.p:.3f}", row.verdict]
    assert lines[2] == ("exploratory: mean return over the curve (area / steps): " + ", ".join(
        f"{arm} {means['curve_mean', arm]:.2f}" for arm in (base, treated)))
    assert study.check_study(loaded, ROOT) == []


def test_the_archives_checksums_hold_every_frozen_file_and_fail_on_one_changed_byte(tmp_path):
    """results/archive/SHA256SUMS (sha256sum's format) lists the frozen MinAtar reports and their
    full-precision numbers; each listed file gives its digest, and one byte changed, a file
    missing or a malformed line is named (`vaco-report --all --check` runs the same check)."""
    import shutil

    from vaco_jax.analysis import check

    listed = check.checksums(ROOT / check.CHECKSUMS)
    frozen = {p.relative_to(ARCHIVE).as_posix() for p in (ARCHIVE / "minatar-cnn").rglob("*")
              if p.is_file()}
    assert frozen == {"minatar-cnn/legacy_estimates.json", "minatar-cnn/long/report.md",
                      "minatar-cnn/space-invaders/report.md"} and frozen <= set(listed)
    assert check.checksum_problems(ROOT) == []
    copy = tmp_path / "checkout"
    for name in listed:
        (copy / "results/archive" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ARCHIVE / name, copy / "results/archive" / name)
    shutil.copy2(ROOT / check.CHECKSUMS, copy / check.CHECKSUMS)
    assert check.checksum_problems(copy) == []
    for name in listed:
        path = copy / "results/archive" / name
        original = path.read_bytes()
        for at in (0, len(original) // 2, len(original) - 1):
            path.write_bytes(original[:at] + bytes([original[at] ^ 1]) + original[at + 1:])
            assert check.checksum_problems(copy) == [
                f"results/archive/{name}: its bytes changed (its SHA-256 is not the one "
                f"{check.CHECKSUMS} lists)"]
        path.unlink()
        assert check.checksum_problems(copy) == [
            f"results/archive/{name}: missing (listed in {check.CHECKSUMS})"]
        path.write_bytes(original)
    assert check.checksum_problems(copy) == []
    (copy / check.CHECKSUMS).write_text("0123  minatar-cnn/long/report.md\n")
    (problem,) = check.checksum_problems(copy)
    assert "line 1 is not a SHA-256 digest and a relative path" in problem


# --- the study files in RESULTS.md, the README's results table and `vaco-report --all --check` --
def _results_rows(path: Path, first: str) -> dict[str, dict[str, str]]:
    """The rows of `path`'s table whose first column is `first`, by that column's text (a link's
    text, not its target)."""
    import re

    from vaco_jax.study import specs

    [table] = [t for t in specs.markdown_tables(path) if t and first in t[0]]
    return {re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", row[first]): row for row in table}


def _headline_numbers(cell: str) -> tuple[str, list[float]]:
    """A headline cell "label: +0.12 [-0.03, +0.27]": (its label, its three numbers)."""
    import re

    label, shown = cell.rsplit(": ", 1)
    return label, [float(n) for n in re.findall(r"[-+]?\d+\.\d+", shown)]


def test_each_study_file_is_a_row_of_results_md_and_the_readme_with_its_estimates_headline():
    """RESULTS.md and the README's results table give each committed study file (not those of
    studies/pending/) a row: its first [[headlines]] entry's label and the estimate [interval] of
    the row its key names in its committed estimates.csv, at the two decimals printed, with that
    row's verdict; a study file without headlines its question and registration status alone."""
    from vaco_jax.analysis import report
    from vaco_jax.study import specs

    results = _results_rows(ROOT / specs.RESULTS, "study")
    readme = _results_rows(ROOT / specs.README, "question")
    paths = sorted((ROOT / specs.STUDY_FILES).glob("*.toml"))
    assert len(paths) >= 7 and not {p.stem for p in (ROOT / "studies/pending").glob("*.toml")} \
        & set(results)
    headlined = 0
    for path in paths:
        loaded = study.load(path, root=ROOT)
        row, shown = results[loaded.name], readme[loaded.question]
        assert row["question"] == loaded.question
        report_md = f"studies/{loaded.name}/report.md"
        assert row["report"] == f"[{report_md}]({report_md})"
        if not loaded.headlines:
            assert row["headline estimates [95% CI]"] == specs.NO_HEADLINE
            assert row["pre-registered verdict"] == shown["pre-registered verdict"] == (
                f"pre-registered ({loaded.family['registration'][:7]})")
            continue
        entry = loaded.headlines[0]
        table = report.read_csv(ROOT / loaded.output / "estimates.csv")
        key = {"study": loaded.name, "task": entry.get("task", "pooled"),
               **{k: entry[k] for k in ("estimand", "metric", "method", "setting")}}
        [estimate] = table[(table[list(key)] == pd.Series(key)).all(axis=1)].itertuples()
        for cell in (row["headline estimates [95% CI]"], shown["headline estimates [95% CI]"]):
            label, numbers = _headline_numbers(cell)
            assert label == entry["label"]
            np.testing.assert_allclose(numbers, [estimate.point, estimate.low, estimate.high],
                                       rtol=0, atol=0.005 + 1e-9)
        assert row["seeds"] == str(estimate.seeds)
        assert row["pre-registered verdict"] == shown["pre-registered verdict"]
        if loaded.family:
            assert row["pre-registered verdict"] == (
                f"pre-registered ({loaded.family['registration'][:7]}): {estimate.verdict}")
        else:
            assert row["pre-registered verdict"] == "none (exploratory)"
        headlined += 1
    assert headlined >= 4


def test_vaco_report_all_checks_a_study_files_committed_files_and_row(tmp_path):
    """In a checkout holding one study file (the MinAtar Breakout test: the file, its runs and its
    committed estimates.csv and report.md; a study file of studies/pending/ beside it), `--all`'s
    check regenerates it for real: RESULTS.md's row shows the headline of its estimates.csv, and a
    changed number in its estimates.csv or report.md fails the check, naming the file."""
    import shutil

    from vaco_jax.study import specs

    for directory in ("results/minatar-cnn/long", "results/studies/minatar-long"):
        shutil.copytree(ROOT / directory, tmp_path / directory)
    (tmp_path / "studies/pending").mkdir(parents=True)
    shutil.copy2(ROOT / "studies/minatar-long.toml", tmp_path / "studies/minatar-long.toml")
    (tmp_path / "studies/pending/later.toml").write_text(
        (ROOT / "studies/minatar-long.toml").read_text().replace('"minatar-long"', '"later"')
        .replace("results/studies/minatar-long", "results/studies/later"))
    made_files = specs.regenerate_study_files(tmp_path)
    assert list(made_files) == ["minatar-long"]
    (tmp_path / specs.RESULTS).write_text(specs.results_markdown({}, {}, tmp_path, made_files))
    (tmp_path / specs.INDEX).write_text(specs.index_markdown({}, {}, tmp_path))
    (tmp_path / specs.README).write_text(specs.with_readme_block(
        f"# x\n\n{specs.README_BEGIN}\n{specs.README_END}\n",
        specs.readme_block({}, {}, tmp_path, made_files)))
    assert specs.check({}, tmp_path) == []

    estimates = tmp_path / "results/studies/minatar-long/estimates.csv"
    welch = pd.read_csv(estimates).query("estimand == 'welch'").iloc[0]
    raw_point = pd.read_csv(estimates, dtype=str).query("estimand == 'welch'").iloc[0]["point"]
    row = _results_rows(tmp_path / specs.RESULTS, "study")["minatar-long"]
    label, numbers = _headline_numbers(row["headline estimates [95% CI]"])
    assert label == "CNN − MLP, final return at 1,228,800 steps"
    np.testing.assert_allclose(numbers, [welch["point"], welch["low"], welch["high"]], rtol=0,
                               atol=0.005 + 1e-9)
    assert row["pre-registered verdict"].endswith(f": {welch['verdict']}")

    for name, column in (("estimates.csv", "row 1, column 'point'"), ("report.md", "line ")):
        path = tmp_path / "results/studies/minatar-long" / name
        original = path.read_text()
        old = raw_point if name == "estimates.csv" else f"{welch['point']:.2f}"
        assert old in original
        path.write_text(original.replace(old, str(round(welch["point"] + 1, 2)), 1))
        problems = specs.check({}, tmp_path)
        path.write_text(original)
        assert len(problems) == 1 and problems[0].startswith(
            f"results/studies/minatar-long/{name}: {column}"), problems
    assert specs.check({}, tmp_path) == []


def test_the_v3_board_family_is_the_other_13_methods_on_change_and_level(tmp_path):
    """Family B on a synthetic board: 13 methods and PPO-Clip, PPO-Clip losing 0.3 from k = 0
    to 4, `spo` losing 0.6 and `pg` nothing, the rest as PPO-Clip: 26 tests, one Holm."""
    import numpy as np

    from vaco_jax.analysis import study

    loaded = study.load(ROOT / "studies" / "pending" / "cpu-v3-board.toml")
    methods = loaded.estimands[0]["methods"]
    assert len(methods) == 14 and "ppo_clip" in methods
    assert not {"vaco", "appo", "gae+tv_filter"} & set(methods)   # family P's, not B's
    loss = {m: 0.3 for m in methods} | {"spo": 0.6, "pg": 0.0}
    table, words = _estimate_on_a_synthetic_v3_board(
        tmp_path, "cpu-v3-board", loss, np.random.default_rng(2), reps=5)
    assert words.startswith("pre-registered") and "over 26 tests" in words
    family = table[table["p_holm"].notna()].set_index(["estimand", "method"])["verdict"]
    assert len(family) == 26
    assert family["change_difference", "spo"] == "degrades more than PPO-Clip"
    assert family["change_difference", "pg"] == "degrades less than PPO-Clip"
    assert family["change_difference", "topr"] == "no difference shown"
    assert family["difference", "pg"] == "higher than PPO-Clip at k = 4"
