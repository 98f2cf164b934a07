"""The LLM protocols of the lag-robustness benchmark: protocols as data, the run and its resume,
the scorecard's normalisation, retention and comparisons against a hand computation, its notes,
and the LLM leaderboard with its check."""

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from vaco_jax import io
from vaco_jax.commands import bench as bench_command
from vaco_jax.llm import bench, experiment, families, scorecard
from vaco_jax.llm import config as llm_config

WARM = {"greedy": 0.2, "sampled": 0.1}


# --- protocols ------------------------------------------------------------------------------------
def test_llm_protocols_are_data_that_validate_and_plan_from_their_own_fields():
    cpu = bench.protocol("llm-cpu", 1)
    assert cpu.version == 1 and cpu.ks == bench.LLM_CPU_KS and cpu.ks[0] == 0
    assert cpu.seeds == 10 and cpu.seed == 300 and cpu.runs_per_call <= 10
    scored = set(range(cpu.seed, cpu.seed + cpu.seeds))
    assert not scored & set(range(cpu.design_seed, cpu.design_seed + cpu.design_seeds))
    assert cpu.config().grpo.seed == 300 and cpu.config().grpo.num_seeds == 10
    for proto in bench.VERSIONS.values():
        config = bench.check(proto, "vaco")          # validates every N and lag, compiles nothing
        size = bench.plan(proto)
        assert size["runs"] == len(proto.lag_settings) * len(proto.ns) * proto.seeds
        assert size["iterations"] == size["runs"] * config.grpo.iterations
        assert size["answers"] == size["iterations"] * config.grpo.batch_size
    gpu = bench.protocol("llm-gpu").config()
    assert gpu.model.dtype == "bfloat16" and gpu.model.d_model == 1024
    assert bench.protocol("llm-cpu").version == 2      # a name alone: its newest version
    with pytest.raises(llm_config.ConfigError, match=r"--protocol-version.*\[1, 2\]"):
        bench.protocol("llm-cpu", 7)


def test_llm_tiny_says_it_checks_the_pipeline_and_measures_nothing():
    # Its shipped warm start scores 0 (the record's held-out accuracy), and its runs stay there:
    # the plan says so rather than promise a measurement.
    from vaco_jax.llm import sft
    proto = bench.protocol("llm-tiny", 1)
    record = json.loads(sft.shipped_record(proto.config()).read_text())
    assert record["base_accuracy"] == 0.0
    text = bench.plan_text(proto)
    assert "pipeline end to end" in text.splitlines()[0] and "measures nothing" in text
    assert "measures nothing" not in bench.plan_text(bench.protocol("llm-cpu"))


def test_a_bad_objective_or_option_is_refused_before_anything_compiles(monkeypatch, capsys):
    monkeypatch.setattr(experiment, "train_one_n", lambda *a, **k: pytest.fail("it trained"))
    assert bench_command.main(["--protocol", "llm-tiny", "--algo", "appo"]) == 2
    err = capsys.readouterr().err
    assert "`algo` = 'appo' is invalid" in err and "ppo_clip" in err and "llm-tiny" in err
    assert bench_command.main(["--protocol", "llm-tiny", "--protocol-version", "1", "--algo",
                               "vaco", "--tune"]) == 2
    assert "option `tune` is invalid for protocol llm-tiny v1" in capsys.readouterr().err
    assert bench_command.main(["--protocol", "llm-tiny", "--algo", "vaco",
                           "--protocol-version", "7"]) == 2
    assert "--protocol-version" in capsys.readouterr().err
    assert bench_command.main(["--protocol", "llm-cpu", "--algo", "vaco", "--plan"]) == 0
    plan = capsys.readouterr().out
    assert f"{bench.plan(bench.protocol('llm-cpu'))['runs']} runs" in plan


# --- the run, end to end --------------------------------------------------------------------------
def test_llm_tiny_runs_resumes_and_writes_its_scorecard(tmp_path, capsys):
    out, board = tmp_path / "board" / "ppo_clip", tmp_path / "board"
    board.mkdir()
    argv = ["--protocol", "llm-tiny", "--protocol-version", "1", "--algo", "ppo_clip", "--out",
            str(out), "--leaderboard", str(board)]
    start = time.perf_counter()
    assert bench_command.main(argv) == 0
    print(f"llm-tiny ppo_clip: {time.perf_counter() - start:.0f} s")
    proto = bench.protocol("llm-tiny", 1)
    assert io.compact_path(out / bench.RESULTS).exists() and not (out / bench.RESULTS).exists()
    rows = io.read_rows(out / bench.RESULTS)
    assert sorted((r["k"], r["n"], r["seed"]) for r in rows) == sorted(
        (k, n, s) for k in proto.ks for n in proto.ns for s in range(proto.seeds))
    info = json.loads((out / bench.BENCH_FILE).read_text())
    assert info["method"] == "ppo_clip" and info["protocol"] == "llm-tiny"
    assert info["git_commit"] == io.git_commit()
    assert info["cost"]["compile_seconds"] > 0 and info["cost"]["training_seconds"] > 0
    assert info["comparability"]["config"] == bench.config_hash(proto, proto.config())
    card = json.loads((out / "scorecard.json").read_text())
    hist = {(d["k"], d["N"]): d["update_age_hist"] for d in card["diagnostics"]}
    assert set(hist) == {(k, n) for k in proto.ks for n in proto.ns}
    assert all(abs(sum(h.values()) - 1) < 1e-6 for h in hist.values())
    assert {"tv_backward", "tv_forward_mean", "intervened_fraction_mean"} <= set(
        card["diagnostics"][0])
    assert (out / "scorecard.png").stat().st_size > 5_000 and (out / "scorecard.md").exists()
    assert "ppo_clip: final accuracy" in (out / "log.txt").read_text()
    # Resumed: every run is in, nothing trains again, and the cost adds up.
    capsys.readouterr()
    assert bench_command.main(argv) == 0
    assert "skipped" in capsys.readouterr().out
    assert len(io.read_rows(out / bench.RESULTS)) == len(rows)
    again = json.loads((out / bench.BENCH_FILE).read_text())
    assert again["cost"]["wall_seconds"] > info["cost"]["wall_seconds"]
    assert again["cost"]["training_seconds"] == info["cost"]["training_seconds"]


# --- hand-made results ----------------------------------------------------------------------------
def _rows(method, accuracy):
    """Result rows of `method` on llm-tiny whose greedy accuracy at evaluation e (0, 1) is
    `accuracy(k, n, seed, e)` and sampled accuracy half of it."""
    proto = bench.protocol("llm-tiny", 1)
    rows = []
    for k in proto.ks:
        for n in proto.ns:
            for s in range(proto.seeds):
                greedy = [accuracy(k, n, s, e) for e in (0, 1)]
                rows.append({"k": k, "lag_sampling": "constant", "n": n, "objective": method,
                             "seed": s, "eval_iterations": [2, 4], "eval_accuracy": greedy,
                             "eval_sampled_accuracy": [g / 2 for g in greedy],
                             "final_accuracy": greedy[-1], "final_sampled_accuracy": greedy[-1] / 2,
                             "tv_backward": [0.01 * k] * 4, "tv_forward_mean": [0.001 * n] * 4,
                             "intervened_fraction_mean": [0.1] * 4,
                             "update_age_mean": [float(k)] * 4, "update_age_max": [float(k)] * 4,
                             "update_age_hist_0_0": [1.0 if k == 0 else 0.0] * 4,
                             "update_age_hist_1_1": [1.0 if k == 1 else 0.0] * 4,
                             "update_age_hist_2_3": [1.0 if k == 3 else 0.0] * 4})
    return rows


def _entry(directory, method, rows, **info):
    directory.mkdir(parents=True)
    io.write_jsonl_atomic(directory / bench.RESULTS, rows)
    key = {"protocol": "llm-tiny", "protocol_version": 1, "config": "c0ffee", "objective": method,
           "warm_start": "abc", "versions": {"jax": "1"}}
    io.write_json_atomic(directory / bench.BENCH_FILE, {
        "method": method, "algo": method, "protocol": "llm-tiny", "protocol_version": 1,
        "warm_start": {"digest": "abc", "greedy": WARM["greedy"], "sampled": WARM["sampled"]},
        "comparability": key, "cost": {"wall_seconds": 10.0, "compile_seconds": 4.0,
                                       "training_seconds": 5.0},
        "git_commit": "0" * 40, **info})
    return directory


def _ppo(k, n, s, e):
    return 0.6 + 0.02 * s - 0.05 * k - 0.01 * n + 0.1 * e


def _vaco(k, n, s, e):
    return 0.58 + 0.03 * s - 0.02 * k - 0.01 * n + 0.1 * e + (0.005 if s == 1 else 0.0)


@pytest.fixture
def hand_board(tmp_path):
    board = tmp_path / "board"
    _entry(board / "ppo_clip", "ppo_clip", _rows("ppo_clip", _ppo))
    _entry(board / "vaco", "vaco", _rows("vaco", _vaco))
    return board


def test_scores_retention_and_comparisons_are_the_hand_computation(hand_board):
    card = scorecard.scorecard(hand_board / "vaco", hand_board, reps=200)
    assert not card.notes
    seeds = range(3)
    for task, scale in (("greedy", 1.0), ("sampled", 0.5)):
        warm = WARM[task]
        ppo_final = np.mean([scale * _ppo(0, 1, s, 1) for s in seeds])
        ppo_auc = np.mean([scale * (_ppo(0, 1, s, 0) + _ppo(0, 1, s, 1)) / 2 for s in seeds])
        for k, n in ((0, 1), (3, 2)):
            final = [scale * _vaco(k, n, s, 1) for s in seeds]
            auc = [scale * (_vaco(k, n, s, 0) + _vaco(k, n, s, 1)) / 2 for s in seeds]
            row = lambda metric: card.scores[(card.scores.task == task) & (card.scores.k == k)  # noqa: E731
                                             & (card.scores.N == n)
                                             & (card.scores.metric == metric)].iloc[0]
            expected = (np.array(final) - warm) / (ppo_final - warm)
            assert row("final").score == pytest.approx(expected.mean())
            half = scipy_stats.t.ppf(0.975, 2) * expected.std(ddof=1) / np.sqrt(3)
            assert row("final").low == pytest.approx(expected.mean() - half)
            assert row("auc").score == pytest.approx(
                np.mean((np.array(auc) - warm) / (ppo_auc - warm)))
        # Retention at k = 3, N = 2: its gain over the warm start ÷ the gain at k = 0, N = 2.
        r = card.retention[(card.retention.task == task) & (card.retention.k == 3)
                           & (card.retention.N == 2) & (card.retention.metric == "final")].iloc[0]
        gain = lambda k: np.mean([scale * _vaco(k, 2, s, 1) - warm for s in seeds])  # noqa: E731
        assert r.retention == pytest.approx(gain(3) / gain(0))
    # The family: vaco − ppo_clip at the largest k, N = 1 and 2, greedy and sampled; t-test, Holm.
    c = card.comparisons
    assert len(c) == 4 and set(c.N) == {1, 2} and set(c.k) == {3}
    p = {}
    for r in c.itertuples():
        scale = 1.0 if r.task == "greedy" else 0.5
        d = [scale * (_vaco(3, r.N, s, 1) - _ppo(3, r.N, s, 1)) for s in seeds]
        assert r.estimate == pytest.approx(np.mean(d))
        p[(r.task, r.N)] = scipy_stats.ttest_1samp(d, 0).pvalue
        assert r.p_t == pytest.approx(p[(r.task, r.N)])
    ordered = sorted(p.values())
    holm = np.minimum(1, np.maximum.accumulate([(4 - i) * q for i, q in enumerate(ordered)]))
    assert sorted(c.p_holm) == pytest.approx(sorted(holm))
    assert all(v.startswith("Holm p") for v in c.verdict)   # no pre-registration: exploratory
    diag = card.diagnostics.set_index(["k", "N"])
    assert diag.loc[(3, 2), "tv_backward"] == pytest.approx(0.03)
    assert diag.loc[(3, 1), "update_age_hist"] == {"0_0": 0.0, "1_1": 0.0, "2_3": 1.0}


def test_without_ppo_clip_the_report_names_what_it_could_not_compute(hand_board, tmp_path, capsys):
    alone = tmp_path / "alone"
    alone.mkdir()
    (hand_board / "vaco").rename(alone / "vaco")
    assert bench_command.main(["--protocol", "llm-tiny", "--protocol-version", "1", "--algo",
                               "vaco", "--out", str(alone / "vaco"), "--leaderboard", str(alone),
                               "--report-only"]) == 0
    assert "holds no ppo_clip entry" in capsys.readouterr().err
    card = json.loads((alone / "vaco" / "scorecard.json").read_text())
    assert card["comparisons"] is None and all(s["score"] is None for s in card["scores"])
    assert card["retention"]   # needs no PPO-Clip: the ratio of gains over the warm start
    text = (alone / "vaco" / "scorecard.md").read_text()
    assert "Not computed:" in text and "holds no ppo_clip entry" in text
    assert (alone / "vaco" / "scorecard.png").exists()
    # An incomparable PPO-Clip is named with why.
    other = _entry(tmp_path / "other" / "ppo_clip", "ppo_clip", _rows("ppo_clip", _ppo))
    info = json.loads((other / bench.BENCH_FILE).read_text())
    info["comparability"]["warm_start"] = "def"
    io.write_json_atomic(other / bench.BENCH_FILE, info)
    notes = scorecard.scorecard(alone / "vaco", tmp_path / "other", reps=200).notes
    assert any("not comparable: warm start def (here abc)" in n for n in notes)


def test_the_leaderboard_is_checked_against_its_per_run_files(hand_board, capsys):
    assert bench_command.main(["--table", str(hand_board)]) == 0
    table = (hand_board / "leaderboard.csv").read_text()
    assert table.splitlines()[0].startswith("method,greedy_N1_k0,greedy_N1_k3,")
    assert (hand_board / "leaderboard.md").exists() and (hand_board / "leaderboard.png").exists()
    assert "| `vaco` |" in (hand_board / "leaderboard.md").read_text()
    # Cost: compiling + training of every program (4 + 5 s), not the wall of the last call.
    cost = (hand_board / "leaderboard.md").read_text().split("Cost per ")[1]
    assert "| `vaco` | 0.1 | not recorded |" in cost
    assert bench_command.main(["--table", str(hand_board), "--check"]) == 0
    lines = table.splitlines()
    fields = lines[2].split(",")
    fields[1] = f"{float(fields[1]) + 0.01!r}"
    (hand_board / "leaderboard.csv").write_text("\n".join([*lines[:2], ",".join(fields),
                                                           *lines[3:]]) + "\n")
    capsys.readouterr()
    assert bench_command.main(["--table", str(hand_board), "--check"]) == 1
    assert f"{hand_board / 'leaderboard.csv'}: differs from its recomputation" in \
        capsys.readouterr().out
    card = json.loads((hand_board / "vaco" / "scorecard.json").read_text())
    card["scores"][0]["score"] += 0.5
    io.write_json_atomic(hand_board / "vaco" / "scorecard.json", card)
    problems = scorecard.check(hand_board)
    assert f"{hand_board / 'vaco' / 'scorecard.json'}: differs from its recomputation" in problems


def test_the_board_says_the_realised_snapshot_age_beside_each_nominal_lag(tmp_path):
    # Four iterations: at nominal k, iteration t is generated at age min(t, k).
    aged = lambda rows: [{**r, "snapshot_age": [float(min(t, r["k"])) for t in range(4)]}  # noqa: E731
                         for r in rows]
    board = tmp_path / "board"
    _entry(board / "ppo_clip", "ppo_clip", aged(_rows("ppo_clip", _ppo)))
    _entry(board / "vaco", "vaco", aged(_rows("vaco", _vaco)))
    table, cards = scorecard.board(board, reps=50)
    text = scorecard.board_markdown(table, cards)
    for k, mean in ((0, 0.0), (1, 0.75), (3, 1.5)):   # mean over t of min(t, k)
        assert f"k = {k} (realised mean age {mean:.2f}, at most {min(3, k)})" in text
    diag = cards["vaco"].diagnostics.set_index(["k", "N"])
    assert diag.loc[(3, 2), "snapshot_age"] == pytest.approx(1.5)
    assert diag.loc[(3, 2), "snapshot_age_max"] == 3.0
    assert "snapshot_age_max" in scorecard.markdown(cards["vaco"])


def test_the_committed_llm_board_says_the_ages_its_runs_realised():
    """Beside each nominal lag, `leaderboard.md` gives the mean and largest snapshot age of the
    batches, as the committed per-run files recorded them (not as the protocol names them)."""
    root = Path(__file__).resolve().parent.parent / "results" / "lag-bench" / "llm-cpu"
    runs = pd.concat([pd.read_parquet(p, columns=["k", "lag_sampling", "snapshot_age"])
                      for p in sorted(root.glob(f"*/{bench.RESULTS.replace('.jsonl', '.parquet')}"))])
    assert len(runs) == 13 * 80
    text = (root / "leaderboard.md").read_text()
    for (mode, k), group in runs.groupby(["lag_sampling", "k"]):
        ages = np.stack(group.snapshot_age.to_list())
        words = f"k = {k}" if mode == "constant" else f"uniform 0..{k}"
        assert f"{words} (realised mean age {ages.mean():.2f}, at most {ages.max():.0f})" in text


def test_the_stochastic_lag_runs_after_the_constant_lags_and_resumes(tmp_path, monkeypatch,
                                                                     stub_warm_start):
    # A protocol with the stochastic lag: per N, one program for every constant k, then one for
    # the uniform lag (its k = 0 runs are done by then); trained by a stub, scored as any other.
    proto = dataclasses.replace(bench.protocol("llm-tiny", 1), uniform=True)
    calls = []

    def train_one_n(config, n, objectives, *args, ks=(0,), lag_sampling="constant", **kwargs):
        calls.append((n, tuple(ks), lag_sampling))
        rows = []
        for k in ks:
            for s in range(config.grpo.num_seeds):
                acc = 0.5 + 0.01 * s - 0.02 * k - 0.01 * (lag_sampling == "uniform")
                rows.append({"k": k, "lag_sampling": experiment.lag_mode(k, lag_sampling),
                             "n": n, "objective": objectives[0], "seed": s,
                             "eval_iterations": [2, 4], "eval_accuracy": [0.4, acc],
                             "eval_sampled_accuracy": [0.3, acc - 0.1],
                             "train_greedy_accuracy": [0.5, acc], "final_accuracy": acc,
                             "final_sampled_accuracy": acc - 0.1,
                             "final_train_greedy_accuracy": acc, "reward": [0.3, 0.4],
                             "clip_fraction_mean": [0.0, 0.0], "filtered_fraction_mean": [0, 0],
                             "tv_estimate_mean": [0.0, 0.0], "tv_estimate_max": [0.0, 0.0],
                             "approx_kl_mean": [0.0, 0.0], "compile_seconds": 1.0 + n,
                             "run_seconds": 2.0 + n + 10 * (lag_sampling == "uniform")})
        return rows

    monkeypatch.setattr(experiment, "train_one_n", train_one_n)
    monkeypatch.setattr(bench, "warm_start_sampled_accuracy", lambda proto: 0.05)
    stub_warm_start(proto.config().model)
    out = tmp_path / "ppo_clip"
    info = bench.run(proto, "ppo_clip", out, log=lambda _: None)
    assert calls == [(1, (0, 1, 3), "constant"), (2, (0, 1, 3), "constant"),
                     (1, (3,), "uniform"), (2, (3,), "uniform")]
    assert info["cost"]["compile_seconds"] == 2 * (2.0 + 3.0)
    assert info["cost"]["training_seconds"] == (3.0 + 4.0) + (13.0 + 14.0)
    assert io.compact_path(out / bench.RESULTS).exists()
    assert info["commits"] == [io.git_commit() or "unrecorded"]
    # A resume keeps the commits of the calls before it: the pre-registration gate checks each.
    io.write_json_atomic(out / bench.BENCH_FILE, {**info, "commits": ["1" * 40]})
    calls.clear()
    again = bench.run(proto, "ppo_clip", out, log=lambda _: None)  # resumed: nothing to run
    assert calls == []
    assert again["commits"] == sorted({"1" * 40, io.git_commit() or "unrecorded"})
    card = scorecard.scorecard(out, None, reps=200)
    uniform = card.retention[(card.retention.sampling == "uniform") & (card.retention.N == 1)
                             & (card.retention.task == "greedy")
                             & (card.retention.metric == "final")].iloc[0]
    gain = lambda k, u: np.mean([0.5 + 0.01 * s - 0.02 * k - 0.01 * u - 0.45  # noqa: E731
                                 for s in range(3)])
    assert uniform.k == 3 and uniform.retention == pytest.approx(gain(3, 1) / gain(0, 0))
    with pytest.raises(llm_config.ConfigError, match="holds method 'ppo_clip'"):
        bench.run(proto, "vaco", out, log=lambda _: None)


# --- the leaderboard's pre-registered families ------------------------------------------------------
def _noise(salt):
    """A small seed-dependent wobble, so that no difference is the same on every seed."""
    return lambda k, n, s: 0.002 * ((37 * s + 11 * k + 5 * n + salt) % 7)


def _with_noise(accuracy, salt):
    wobble = _noise(salt)
    return lambda k, n, s, e: accuracy(k, n, s, e) + wobble(k, n, s)


# PPO-Clip and SPO lose 0.05 per step of lag, VACO 0.01; SPO is PPO-Clip up to the wobble.
THREE = {"ppo_clip": _with_noise(_ppo, 0),
         "vaco": _with_noise(lambda k, n, s, e: _ppo(k, n, s, e) - 0.02 + 0.04 * k, 3),
         "spo": _with_noise(_ppo, 5)}


def _three_board(root, rows=None):
    for method, accuracy in THREE.items():
        made = _rows(method, accuracy)
        _entry(root / method, method, rows(method, made) if rows else made)
    return root


def _holm(p):
    from statsmodels.stats.multitest import multipletests

    return multipletests(p, method="holm")[1]


def test_the_families_are_paired_t_tests_with_holm_over_each_family(tmp_path):
    board = _three_board(tmp_path / "board")
    assert bench_command.main(["--table", str(board)]) == 0
    table = pd.read_csv(board / "primary.csv")
    assert list(table.columns) == ["family", "objective", "N", "metric", "mean", "ci_low",
                                   "ci_high", "p", "p_holm", "verdict", "n_seeds"]
    proto = bench.protocol("llm-tiny", 1)
    K, seeds = proto.largest_lag, range(proto.seeds)
    expected = {"F1": [(o, n, m) for o in ("vaco", "spo") for n in proto.ns
                       for m in ("final_accuracy", "final_sampled_accuracy")],
                "F2": [(o, n, m) for o in THREE for n in proto.ns
                       for m in ("final_accuracy", "final_sampled_accuracy")]}
    for name, keys in expected.items():
        part = table[table.family == name].set_index(["objective", "N", "metric"])
        assert sorted(part.index) == sorted(keys)          # 8 and 12 tests
        p = {}
        for o, n, m in keys:
            scale = 1.0 if m == "final_accuracy" else 0.5
            other, k_other = ("ppo_clip", K) if name == "F1" else (o, 0)
            d = np.array([scale * (THREE[o](K, n, s, 1) - THREE[other](k_other, n, s, 1))
                          for s in seeds])
            r = part.loc[(o, n, m)]
            half = scipy_stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
            assert (r["mean"], r.ci_low, r.ci_high) == pytest.approx(
                (d.mean(), d.mean() - half, d.mean() + half))
            p[(o, n, m)] = scipy_stats.ttest_1samp(d, 0).pvalue
            assert r.p == pytest.approx(p[(o, n, m)]) and r.n_seeds == len(d)
        holm = dict(zip(p, _holm(list(p.values()))))        # over this family's tests alone
        assert [part.loc[key].p_holm for key in p] == pytest.approx(list(holm.values()))
    # llm-tiny names no pre-registration: no verdict words, and leaderboard.md says why.
    assert set(table.verdict) == {"exploratory (no pre-registration named)"}
    text = (board / "leaderboard.md").read_text()
    assert "### F1 (primary): the objective − `ppo_clip` at k = 3 (8 tests)" in text
    assert "### F2: the objective at k = 3 − itself at k = 0 (12 tests)" in text
    assert "names no pre-registration commit" in text


@pytest.mark.parametrize("after", [True, False])
def test_verdict_words_only_for_results_made_after_the_pre_registration(tmp_path, monkeypatch,
                                                                        after):
    from vaco_jax.pipeline import preregistration

    registered = dataclasses.replace(bench.protocol("llm-tiny", 1), preregistration="f" * 40)
    monkeypatch.setitem(bench.VERSIONS, ("llm-tiny", 1), registered)
    seen = []
    monkeypatch.setattr(preregistration, "descends_from",
                        lambda commit, ancestor: seen.append((commit, ancestor)) or after)
    tests = families.compute([scorecard.load(p) for p in
                              scorecard.entries(_three_board(tmp_path / "board"))])
    assert set(seen) == {("0" * 40, "f" * 40)}            # every entry's commit, checked
    verdict = tests.table.set_index(["family", "objective", "N", "metric"]).verdict
    if after:
        assert verdict["F1", "vaco", 2, "final_accuracy"] == "higher than PPO-Clip under lag"
        assert verdict["F1", "spo", 2, "final_accuracy"] == "no difference shown"
        assert verdict["F2", "ppo_clip", 1, "final_accuracy"] == "lag lowers it"
        assert set(verdict["F2"]) <= {"lag lowers it", "lag raises it", "no change shown"}
        # The answer reads the verdicts: F2's PPO-Clip rows, then F1's grid, N by N.
        answer = families.answer(tests)
        assert answer.startswith("## The answer\n")
        assert "| objective | N=1 greedy | N=1 sampled | N=2 greedy | N=2 sampled |" in answer
        assert "| `ppo_clip` |" + " lag lowers it |" * 4 in answer
        assert "| `vaco` |" + " higher |" * 4 in answer
        assert "| `spo` |" + " no difference shown |" * 4 in answer
    else:
        assert set(verdict) == {"exploratory (made before the pre-registration)"}
        assert "exploratory, without verdict words" in families.markdown(tests)
        assert "## The answer (exploratory: no verdict words)" in families.markdown(tests)
        assert "| `vaco` | +0.1" in families.answer(tests)     # differences, not verdicts


def test_a_pre_registered_family_is_its_named_objectives_and_judged_only_when_complete(
        tmp_path, monkeypatch):
    from vaco_jax.pipeline import preregistration

    registered = dataclasses.replace(bench.protocol("llm-tiny", 1), preregistration="f" * 40)
    monkeypatch.setitem(bench.VERSIONS, ("llm-tiny", 1), registered)
    monkeypatch.setattr(preregistration, "descends_from", lambda commit, ancestor: True)
    entries = [scorecard.load(p) for p in scorecard.entries(_three_board(tmp_path / "board"))]
    # The registration names PPO-Clip, VACO and GSPO: SPO is left out, GSPO's tests are missing.
    monkeypatch.setitem(families.REGISTERED, ("llm-tiny", 1), ("ppo_clip", "vaco", "gspo"))
    tests = families.compute(entries)
    assert set(tests.table.objective) == {"ppo_clip", "vaco"}
    assert set(tests.table.verdict) == {"exploratory (4 of the 8 tests present)",
                                        "exploratory (8 of the 12 tests present)"}
    assert "`spo`: not among the objectives the pre-registration names" in " ".join(tests.notes)
    assert ("F1: 4 of the 8 tests the pre-registration names are present; Holm's correction is "
            "over these 4, and no verdict is given until all are") in tests.notes
    # Every named objective present: the verdicts are the pre-registered ones.
    monkeypatch.setitem(families.REGISTERED, ("llm-tiny", 1), ("ppo_clip", "vaco", "spo"))
    verdict = families.compute(entries).table.set_index(["family", "objective", "N",
                                                         "metric"]).verdict
    assert verdict["F1", "vaco", 2, "final_accuracy"] == "higher than PPO-Clip under lag"


def test_check_names_primary_csv_when_it_differs_or_is_missing(tmp_path, capsys):
    board = _three_board(tmp_path / "board")
    assert bench_command.main(["--table", str(board)]) == 0
    assert bench_command.main(["--table", str(board), "--check"]) == 0
    table = pd.read_csv(board / "primary.csv")
    table.loc[0, "p_holm"] = 0.5 * table.loc[0, "p_holm"]
    table.to_csv(board / "primary.csv", index=False)
    capsys.readouterr()
    assert bench_command.main(["--table", str(board), "--check"]) == 1
    assert capsys.readouterr().out.strip() == (
        f"{board / 'primary.csv'}: differs from its recomputation")
    (board / "primary.csv").unlink()
    assert scorecard.check(board) == [
        f"{board / 'primary.csv'}: missing (the recomputation makes it)"]


def test_an_objective_without_the_largest_lag_is_left_out_and_named(tmp_path):
    def rows(method, made):   # SPO never ran k = 3; VACO lost seed 2 at k = 0, N = 2
        if method == "spo":
            return [r for r in made if r["k"] != 3]
        if method == "vaco":
            return [r for r in made if (r["k"], r["n"], r["seed"]) != (0, 2, 2)]
        return made

    board = _three_board(tmp_path / "board", rows)
    assert bench_command.main(["--table", str(board)]) == 0
    table = pd.read_csv(board / "primary.csv")
    f1, f2 = table[table.family == "F1"], table[table.family == "F2"]
    assert set(f1.objective) == {"vaco"} and len(f1) == 4
    assert sorted(zip(f2.objective, f2.N)) == sorted(
        [("ppo_clip", 1)] * 2 + [("ppo_clip", 2)] * 2 + [("vaco", 1)] * 2)
    assert list(f1.p_holm) == pytest.approx(list(_holm(list(f1.p))))   # Holm over the 4 present
    text = (board / "leaderboard.md").read_text()
    assert "`spo` at k = 3, N = 1: no runs; its tests there are left out" in text
    assert ("`vaco` at k = 0, N = 2: seeds 2 missing (the protocol has 3); its tests there are "
            "left out") in text
    assert "F1: 4 of the 8 tests the board's objectives make are present" in text
    assert "F2: 6 of the 12 tests the board's objectives make are present" in text


def test_the_key_lowers_the_grpo_program_so_a_sampler_change_breaks_it(monkeypatch):
    import jax

    from vaco_jax.llm import sampling

    proto = bench.protocol("llm-tiny", 1)
    key = bench.program_key(proto, "ppo_clip")
    # Another objective runs in the same program, with other inputs.
    other = bench.program_key(proto, "vaco")
    assert other["program"] == key["program"] and other["inputs"] != key["inputs"]
    # A sampler that draws at half the temperature computes something else.
    choose = sampling.choose_tokens
    monkeypatch.setattr(sampling, "choose_tokens",
                        lambda logits, key, **kw: choose(logits * 2.0, key, **kw))
    jax.clear_caches()
    changed = bench.program_key(proto, "ppo_clip")
    assert changed["program"] != key["program"] and changed["inputs"] == key["inputs"]
    assert bench.key_differences({**key, "config": "c"}, {**changed, "config": "c"}) == [
        f"GRPO program {changed['program']} (here {key['program']})"]
