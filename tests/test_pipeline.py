"""The analysis pipeline: runs → scores → estimates → pre-registered tests → tables, and the
lag-robustness benchmark's report built on it, on synthetic runs with known answers."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from vaco_jax.pipeline import estimates, preregistration, runs, scores, tables
from vaco_jax.study import robustness

STEPS = np.array([1.0, 2.0, 3.0, 4.0])
RANDOM = {"a": 10.0, "b": -5.0}
SEEDS = range(300, 310)
# Per method, the fraction of synchronous PPO-Clip's return it keeps at k = 2 and at k = 8.
KEEPS = {"ppo_clip": (0.9, 0.5), "appo": (0.95, 0.7), "vaco": (1.0, 0.9)}
SETTINGS = [(0, "oldest", 4), (2, "oldest", 4), (8, "oldest", 4), (8, "uniform", 4),
            (0, "oldest", 16), (8, "oldest", 16)]
COMMIT = "c" * 40
"""The commit every synthetic run records."""
REGISTRATION = "a" * 40
AFTER = robustness.Spec(reps=200, registration=REGISTRATION, descends=lambda commit, ancestor: True)
"""A spec whose pre-registration the synthetic runs descend from: its verdicts are words."""


def synthetic_runs(seeds=SEEDS, methods=KEEPS, commit=COMMIT) -> pd.DataFrame:
    """A tidy runs table: every method reaches 100 above random at k = 0 (seed noise ±5), its
    `KEEPS` fraction at lag, along a linear curve."""
    rows = []
    for task, random in RANDOM.items():
        for method in methods:
            for k, sampling, K in SETTINGS:
                keep = {0: 1.0, 2: KEEPS[method][0], 8: KEEPS[method][1]}[k]
                for seed in seeds:
                    top = random + 100 * keep + 5 * np.sin(seed * 7.0 + k)
                    returns = random + (top - random) * STEPS / STEPS[-1]
                    rows.append({"study": "bench", "task": task, "method": method, "k": k,
                                 "sampling": sampling, "K": K, "lr": 3e-4, "delta": 0.2,
                                 "seed": seed, "budget": 4, "final": returns[-1],
                                 "auc": returns.mean(), "diverged": False,
                                 "diverged_at_step": None, "evaluations": 4, "commit": commit,
                                 "steps": STEPS, "returns": returns})
    return pd.DataFrame(rows)


def test_a_sweeps_rows_become_one_row_per_run_diverged_from_its_first_bad_evaluation():
    rows = pd.DataFrame([{"cell": "c", "study": "s", "env": "a", "algo": "vaco", "variant": "oldest",
                          "capacity": 3, "delta": 0.2, "seed": seed, "eval_index": i,
                          "step": 10 * (i + 1), "budget": 40, "snapshot_sampling": "oldest",
                          "diverged": False,
                          "eval_return": np.nan if (seed, i) == (1, 2) else float(i)}
                         for seed in (0, 1) for i in range(4)])
    plan = {"c": {"config": {"num_epochs": 4, "learning_rate": 3e-4}}}
    table = runs.tidy(runs.evaluations(rows, plan, {"c": "abc"}), last_evals=2)
    assert len(table) == 2 and set(table["k"]) == {2} and set(table["K"]) == {4}
    ok, bad = table.iloc[0], table.iloc[1]
    assert ok["final"] == 2.5 and not ok["diverged"] and ok["commit"] == "abc"
    assert bad["diverged"] and bad["diverged_at_step"] == 30 and np.isnan(bad["final"])
    assert np.isnan(bad["returns"][3])   # diverged from then on, though its last return is finite


def test_a_run_keeps_the_mean_of_its_finite_diagnostics_under_the_columns_that_name_it():
    rows = pd.DataFrame([{"env": "a", "seed": seed, "eval_index": i, "step": 10 * (i + 1),
                          "eval_return": 1.0, "diverged": False,
                          "behavior_tv": np.nan if i == 0 else 0.1 * (i + seed)}
                         for seed in (0, 1) for i in range(3)])
    table = runs.tidy(rows, last_evals=2, run=["env", "seed"], means=["behavior_tv", "approx_kl"])
    assert list(table.columns[:2]) == ["env", "seed"] and list(table["seed"]) == [0, 1]
    np.testing.assert_allclose(table["behavior_tv"], [0.15, 0.25])   # the NaN left out
    assert table["approx_kl"].isna().all()                             # not logged: NaN


def test_means_and_ratios_pool_the_mean_over_tasks_and_leave_out_the_base_cells():
    frame = pd.DataFrame([{"task": task, "k": k, "seed": seed,
                           "v": (1.0 if k == 0 else keep) * (10 + seed % 2)}
                          for task, keep in (("a", 0.5), ("b", 0.7)) for k in (0, 8)
                          for seed in range(4)])
    kept = estimates.ratios(frame, "v", ["task", "k"], lambda c: (0,), reps=200)
    assert list(zip(kept["task"], kept["k"])) == [("a", 8), ("b", 8), (estimates.POOLED, 8)]
    np.testing.assert_allclose(kept["point"], [0.5, 0.7, 0.6])
    assert (kept["low"] <= kept["point"]).all() and (kept["point"] <= kept["high"]).all()
    mean = estimates.means(frame, "v", ["task", "k"], reps=200).set_index(["task", "k"])
    assert mean.loc[(estimates.POOLED, 0), "point"] == pytest.approx(10.5)
    assert mean.loc[(estimates.POOLED, 0), "tasks"] == 2


def test_a_wide_table_has_a_row_per_index_and_a_column_per_value_in_order():
    frame = pd.DataFrame({"task": ["b", "b", estimates.POOLED], "lag": ["k=3", "k=1", "k=1"]})
    text = tables.wide(frame, ["x", "y", "z"], ["task"], "lag", ["k=1", "k=3"])
    assert text.splitlines() == ["| task | k=1 | k=3 |", "|---|---|---|", "| b | y | x |",
                                 "| pooled (mean over tasks) | z | — |"]


def test_random_scores_zero_and_the_reference_method_one_on_final_and_auc():
    table = synthetic_runs()
    reference = scores.reference_of_method(table, RANDOM, "ppo_clip", k=0, sampling="oldest", K=4)
    scored = scores.normalised(table, RANDOM, reference)
    sync = scored[(scored.method == "ppo_clip") & (scored.k == 0) & (scored.K == 4)]
    np.testing.assert_allclose(sync.groupby("task")[["final_score", "auc_score"]].mean(), 1.0)
    failed = table.iloc[[0]].assign(returns=[np.full(4, np.nan)], diverged=True)
    assert scores.normalised(failed, RANDOM, reference)[["final_score", "auc_score"]].eq(0).all(None)


def test_retention_is_the_score_kept_and_breaks_at_the_first_lag_below_the_level():
    scored = scores.normalised(synthetic_runs(seeds=range(300, 302)) .assign(), RANDOM,
                               pd.DataFrame({"task": ["a", "b"], "final": [110.0, 95.0],
                                             "auc": [110.0, 95.0]}))
    ppo = scored[(scored.method == "ppo_clip") & (scored.K == 4) & (scored.sampling == "oldest")]
    kept = estimates.retention(ppo, "final_score", {"k": 0}, {"k": 8}, reps=200)
    assert list(kept["task"]) == ["a", "b", estimates.POOLED]
    np.testing.assert_allclose(kept["retention"], 0.5, atol=0.05)
    assert estimates.break_lag([8, 2], [0.5, 0.9], [0.6, 0.95]) == ("8", "8")
    assert estimates.break_lag([2, 8], [0.9, 0.85], [1.0, 0.9]) == ("none", "none")
    assert estimates.break_lag([2], [np.nan], [np.nan]) == ("undefined", "undefined")


def test_paired_differences_pool_the_per_seed_mean_over_tasks():
    frame = pd.DataFrame({"task": ["a"] * 4 + ["b"] * 4, "seed": [0, 1] * 4,
                          "method": (["x"] * 2 + ["y"] * 2) * 2,
                          "v": [1.0, 2.0, 0.0, 0.0, 3.0, 4.0, 1.0, 1.0]})
    d = estimates.paired_differences(frame, "v", {"method": "x"}, {"method": "y"})
    assert list(d[estimates.POOLED]) == [1.5, 2.5]


def test_a_family_is_holm_adjusted_and_a_study_names_its_own_target():
    tests = [{"method": "m", "differences": np.full(10, 1.0) + np.arange(10) * 0.01},
             {"method": "n", "differences": np.r_[np.ones(5), -np.ones(5)]}]
    table = preregistration.family(tests, test="sign-flip")
    assert table["p_holm"].iloc[0] == pytest.approx(2 * table["p"].iloc[0])
    assert list(table["verdict"]) == ["higher", "no difference shown"]
    assert preregistration.status([], "0" * 40)[0] == "unknown"


def test_one_interval_formatter_says_undefined_for_a_number_that_does_not_exist():
    assert tables.interval(0.5, 0.41, 0.625) == "0.50 [0.41, 0.62]"
    assert tables.interval(np.nan, 0, 1) == "undefined"
    assert tables.interval(0.5, np.nan, np.nan) == "0.50 [n/a]"
    assert tables.interval(0.1, -0.2, 0.3, sign=True) == "+0.10 [-0.20, +0.30]"


def test_a_figure_is_stored_in_256_colours_that_look_as_matplotlib_drew_it(tmp_path):
    import io as io_

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    from vaco_jax.pipeline import figures

    fig, ax = plt.subplots(figsize=(4, 3))
    for shift in range(6):
        ax.fill_between([0, 1, 2], [shift, shift + 1, shift], [shift + 2] * 3, alpha=0.2)
        ax.plot([0, 1, 2], [shift, shift + 1.5, shift + 0.5], marker="o")
    drawn = io_.BytesIO()
    fig.savefig(drawn, format="png", dpi=100)
    path = figures.save(fig, tmp_path / "f.png", dpi=100)
    assert fig.number not in plt.get_fignums()   # written and closed
    with Image.open(drawn) as image:
        full = np.asarray(image.convert("RGB"), dtype=np.int16)
    with Image.open(path) as stored:
        assert stored.mode == "P" and len(stored.getcolors(256)) <= 256
        pixels = np.asarray(stored.convert("RGB"), dtype=np.int16)
    assert pixels.shape == full.shape
    assert np.abs(pixels - full).mean() < 1.0 and np.abs(pixels - full).max() < 40
    assert path.stat().st_size < 0.6 * len(drawn.getvalue())


def test_a_transparent_figure_is_stored_transparent(tmp_path):
    import io as io_

    import matplotlib.pyplot as plt
    from PIL import Image

    from vaco_jax.pipeline import figures

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, 1])
    drawn = io_.BytesIO()
    fig.savefig(drawn, format="png", dpi=80, transparent=True)
    path = figures.save(fig, tmp_path / "t.png", dpi=80, transparent=True)
    with Image.open(drawn) as image:
        full = np.asarray(image.convert("RGBA"), dtype=np.int16)
    with Image.open(path) as stored:
        assert stored.mode == "P"
        pixels = np.asarray(stored.convert("RGBA"), dtype=np.int16)
    assert full[0, 0, 3] == 0 and pixels[0, 0, 3] == 0   # the corner is see-through in both
    assert np.abs(pixels - full).mean() < 1.0


@pytest.fixture(scope="module")
def report():
    return robustness.report(synthetic_runs(), RANDOM, AFTER)


def test_the_benchmark_ranks_by_iqm_of_normalised_auc_at_the_largest_lag(report):
    assert not report.notes
    at = report.aggregates[(report.aggregates.k == 8) & (report.aggregates.K == 4)
                           & (report.aggregates.sampling == "oldest")
                           & (report.aggregates.metric == "auc")]
    assert list(at.sort_values("iqm", ascending=False)["method"]) == ["vaco", "appo", "ppo_clip"]
    poi = report.improvement.set_index("method")["point"]
    assert poi["vaco"] == 1.0 and poi["appo"] == 1.0
    verdicts = report.comparisons.set_index("method")["verdict"]
    assert verdicts.to_dict() == {"appo": "higher", "vaco": "higher"}
    assert ("Pre-registration: made at ccccccc, after the pre-registration (aaaaaaa); the "
            "verdicts are the pre-registered ones.") in robustness.markdown(report)
    kept = report.retention[(report.retention.method == "vaco") & (report.retention.k == 8)
                            & (report.retention.K == 4) & (report.retention.task == "pooled")
                            & (report.retention.sampling == "oldest")]
    np.testing.assert_allclose(kept["retention"], 0.9, atol=0.02)


def test_the_leaderboard_shows_each_methods_retention_and_its_score_per_task(report):
    text = robustness.markdown(report)
    table = text.split("| method | IQM AUC |", 1)[1].split("\n\n", 1)[0].splitlines()
    assert table[0].split("|")[1:3] == [" AUC retention ", " P(> ppo_clip) "]
    # VACO keeps 0.9 of its synchronous return at k = 8, on both tasks.
    assert table[2].startswith("| vaco | ")
    assert float(table[2].split(" | ")[3].split()[0]) == pytest.approx(0.9, abs=0.02)
    per_task = text.split("over seeds (exploratory):\n\n", 1)[1].split("\n\n", 1)[0]
    rows = per_task.splitlines()
    assert rows[0] == "| method | a | b |" and [r.split(" | ")[0] for r in rows[2:]] == [
        "| vaco", "| appo", "| ppo_clip"]
    assert float(rows[2].split(" | ")[1]) == pytest.approx(0.9, abs=0.02)


def test_the_per_run_scores_table_holds_each_runs_setting_and_scores_once(report):
    # What recomputes a run's scores, and no column that is the same in every row of a method
    # (its commit is in its cells.jsonl; study, δ, budget and evaluations in its plan).
    assert list(report.scores.columns) == list(robustness.SCORE_COLUMNS)
    assert len(report.scores) == len(report.scores.drop_duplicates(
        ["task", "method", "k", "sampling", "K", "seed"]))


def test_the_figure_lists_the_methods_as_ranked_with_every_setting_on_one_axis(report):
    fig = robustness.figure(report)
    first, *others = fig.axes
    assert [t.get_text() for t in first.get_yticklabels()] == ["vaco", "appo", "ppo_clip"]
    assert len(fig.axes) == 6 and all(ax.get_xlim() == first.get_xlim() for ax in others)
    # What its 0 and 1 are, on every panel's axis.
    assert all("1 = synchronous PPO-Clip" in ax.get_xlabel() for ax in fig.axes)
    assert "0 = the random policy, 1 = synchronous PPO-Clip" in fig._suptitle.get_text()


def test_the_committed_board_reads_into_one_table_without_a_pandas_deprecation():
    # Methods none of whose runs diverged hold only None in `diverged_at_step`; the others steps.
    import pathlib
    import warnings
    board = pathlib.Path(__file__).resolve().parent.parent / "results" / "lag-bench" / "cpu-v2"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        table, random = robustness.read(board)
    assert table["diverged_at_step"].dtype == np.float64
    assert table["diverged_at_step"].notna().any() and table["diverged_at_step"].isna().any()
    assert table.method.nunique() == 17 and random


def test_a_figure_that_cannot_be_drawn_is_named_in_the_leaderboard_not_a_traceback(
        report, tmp_path, monkeypatch):
    def broken(r):
        raise ValueError("no axes")
    monkeypatch.setattr(robustness, "figure", broken)
    written = robustness.write(dataclasses.replace(report, notes=[]), tmp_path)
    assert tmp_path / "leaderboard.png" not in written
    text = (tmp_path / "leaderboard.md").read_text()
    assert "* figure: not computed (ValueError: no axes)" in text


def test_split_half_reliability_compares_the_first_five_seeds_with_the_second(report):
    rel = report.reliability
    assert rel["seeds_a"].iloc[0] == "300–304" and rel["seeds_b"].iloc[0] == "305–309"
    assert rel["spearman"].iloc[0] == 1.0 and rel["spearman_brown"].iloc[0] == 1.0
    assert (rel["verdict_a"] == rel["verdict_b"]).all()


def test_a_report_without_its_reference_says_what_it_could_not_compare(tmp_path):
    table = synthetic_runs(methods={"vaco": KEEPS["vaco"]})
    r = robustness.report(table, RANDOM, robustness.Spec(reps=50))
    assert r.scores is None and "no ppo_clip runs" in r.notes[0]
    written = robustness.write(r, tmp_path)
    assert "no ppo_clip runs" in (tmp_path / "leaderboard.md").read_text()
    assert written == [tmp_path / "leaderboard.md"]


@pytest.mark.parametrize("status, commit, descends", [
    ("before", COMMIT, lambda commit, ancestor: False),
    ("unknown", "", lambda commit, ancestor: True),       # no commit recorded
    ("unknown", COMMIT, lambda commit, ancestor: None),   # not in this checkout's history
    ("none", COMMIT, None)])                              # no pre-registration named
def test_runs_not_made_after_the_pre_registration_get_exploratory_words_not_verdicts(
        status, commit, descends):
    spec = robustness.Spec(reps=20, registration=REGISTRATION if descends else "",
                           descends=descends)
    r = robustness.report(synthetic_runs(commit=commit), RANDOM, spec)
    assert r.status == status and not r.notes
    assert r.comparisons.set_index("method")["verdict"].to_dict() == {
        "appo": "Holm p < 0.05, estimate > 0", "vaco": "Holm p < 0.05, estimate > 0"}
    halves = {*r.reliability["verdict_a"], *r.reliability["verdict_b"]}
    assert halves == {"reference", "Holm p ≥ 0.05"}
    assert (f"Pre-registration: {r.status_words}; exploratory, without verdict words."
            in robustness.markdown(r))


def test_the_status_line_names_the_commits_against_the_pre_registration():
    before = robustness.Spec(registration=REGISTRATION, descends=lambda commit, ancestor: False)
    assert robustness.status(synthetic_runs(), before) == (
        "before", "made at ccccccc, before the pre-registration (aaaaaaa)")
    assert robustness.status(synthetic_runs(), robustness.Spec())[0] == "none"


def test_check_passes_on_its_own_tables_and_names_the_file_of_an_edited_number(
        report, tmp_path, monkeypatch):
    robustness.write(report, tmp_path)
    monkeypatch.setattr(robustness, "read", lambda directory: (synthetic_runs(), RANDOM))
    assert robustness.check(tmp_path, AFTER) == []
    path = tmp_path / "aggregates.csv"
    text = path.read_text().splitlines()
    text[1] = text[1].replace(",4,", ",5,", 1)
    path.write_text("\n".join(text) + "\n")
    assert robustness.check(tmp_path, AFTER) == [
        f"{path}: differs from its recomputation"]


def test_vaco_bench_table_writes_a_v2_leaderboard_that_its_check_recomputes(tmp_path, monkeypatch):
    from vaco_jax.commands import bench as bench_command
    for method in ("ppo_clip", "vaco"):
        (tmp_path / method).mkdir()
        (tmp_path / method / "bench.json").write_text(json.dumps(
            {"method": method, "protocol": "cpu", "protocol_version": 2}))
    monkeypatch.setattr(robustness, "read", lambda directory: (synthetic_runs(), RANDOM))
    # The synthetic commit descends from protocol cpu v2's pre-registration and from nothing else;
    # its family is the three synthetic methods.
    monkeypatch.setattr(preregistration, "descends_from", lambda commit, ancestor: (
        commit == COMMIT and ancestor == robustness.PREREGISTRATIONS["cpu", 2]))
    monkeypatch.setitem(robustness.FAMILIES, ("cpu", 2), ("ppo_clip", "appo", "vaco"))
    assert robustness.protocol_version(tmp_path) == 2
    assert robustness.registration(tmp_path) == "a5f50b2db9b939aa52f6a8b53bf0e140b03a16dd"
    assert bench_command.main(["--table", str(tmp_path)]) == 0
    assert {"aggregates.csv", "comparisons.csv", "reliability.csv", "leaderboard.md",
            "leaderboard.png"} <= {p.name for p in tmp_path.iterdir()}
    assert set(pd.read_csv(tmp_path / "comparisons.csv")["verdict"]) == {"higher"}
    assert "after the pre-registration (a5f50b2)" in (tmp_path / "leaderboard.md").read_text()
    assert bench_command.main(["--table", str(tmp_path), "--check"]) == 0
    assert bench_command.main(["--table", str(tmp_path), "--agree-with", "x.csv"]) == 2


def test_a_board_without_exactly_its_registered_methods_gets_no_verdict_words(
        tmp_path, monkeypatch):
    family = robustness.FAMILIES["cpu", 2]
    assert len(set(family)) == 17 and robustness.REFERENCE in family
    for method in ("ppo_clip", "appo", "vaco"):
        _method_dir(tmp_path / method, method, protocol="cpu")
    monkeypatch.setattr(robustness, "read", lambda directory: (synthetic_runs(), RANDOM))
    monkeypatch.setattr(preregistration, "descends_from", lambda commit, ancestor: True)
    assert robustness.family(tmp_path) == family
    r = robustness._recompute(tmp_path, None)
    assert r.status == "incomplete" and not r.pre_registered
    assert r.status_words.startswith("made at ccccccc, after the pre-registration (a5f50b2); "
                                     "its family names 17 methods, 14 without runs here (")
    assert set(r.comparisons["verdict"]) == {"Holm p < 0.05, estimate > 0"}
    assert "exploratory, without verdict words." in robustness.markdown(r)
    # A method the family does not name is as much a different family as one missing.
    monkeypatch.setitem(robustness.FAMILIES, ("cpu", 2), ("ppo_clip", "appo"))
    r = robustness._recompute(tmp_path, None)
    assert r.status == "incomplete" and r.status_words.endswith(
        "its family names 2 methods, 1 here it does not name (vaco): Holm's correction over "
        "these is not the registered test")
    monkeypatch.setitem(robustness.FAMILIES, ("cpu", 2), ("ppo_clip", "appo", "vaco"))
    assert robustness._recompute(tmp_path, None).status == "after"


def _method_dir(path, method, protocol="tiny", version=2):
    path.mkdir(parents=True)
    (path / "bench.json").write_text(json.dumps(
        {"method": method, "protocol": protocol, "protocol_version": version}))
    return path


def _read_synthetic(method_dir):
    method = json.loads((method_dir / "bench.json").read_text())["method"]
    return synthetic_runs(methods=[method]), RANDOM


def test_a_method_is_ranked_beside_the_leaderboards_methods_that_compute_what_it_computes(
        tmp_path, monkeypatch):
    board = tmp_path / "board"
    for method in ("ppo_clip", "appo", "vaco", "geppo"):
        _method_dir(board / method, method)
    _method_dir(board / "old", "icepop", version=1)          # another version: not a candidate
    mine = _method_dir(tmp_path / "mine", "vaco")
    monkeypatch.setattr(robustness, "read_method", _read_synthetic)
    seen = []

    def comparable(info):
        seen.append(info["method"])
        return info["method"] != "geppo", "program of cell bench/a/geppo/lag differs"

    r = robustness.beside(mine, board, comparable, reps=200)
    # The board's own vaco gives way to this one; geppo computes something else here.
    assert sorted(seen) == ["appo", "geppo", "ppo_clip"]
    assert set(r.scores["method"]) == {"vaco", "ppo_clip", "appo"}
    assert r.left_out == ["geppo: program of cell bench/a/geppo/lag differs"]
    assert robustness.ranking(r) == ["vaco", "appo", "ppo_clip"]
    text = robustness.markdown(r)
    assert ("Methods of the leaderboard left out, and why:\n"
            "* geppo: program of cell bench/a/geppo/lag differs") in text
    # The pre-registered family named the leaderboard's methods, not this one: no verdict words.
    assert not r.pre_registered and "without verdict words" in text
    # The board is named as a result records a path: relative, never this machine's location.
    monkeypatch.chdir(tmp_path)
    assert robustness.beside(mine, board.resolve(), comparable, reps=20).status_words.startswith(
        "vaco beside the leaderboard board, ")
    assert set(r.comparisons["verdict"]) <= {"Holm p < 0.05, estimate > 0",
                                             "Holm p < 0.05, estimate < 0", "Holm p ≥ 0.05"}
    # A board with nothing comparable still ranks the method (against no reference: said why).
    alone = robustness.beside(mine, board, lambda info: (False, "made with jax 0.9.1"), reps=200)
    assert alone.scores is None and "no ppo_clip runs" in alone.notes[0]
    assert len(alone.left_out) == 3


def test_vaco_bench_writes_a_finished_v2_method_beside_the_leaderboard(tmp_path, monkeypatch,
                                                                        capsys):
    from vaco_jax import io
    from vaco_jax.commands import bench as bench_command
    from vaco_jax.study import bench, sweep
    board = tmp_path / "board"
    for method in ("ppo_clip", "appo"):
        _method_dir(board / method, method)
    mine = _method_dir(tmp_path / "vaco", "vaco")
    monkeypatch.setattr(robustness, "read_method", _read_synthetic)
    monkeypatch.setattr(bench, "computed_here", lambda info: (True, "same programs"))
    args = ["--algo", "vaco", "--protocol", "tiny", "--out", str(mine), "--leaderboard",
            str(board), "--report-only", "--no-progress"]
    cells = [c.cell_id for c in bench.bench_cells(bench.Method("vaco"), bench.protocol("tiny"))]
    io.append_jsonl(mine / bench.RUNS / sweep.CELLS, [{"cell": cells[0]}])
    assert bench_command.main(args) == 0            # one cell still to run: no report yet
    assert f"1 cells not finished yet: {cells[1]}" in capsys.readouterr().out
    assert not (mine / robustness.BESIDE).exists()
    io.append_jsonl(mine / bench.RUNS / sweep.CELLS, [{"cell": cells[1]}])
    assert bench_command.main(args) == 0
    text = (mine / robustness.BESIDE / "leaderboard.md").read_text()
    assert "| vaco | " in text and "| appo | " in text and "| ppo_clip | " in text


def test_the_minatar_studies_run_from_their_study_files_with_the_committed_numbers():
    from vaco_jax.analysis import study
    from vaco_jax.study import specs
    loaded = study.load(specs.ROOT / "studies" / "minatar-long.toml", root=specs.ROOT)
    lines = study.make(loaded, specs.ROOT, descends=lambda commit, ancestor: True)[
        "report.md"].splitlines()
    assert ("| cnn | mlp | gymnax:Breakout-MinAtar | -6.62 [-13.02, -0.22] | 5 | 0.044 | 0.044 | "
            "the MLP learns more at this budget |") in lines
    assert "| cnn | gymnax:Breakout-MinAtar | 6.84 [5.56, 8.08] | 5 |" in lines
    assert "| mlp | gymnax:Breakout-MinAtar | 9.67 [8.30, 10.47] | 5 |" in lines


def test_the_leaderboard_states_each_methods_cost_summed_over_its_cells_records(tmp_path):
    from vaco_jax import io
    cell = {"runs": 20, "env_steps_per_run": 1000, "compile_seconds": 10.0, "host": "h"}
    for method, walls in (("ppo_clip", (60.0, 120.0)), ("vaco", (30.0,))):
        (tmp_path / method).mkdir()
        (tmp_path / method / "bench.json").write_text(json.dumps(
            {"method": method, "learning_rate": 0.003}))
        # Two records: a call that was stopped and the one that resumed it.
        io.append_jsonl(tmp_path / method / "runs" / "cells.jsonl", [
            {**cell, "cell": f"c{i}", "wall_seconds": w, "train_seconds": w - 10}
            for i, w in enumerate(walls)])
    io.append_jsonl(tmp_path / "vaco" / "tuning" / "cells.jsonl", [
        {**cell, "cell": "t", "wall_seconds": 600.0, "train_seconds": 590.0}])
    cost = robustness.costs(tmp_path).set_index("method")
    assert cost.loc["ppo_clip", "runs_wall_seconds"] == 180.0
    assert cost.loc["ppo_clip", "runs_env_steps"] == 40_000
    assert np.isnan(cost.loc["ppo_clip", "tuning_wall_seconds"])
    assert cost.loc["vaco", "tuning_wall_seconds"] == 600.0
    (tmp_path / "vaco" / "tuning.json").write_text(json.dumps(
        {"grid": [1e-4, 3e-4, 1e-3, 3e-3], "chosen": 3e-3}))
    r = robustness.Report(robustness.Spec(), cost=robustness.costs(tmp_path))
    assert list(r.cost["grid_edge"]) == ["", "largest"]
    text = robustness.markdown(r)
    assert "| vaco | 0.003 | 10.0 | 0.5 | h |" in text
    assert "| ppo_clip | 0.003 | undefined | 3.0 | h |" in text
    assert ("Chose the largest learning rate of the grid (a better one may lie beyond it): "
            "vaco.") in text and "smallest" not in text
    assert "other processes" not in text   # no cell recorded it
    # Cells that recorded how much CPU other processes used meanwhile: the sum, in minutes.
    io.append_jsonl(tmp_path / "vaco" / "runs" / "cells.jsonl", [
        {**cell, "cell": "c1", "wall_seconds": 30.0, "train_seconds": 20.0,
         "others_cpu_seconds": 90.0}])
    cost = robustness.costs(tmp_path).set_index("method")
    assert "runs_others_cpu_seconds" not in cost   # vaco's first cell did not record it
    (tmp_path / "vaco" / "runs" / "cells.jsonl").unlink()
    io.append_jsonl(tmp_path / "vaco" / "runs" / "cells.jsonl", [
        {**cell, "cell": f"c{i}", "wall_seconds": 30.0, "train_seconds": 20.0,
         "others_cpu_seconds": 90.0 * i} for i in (1, 2)])
    r = robustness.Report(robustness.Spec(), cost=robustness.costs(tmp_path))
    assert r.cost.set_index("method").loc["vaco", "runs_others_cpu_seconds"] == 270.0
    assert "| vaco | 0.003 | 10.0 | 1.0 | h | undefined | 4.5 |" in robustness.markdown(r)


def test_a_cell_record_says_how_much_cpu_other_processes_used_meanwhile():
    import os
    import subprocess
    import sys

    from vaco_jax import io
    if io.cpu_seconds() is None:
        pytest.skip("no /proc/stat on this system")
    waited = lambda: os.times().children_user + os.times().children_system  # noqa: E731
    before, since = waited(), io.cpu_seconds()
    subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                    "while time.process_time() - t < 0.5: pass"], check=True)
    child = waited() - before   # the CPU seconds the busy child used
    assert io.others_cpu_seconds(since) >= 0.8 * child > 0.3
    assert io.others_cpu_seconds(None) is None
    assert io.cpu_seconds("/nonexistent") is None
