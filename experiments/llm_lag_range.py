"""How far backward lag must go before it changes an objective (PPO-Clip by default) on the LLM
testbed: per N and k, held-out greedy and sampled accuracy at the end of training (mean and 95% t
interval over the seeds), and the paired difference from k = 0 (the same seeds). Prints a markdown
table.

    python -m experiments.llm_lag_range results/llm/lag-range-design > results/llm/lag-range-design/lag_range.md
    python -m experiments.llm_lag_range DIR --objective vaco

The runs come from `vaco-llm cpu --ks ... --objectives OBJECTIVE` (the command is in the
directory's README)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from vaco_jax import io
from vaco_jax.pipeline import tables
from vaco_jax.study import stats

METRICS = (("final_accuracy", "greedy"), ("final_sampled_accuracy", "sampled"))
NAMES = {"ppo_clip": "PPO-Clip", "vaco": "VACO"}


def table(directory: str | Path, objective: str = "ppo_clip") -> str:
    rows = io.read_rows(Path(directory) / "results.jsonl")
    by = {(r["n"], r["k"], r["seed"]): r for r in rows if r["objective"] == objective}
    if not by:
        raise SystemExit(f"{directory}: no runs of objective {objective!r}")
    ns = sorted({n for n, _, _ in by})
    ks = sorted({k for _, k, _ in by})
    seeds = sorted({s for _, _, s in by})
    head = ["N", "k"] + [f"held-out {name}" for _, name in METRICS] + \
        [f"{name} − k = 0" for _, name in METRICS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in ns:
        for k in ks:
            cells = [str(n), str(k)]
            values = {field: np.array([by[n, k, s][field] for s in seeds]) for field, _ in METRICS}
            base = {field: np.array([by[n, 0, s][field] for s in seeds]) for field, _ in METRICS}
            cells += [tables.interval(*stats.paired_t_interval(values[f]), digits=3)
                      for f, _ in METRICS]
            cells += ["–" if k == 0 else
                      tables.interval(*stats.paired_t_interval(values[f] - base[f]), digits=3,
                                      sign=True) for f, _ in METRICS]
            lines.append("| " + " | ".join(cells) + " |")
    return (f"{NAMES.get(objective, objective)}, {len(seeds)} seeds; mean [95% t interval]; "
            "differences paired by seed.\n\n" + "\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.llm_lag_range",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="the vaco-llm output directory (results.jsonl)")
    parser.add_argument("--objective", default="ppo_clip", help="whose runs (default ppo_clip)")
    args = parser.parse_args(argv)
    sys.stdout.write(table(args.directory, args.objective))
    return 0


if __name__ == "__main__":
    sys.exit(main())
