"""The real-asynchrony equivalence study's pieces (experiments/async_equivalence.py) against hand
computations: the pooled lag profile of the real calls, the Welch interval, the plan."""

import json

import numpy as np
import pytest
from scipy import stats

from experiments import async_equivalence as study


def test_the_simulated_run_acts_with_the_real_calls_ages_pooled(tmp_path):
    for call, counts in enumerate(([6, 2], [2, 4, 2])):
        where = study.directory(tmp_path, "real", "vaco", "dmc:X", "queue16", call)
        where.mkdir(parents=True)
        (where / "summary.json").write_text(json.dumps({"ages": {"counts": counts}}))
    # 8 + 6 + 2 = 16 segments: ages 0, 1, 2 in 8, 6 and 2 of them
    assert study.pooled_profile(tmp_path, "vaco", "dmc:X", "queue16", 2) == \
        pytest.approx([0.5, 0.375, 0.125])


def test_the_welch_interval_is_scipys():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.1, 1.0, 40), rng.normal(0.0, 2.0, 30)
    d, low, high = study.welch(a, b, 0.90)
    expected = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.90)
    assert d == pytest.approx(a.mean() - b.mean())
    assert (low, high) == pytest.approx((expected.low, expected.high))


def test_the_plan_pairs_every_real_call_with_one_simulated_and_one_synchronous_run():
    preset = study.PRESETS["cpu"]
    planned = list(study.runs(preset))
    per_cell = len(study.REGIMES) * (preset.calls + 1) + 1
    assert len(planned) == len(preset.tasks) * len(preset.methods) * per_cell
    real = [p for p in planned if p[0] == "real"]
    seeds = {(m, env, regime): set() for _, m, env, regime, *_ in real}
    for _, m, env, regime, call, fields, asynchrony in real:
        assert asynchrony["asynchronous"]
        seeds[m, env, regime] |= set(range(fields["seed"], fields["seed"] + fields["num_seeds"]))
    n = preset.calls * preset.seeds_per_call
    assert all(s == set(range(study.SEED, study.SEED + n)) for s in seeds.values())
