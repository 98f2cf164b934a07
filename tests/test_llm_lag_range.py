"""experiments.llm_lag_range: the lag-range table of one objective's runs, by hand."""

import json

import pytest

from experiments import llm_lag_range


def test_the_lag_range_table_reads_the_named_objectives_runs_and_pairs_them_by_seed(tmp_path):
    rows = [{"objective": objective, "n": 1, "k": k, "seed": seed,
             "final_accuracy": greedy, "final_sampled_accuracy": sampled}
            for objective, shift in (("vaco", 0.0), ("ppo_clip", 0.5))
            for k, seed, greedy, sampled in ((0, 0, 0.50, 0.30), (0, 1, 0.60, 0.40),
                                             (32, 0, 0.40, 0.30), (32, 1, 0.40, 0.20))
            for greedy, sampled in ((greedy + shift, sampled),)]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = llm_lag_range.table(tmp_path, "vaco").splitlines()
    assert lines[0].startswith("VACO, 2 seeds")
    # k = 32 − k = 0, paired: greedy −0.10 and −0.20 (mean −0.15), sampled 0.00 and −0.20 (−0.10)
    assert lines[-1].startswith("| 1 | 32 | 0.400 [0.400, 0.400] | 0.250 [")
    assert "| -0.150 [" in lines[-1] and "| -0.100 [" in lines[-1]
    assert llm_lag_range.table(tmp_path).splitlines()[4].startswith("| 1 | 0 | 1.050 [")
    with pytest.raises(SystemExit, match="no runs of objective 'pg'"):
        llm_lag_range.table(tmp_path, "pg")
