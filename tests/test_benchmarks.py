"""The benchmarks at a tiny size: they run and measure what they say; the throughput benchmark judges
the targets.

Speed itself is asserted by the benchmark script (PASS/MISS per target), never here.
"""

import dataclasses
import json
import re

import pytest

from benchmarks import profile, throughput, time_to_return
from benchmarks.measure import Case

SMOKE_ROWS = ["limit", "wrapper", "brax_wrapper", "brax_ppo", "ppo_clip", "chunk", "seeds_2", "sequential_2"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "smoke.json"
    report = throughput.main(["--preset", "smoke", "--only", *SMOKE_ROWS, "--out", str(out)])
    return report, json.loads(out.read_text())


def test_smoke_run_measures_every_row_and_writes_json(smoke):
    report, written = smoke
    rows = written["envs"]["toy_reach"]["rows"]
    assert sorted(rows) == sorted(SMOKE_ROWS)
    for name, row in rows.items():
        assert row["sps"] > 0 and row["cpu_sps"] > 0, name
        assert row["compile_s"] >= 0 and row["peak_rss_mb"] > 100, name
    assert written["versions"]["jax"] and written["device"]["platform"] == "cpu"
    assert written["case"]["num_envs"] == 8 and written["preset"] == "smoke"


def test_smoke_ratios_are_the_quotients_of_the_measurements(smoke):
    _, written = smoke
    env = written["envs"]["toy_reach"]
    measured = written["rounds"][0]["toy_reach"]
    assert env["ratios"]["ppo_clip/brax_ppo"] == pytest.approx(
        measured["ppo_clip"]["sps"] / measured["brax_ppo"]["sps"])
    sequential = measured["sequential_2"]
    assert len(sequential["per_seed_s"]) == 2
    expected = measured["seeds_2"]["sps"] / (2 * sequential["steps_per_seed"]
                                             / sum(sequential["per_seed_s"]))
    assert env["ratios"]["vmapped/sequential"] == pytest.approx(expected)
    assert env["ratios"]["compile_s(chunk)"] == measured["chunk"]["compile_s"]
    assert env["ratios"]["wrapper/brax_wrapper"] == pytest.approx(
        measured["wrapper"]["sps"] / measured["brax_wrapper"]["sps"])
    assert set(env["verdicts"]) == {"ppo_clip/brax_ppo", "vmapped/sequential", "compile_s(chunk)",
                                    "ppo_clip/limit"}
    assert env["verdicts"]["ppo_clip/limit"] == "report"
    assert all(env["verdicts"][k].startswith(("PASS", "MISS"))
               for k in ("ppo_clip/brax_ppo", "vmapped/sequential", "compile_s(chunk)"))


def test_ratios_and_verdicts_from_known_measurements():
    results = {
        "limit": {"sps": 1000.0}, "brax_ppo": {"sps": 100.0}, "ppo_clip": {"sps": 150.0},
        "vaco": {"sps": 120.0}, "vaco_c8": {"sps": 135.0}, "impala": {"sps": 60.0},
        "chunk": {"sps": 1.0, "compile_s": 70.0, "compile_cpu_s": 50.0},
        "seeds_4": {"sps": 300.0}, "seeds_16": {"sps": 480.0},
        "sequential_16": {"sps": 1.0, "steps_per_seed": 100, "per_seed_s": [1.0] * 16},
    }
    r = throughput.ratios(results, seeds=(4, 16))
    assert r["ppo_clip/brax_ppo"] == 1.5 and r["vaco/ppo_clip"] == 0.8
    assert r["vaco_c8/ppo_clip"] == 0.9 and r["impala/vaco"] == 0.5
    assert r["vmapped/sequential@4"] == 3.0 and r["vmapped/sequential"] == 4.8
    assert r["compile_s(chunk)"] == 70.0
    assert r["ppo_clip/limit"] == 0.15
    assert throughput.verdict("ppo_clip/brax_ppo", 1.5).startswith("PASS")
    assert throughput.verdict("vaco/ppo_clip", 0.8).startswith("MISS")
    assert throughput.verdict("compile_s(chunk)", 70.0).startswith("MISS")
    assert throughput.verdict("impala/vaco", 0.5) == "report"


def test_a_measurement_runs_in_its_own_process():
    case = dataclasses.replace(Case(**throughput.PRESETS["smoke"]["case"]), repeats=1)
    row = {"env": "toy_reach", "name": "limit", "kind": "limit", "kwargs": {}, "solver": "default"}
    result = throughput.run_row(row, case, inline=False)
    assert "error" not in result, result.get("error")
    assert result["sps"] > 0 and result["peak_rss_mb"] > 100


def test_a_frozen_case_sets_the_learning_rate_of_every_config_and_none_keeps_the_default():
    assert Case(env="toy_reach").config("vaco").learning_rate == 3e-4
    frozen = Case(env="toy_reach", learning_rate=1e-20)
    assert frozen.config("ppo_clip").learning_rate == 1e-20
    assert frozen.config("vaco", capacity=8).capacity == 8


def test_the_compile_benchmark_times_each_stage_and_counts_the_env_step_copies():
    from benchmarks import compile as compile_benchmark

    iteration = compile_benchmark.measure("iteration_ppo_clip", "toy_reach")
    assert iteration["trace_s"] > 0 and iteration["lower_s"] > 0 and iteration["xla_compile_s"] > 0
    assert iteration["compile_s"] == pytest.approx(
        iteration["trace_s"] + iteration["lower_s"] + iteration["xla_compile_s"])
    # One rollout body steps the envs; resets: a new run's start, and the fresh-state pool's refill.
    assert iteration["step"] >= 1 and iteration["reset"] == 2
    assert iteration["hlo_instructions"] > 100
    evaluation = compile_benchmark.measure("evaluation", "toy_reach")
    assert evaluation["step"] == 1 and evaluation["reset"] == 1   # one while-loop body, one reset
    assert evaluation["hlo_instructions"] < iteration["hlo_instructions"]
    init = compile_benchmark.measure("init", "toy_reach")   # parameters and buffers, no env step
    assert init["trace_s"] > 0 and init["hlo_instructions"] < iteration["hlo_instructions"]


def test_the_profile_times_every_part_of_an_iteration(tmp_path):
    out = tmp_path / "profile.json"
    profile.main(["--preset", "smoke", "--algos", "vaco", "--regime", "frozen", "--calls", "2",
                  "--out", str(out)])
    written = json.loads(out.read_text())
    (row,) = written["profiles"]
    seconds = row["seconds"]
    assert (row["env"], row["algo"], row["regime"]) == ("toy_reach", "vaco", "frozen")
    assert all(seconds[part] > 0 for part in profile.PARTS), seconds
    assert seconds["other"] == pytest.approx(seconds["iteration"] - sum(
        seconds[p] for p in ("acting", "realign", "update", "publish")))
    assert row["sps"] == pytest.approx(row["env_steps_per_iteration"] / seconds["iteration"])
    assert row["limit_sps"] > 0 and written["versions"]["jax"]


def test_ratios_are_medians_of_rounds_with_their_spread_and_the_limit(smoke):
    _, written = smoke
    env = written["envs"]["toy_reach"]
    (measured,) = [r["toy_reach"] for r in written["rounds"]]    # the smoke preset: one round
    assert env["limit_sps"] == measured["limit"]["sps"]
    value = env["ratios"]["ppo_clip/brax_ppo"]
    assert env["ratio_spread"]["ppo_clip/brax_ppo"] == [value, value]
    assert throughput.PRESETS["cpu"]["rounds"] >= 5 and throughput.PRESETS["smoke"]["rounds"] == 1


def test_time_to_return_reads_the_first_crossing_of_the_seed_mean_and_the_return_at_budgets():
    # Brax-like: two seeds run one after another, one return each per evaluation.
    brax = [[{"seconds": 10, "steps": 100, "returns": [50.0]},
             {"seconds": 20, "steps": 200, "returns": [150.0]},
             {"seconds": 30, "steps": 300, "returns": [300.0]}],
            [{"seconds": 12, "steps": 100, "returns": [70.0]},
             {"seconds": 24, "steps": 200, "returns": [30.0]}]]   # stopped one evaluation early
    curve = time_to_return.aggregate(brax)
    assert [p["seconds"] for p in curve] == [11.0, 22.0]          # only evaluations both reached
    assert [p["mean_return"] for p in curve] == [60.0, 90.0]
    # Ours: every seed in one run, all returns in each point.
    ours = time_to_return.aggregate([[{"seconds": 5, "steps": 64, "returns": [10.0, 30.0]},
                                      {"seconds": 9, "steps": 128, "returns": [100.0, 120.0]}]])
    assert [p["mean_return"] for p in ours] == [20.0, 110.0]
    summary = time_to_return.summarise({"brax_ppo": curve, "vaco": ours}, threshold=80.0,
                                       budgets=[8, 30])
    assert summary["brax_ppo"]["seconds_to_threshold"] == 22.0     # the mean, not one seed's 150
    assert summary["vaco"]["seconds_to_threshold"] == 9
    assert summary["vaco"]["ratio_to_brax"] == pytest.approx(9 / 22)
    assert summary["vaco"]["return_at"] == {"8": 20.0, "30": 110.0}
    assert summary["brax_ppo"]["return_at"] == {"8": None, "30": 90.0}
    never = time_to_return.summarise({"brax_ppo": curve, "vaco": ours}, threshold=1e9, budgets=[8])
    assert never["vaco"]["seconds_to_threshold"] is None and never["vaco"]["ratio_to_brax"] is None
    # Brax stopped (at 22 s) before reaching what ours reached at 9 s: the ratio is at most 9/22.
    bounded = time_to_return.summarise({"brax_ppo": curve, "vaco": ours}, threshold=100.0,
                                       budgets=[8])
    assert bounded["brax_ppo"]["seconds_to_threshold"] is None
    assert bounded["vaco"]["ratio_to_brax"] is None
    assert bounded["vaco"]["ratio_to_brax_at_most"] == pytest.approx(9 / 22)
    # Brax's PPO at our shapes is a second reference, with ratios of its own.
    both = time_to_return.summarise({"brax_ppo": curve, "brax_ppo_ours": ours[:1], "vaco": ours},
                                    threshold=80.0, budgets=[8])
    assert both["vaco"]["ratio_to_brax"] == pytest.approx(9 / 22)
    assert both["vaco"]["ratio_to_brax_ours"] is None
    assert both["vaco"]["ratio_to_brax_ours_at_most"] == pytest.approx(9 / 5)


def test_brax_ppo_at_our_shapes_takes_our_batch_and_hyper_parameters():
    from vaco_jax import Config

    c, settings = Config(), time_to_return.ours_in_brax_terms(300_000)
    # One segment of unroll_length per env per training step, in M minibatches of whole segments.
    assert settings["batch_size"] * settings["num_minibatches"] == c.num_envs
    assert (settings["num_envs"], settings["unroll_length"], settings["num_updates_per_batch"]) == (
        c.num_envs, c.unroll_length, c.num_epochs)
    assert (settings["learning_rate"], settings["discounting"], settings["gae_lambda"],
            settings["clipping_epsilon"], settings["reward_scaling"], settings["entropy_cost"]) == (
        c.learning_rate, c.gamma, c.gae_lambda, c.clip_eps, c.reward_scale, c.ent_coef)
    assert settings["network_factory"].keywords["policy_hidden_layer_sizes"] == c.actor_hidden


# --- the accelerator check (docs/scale-out.md shows what it prints) -----------------------------
@pytest.mark.slow
def test_the_accelerator_check_measures_its_three_things_at_toy_shapes(tmp_path, capsys):
    from benchmarks import accelerator_check

    out = tmp_path / "check.json"
    result = accelerator_check.main(["--smoke", "--out", str(out)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == result["devices"] and result["budget_seconds"] == 570
    assert re.fullmatch(r"quick start: [\d,]+ env steps/s, compile [\d.]+ s, \d+ s in all, final "
                        r"returns \[-?[\d.]+, -?[\d.]+\]", lines[1]), lines[1]
    assert re.fullmatch(r"throughput, toy_reach at 8 envs per seed: limit [\d,]+ env steps/s "
                        r"\(compile [\d.]+ s\), vaco [\d,]+ env steps/s \(compile [\d.]+ s\)",
                        lines[2]), lines[2]
    assert re.fullmatch(r"lag cell lag/toy_reach/vaco/oldest \(6 runs × 2,048 steps, 6 runs on 1 "
                        r"device\): [\d,]+ env steps/s, compile \d+ s, peak [\d.]+ [kMG]?B memory "
                        r"per device, \d+ s in all", lines[3]), lines[3]
    assert lines[4] == f"-> {out}"
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert len(result["quickstart"]["final_eval_return"]) == 2
    assert {"limit", "vaco"} == set(result["throughput"]["rows"]["toy_reach"])
    cell = result["lag_cell"]
    assert (cell["runs"], cell["env_steps_per_run"]) == (6, 2048) and cell["sps"] > 0


def test_a_failed_measurement_prints_the_exception_that_stopped_it(tmp_path, capsys, monkeypatch):
    from benchmarks import accelerator_check

    monkeypatch.setitem(accelerator_check.MODES["smoke"], "quickstart",
                        ["--env", "no_such_env", "--no-progress"])
    result = accelerator_check.main(["--smoke", "--only", "quickstart"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("quick start: `python -m vaco_jax.commands.train --env no_such_env")
    assert lines[1].endswith(result["quickstart"]["error"].strip().splitlines()[-1].strip())
    assert "no_such_env" in lines[1].split("failed:")[1], lines[1]


def test_the_accelerator_check_keeps_what_it_measured_when_its_time_runs_out(tmp_path, capsys):
    from benchmarks import accelerator_check

    out = tmp_path / "check.json"
    result = accelerator_check.main(["--smoke", "--budget", "0.5", "--out", str(out)])
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"quick start: timed out after \d+ s \(the budget is 0.5 s\)", lines[1])
    assert lines[2:4] == ["throughput: no time left (the budget is 0.5 s)",
                          "lag cell: no time left (the budget is 0.5 s)"]
    assert json.loads(out.read_text())["lag_cell"] == result["lag_cell"]
