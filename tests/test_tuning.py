"""Per-task tuning (protocol v3): the grid, the choice and the extension of a choice on an edge,
checked against hand-made tables; and the cells it plans."""

import pytest

from vaco_jax.study import bench, tuning

CLIP = tuning.Constraint("clip_eps", tuning.DOUBLING, (0.05, 0.1, 0.2, 0.4))
GRID = tuning.Grid((3e-4, 1e-3, 3e-3, 1e-2), "clip_eps", (0.05, 0.1, 0.2, 0.4))


def runs_of(table: dict) -> list[dict]:
    """Two design seeds per configuration whose mean AUC is the table's value (±1)."""
    return [{"learning_rate": lr, "clip_eps": eps, "auc": auc + d, "final": auc}
            for (lr, eps), auc in table.items() for d in (-1.0, 1.0)]


def test_the_choice_is_the_best_mean_auc_with_ties_to_the_smaller_rate_then_constraint():
    table = {(lr, eps): 0.0 for lr in GRID.learning_rates for eps in GRID.values}
    table[1e-3, 0.2] = 5.0
    table[3e-3, 0.1] = 5.0           # a tie: the smaller learning rate wins
    table[1e-3, 0.1] = 5.0           # a tie at that rate: the smaller ε wins
    chosen, rows = tuning.choose(runs_of(table), GRID)
    assert chosen == {"learning_rate": 1e-3, "clip_eps": 0.1}
    assert len(rows) == 16 and all(row["runs"] == 2 for row in rows)
    assert max(row["auc"] for row in rows) == pytest.approx(5.0)


def test_a_choice_inside_the_grid_is_not_extended():
    wider, notes = tuning.extend(GRID, {"learning_rate": 1e-3, "clip_eps": 0.2},
                                 tuning.LR_LADDER, CLIP)
    assert wider is None and notes == []


def test_a_choice_on_two_edges_adds_the_next_rate_and_the_next_value():
    wider, notes = tuning.extend(GRID, {"learning_rate": 1e-2, "clip_eps": 0.05},
                                 tuning.LR_LADDER, CLIP)
    assert wider.learning_rates == (3e-4, 1e-3, 3e-3, 1e-2, 3e-2)
    assert wider.values == (0.025, 0.05, 0.1, 0.2, 0.4)
    assert notes == ["learning_rate above: 0.03", "clip_eps below: 0.025"]
    new = tuning.added(GRID, wider)
    # a row (5 values at 3e-2) and a column (4 old rates at 0.025): 25 - 16 configurations
    assert len(new) == 9
    assert {"learning_rate": 3e-2, "clip_eps": 0.4} in new
    assert {"learning_rate": 3e-4, "clip_eps": 0.025} in new
    assert {"learning_rate": 1e-3, "clip_eps": 0.1} not in new


def test_a_choice_at_the_ladders_end_is_recorded_not_extended():
    top = tuning.Grid((3e-2, 1e-1), "clip_eps", (0.8, 1.6))
    wider, notes = tuning.extend(top, {"learning_rate": 1e-1, "clip_eps": 1.6},
                                 tuning.LR_LADDER, CLIP)
    assert wider is None
    assert notes == ["learning_rate at the upper end of the ladder",
                     "clip_eps at the upper end of the ladder"]


def test_a_method_without_a_constraint_spends_the_same_budget_on_learning_rates():
    proto = bench.protocol("tiny", 3)
    assert bench.method_grid(bench.Method("impala"), proto).field is None
    budgets = {m.name: len(bench.method_grid(m, proto).configs())
               for m in bench.LEADERBOARD_METHODS}
    assert set(budgets.values()) == {16}, budgets
    fine = proto.lr_only
    # 10^(1/8) apart, each rounded to 3 significant digits
    assert all(b / a == pytest.approx(10 ** (1 / 8), rel=5e-3) for a, b in zip(fine, fine[1:]))


def test_each_method_tunes_its_own_constraint():
    proto = bench.protocol("tiny", 3)
    field = {m.name: bench.method_grid(m, proto).field for m in bench.LEADERBOARD_METHODS}
    assert field["vaco"] == field["gae+tv_filter"] == "delta"
    assert field["ppo_clip"] == field["appo"] == "clip_eps"
    assert field["ppo_kl"] == "kl_coef" and field["ppo_kl_adaptive"] == "kl_target"
    assert field["m2po"] == "m2_tau"


def test_tuning_cells_vmap_the_grid_and_scored_cells_take_each_tasks_choice():
    proto = bench.protocol("tiny", 3)
    vaco = bench.Method("vaco")
    (cell,) = bench.tuning_cells(vaco, proto)
    assert len(cell.runs) == 16 * proto.design_seeds
    deltas = sorted({run.delta for run in cell.runs})
    assert deltas == [0.05, 0.1, 0.2, 0.4]          # δ is the run's own leaf
    chosen = {"toy_reach": {"learning_rate": 3e-3, "delta": 0.1}}
    for scored in bench.bench_cells(vaco, proto, learning_rate=chosen):
        assert {run.delta for run in scored.runs} == {0.1}
        assert {dict(run.hparams)["learning_rate"] for run in scored.runs} == {3e-3}
        assert {run.config(scored.config).delta for run in scored.runs} == {0.1}


def test_an_objectives_own_constraint_reaches_the_run_as_its_hyper_parameter():
    proto = bench.protocol("tiny", 3)
    m2po = bench.Method("m2po")
    chosen = {"toy_reach": {"learning_rate": 1e-3, "m2_tau": 0.02}}
    (lag, *_) = bench.bench_cells(m2po, proto, learning_rate=chosen)
    run = lag.runs[0]
    assert dict(run.hparams)["objective_hparams"] == ("m2_tau=0.02",)
    hp = run.config(lag.config).hparams()
    assert float(hp.objective["m2_tau"]) == pytest.approx(0.02)


def test_a_per_task_board_is_normalised_by_tuned_ppo_clips_design_seed_scores(tmp_path):
    """Protocol v3's reference is fixed before the scored runs: PPO-Clip's chosen configuration's
    mean final and AUC over the design seeds (its tuning.json), not its scored runs."""
    import json

    import pandas as pd

    from vaco_jax.study import robustness

    tuning_file = {"per_task": True, "tasks": {"t": {
        "chosen": {"learning_rate": 1e-3, "clip_eps": 0.2}, "edge": False,
        "configurations": [
            {"learning_rate": 1e-3, "clip_eps": 0.1, "auc": 50.0, "final": 60.0},
            {"learning_rate": 1e-3, "clip_eps": 0.2, "auc": 40.0, "final": 80.0}]}}}
    (tmp_path / "ppo_clip").mkdir()
    (tmp_path / "ppo_clip" / bench.TUNING_FILE).write_text(json.dumps(tuning_file))
    fixed = robustness.fixed_reference(tmp_path)
    assert fixed == (("t", 80.0, 40.0),)
    assert robustness._grid_edge(tmp_path / "ppo_clip" / bench.TUNING_FILE) == ""
    import numpy as np

    runs = pd.DataFrame({"task": ["t", "t"], "method": ["vaco", "ppo_clip"], "k": [4, 4],
                         "seed": [400, 400], "returns": [np.full(4, 25.0), np.full(4, 10.0)],
                         "steps": [np.arange(1, 5) * 100] * 2,
                         "diverged_at_step": [None, None]})
    scored = robustness.normalise(runs, {"t": 10.0}, robustness.Spec(fixed=fixed))
    # (x − random) / (reference − random): AUC (25 − 10) / (40 − 10), final (25 − 10) / (80 − 10)
    assert scored["auc_score"].tolist() == pytest.approx([0.5, 0.0])
    assert scored["final_score"].tolist() == pytest.approx([15 / 70, 0.0])


def test_a_fixed_reference_board_ranks_on_the_mean_and_shows_each_methods_change():
    """Protocol v3's table: ranked by the mean normalised AUC at the largest lag over tasks ×
    seeds, beside each method's change from k = 0 (per seed, mean over tasks)."""
    import numpy as np
    import pandas as pd

    from vaco_jax.study import robustness

    rows = []
    for method, (at0, at4) in {"ppo_clip": (1.0, 0.6), "vaco": (0.9, 0.8)}.items():
        for task in ("a", "b"):
            for seed in range(6):
                for k, value in ((0, at0), (4, at4)):
                    rows.append({"task": task, "method": method, "k": k, "sampling": "oldest",
                                 "K": 4, "seed": seed, "auc_score": value + 0.01 * seed,
                                 "final_score": value})
    scored = pd.DataFrame(rows)
    spec = robustness.Spec(base={"k": 0, "sampling": "oldest", "K": 4},
                           largest={"k": 4, "sampling": "oldest", "K": 4}, reps=50,
                           fixed=(("a", 1.0, 1.0), ("b", 1.0, 1.0)))
    aggregates = robustness.aggregates(scored, spec)
    report = robustness.Report(spec, scores=scored, aggregates=aggregates)
    assert robustness.ranking(report) == ["vaco", "ppo_clip"]
    at4 = aggregates[(aggregates.k == 4) & (aggregates.metric == "auc")].set_index("method")
    assert at4.loc["vaco", "mean"] == pytest.approx(0.8 + 0.01 * np.mean(range(6)))
    point, low, high = robustness.change(scored, spec, "ppo_clip")
    assert point == pytest.approx(-0.4) and low <= point <= high
    assert robustness.change(scored, spec, "vaco")[0] == pytest.approx(-0.1)


def test_a_field_a_metric_overwrote_in_float32_is_read_as_the_grids_value():
    """PPO-KL logs its coefficient as a metric of the same name, in float32, over the run's
    value in its rows: the tuning reads each value as the nearest one its grid holds."""
    import numpy as np
    import pandas as pd

    proto = bench.protocol("tiny", 3)
    grid = bench.method_grid(bench.Method("ppo_kl"), proto)
    rows = pd.DataFrame([{"env": "toy_reach", "learning_rate": lr, "kl_coef": float(np.float32(c)),
                          "seed": seed, "eval_index": i, "eval_return": 1.0 + c}
                         for lr in grid.learning_rates for c in grid.values for seed in (0, 1)
                         for i in range(3)])
    assert float(np.float32(0.03)) != 0.03
    runs = bench._tuning_runs(rows, {"toy_reach": 0.0}, proto, grid)["toy_reach"]
    assert {r["kl_coef"] for r in runs} == set(grid.values)
    chosen, _ = tuning.choose(runs, grid)
    assert chosen == {"learning_rate": min(grid.learning_rates), "kl_coef": max(grid.values)}


def test_the_committed_tiny_board_recomputes_from_a_copy_in_another_folder(tmp_path):
    """results/lag-bench/tiny-v3, the board the README's first benchmark command compares with:
    every table recomputes from its per-run files wherever the folder lies."""
    import shutil
    from pathlib import Path

    from vaco_jax.study import robustness

    board = Path(__file__).resolve().parent.parent / "results" / "lag-bench" / "tiny-v3"
    copy = tmp_path / "elsewhere" / "tiny-v3"
    shutil.copytree(board, copy)
    assert robustness.check(copy) == []
    assert len(list(copy.glob("*/tuning.json"))) == len(bench.LEADERBOARD_METHODS)
