"""vaco_jax.study.stats and vaco_jax.study.capacity: rliable agreement, hand formulas, normalisation maths."""

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from rliable import library as rly
from rliable import metrics as rly_metrics

from vaco_jax.study import capacity as capacity_sweeps, references, stats


def _scores(seed=0, runs=10, tasks=3):
    rng = np.random.default_rng(seed)
    return rng.normal(loc=np.arange(tasks) * 0.3, scale=0.5, size=(runs, tasks))


# --- normalisation ------------------------------------------------------------------------------
def test_normalize_maps_random_to_zero_and_reference_to_one():
    returns = np.array([-50.0, 100.0, 250.0, 400.0])
    scores = stats.normalize(returns, random_return=100.0, reference_return=400.0)
    np.testing.assert_allclose(scores, [-0.5, 0.0, 0.5, 1.0])
    # Per-env references broadcast; the map is affine, so differences scale by 1 / span.
    np.testing.assert_allclose(stats.normalize([[3.0, 30.0]], [1.0, 10.0], [5.0, 50.0]), [[0.5, 0.5]])


@pytest.mark.parametrize("reference", [100.0, 50.0, np.nan])
def test_normalize_rejects_a_reference_not_better_than_random(reference):
    with pytest.raises(ValueError, match="must exceed the random-policy return"):
        stats.normalize([1.0], random_return=100.0, reference_return=reference)


def test_add_scores_normalises_each_env_with_its_own_reference():
    results = pd.DataFrame({"env": ["a", "a", "b"], "budget": [10, 10, 20],
                            "eval_return": [5.0, 10.0, 0.0]})
    table = {"schema_version": 1, "entries": [
        {"env": "a", "budget": 10, "random_return": 0.0, "ppo_sync_return": 10.0, "preset": "x"},
        {"env": "b", "budget": 20, "random_return": -4.0, "ppo_sync_return": 4.0, "preset": "x"},
        {"env": "b", "budget": 99, "random_return": 0.0, "ppo_sync_return": 1.0, "preset": "y"}]}
    np.testing.assert_allclose(references.add_scores(results, table)["score"], [0.5, 1.0, 0.5])
    with pytest.raises(KeyError, match="no reference returns for env 'a' at budget 11"):
        references.add_scores(results.assign(budget=[11, 11, 20]), table)


def test_reference_table_round_trip_replaces_same_env_and_budget(tmp_path):
    path = tmp_path / "refs.json"
    for value in (1.0, 2.0):
        references.update(path, {"preset": "p", "env": "a", "budget": 10, "random_return": 0.0,
                                 "ppo_sync_return": value})
    references.update(path, {"preset": "p", "env": "a", "budget": 20, "random_return": 0.0,
                             "ppo_sync_return": 3.0})
    table = references.load(path)
    assert table["schema_version"] == references.SCHEMA_VERSION
    assert [e["ppo_sync_return"] for e in table["entries"]] == [2.0, 3.0]
    assert references.lookup(table, "a", 10)["ppo_sync_return"] == 2.0


# --- aggregates ---------------------------------------------------------------------------------
def test_aggregate_matches_hand_formulas():
    scores = _scores(runs=8, tasks=3)        # 24 values: IQM averages the middle 12
    median, iqm, mean, gap = stats.aggregate(scores)
    assert median == pytest.approx(np.median(scores.mean(axis=0)))
    assert iqm == pytest.approx(np.sort(scores.ravel())[6:18].mean())
    assert mean == pytest.approx(scores.mean())
    assert gap == pytest.approx(np.mean(1.0 - np.minimum(scores, 1.0)))


def test_interval_estimates_equal_rliable_on_the_same_inputs():
    score_dict = {"vaco": _scores(1), "ppo_clip": _scores(2) - 0.2}
    table = stats.interval_estimates(score_dict, reps=300, seed=7)

    def reference(x):
        return np.array([rly_metrics.aggregate_median(x), rly_metrics.aggregate_iqm(x),
                         rly_metrics.aggregate_mean(x), rly_metrics.aggregate_optimality_gap(x)])

    np.random.seed(7)
    points, intervals = rly.get_interval_estimates(score_dict, reference, reps=300)
    for name in score_dict:
        rows = table[table["method"] == name].set_index("metric").loc[list(stats.METRICS)]
        np.testing.assert_array_equal(rows["point"].to_numpy(), points[name])
        np.testing.assert_array_equal(rows["low"].to_numpy(), intervals[name][0])
        np.testing.assert_array_equal(rows["high"].to_numpy(), intervals[name][1])
        assert np.all(rows["low"] <= rows["point"]) and np.all(rows["point"] <= rows["high"])


def test_an_interval_of_one_metric_is_the_same_as_among_all_four():
    # The resamples do not depend on what is computed on them: asking for the IQM alone gives
    # the IQM rows of the four-metric table exactly.
    score_dict = {"vaco": _scores(1), "ppo_clip": _scores(2) - 0.2, "appo": _scores(3)}
    every = stats.interval_estimates(score_dict, reps=300, seed=7)
    alone = stats.interval_estimates(score_dict, reps=300, seed=7, metrics=("iqm",))
    assert set(alone["metric"]) == {"iqm"}
    pd.testing.assert_frame_equal(alone.reset_index(drop=True),
                                  every[every["metric"] == "iqm"].reset_index(drop=True))
    with pytest.raises(ValueError, match="metrics.*'iqr'.*median, iqm, mean, optimality_gap"):
        stats.interval_estimates(score_dict, metrics=("iqr",))


def test_bootstrap_is_stratified_by_task_and_has_the_right_width():
    # Task 0 always scores 0 and task 1 always 1: resampling runs within each task cannot move the
    # mean; a bootstrap pooling runs across tasks would.
    constant = np.stack([np.zeros(20), np.ones(20)], axis=1)
    row = stats.interval_estimates({"m": constant}, reps=200).set_index("metric").loc["mean"]
    assert (row["low"], row["point"], row["high"]) == (0.5, 0.5, 0.5)
    # One task, 400 N(0, 1) runs: the 95% CI of the mean is about ±1.96 / √400 = ±0.098.
    normal = np.random.default_rng(0).normal(size=(400, 1))
    row = stats.interval_estimates({"m": normal}, reps=2000).set_index("metric").loc["mean"]
    assert (row["high"] - row["low"]) / 2 == pytest.approx(1.96 / 20, rel=0.15)


def test_seeded_and_leaves_the_global_numpy_rng_alone():
    np.random.seed(123)
    expected = np.random.random()
    np.random.seed(123)
    a = stats.interval_estimates({"m": _scores()}, reps=100, seed=5)
    assert np.random.random() == expected
    b = stats.interval_estimates({"m": _scores()}, reps=100, seed=5)
    c = stats.interval_estimates({"m": _scores()}, reps=100, seed=6)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)


def test_probability_of_improvement():
    low, high = np.zeros((5, 2)), np.ones((5, 2))
    table = stats.probability_of_improvement({"vaco": high, "ppo": low, "same": high}, "vaco",
                                             reps=100).set_index("baseline")
    assert table.loc["ppo", ["point", "low", "high"]].tolist() == [1.0, 1.0, 1.0]
    assert table.loc["same", "point"] == 0.5
    # Against rliable and against the Mann–Whitney definition, ties counting one half.
    x, y = _scores(3, runs=6), _scores(4, runs=7)
    table = stats.probability_of_improvement({"x": x, "y": y}, "x", reps=200, seed=1)
    np.random.seed(1)
    points, intervals = rly.get_interval_estimates({"y": [x, y]},
                                                   rly_metrics.probability_of_improvement, reps=200)
    assert table["point"].item() == points["y"]
    assert (table["low"].item(), table["high"].item()) == tuple(np.ravel(intervals["y"]))
    by_hand = np.mean([np.mean((x[:, None, t] > y[None, :, t]) + 0.5 * (x[:, None, t] == y[None, :, t]))
                       for t in range(x.shape[1])])
    assert table["point"].item() == pytest.approx(by_hand)


def test_iqm_and_improvement_probability_equal_rliables_exactly_ties_included():
    # Ours count pairs and partition once where rliable calls SciPy per task: the same values.
    rng = np.random.default_rng(0)
    for trial in range(300):
        n, m, tasks = rng.integers(1, 12, size=2).tolist() + [int(rng.integers(1, 6))]
        if trial % 2:                                 # half the draws with many ties
            x, y = rng.integers(0, 3, (n, tasks)) / 2, rng.integers(0, 3, (m, tasks)) / 2
        else:
            x, y = rng.normal(size=(n, tasks)), rng.normal(size=(m, tasks))
        y = x.copy() if trial % 7 == 0 else y
        assert stats.iqm(x) == rly_metrics.aggregate_iqm(x)
        assert stats.improvement_probability(x, y) == rly_metrics.probability_of_improvement(x, y)


def test_area_under_curve():
    steps = np.array([10.0, 20.0, 30.0, 40.0])
    np.testing.assert_allclose(stats.area_under_curve(np.full((2, 3, 4), 0.7), steps), 0.7)
    # Unequal spacing: each value stands for the chunk ending at its step.
    value = stats.area_under_curve(np.array([1.0, 0.0, 2.0]), np.array([10.0, 40.0, 50.0]))
    assert value == pytest.approx((1.0 * 10 + 0.0 * 30 + 2.0 * 10) / 50)
    with pytest.raises(ValueError, match="increasing"):
        stats.area_under_curve(np.zeros(3), np.array([1.0, 1.0, 2.0]))


def test_performance_profiles_match_the_fraction_above_tau():
    scores = _scores(5)
    taus = np.linspace(-1, 2, 7)
    profile, low, high = stats.performance_profiles({"m": scores}, taus, reps=200)["m"]
    np.testing.assert_allclose(profile, [(scores > t).mean() for t in taus])
    assert np.all(low <= profile + 1e-12) and np.all(profile <= high + 1e-12)


def test_curve_estimates_pointwise_iqm():
    curves = np.random.default_rng(0).normal(size=(8, 2, 5))
    point, low, high = stats.curve_estimates({"m": curves}, reps=100)["m"]
    np.testing.assert_allclose(point, [scipy.stats.trim_mean(curves[..., t], 0.25, axis=None)
                                       for t in range(5)])
    assert point.shape == low.shape == high.shape == (5,)


def test_nan_scores_are_rejected_with_their_position():
    scores = _scores()
    scores[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"NaN or inf .* \[\[2, 1\]\]"):
        stats.interval_estimates({"m": scores})


# --- from a tidy table to matrices ---------------------------------------------------------------
def _tidy(seeds=3, envs=("e1", "e2"), capacities=(1, 4), evals=3):
    rows = []
    for env_index, env in enumerate(envs):
        for algo_index, algo in enumerate(("vaco", "ppo_clip")):
            for capacity in capacities:
                for seed in range(seeds):
                    for e in range(evals):
                        rows.append(dict(cell=f"main/{env}/{algo}", study="main", env=env, algo=algo,
                                         variant="default", capacity=capacity, delta=0.2, seed=seed,
                                         eval_index=e, step=(e + 1) * 100, budget=evals * 100,
                                         score=env_index + algo_index + 10 * capacity + seed + e / 10))
    return pd.DataFrame(rows)


def test_score_and_auc_matrices_from_a_tidy_table():
    table = capacity_sweeps.with_methods(_tidy())
    matrices = capacity_sweeps.score_matrices(table)
    assert sorted(matrices) == [(1, "ppo_clip"), (1, "vaco"), (4, "ppo_clip"), (4, "vaco")]
    # [seeds, envs] at the final evaluation (e = 2): env_index + algo_index + 10 C + seed + 0.2.
    expected = np.array([[0, 1], [1, 2], [2, 3]]) + 1 + 40 + 0.2
    np.testing.assert_allclose(matrices[(4, "ppo_clip")], expected)
    auc = capacity_sweeps.auc_matrices(table)
    np.testing.assert_allclose(auc[(4, "ppo_clip")], expected - 0.1)   # mean over e = 0, 1, 2
    with pytest.raises(ValueError, match="missing seeds on env"):
        capacity_sweeps.score_matrices(table.drop(table.index[(table["env"] == "e2") & (table["seed"] == 1)]))


def test_a_diverged_run_counts_as_a_failure_in_score_and_auc_matrices():
    table = capacity_sweeps.with_methods(_tidy())
    # vaco, C = 4, seed 1 on e2 diverged at its second evaluation (e = 1): NaN from there on.
    run = (table["algo"] == "vaco") & (table["capacity"] == 4) & (table["seed"] == 1) & (
        table["env"] == "e2")
    table["diverged"] = run & (table["eval_index"] >= 1)
    table.loc[table["diverged"], "score"] = np.nan
    matrices = capacity_sweeps.score_matrices(table)
    assert matrices[(4, "vaco")].shape == (3, 2)            # kept, not dropped
    assert matrices[(4, "vaco")][1, 1] == 0.0               # scored as a random policy
    assert matrices[(4, "vaco")][1, 0] == 0 + 0 + 40 + 1 + 0.2   # its other env is untouched
    auc = capacity_sweeps.auc_matrices(table)
    # Mean of (score at e = 0, then 0, 0): (1 + 0 + 40 + 1 + 0.0) / 3.
    assert auc[(4, "vaco")][1, 1] == pytest.approx(42 / 3)


def test_aggregate_and_improvement_tables():
    table = capacity_sweeps.with_methods(_tidy(seeds=4))
    aggregates = capacity_sweeps.aggregate_table(table, reps=100)
    assert len(aggregates) == 2 * 2 * 4 and set(aggregates["seeds"]) == {4}
    iqm = aggregates[(aggregates["metric"] == "mean") & (aggregates["capacity"] == 1)]
    assert iqm.set_index("method")["point"].to_dict() == pytest.approx(
        {"vaco": 10 + 0.5 + 1.5 + 0.2, "ppo_clip": 11 + 0.5 + 1.5 + 0.2})
    improvement = capacity_sweeps.improvement_table(table, "vaco", reps=100)
    assert improvement["baseline"].tolist() == ["ppo_clip", "ppo_clip"]
    assert np.all(improvement["point"] < 0.5)   # ppo_clip scores one more on every env and seed
    assert "| 1 | vaco | " in capacity_sweeps.markdown(aggregates)


def test_bca_interval_does_not_move_with_rounding_noise_in_the_data():
    # A resample that permutes every seed of a stratum has the statistic's own value, but its
    # float sum may round either side of it: a tie counted as below or above by the last bit
    # shifted z₀ (with 5 seeds, 5!/5⁵ ≈ 4% of resamples), and the interval by up to 0.08 here.
    rng = np.random.default_rng(1)
    for _ in range(5):
        data = rng.normal(size=(5, 2))
        noisy = data * (1 + rng.choice([-1, 0, 1], size=data.shape) * 2.0 ** -52)
        (_, *clean), (_, *moved) = (stats.stratified_bca(
            [d], lambda s: s[0][:, 1].mean() - s[0][:, 0].mean(), reps=2000) for d in (data, noisy))
        np.testing.assert_allclose(moved, clean, rtol=1e-9, atol=1e-12)
