"""The lag-robustness benchmark (`vaco-bench`, `vaco_jax.study.bench`, `.scorecard`,
`.leaderboard`) end to end on the `tiny` protocol, and its paired statistics by hand."""

import json
import shutil
from pathlib import Path

import jax
import matplotlib.pyplot as plt
import numpy as np
import pytest
from scipy import stats as scipy_stats

from vaco_jax import io
from vaco_jax.commands import bench as bench_command
from vaco_jax.errors import ConfigError, SweepError
from vaco_jax.study import bench, keys, scorecard, stats, sweep

TINY_V1 = ["--protocol", "tiny", "--protocol-version", "1"]   # the version 1 scorecard's protocol


# --- paired statistics against hand computations -------------------------------------------------
def test_sign_flip_test_is_exact_for_few_seeds():
    # All 3 differences positive: of the 8 sign patterns only all-plus and all-minus reach |mean| 2.
    assert stats.sign_flip_test([1.0, 2.0, 3.0]) == pytest.approx(2 / 8)
    # d = (1, -1): every pattern has |mean| 0 or 1; the observed 0 is reached by all 4.
    assert stats.sign_flip_test([1.0, -1.0]) == pytest.approx(1.0)
    # (3, 1, 1): |mean| ≥ 5/3 for (+,+,+) and (−,−,−) only; (+,+,−) gives 1, so p = 2/8.
    assert stats.sign_flip_test([3.0, 1.0, 1.0]) == pytest.approx(2 / 8)
    # Ten seeds of one sign: the smallest p-value ten seeds can give.
    assert stats.sign_flip_test(np.arange(1.0, 11.0)) == pytest.approx(2 / 1024)


def test_holm_adjusts_step_down_and_keeps_order():
    adjusted = stats.holm([0.01, 0.04, 0.03, np.nan])
    # sorted 0.01, 0.03, 0.04 → 3·0.01, max(0.03, 2·0.03), max(0.06, 1·0.04)
    np.testing.assert_allclose(adjusted[:3], [0.03, 0.06, 0.06])
    assert np.isnan(adjusted[3])


def test_paired_t_interval_is_students():
    d = np.array([0.3, -0.1, 0.5, 0.2, 0.4])
    mean, low, high = stats.paired_t_interval(d)
    half = scipy_stats.t.ppf(0.975, 4) * d.std(ddof=1) / np.sqrt(5)
    assert (mean, low, high) == pytest.approx((d.mean(), d.mean() - half, d.mean() + half))


def test_the_sign_flip_interval_is_the_set_of_shifts_the_test_keeps():
    # By hand: d = 1..6. The test at shift Δ is exact over 64 patterns; the interval's ends are the
    # last shifts on a fine grid whose p stays ≥ 0.05, found here by brute force.
    d = np.arange(1.0, 7.0)
    grid = np.linspace(-2.0, 9.0, 11_001)
    kept = grid[[stats.sign_flip_test(d - g) >= 0.05 for g in grid]]
    mean, low, high = stats.sign_flip_interval(d)
    assert mean == 3.5
    assert low == pytest.approx(kept.min(), abs=1e-3) and high == pytest.approx(kept.max(), abs=1e-3)
    assert stats.sign_flip_test(d - low) >= 0.05 > stats.sign_flip_test(d - (low - 1e-3))


def test_the_sign_flip_interval_agrees_with_the_test_where_students_does_not():
    # One large difference and nine small ones, all positive: the exact test gives 2/1024, the
    # t interval spans 0, the inverted test's interval does not.
    d = np.array([10.0] + [0.01] * 9)
    assert stats.sign_flip_test(d) == pytest.approx(2 / 1024)
    assert stats.paired_t_interval(d)[1] < 0 < stats.sign_flip_interval(d)[1]
    rng = np.random.default_rng(3)
    for n in (6, 8, 10, 12):
        for _ in range(20):
            d = rng.lognormal(size=n) - rng.uniform(0.5, 2.0)
            _, low, high = stats.sign_flip_interval(d)
            assert (low <= 0 <= high) == (stats.sign_flip_test(d) >= 0.05), d


def test_with_five_seeds_the_sign_flip_interval_is_unbounded():
    # 2/32 = 0.0625 is the smallest p five seeds can give: no shift is rejected at 5%.
    assert stats.sign_flip_interval([1.0, 2.0, 3.0, 4.0, 5.0])[1:] == (-np.inf, np.inf)


# --- protocols and methods ------------------------------------------------------------------------
def test_methods_and_protocols_are_checked_before_compiling():
    with pytest.raises(ConfigError, match="option `protocol`"):
        bench.protocol("laptop")
    with pytest.raises(ConfigError, match="option `set`"):
        bench.parse_overrides(["not_a_field=1"])
    assert bench.parse_overrides(["kl_adaptive=true", "tv_reference=learner"]) == \
        (("kl_adaptive", True), ("tv_reference", "learner"))
    with pytest.raises(ConfigError, match="algo"):
        bench.bench_cells(bench.Method("no_such_algo"), bench.protocol("tiny", 1))
    method = bench.Method("ppo_kl", (("kl_adaptive", True),))
    assert method.name == "ppo_kl[kl_adaptive=True]"
    cells = bench.bench_cells(method, bench.protocol("cpu", 1))
    # One program for the lag axis (k = 0, 3, 15 as capacities 1, 4, 16 of the oldest snapshot)
    # and one for the high update frequency, every seed paired across methods.
    assert [c.variant for c in cells] == ["lag", "forward"]
    assert sorted({r.capacity for r in cells[0].runs}) == [1, 4, 16]
    assert cells[0].config.snapshot_sampling == "oldest" and cells[0].config.kl_adaptive
    assert cells[1].config.num_epochs == 16 and {r.capacity for r in cells[1].runs} == {1}
    assert [r.seed for r in cells[0].runs[:10]] == list(range(200, 210))


def test_result_code_leaves_out_analysis_only_modules():
    sources = bench.result_sources()
    assert "trainer.py" in sources and "objectives.py" in sources and "study/sweep.py" in sources
    assert not any(name.startswith(("study/scorecard", "study/stats", "study/lag_by_setting",
                                    "study/leaderboard", "commands/plot", "llm/")) for name in sources)
    other = dict(sources, **{"trainer.py": "0" * 12})
    assert bench.code_difference(sources, other) == ["trainer.py"]


# --- end to end on the tiny protocol -----------------------------------------------------------------
@pytest.fixture(scope="module")
def board(tmp_path_factory):
    root = tmp_path_factory.mktemp("lag-bench")
    for algo in ("ppo_clip", "vaco"):
        assert bench_command.main(["--algo", algo, *TINY_V1, "--out", str(root / algo),
                               "--leaderboard", str(root), "--no-progress"]) == 0
    return root


def test_a_scorecard_holds_every_section_and_compares_with_the_same_code(board):
    card = json.loads((board / "vaco" / "scorecard.json").read_text())
    assert card["method"] == "vaco" and card["protocol"] == "tiny" and not card["missing_cells"]
    assert {r["task"] for r in card["sanity"]} == {"toy_reach"}
    # Retention at every lag k > 0 and at each lag of the high-update-frequency setting, final
    # and AUC, each inside its interval.
    cols = {(r["metric"], r["setting"], r["lag"]) for r in card["retention"]}
    assert cols == {(m, s, k) for m in ("final", "auc") for s, k in
                    (("lag", 1), ("lag", 3), ("forward", 0), ("forward", 3))}
    for r in card["retention"]:
        assert r["low"] <= r["retention"] <= r["high"] and r["seeds"] == 3
    # Against PPO-Clip (a reference method): 2 settings × 2 metrics, pre-registered, Holm-adjusted.
    rows = [r for r in card["comparisons"] if r["against"] == "ppo_clip"]
    assert len(rows) == 4 and all(r["family"] == "pre-registered" for r in rows)
    assert all(r["p_holm"] >= r["p"] for r in rows)
    assert not card["not_compared"]
    # The retention matches a hand computation from the stored runs.
    result = scorecard.load(board / "vaco")
    runs = result.runs
    base = runs[(runs.setting == "lag") & (runs.lag == 0)].set_index("seed").final_z
    lagged = runs[(runs.setting == "lag") & (runs.lag == 3)].set_index("seed").final_z
    row = next(r for r in card["retention"] if (r["metric"], r["setting"], r["lag"]) == ("final", "lag", 3))
    assert row["retention"] == pytest.approx(lagged.mean() / base.mean())
    for name in ("scorecard.md", "scorecard.png"):
        assert (board / "vaco" / name).stat().st_size > 0


def set_bench_info(directory, **changes):
    """Edit a method's bench.json as if it had been made otherwise (`programs`: cell id → key)."""
    path = directory / bench.BENCH_FILE
    info = json.loads(path.read_text())
    info["comparability"]["programs"].update(changes.pop("programs", {}))
    info["comparability"]["versions"].update(changes.pop("versions", {}))
    info.update(changes)
    path.write_text(json.dumps(info))


def test_every_record_keeps_what_its_cells_compute(board):
    info = json.loads((board / "vaco" / bench.BENCH_FILE).read_text())
    key = bench.comparability_key(bench.Method("vaco"), bench.protocol("tiny", 1))
    assert info["comparability"] == key and key["protocol_version"] == 1
    assert set(key["programs"]) == {"bench/toy_reach/vaco/lag", "bench/toy_reach/vaco/forward"}
    assert key["versions"]["jax"] == jax.__version__ and "vaco_jax" not in key["versions"]
    records = sweep.load_cells(board / "vaco" / bench.RUNS)
    assert dict(zip(records.cell, records.program)) == key["programs"]
    assert (records.others_cpu_seconds >= 0).all()   # how busy the machine was meanwhile
    card = json.loads((board / "vaco" / "scorecard.json").read_text())
    assert card["comparability"] == key


def test_a_run_resumes_over_other_source_text_computing_its_programs_and_names_one_that_does_not(
        board, tmp_path, capsys):
    mine = tmp_path / "vaco"
    shutil.copytree(board / "vaco", mine)
    cells = mine / bench.RUNS / sweep.CELLS
    # Made before a docstring was edited: other source text, the programs this code computes.
    records = [dict(r, source="0123456789abcdef") for r in io.read_jsonl(cells)]
    io.write_jsonl_atomic(cells, records)
    args = ["--algo", "vaco", *TINY_V1, "--out", str(mine), "--leaderboard", str(board),
            "--no-progress"]
    assert bench_command.main(args) == 0
    assert "2 cells, 2 already finished, running 0" in capsys.readouterr().out
    # One cell of another program: refused, named.
    [lag, _] = bench.bench_cells(bench.Method("vaco"), bench.protocol("tiny", 1))
    other = keys.PREFIX + "0" * 16
    io.write_jsonl_atomic(cells, [dict(r, program=other) if r["cell"] == lag.cell_id else r
                                  for r in records])
    assert bench_command.main(args) == 2
    assert (f"holds 1 cell made by another program than this code's: '{lag.cell_id}' (program "
            f"{other}; this code's: {keys.cell_key(lag)})") in capsys.readouterr().err


def test_references_that_compute_otherwise_are_named_not_compared(board, tmp_path):
    other = tmp_path / "board"
    shutil.copytree(board, other)
    # Other source files (a docstring edited, say) with the same programs: compared.
    set_bench_info(other / "ppo_clip", result_code="0" * 16)
    card = scorecard.scorecard(other / "vaco", other, reps=200)
    assert not card.not_compared and len(card.comparisons)
    # Another program: named, not compared.
    set_bench_info(other / "ppo_clip", programs={"bench/toy_reach/ppo_clip/lag": "0" * 16})
    card = scorecard.scorecard(other / "vaco", other, reps=200)
    assert card.comparisons.empty
    [note] = card.not_compared
    assert note["method"] == "ppo_clip"
    assert note["why"] == "cell bench/toy_reach/ppo_clip/lag differs (config or runs)"
    assert "vaco-bench --algo ppo_clip --protocol tiny" in note["recompute"]
    assert "Recompute" in scorecard.markdown(card)


def test_before_a_run_the_leaderboard_is_said_comparable_or_not_and_why(board, tmp_path):
    proto = bench.protocol("tiny", 1)
    assert bench.leaderboard_comparability(board, proto) == (
        f"leaderboard {board} (2 methods): comparable: same programs, inputs, versions and "
        f"protocol tiny v1")
    assert "no method on protocol tiny" in bench.leaderboard_comparability(tmp_path / "none", proto)
    other = tmp_path / "board"
    shutil.copytree(board, other)
    set_bench_info(other / "ppo_clip", programs={"bench/toy_reach/ppo_clip/forward": "0" * 16},
                   git_commit="abcdef0123")
    note = bench.leaderboard_comparability(other, proto)
    assert note.startswith(f"leaderboard {other}: comparable with 1 of 2 methods (vaco); not with "
                           f"ppo_clip: cell bench/toy_reach/ppo_clip/forward differs (config or runs)")
    assert "worktree at commit abcdef0" in note
    for method in ("ppo_clip", "vaco"):
        set_bench_info(other / method, versions={"jax": "0.9.1"})
    assert f"(2 methods): not comparable: made with jax 0.9.1 (here {jax.__version__})" in \
        bench.leaderboard_comparability(other, proto)
    # Made before results recorded their programs: comparable only by the same source files.
    for method in ("ppo_clip", "vaco"):
        info = json.loads((other / method / bench.BENCH_FILE).read_text())
        del info["comparability"]
        info["versions"] = bench.key_versions()
        (other / method / bench.BENCH_FILE).write_text(json.dumps(info))
    assert "comparable: same result code" in bench.leaderboard_comparability(other, proto)
    for method in ("ppo_clip", "vaco"):
        info = json.loads((other / method / bench.BENCH_FILE).read_text())
        info["result_sources"]["trainer.py"] = "0" * 12
        info["result_code"] = bench.result_code(info["result_sources"])
        (other / method / bench.BENCH_FILE).write_text(json.dumps(info))
    note = bench.leaderboard_comparability(other, proto)
    assert "not comparable with any of its 2 methods: ppo_clip: made before results recorded " \
        "their programs" in note
    assert "differing from this checkout's in trainer.py" in note
    # Entries of another protocol are not this benchmark's.
    assert "no method on protocol cpu" in bench.leaderboard_comparability(other, bench.protocol("cpu", 1))


def test_a_leaderboard_entry_without_runs_is_named_in_the_report_never_a_traceback(board, tmp_path):
    # A committed entry keeps its bench.json and scorecard but not its per-seed runs.
    other = tmp_path / "board"
    shutil.copytree(board, other)
    shutil.rmtree(other / "ppo_clip" / bench.RUNS)
    mine = tmp_path / "vaco"
    shutil.copytree(board / "vaco", mine)
    for name in ("scorecard.json", "scorecard.md", "scorecard.png"):
        (mine / name).unlink()
    assert bench_command.main(["--algo", "vaco", *TINY_V1, "--out", str(mine),
                           "--leaderboard", str(other), "--report-only"]) == 0
    for name in ("scorecard.json", "scorecard.md", "scorecard.png"):
        assert (mine / name).stat().st_size > 0
    card = json.loads((mine / "scorecard.json").read_text())
    [note] = card["not_compared"]
    assert note["method"] == "ppo_clip" and "holds no per-seed runs" in note["why"]
    text = " ".join((mine / "scorecard.md").read_text().split())
    assert "`ppo_clip`: its directory holds no per-seed runs" in text
    assert "nan" not in text   # what cannot be computed is said, not printed as a number
    assert "Not normalised by synchronous PPO-Clip (–): the leaderboard holds no `ppo_clip` that " \
        "could be compared" in text


def test_a_figure_that_cannot_be_drawn_is_said_and_the_rest_written(board, tmp_path, monkeypatch,
                                                                   capsys):
    def broken(card, leaderboard):
        raise AttributeError("'DataFrame' object has no attribute 'task'")

    monkeypatch.setattr(scorecard, "scorecard_figure", broken)
    mine = tmp_path / "vaco"
    shutil.copytree(board / "vaco", mine)
    (mine / "scorecard.png").unlink()
    assert bench_command.main(["--algo", "vaco", *TINY_V1, "--out", str(mine),
                           "--leaderboard", str(board), "--report-only"]) == 0
    assert (mine / "scorecard.md").exists() and not (mine / "scorecard.png").exists()
    assert f"{mine / 'scorecard.png'} was not written (AttributeError: 'DataFrame' object has no " \
        f"attribute 'task')" in capsys.readouterr().err


@pytest.mark.parametrize("protocol", ["tiny", "llm-tiny"])
def test_a_scorecard_that_cannot_be_computed_ends_the_run_with_a_message_and_its_runs_kept(
        protocol, tmp_path, monkeypatch, capsys):
    """The run (monkeypatched: it writes a row) finishes, then its scorecard raises: exit 1, the
    reason and where the runs are, never a traceback; the rows are as the run left them."""
    from vaco_jax.llm import bench as llm_bench, scorecard as llm_scorecard

    out = tmp_path / "vaco"
    runs = out / bench.RUNS if protocol == "tiny" else out
    row = '{"cell": "bench/toy_reach/vaco/lag", "eval_return": 1.5}\n'

    def long_run(*args, **options):
        runs.mkdir(parents=True, exist_ok=True)
        (runs / sweep.RESULTS).write_text(row)

    def broken(directory, leaderboard=None, **options):
        raise KeyError("task")

    monkeypatch.setattr(bench, "run_bench", long_run)
    monkeypatch.setattr(llm_bench, "run", long_run)
    monkeypatch.setattr(scorecard, "scorecard", broken)
    monkeypatch.setattr(llm_scorecard, "scorecard", broken)
    (tmp_path / "board").mkdir()
    argv = ["--algo", "vaco", "--protocol", protocol, "--out", str(out),
            "--leaderboard", str(tmp_path / "board")]
    assert bench_command.main(argv + ["--protocol-version", "1"]) == 1
    assert (f"error: the scorecard of {out} could not be computed (KeyError: 'task'); its runs "
            f"are kept in {runs}: rerun with --report-only") in capsys.readouterr().err
    assert (runs / sweep.RESULTS).read_text() == row
    assert not list(out.glob("scorecard.*"))


def test_the_report_says_which_cells_are_missing(board, tmp_path):
    partial = tmp_path / "vaco"
    shutil.copytree(board / "vaco", partial)
    cells = partial / bench.RUNS / sweep.CELLS
    records = [json.loads(line) for line in cells.read_text().splitlines()]
    cells.write_text(json.dumps(records[0]) + "\n")   # the forward cell never finished
    (tmp_path / "none").mkdir()
    assert bench_command.main(["--algo", "vaco", *TINY_V1, "--out", str(partial),
                           "--leaderboard", str(tmp_path / "none"), "--report-only"]) == 0
    card = json.loads((partial / "scorecard.json").read_text())
    assert card["missing_cells"] == ["bench/toy_reach/vaco/forward"]
    assert {r["setting"] for r in card["retention"]} == {"lag"}
    assert "Incomplete" in (partial / "scorecard.md").read_text()


def test_the_default_leaderboard_is_the_checkout_s_from_any_directory(board, tmp_path,
                                                                     monkeypatch, capsys):
    mine = tmp_path / "vaco"
    shutil.copytree(board / "vaco", mine)
    monkeypatch.chdir(tmp_path)
    args = ["--algo", "vaco", *TINY_V1, "--out", str(mine), "--report-only"]
    assert bench_command.main(args) == 0
    committed = Path(__file__).resolve().parent.parent / "results" / "lag-bench" / "tiny"
    assert bench.committed_leaderboard("tiny") == committed
    # No tiny leaderboard is committed: the scorecard says it compared with none, and where it looked.
    assert f"compared with no other method: there is no leaderboard at {committed}" in \
        " ".join(capsys.readouterr().err.split())
    assert json.loads((mine / "scorecard.json").read_text())["comparisons"] == []
    # A leaderboard named but absent is refused, not taken for an empty one.
    assert bench_command.main([*args, "--leaderboard", str(tmp_path / "absent")]) == 2
    assert "option `leaderboard` = " in capsys.readouterr().err


def test_the_leaderboard_table_ranks_every_method(board):
    open_figures = plt.get_fignums()
    assert bench_command.main(["--table", str(board)]) == 0
    text = (board / "leaderboard.md").read_text()
    assert "| vaco | toy_reach |" in text and "| ppo_clip | toy_reach |" in text
    assert (board / "leaderboard.png").stat().st_size > 0
    assert plt.get_fignums() == open_figures   # its figure is closed once written


def test_a_method_with_no_finished_cell_is_named_in_the_table_not_a_crash(board, tmp_path):
    other = tmp_path / "board"
    shutil.copytree(board, other)
    (other / "vaco" / bench.RUNS / sweep.CELLS).write_text("")   # started, nothing finished yet
    assert bench_command.main(["--table", str(other)]) == 0
    text = (other / "leaderboard.md").read_text()
    assert "| ppo_clip | toy_reach |" in text and "| vaco | toy_reach |" not in text
    assert "`vaco`: 2 cells not finished" in text


def test_a_table_of_methods_without_runs_is_refused_naming_them_not_a_traceback(board, tmp_path,
                                                                               capsys):
    other = tmp_path / "board"
    shutil.copytree(board, other)
    for method in ("ppo_clip", "vaco"):   # as committed: bench.json and scorecard, no runs
        shutil.rmtree(other / method / bench.RUNS)
    written = {p.name: p.read_bytes() for p in other.iterdir() if p.is_file()}
    assert bench_command.main(["--table", str(other)]) == 2
    assert "`vaco` left out: its directory holds no per-seed runs" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in other.iterdir() if p.is_file()} == written


def test_the_leaderboard_agrees_or_not_with_a_lag_study_by_rank_and_by_drops(tmp_path):
    import pandas as pd
    from scipy import stats

    from vaco_jax.study import leaderboard

    ours = pd.DataFrame({"method": ["vaco", "ppo_clip", "ppo_kl", "spo", "ppo_kl_adaptive"],
                         "task": ["idp"] * 5, "lag_retention": [0.95, 0.9, 0.3, 0.85, 0.1]})
    ours.attrs["largest_lag"] = 15
    study = pd.DataFrame({
        "task": ["idp"] * 7, "sampling": ["oldest"] * 6 + ["uniform"],
        "lag": ["k=15"] * 5 + ["k=3", "uniform C=16"],
        "method": ["vaco", "ppo_clip", "ppo_kl", "spo", "ppo_kl [kl_adaptive]", "spo", "spo"],
        "degradation": [0.99, 1.0, 0.18, 0.23, 0.76, 0.5, 0.5]})
    study.to_csv(tmp_path / "degradation.csv", index=False)
    agree = leaderboard.agreement(ours, tmp_path / "degradation.csv")
    # Only k = 15 under oldest sampling counts; the adaptive variant is found by its study name.
    assert list(agree.study) == [0.99, 1.0, 0.18, 0.23, 0.76]
    assert agree.attrs["spearman"] == pytest.approx(
        stats.spearmanr([0.95, 0.9, 0.3, 0.85, 0.1], [0.99, 1.0, 0.18, 0.23, 0.76])[0])
    # spo keeps 0.85 here but drops to 0.23 there: 4 of 5 agree.
    assert agree.attrs["agree"] == 4 and agree.attrs["methods"] == 5
    text = leaderboard.agreement_markdown(agree, "study")
    assert "agree on which methods drop (retention below 0.8) for 4 of 5" in text
    assert "| spo | idp | 0.85 | 0.23 | no | yes |" in text

    # The benchmark runs IMPALA at the protocol's 4 epochs: it is the study's 4-epoch variant, not
    # the study's one-pass `impala` row.
    study = pd.DataFrame({"task": ["idp"] * 2, "sampling": ["oldest"] * 2, "lag": ["k=15"] * 2,
                          "method": ["impala", "impala [epochs=4]"], "degradation": [-0.01, 0.06]})
    study.to_csv(tmp_path / "degradation.csv", index=False)
    impala = pd.DataFrame({"method": ["impala"], "task": ["idp"], "lag_retention": [0.03]})
    impala.attrs["largest_lag"] = 15
    assert list(leaderboard.agreement(impala, tmp_path / "degradation.csv").study) == [0.06]


def test_the_table_command_writes_the_agreement_with_a_study(board, tmp_path):
    import pandas as pd

    pd.DataFrame({"task": ["toy_reach"] * 2, "sampling": ["oldest"] * 2, "lag": ["k=3"] * 2,
                  "method": ["vaco", "ppo_clip"], "degradation": [0.9, 0.5]}).to_csv(
        tmp_path / "degradation.csv", index=False)
    assert bench_command.main(["--table", str(board), "--agree-with",
                           str(tmp_path / "degradation.csv")]) == 0
    text = (board / "agreement.md").read_text()
    assert "over the 2 methods both ran" in text and "too few methods" in text
    assert "| vaco | toy_reach |" in text and "| 0.90 |" in text


USER_OBJECTIVE = '''
import jax.numpy as jnp
import vaco_jax
from vaco_jax.objectives import log_ratio, masked_mean


@vaco_jax.objective(hparams={"tau": 0.04})
def penalised_pg(x, p):
    ratio = jnp.exp(log_ratio(x.log_prob, x.log_behavior))
    return -masked_mean(ratio * x.advantages - p.tau * (ratio - 1.0) ** 2, x.mask), {}
'''


def test_a_users_objective_gets_a_scorecard_beside_the_leaderboard(board, tmp_path, monkeypatch,
                                                                   capsys):
    import hashlib
    import importlib
    import sys

    from vaco_jax import algorithms

    path = tmp_path / "bench_objectives.py"
    path.write_text(USER_OBJECTIVE)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "mine"
    assert bench_command.main(["--algo", "gae+bench_objectives:penalised_pg", *TINY_V1,
                           "--set", "objective_hparams=tau=0.1", "--out", str(out),
                           "--leaderboard", str(board), "--no-progress"]) == 0
    info = json.loads((out / "bench.json").read_text())
    assert info["objective"]["hparams"] == {"tau": 0.1}
    assert info["objective"]["code"]["source"] == hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    card = json.loads((out / "scorecard.json").read_text())
    # Compared with the leaderboard's methods (the package's code is the same), pre-registered
    # against PPO-Clip and VACO.
    against = {r["against"] for r in card["comparisons"] if r["family"] == "pre-registered"}
    assert against == {"ppo_clip", "vaco"} and not card["not_compared"]
    algo = "gae+bench_objectives:penalised_pg"
    fingerprint = algorithms.objective_fingerprint(algorithms.resolve_objective(algo[4:]))
    assert info["objective"]["code"]["fingerprint"] == fingerprint
    assert {r["objective"]["fingerprint"] for r in io.read_jsonl(out / bench.RUNS / sweep.CELLS)} \
        == {fingerprint}

    def edit(text):
        path.write_text(text)
        importlib.invalidate_caches()
        importlib.reload(sys.modules["bench_objectives"])

    # Another version of the objective under the same name is refused before anything runs: by
    # the benchmark, and by the sweep beneath it.
    edit(USER_OBJECTIVE.replace("p.tau * (ratio - 1.0) ** 2", "p.tau * abs(ratio - 1.0)"))
    args = ["--algo", algo, *TINY_V1, "--set", "objective_hparams=tau=0.1", "--out",
            str(out), "--leaderboard", str(board), "--no-progress"]
    capsys.readouterr()
    assert bench_command.main(args) == 2
    assert "made by another version of its objective 'bench_objectives:penalised_pg'" in \
        " ".join(capsys.readouterr().err.split())
    cells = bench.bench_cells(bench.Method(algo, (("objective_hparams", ("tau=0.1",)),)),
                              bench.protocol("tiny", 1))
    with pytest.raises(SweepError, match="made by another version of objective"):
        sweep.run_sweep(cells, out / bench.RUNS, max_cells=0, log=lambda _: None)
    # A comment computes the same: the finished cells are its own, nothing runs again.
    edit("# tuned on ten seeds\n" + USER_OBJECTIVE)
    assert bench_command.main(args) == 0 and "running 0" in capsys.readouterr().out


EXAMPLE_PROFILE = Path(__file__).resolve().parent.parent / "docs" / "lag_profiles" / "example.json"


def test_a_lag_profile_adds_one_cell_per_task_checked_before_compiling(tmp_path, capsys):
    cells = bench.bench_cells(bench.Method("vaco"), bench.protocol("cpu", 1), (0.5, 0.25, 0.25))
    assert [c.variant for c in cells] == ["lag", "forward", "profile"]
    profile = cells[2].config
    assert (profile.snapshot_sampling, profile.lag_profile, profile.slots) == (
        "profile", (0.5, 0.25, 0.25), 3)
    assert profile.num_epochs == cells[0].config.num_epochs   # the lag axis's shapes
    assert [(r.capacity, r.seed) for r in cells[2].runs] == [(3, s) for s in range(200, 210)]
    assert bench_command.main(["--algo", "vaco", *TINY_V1, "--plan",
                           "--lag-profile", str(EXAMPLE_PROFILE)]) == 0
    assert "bench/toy_reach/vaco/profile: 3 runs" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text('{"probabilities": [-0.5, 1.5]}')
    assert bench_command.main(["--algo", "vaco", *TINY_V1, "--plan",
                           "--lag-profile", str(bad)]) == 2
    assert ">= 0" in capsys.readouterr().err


def test_a_scorecard_reports_retention_under_the_methods_lag_profile(board, tmp_path, capsys):
    # The method's finished cells are kept; only the profile's cell runs.
    out = tmp_path / "vaco"
    shutil.copytree(board / "vaco", out)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"probabilities": [0.5, 0.5]}))
    args = ["--algo", "vaco", *TINY_V1, "--out", str(out), "--leaderboard", str(board),
            "--no-progress", "--lag-profile", str(profile)]
    assert bench_command.main(args) == 0
    assert json.loads((out / bench.BENCH_FILE).read_text())["lag_profile"] == [0.5, 0.5]
    card = json.loads((out / "scorecard.json").read_text())
    assert not card["missing_cells"]
    rows = [r for r in card["retention"] if r["setting"] == "profile"]
    assert {(r["metric"], r["lag"]) for r in rows} == {("final", 1), ("auc", 1)}
    assert "lag profile (ages 0–1)" in (out / "scorecard.md").read_text()
    runs = sweep.load_results(out / bench.RUNS)
    assert set(runs[runs.variant == "profile"]["snapshot_sampling"]) == {"profile"}
    # Another profile needs another directory.
    profile.write_text(json.dumps({"probabilities": [0.25, 0.75]}))
    capsys.readouterr()
    assert bench_command.main(args) == 2
    assert "another --out directory for another profile" in capsys.readouterr().err


# --- protocol version 2 ----------------------------------------------------------------------------
def test_version_1_protocols_keep_the_cells_of_their_results():
    # Fingerprints of version 1's cells as the committed leaderboard's code planned them.
    pinned = {("tiny", "lag"): "bb6959026ff5d43f", ("tiny", "forward"): "9eb5f13768ec38d0",
              ("cpu", "lag"): "7863c9f3bd8d7517", ("cpu", "forward"): "7a0aeb8e2ab9b1ea"}
    for name in ("tiny", "cpu"):
        for cell in bench.bench_cells(bench.Method("vaco"), bench.protocol(name, 1)):
            assert cell.fingerprint() == pinned[name, cell.variant], cell.cell_id
    assert bench.protocol("cpu").version == 3 and bench.protocol("cpu", 1).lags == (0, 3, 15)
    with pytest.raises(ConfigError, match="option `protocol_version`"):
        bench.protocol("cpu", 7)


def test_the_v2_lag_axis_is_one_program_of_lag_profiles_per_task():
    proto = bench.protocol("cpu", 2)
    cells = bench.bench_cells(bench.Method("vaco"), proto, learning_rate=1e-3)
    assert [c.env for c in cells[::2]] == [t.env for t in proto.tasks] and len(proto.tasks) >= 5
    lag, forward = cells[0], cells[1]
    assert lag.config.snapshot_sampling == "profile" and lag.config.max_capacity == 9
    assert lag.variant == "lag" and forward.variant == "forward"
    tags = [dict(r.tags) for r in lag.runs]
    assert sorted({t["setting"] for t in tags}) == ["k=0", "k=2", "k=8", "uniform≤8"]
    assert {r.seed for r in lag.runs} == set(range(300, 310)) and len(lag.runs) == 40
    for run in lag.runs:
        hparams = dict(run.hparams)
        assert hparams["learning_rate"] == 1e-3
        profile, k = hparams["lag_profile"], dict(run.tags)["lag"]
        if k is None:   # the stochastic lag: every age 0..8 alike
            assert run.capacity == 9 and profile == pytest.approx([1 / 9] * 9)
        else:           # constant lag k: all the mass on age k, as `oldest` with capacity k + 1
            assert run.capacity == k + 1 and profile == (0.0,) * k + (1.0,)
    assert forward.config.num_epochs == 16 and len(forward.runs) == 20
    assert sorted({dict(r.tags)["setting"] for r in forward.runs}) == \
        ["num_epochs=16, k=0", "num_epochs=16, k=8"]
    # The tasks' own settings, and their env's episode length where the table gives none.
    pendulum = next(c for c in cells if c.env == "gymnax:Pendulum-v1")
    assert pendulum.config.gamma == 0.9 and pendulum.config.episode_length == 200
    # The choice of learning rate: the grid × the design seeds at k = 0, never a scored seed.
    tune = bench.tuning_cells(bench.Method("vaco"), proto)
    assert len(tune) == len(proto.tasks)
    assert {dict(r.hparams)["learning_rate"] for r in tune[0].runs} == {1e-4, 3e-4, 1e-3, 3e-3}
    assert {r.seed for r in tune[0].runs} == set(range(900, 905))
    assert {dict(r.tags)["setting"] for r in tune[0].runs} == {"k=0"}
    with pytest.raises(ConfigError, match="learning rate is chosen"):
        bench.bench_cells(bench.Method("vaco", (("learning_rate", 1e-3),)), proto)
    # A user's lag profile: one more program per task, its rows told apart from the protocol's.
    cells = bench.bench_cells(bench.Method("vaco"), proto, (0.5, 0.5), learning_rate=1e-3)
    assert [c.variant for c in cells[:3]] == ["lag", "forward", "profile"]
    assert {dict(r.tags)["snapshot_sampling"] for r in cells[2].runs} == {"user_profile"}
    assert {dict(r.tags)["snapshot_sampling"] for r in cells[0].runs} == {"oldest", "profile"}


def test_a_protocol_whose_extras_are_missing_fails_with_the_install_command(monkeypatch, capsys):
    from vaco_jax import envs

    monkeypatch.setattr(envs, "gymnax_available", lambda: False)
    assert bench_command.main(["--algo", "vaco", "--protocol", "cpu", "--plan"]) == 2
    assert 'pip install -e ".[gymnax]"' in capsys.readouterr().err


def test_the_plan_prints_the_size_and_a_time_only_where_throughput_was_measured(capsys, tmp_path):
    assert bench_command.main(["--algo", "vaco", "--protocol", "cpu", "--plan", "--out",
                               str(tmp_path / "none"), "--leaderboard", str(tmp_path)]) == 0
    # v3: six tasks × (4 lags + a uniform lag, and K = 16 at 2 lags) × 20 seeds, 128 iterations
    # of num_envs × 32 steps: (32 + 128 + 32 + 16 + 64 + 32) × 4,096 × 140 env steps
    assert "12 cells (12 compiled programs), 840 runs, 174,325,760 env steps" in \
        capsys.readouterr().out
    assert bench_command.main(["--algo", "vaco", "--protocol", "cpu", "--protocol-version", "2",
                               "--plan", "--out", str(tmp_path / "none"), "--leaderboard",
                               str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "10 cells (10 compiled programs), 300 runs, 108,134,400 env steps, 96,000 " \
           "evaluation episodes" in out
    # The whole cost: the learning-rate choice, the scored runs and the comparability check.
    assert "  the learning-rate choice: not estimated (no measured throughput for 5 of its 5 " \
           "cells)" in out
    assert "  the scored runs: not estimated" in out
    assert "comparability check lowers no cell" in out
    assert "estimated time in all: not estimated" in out
    cells = bench.tuning_cells(bench.Method("vaco"), bench.protocol("tiny", 2))
    measured = [{"cell": "bench/toy_reach/ppo_clip/tune", "sps": 1000.0, "compile_seconds": 5.0}]
    size = bench.plan_size(cells, measured)
    assert size["runs"] == 6 and size["env_steps"] == 6 * 8_192
    assert size["estimated_seconds"] == pytest.approx(6 * 8_192 / 1000 + 5)


def test_the_learning_rate_rule_normalises_per_task_and_ties_to_the_default():
    import pandas as pd

    proto = bench.protocol("tiny", 2)

    def rows(table):   # {env: {lr: return at every evaluation}}, one seed
        return pd.DataFrame([{"env": env, "learning_rate": lr, "seed": 900, "eval_index": i,
                              "eval_return": value}
                             for env, by_lr in table.items() for lr, value in by_lr.items()
                             for i in range(4)])

    # Task a: 1e-3 best (AUC 10 over random 0), 3e-4 half as good; task b: 3e-4 best.
    chosen = bench.choose_learning_rate(
        rows({"a": {1e-4: 0.0, 3e-4: 5.0, 1e-3: 10.0}, "b": {1e-4: 2.0, 3e-4: 4.0, 1e-3: 3.0}}),
        {"a": 0.0, "b": 2.0}, proto)
    # normalised: a 0, 0.5, 1; b 0, 1, 0.5 → means 0, 0.75, 0.75: a tie, to 3e-4.
    assert chosen["score"] == {"0.0001": 0.0, "0.0003": 0.75, "0.001": 0.75}
    assert chosen["chosen"] == 3e-4
    assert chosen["tasks"]["b"]["learning_rates"]["0.001"]["normalised_auc"] == 0.5
    chosen = bench.choose_learning_rate(
        rows({"a": {1e-4: 0.0, 3e-4: 5.0, 1e-3: 10.0}, "b": {1e-4: 2.0, 3e-4: 4.0, 1e-3: 4.0}}),
        {"a": 0.0, "b": 2.0}, proto)
    assert chosen["chosen"] == 1e-3


def test_the_leaderboard_holds_each_distinct_algorithm_once():
    from vaco_jax import algorithms

    names = [m.name for m in bench.LEADERBOARD_METHODS]
    keys = []
    for method in bench.LEADERBOARD_METHODS:
        algorithm = algorithms.parse(method.algo)
        keys.append((algorithm.estimator.name, algorithm.objective.name, method.overrides))
    assert len(set(keys)) == len(keys)
    assert "appo" in names and "vtrace_once+ppo_clip" not in names   # one computation
    assert "decoupled_ppo" in names and "tis" not in names
    assert {"vaco", "ppo_clip", "gae+tv_filter", "ppo_kl_adaptive", "ppo_kl_adaptive_learner"} <= set(names)


def test_the_tuned_learning_rate_is_chosen_recorded_and_required(tmp_path, capsys):
    out = tmp_path / "ppo_clip"
    base = ["--algo", "ppo_clip", "--protocol", "tiny", "--protocol-version", "2", "--out",
            str(out), "--no-progress"]
    # No choice yet, no --learning-rate: refused before anything compiles.
    assert bench_command.main(base) == 2
    assert "--tune" in capsys.readouterr().err and not (out / bench.RUNS).exists()
    assert bench_command.main(base + ["--tune"]) == 0
    tuning = json.loads((out / bench.TUNING_FILE).read_text())
    assert tuning["chosen"] in (1e-4, 3e-4, 1e-3) and tuning["design_seeds"] == [900, 901]
    assert set(tuning["tasks"]["toy_reach"]["learning_rates"]) == {"0.0001", "0.0003", "0.001"}
    assert tuning["cost"]["wall_seconds"] > 0 and tuning["cost"]["env_steps"] == 6 * 8_192
    assert bench_command.main(base) == 0
    info = json.loads((out / bench.BENCH_FILE).read_text())
    assert (info["learning_rate"], info["tuned"], info["protocol_version"]) == \
        (tuning["chosen"], True, 2)
    rows = sweep.load_results(out / bench.RUNS)
    assert set(rows["learning_rate"]) == {tuning["chosen"]}
    assert set(rows["seed"]) == {300, 301, 302}
    assert set(rows["setting"]) == {"k=0", "k=1", "k=3", "uniform≤3",
                                    "num_epochs=4, k=0", "num_epochs=4, k=3"}
    assert set(rows["cell"]) == {"bench/toy_reach/ppo_clip/lag", "bench/toy_reach/ppo_clip/forward"}
    commits = sweep.load_cells(out / bench.RUNS)["git_commit"]
    assert commits.notna().all()
    # Each finished sweep is stored compactly, ready to commit.
    for runs in (out / bench.RUNS, out / bench.TUNING_RUNS):
        assert (runs / "results.parquet").exists() and not (runs / sweep.RESULTS).exists()
    # The report's reader tells every setting apart: a constant lag as `oldest` (its one-hot
    # profile is that computation), the stochastic lag as the profile it is.
    from vaco_jax.pipeline import runs as pipeline_runs

    table = pipeline_runs.read([out / bench.RUNS])
    assert len(table) == 18 and set(table["lr"]) == {tuning["chosen"]}
    assert set(zip(table["k"], table["sampling"], table["K"])) == {
        (0, "oldest", 2), (1, "oldest", 2), (3, "oldest", 2), (3, "profile", 2),
        (0, "oldest", 4), (3, "oldest", 4)}
    # Another learning rate in the same directory is refused; elsewhere it is recorded as not tuned.
    assert bench_command.main(base + ["--learning-rate", "0.5"]) == 2
    assert "learning rate" in capsys.readouterr().err


def test_a_leaderboard_of_another_protocol_version_is_said_not_comparable(board):
    # The board holds version 1 methods; a version 2 run is compared with none of them.
    line = bench.leaderboard_comparability(board, bench.protocol("tiny", 2))
    assert line.startswith(f"leaderboard {board} (2 methods): not comparable: made on protocol "
                           f"tiny v1 (this run: v2)")
    # Version 1's results are still what this checkout computes for version 1.
    info = json.loads((board / "vaco" / bench.BENCH_FILE).read_text())
    assert bench.computed_here(info)[0]


def test_program_digests_compare_two_checkouts_and_name_each_program_that_differs(
        tmp_path, monkeypatch, capsys):
    from experiments import program_digests

    monkeypatch.setattr(program_digests, "digests",
                        lambda protocol, env: {"vaco/lag": "a", "ppo_clip/lag": "b"})
    (tmp_path / "same.json").write_text(json.dumps({"vaco/lag": "a", "ppo_clip/lag": "b"}))
    (tmp_path / "other.json").write_text(json.dumps({"vaco/lag": "a", "ppo_clip/lag": "c"}))
    out = str(tmp_path / "here.json")
    assert program_digests.main([out, "--compare", str(tmp_path / "same.json")]) == 0
    assert program_digests.main([out, "--compare", str(tmp_path / "other.json")]) == 1
    assert "differs: ppo_clip/lag: c there, b here" in capsys.readouterr().out
    assert json.loads(Path(out).read_text()) == {"vaco/lag": "a", "ppo_clip/lag": "b"}


def test_a_partial_save_that_cannot_be_resumed_is_an_error_message_not_a_traceback(
        tmp_path, monkeypatch, capsys):
    """A cell stopped part-way whose save another code wrote: exit 2 and the reason, for
    `vaco-bench` and `vaco-sweep` alike."""
    from vaco_jax.commands import sweep as sweep_command
    from vaco_jax.errors import CheckpointError

    def refused(*args, **options):
        raise CheckpointError("checkpoint 'partial/c' was written by other code")

    monkeypatch.setattr(bench, "run_bench", refused)
    monkeypatch.setattr(sweep, "run_sweep", refused)
    assert bench_command.main(["--algo", "vaco", "--protocol", "tiny", "--protocol-version", "1",
                               "--out", str(tmp_path / "b")]) == 2
    assert "error: checkpoint 'partial/c' was written by other code" in capsys.readouterr().err
    assert sweep_command.main(["--preset", "lag-tiny", "--out", str(tmp_path / "s")]) == 2
    assert "error: checkpoint 'partial/c' was written by other code" in capsys.readouterr().err


def test_check_of_a_v1_leaderboard_says_why_there_is_nothing_to_recompute(tmp_path, capsys):
    (tmp_path / "vaco").mkdir()
    (tmp_path / "vaco" / bench.BENCH_FILE).write_text(json.dumps(
        {"method": "vaco", "protocol": "cpu", "protocol_version": 1}))
    assert bench_command.main(["--table", str(tmp_path), "--check"]) == 2
    assert (f"error: {tmp_path} is a protocol v1 leaderboard: its methods' per-run files are not "
            "kept") in capsys.readouterr().err


def test_per_task_tuning_chooses_inside_its_grid_and_the_scored_runs_use_the_choice(tmp_path, capsys):
    """Protocol v3: `--tune` runs learning rates × ε on the design seeds, extends a choice on an
    edge until it is inside (or at a ladder's end), and the scored runs take the task's choice."""
    out = tmp_path / "ppo_clip"
    base = ["--algo", "ppo_clip", "--protocol", "tiny", "--protocol-version", "3", "--out",
            str(out), "--no-progress"]
    assert bench_command.main(base + ["--tune"]) == 0
    assert "toy_reach: learning_rate" in capsys.readouterr().out
    tuning = json.loads((out / bench.TUNING_FILE).read_text())
    task = tuning["tasks"]["toy_reach"]
    chosen, grid = task["chosen"], task["grid"]
    assert set(chosen) == {"learning_rate", "clip_eps"}
    # inside the final grid on both axes (this task's ladders do not end within reach)
    assert min(grid["learning_rates"]) < chosen["learning_rate"] < max(grid["learning_rates"])
    assert min(grid["values"]) < chosen["clip_eps"] < max(grid["values"]) and not task["edge"]
    assert len(task["configurations"]) == len(grid["learning_rates"]) * len(grid["values"]) >= 16
    best = max(task["configurations"], key=lambda row: row["auc"])
    assert (best["learning_rate"], best["clip_eps"]) == (chosen["learning_rate"], chosen["clip_eps"])
    assert bench_command.main(base) == 0
    rows = sweep.load_results(out / bench.RUNS)
    assert set(rows["learning_rate"]) == {chosen["learning_rate"]}
    assert set(rows["clip_eps"]) == {chosen["clip_eps"]}
    assert set(rows["seed"]) == {400, 401, 402}


def test_the_held_out_tasks_run_as_their_own_board_and_a_protocol_without_them_refuses(
        capsys, tmp_path):
    base = ["--algo", "vaco", "--protocol", "cpu", "--plan", "--out", str(tmp_path / "m")]
    assert bench_command.main(base + ["--held-out", "--tune"]) == 0
    out = capsys.readouterr().out
    assert "3 cells (3 compiled programs), 240 runs" in out      # 3 tasks × 16 configs × 5 seeds
    for env in ("gymnax:Asterix-MinAtar", "dmc:FingerTurnEasy", "pusher"):
        assert f"bench/{env}/vaco/tune" in out
    assert "dmc:CartpoleSwingup" not in out
    assert bench.committed_leaderboard("cpu", 3, held_out=True).name == "cpu-v3-held-out"
    assert bench_command.main(base + ["--held-out", "--protocol-version", "2"]) == 2
    assert "option `held_out` is invalid" in capsys.readouterr().err
