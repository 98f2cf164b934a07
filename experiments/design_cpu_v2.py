"""Design-seed measurements for the lag-robustness benchmark's `cpu` protocol v2.

Candidate tasks are run with synchronous and lagged PPO-Clip on design seeds (900-904), which the
leaderboard never uses, to choose tasks whose budget leaves PPO-Clip unsaturated and on which lag
changes something. Resumable (one sweep cell per task): run the same command again to continue.

    python -m experiments.design_cpu_v2 OUT [--tasks dmc:CartpoleSwingup ...] [--algo ppo_clip]
    python -m experiments.design_cpu_v2 OUT --summary     # OUT/summary.md from the runs in OUT
"""

from __future__ import annotations

import argparse
import dataclasses

from vaco_jax import io
from vaco_jax.config import Config
from vaco_jax.study import bench

# The controlled-lag study's CPU shapes: 32 envs x 32 steps per iteration, K = 4 x M = 8.
SHAPES = {"num_envs": 32, "unroll_length": 32, "num_epochs": 4, "num_minibatches": 8,
          "num_actors": 4, "num_evals": 20, "eval_envs": 16}
# Generous budgets: the curve of 20 evaluations shows where each smaller budget would end.
CANDIDATES = {
    "gymnax:CartPole-v1": 204_800,
    "gymnax:Acrobot-v1": 409_600,
    "dmc:CartpoleSwingup": 1_024_000,
    "dmc:PendulumSwingup": 1_024_000,
    "dmc:AcrobotSwingup": 1_024_000,
    "inverted_double_pendulum": 409_600,
    "gymnax:Pendulum-v1": 819_200,
    "dmc:ReacherEasy": 1_024_000,
    "reacher": 1_024_000,
    "gymnax:Breakout-MinAtar": 1_228_800,
    "gymnax:SpaceInvaders-MinAtar": 1_228_800,
}
DESIGN_SEED = 900
# Fields a task needs to be learnable at all, the same for every method.
TASK_FIELDS = {
    "gymnax:Pendulum-v1": {"gamma": 0.9},
    "gymnax:Breakout-MinAtar": {"ent_coef": 0.01},
    "gymnax:SpaceInvaders-MinAtar": {"ent_coef": 0.01},
}


def task(env: str, budget: int, seeds: int) -> bench.Task:
    defaults = Config.for_env(env)
    fields = {"episode_length": defaults.episode_length, **SHAPES, "total_steps": budget,
              **TASK_FIELDS.get(env, {})}
    return bench.Task(env, tuple(fields.items()), seeds)


def summarise(root: str) -> str:
    """The design measurements as markdown tables: stage 1 (PPO-Clip, k = 0 and 8, candidate
    budgets) and stage 2 (four methods at the chosen budgets, normalised)."""
    import glob
    import json
    from pathlib import Path

    import numpy as np
    import pandas as pd

    from vaco_jax.study import sweep

    def runs_of(directory):
        rows = sweep.load_results(directory)
        cells = {json.loads(l)["cell"]: json.loads(l) for l in
                 (Path(directory) / "cells.jsonl").read_text().splitlines() if l.strip()}
        def one(g):
            g = g.sort_values("step")
            return pd.Series({"final": g.eval_return.iloc[-3:].mean(), "auc": g.eval_return.mean(),
                              "budget": g.step.iloc[-1]})
        per_run = rows.groupby(["env", "algo", "capacity", "seed"])[["step", "eval_return"]].apply(one)
        return per_run.reset_index(), cells, rows

    lines = []
    stage1 = f"{root}/ppo_clip/runs"
    random = json.loads(Path(f"{root}/ppo_clip/random_returns.json").read_text())
    runs, cells, rows = runs_of(stage1)
    lines += ["## Stage 1: PPO-Clip on the candidates (design seeds 900–904)", "",
              "| task | budget | random | final, k = 0 | final, k = 8 | AUC, k = 8 ÷ k = 0 | "
              "steps/s (10 runs, loaded machine) |", "|---|---|---|---|---|---|---|"]
    for env in dict.fromkeys(runs.env):
        g = runs[runs.env == env]
        k0, k8 = g[g.capacity == 1], g[g.capacity == 9]
        cell = next(c for c in cells.values() if c["cell"].split("/")[1] == env)
        lines.append(f"| `{env}` | {int(g.budget.iloc[0]):,} | {random[env]:.1f} | "
                     f"{k0.final.mean():.1f} [{k0.final.min():.1f}, {k0.final.max():.1f}] | "
                     f"{k8.final.mean():.1f} | "
                     f"{(k8.auc.mean() - random[env]) / (k0.auc.mean() - random[env]):.2f} | "
                     f"{cell['sps']:,.0f} |")
    # stage 1 curves read at fractions of the budget: where a smaller budget would end
    lines += ["", "PPO-Clip's mean evaluation return (k = 0 / k = 8) at a quarter, half, three "
              "quarters and all of each candidate budget:", "",
              "| task | 25% | 50% | 75% | 100% |", "|---|---|---|---|---|"]
    for env in dict.fromkeys(runs.env):
        g = rows[rows.env == env]
        p = g.pivot_table(index="capacity", columns="step", values="eval_return")
        steps = list(p.columns)
        picks = [steps[int(len(steps) * f) - 1] for f in (0.25, 0.5, 0.75, 1.0)]
        lines.append(f"| `{env}` | " + " | ".join(
            f"{p.loc[1, s]:.1f} / {p.loc[9, s]:.1f} ({s:,})" for s in picks) + " |")
    stage2 = sorted(glob.glob(f"{root}/stage2/*/runs"))
    if stage2:
        frames, rand2 = [], {}
        for d in stage2:
            frames.append(runs_of(d)[0])
            rand2.update(json.loads((Path(d).parent / "random_returns.json").read_text()))
        r2 = pd.concat(frames)
        lines += ["", "## Stage 2: four methods at the chosen budgets (design seeds 900–904)", "",
                  "Normalised score, random = 0, PPO-Clip at k = 0 = 1 (same seeds), mean of 5 "
                  "seeds: final / AUC.", "",
                  "| task | budget | method | k = 0 | k = 8 |", "|---|---|---|---|---|"]
        for env in dict.fromkeys(r2.env):
            g = r2[r2.env == env]
            ref = g[(g.algo == "ppo_clip") & (g.capacity == 1)]
            if ref.empty:
                continue
            for algo in sorted(set(g.algo)):
                cells_ = []
                for cap in (1, 9):
                    h = g[(g.algo == algo) & (g.capacity == cap)]
                    n = [(h[v].mean() - rand2[env]) / (ref[v].mean() - rand2[env])
                         for v in ("final", "auc")]
                    cells_.append(f"{n[0]:.2f} / {n[1]:.2f}")
                lines.append(f"| `{env}` | {int(g.budget.iloc[0]):,} | {algo} | "
                             + " | ".join(cells_) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.design_cpu_v2",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--summary", action="store_true",
                        help="write OUT/summary.md from the runs already in OUT and stop")
    parser.add_argument("--tasks", nargs="+", default=list(CANDIDATES))
    parser.add_argument("--algo", default="ppo_clip")
    parser.add_argument("--lags", type=int, nargs="+", default=[0, 8])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", nargs="*", default=[], metavar="ENV=STEPS",
                        help="another budget for a candidate")
    args = parser.parse_args(argv)
    if args.summary:
        path = f"{args.out}/summary.md"
        text = ("# Design-seed measurements for the benchmark's cpu protocol v2\n\n"
                "Generated by `python -m experiments.design_cpu_v2 "
                f"{args.out} --summary`.\n\n" + summarise(args.out))   # may fail: nothing written
        io.write_bytes_atomic(path, text.encode())
        print(path)
        return
    budgets = {**CANDIDATES, **{e: int(b) for e, _, b in (x.partition("=") for x in args.budget)}}
    proto = bench.Protocol(
        "cpu-design", 2, tuple(task(env, budgets[env], args.seeds) for env in args.tasks),
        lags=tuple(args.lags), forward=(), seed=DESIGN_SEED,
        description="design seeds: candidate tasks for cpu v2")
    for t in proto.tasks:
        print(t.env, dict(t.config))
    bench.run_bench(bench.Method(args.algo), proto, f"{args.out}/{args.algo}",
                    allow_code_change=True)


if __name__ == "__main__":
    main()
