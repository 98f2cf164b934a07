"""Design-seed measurements for the lag-robustness benchmark's `cpu` protocol v3 (design stage).

Everything here runs on design seeds 900-904, which no score uses, before anything is
pre-registered. Every task runs the same number of learner iterations T = 128, so a lag of k
iterations is the same fraction of every run; a task's budget is set by its steps per iteration
(num_envs x 32 steps), T x num_envs x 32 env steps per run.

Stage 1 reads ONLY synchronous PPO-Clip (k = 0), on each candidate task over a learning-rate grid
(one program per task: every learning rate x design seed vmapped). Stage 2 runs PPO-Clip at its
per-task stage-1 learning rate at constant lags k in {0, 2, 4, 6, 8} (lag profiles, one program
per task) on the tasks the rule keeps, to choose the protocol's largest lag k_max.

THE TASK RULE (written before stage 1 ran; it reads stage 1 only, never a lagged run):

  For each candidate, PPO-Clip's learning rate is the grid's rate with the highest mean AUC over the
  design seeds (AUC: the mean of a run's evaluation returns; ties to the smaller rate). At that rate,
  with `final` the mean over the design seeds of each run's last 3 evaluations and `random` the
  random policy's mean return, a task is KEPT when both hold:

  L (learns, well above random): where the task has a return cap R (`RETURN_CAP`),
    final - random >= 0.25 (R - random); where it has none, final - random > 0 and
    final - random >= 3 x the standard deviation of the design seeds' final returns.
  S (not at its cap before the last quarter): where it has a cap, the seed-mean return at every
    evaluation in the first three quarters of the run is below random + 0.9 (R - random); where it
    has none, it is still rising in the last quarter: the seed-mean return over the three
    evaluations that end at 3/4 of the run is below random + 0.95 (final - random).

  AMENDMENT L' (made after stage 1's synchronous runs of Breakout-MinAtar, before any lagged run
  of a task without a cap; it reads stage 1 only): for a task without a cap, L's "3 x the standard
  deviation of the seeds' final returns" treats the spread between seeds (Breakout: 6.8 to ~20)
  as noise around random. L' asks instead that every design seed's final return is above random
  and that final - random >= 3 standard errors (sd / sqrt(5)). Capped tasks are unchanged. Stage 2
  and the summary use L' and report L as written beside it.

  Then cost (it reads only stage 1's steps/s): if the kept tasks' projected cost exceeds the limit
  (2 hours per method on a quiet 2-core machine, tuning included, 20 scoring seeds), the most
  expensive kept task of the suite with the most kept tasks is dropped, until it fits. If fewer
  than 8 tasks of 3 suites, 2 with discrete actions, are left, that is reported and the candidates'
  steps per iteration (or T) are chosen again; the rule is not changed to let a task in.

k_max (at most T/16 = 8; never chosen by how methods spread apart): the smallest k in {2, 4, 6, 8}
at which PPO-Clip's median over kept tasks of (AUC_k - random) / (AUC_0 - random)
is at most 0.9 (none: reported, and T is chosen again).

  AMENDMENT K' (made after reading round 3's stage 2, which holds PPO-Clip's runs only): the
  protocol's lag axis must hold at least four values in 0..k_max, so k_max >= 3; k_max is the
  smallest measured k >= 3 whose median is at most 0.9. (Over the six kept tasks the rule as
  written gives 2: a lag axis {0, 1, 2} of three values.)

Held-out tasks (`HELD_OUT`) are named here and never run on the design seeds.

ROUND 2 (written after round 1's stage 1 and stage 2, before any round-2 run). Round 1 kept five
tasks, one discrete. As the rule says, the steps per iteration of the candidates that failed are
chosen again (`ROUND2`), read from round 1's synchronous curves only: CartPole and Acrobot were at
their cap or plateau early (fewer envs: 8 each, the fewest M = 8 minibatches allow), gymnax Pendulum peaked at half the run at the
grid's top rate (32 envs, and a grid that reaches 1e-2), SpaceInvaders plateaued (32 envs).
Freeway (too late at 64 envs; 128 would cost about 70 minutes per method on a quiet machine),
FingerSpin (does not learn) and `reacher` (v2's slowest task) are not run again: by round 1's
rates none fits the cost limit beside the kept tasks. Round 1's rate was the grid's top on most
tasks, so the grid is extended one step to 1e-2 (`LR_GRID_2`): the five kept tasks run at 1e-2
only and are decided again on all four rates, by the same rule. Stage 2 runs, at the same lags,
each task kept in round 2 whose rate is not one stage 2 already ran; k_max is chosen again by the
same rule over every task kept in round 2.

    python -m experiments.design_cpu_v3 OUT --round 2 [--stage 2] [--tasks ...] [--summary]

ROUND 3 (written after round 2's stage 1, before any round-3 run; `ROUND3`): five new, cheap
candidates at the extended grid, by the same rule. Stage 2 then runs every task kept so far
whose rate stage 2 has not run, and k_max is chosen again over every kept task.

    python -m experiments.design_cpu_v3 OUT --round 3 [--stage 2] [--summary]

    python -m experiments.design_cpu_v3 OUT --plan                # sizes and cost, runs nothing
    python -m experiments.design_cpu_v3 OUT                       # stage 1 (resumable)
    python -m experiments.design_cpu_v3 OUT --stage 2 [--tasks ...]
    python -m experiments.design_cpu_v3 OUT --summary             # OUT/summary.md from the runs
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vaco_jax import io
from vaco_jax.config import Config
from vaco_jax.study import bench

T = 128                     # learner iterations of every run, every task
UNROLL = 32
NUM_EVALS = 16              # one evaluation every 8 iterations
SHAPES = {"unroll_length": UNROLL, "num_epochs": 4, "num_minibatches": 8, "num_actors": 4,
          "num_evals": NUM_EVALS, "eval_envs": 16}
# Candidate -> (num_envs, the task's own fields). Steps per run = T x num_envs x 32. The envs per
# iteration scale a task's budget with how much data it needs (v2's design curves): 16 for tasks
# PPO-Clip learns in ~50k steps, 128 for CartpoleSwingup, which needs ~500k.
CANDIDATES = {   # in the order stage 1 runs them: the cheapest first
    "gymnax:CartPole-v1": (16, {}),
    "gymnax:Acrobot-v1": (16, {}),
    "gymnax:Pendulum-v1": (64, {"gamma": 0.9}),
    "dmc:CartpoleBalance": (32, {}),
    "gymnax:Breakout-MinAtar": (64, {"ent_coef": 0.01}),
    "dmc:CartpoleSwingup": (128, {}),
    "gymnax:SpaceInvaders-MinAtar": (64, {"ent_coef": 0.01}),
    "gymnax:Freeway-MinAtar": (64, {"ent_coef": 0.01}),
    "dmc:ReacherEasy": (32, {}),
    "inverted_double_pendulum": (16, {}),
    "dmc:FingerSpin": (32, {}),
    "reacher": (32, {}),
}
# Named in advance, never run on the design seeds: scored beside the kept tasks, reported apart.
HELD_OUT = {
    "gymnax:Asterix-MinAtar": (64, {"ent_coef": 0.01}),
    "dmc:FingerTurnEasy": (64, {}),
    "pusher": (32, {}),
}
SUITE = {"gymnax:CartPole-v1": "gymnax classic", "gymnax:Acrobot-v1": "gymnax classic",
         "gymnax:Pendulum-v1": "gymnax classic", "gymnax:Reacher-misc": "gymnax misc",
         "gymnax:Swimmer-misc": "gymnax misc", "gymnax:Catch-bsuite": "bsuite"}
DISCRETE = {"gymnax:CartPole-v1", "gymnax:Acrobot-v1", "gymnax:Breakout-MinAtar",
            "gymnax:SpaceInvaders-MinAtar", "gymnax:Freeway-MinAtar", "gymnax:Asterix-MinAtar",
            "gymnax:Catch-bsuite"}
# A task's documented maximum return at its episode length (None: no cap the policy can reach).
RETURN_CAP = {"gymnax:CartPole-v1": 500.0, "inverted_double_pendulum": 9_360.0,
              "gymnax:Catch-bsuite": 1.0,
              **{env: 1_000.0 for env in (*CANDIDATES, *HELD_OUT) if env.startswith("dmc:")}}
LR_GRID = (3e-4, 1e-3, 3e-3)
# Round 2 (module docstring): the candidates' steps per iteration chosen again, and the grid's step.
ROUND2 = {
    "gymnax:CartPole-v1": (8, {}),
    "gymnax:Acrobot-v1": (8, {}),   # 8: the fewest envs K = 4 x M = 8 allows
    "gymnax:Pendulum-v1": (32, {"gamma": 0.9}),
    "gymnax:SpaceInvaders-MinAtar": (32, {"ent_coef": 0.01}),
}
# Round 3 (written after round 2's stage 1, before any round-3 run): round 2 kept one more task
# (SpaceInvaders), six in all, two discrete; CartPole and Acrobot reach their cap or plateau even
# at 8 envs (the fewest M = 8 allows) and Pendulum plateaus. New candidates, each cheap on a CPU,
# with the budgets their suites' v2 curves suggest (DM Control 32 envs; gymnax misc 16; Catch 8).
ROUND3 = {
    "dmc:PointMass": (32, {}),
    "dmc:PendulumSwingup": (32, {}),
    "gymnax:Reacher-misc": (16, {}),
    "gymnax:Swimmer-misc": (16, {}),
    "gymnax:Catch-bsuite": (8, {}),
}
ROUNDS = {2: ROUND2, 3: ROUND3}
RETURN_CAP.update({env: 1_000.0 for env in ROUND3 if env.startswith("dmc:")})
ROUND1_KEPT = ("dmc:CartpoleBalance", "gymnax:Breakout-MinAtar", "dmc:CartpoleSwingup",
               "dmc:ReacherEasy", "inverted_double_pendulum")
LR_GRID_2 = (3e-4, 1e-3, 3e-3, 1e-2)
DESIGN_SEED = 900
SEEDS = 5
LAGS = (0, 2, 4, 6, 8)      # stage 2; T/16 = 8
# The v3 protocol the cost is projected for: per task, a 16-configuration tuning at k = 0 on 5
# design seeds, then 20 scoring seeds at each of 4 constant lags and a uniform lag (K = 4), and at
# k = 0 and k_max with K = 16.
PROJECTED = {"tuning_runs": 16 * 5, "lag_runs": 5 * 20, "forward_runs": 2 * 20,
             "limit_seconds": 2 * 3600}


def suite(env: str) -> str:
    if env in SUITE:
        return SUITE[env]
    if env.endswith("-MinAtar"):
        return "MinAtar"
    if env.startswith("dmc:"):
        return "DM Control"
    return "Brax/MJX"


def task(env: str, seeds: int, table=None) -> bench.Task:
    num_envs, own = (table or {**CANDIDATES, **HELD_OUT})[env]
    fields = {"episode_length": Config.for_env(env).episode_length, "num_envs": num_envs,
              **SHAPES, "total_steps": T * num_envs * UNROLL, **own}
    return bench.Task(env, tuple(fields.items()), seeds)


def design_protocol(tasks, table=None, rates=LR_GRID) -> bench.Protocol:
    return bench.Protocol(
        "cpu-design", 3, tuple(task(env, SEEDS, table) for env in tasks), lags=LAGS, forward=(),
        seed=DESIGN_SEED, sampling="profile", design_seed=DESIGN_SEED, design_seeds=SEEDS,
        learning_rates=rates, description="design seeds: candidate tasks for cpu v3")


def stage1_cells(tasks):
    return bench.tuning_cells(bench.Method("ppo_clip"), design_protocol(tasks))


def round2_stage1_cells(tasks):
    """Round 2's new candidates over the whole extended grid; round 1's kept tasks at its new
    step only (their other rates are round 1's runs)."""
    method = bench.Method("ppo_clip")
    new = [env for env in tasks if env in ROUND2]
    old = [env for env in tasks if env in ROUND1_KEPT]
    return ((bench.tuning_cells(method, design_protocol(new, ROUND2, LR_GRID_2)) if new else [])
            + (bench.tuning_cells(method, design_protocol(old, CANDIDATES, (LR_GRID_2[-1],)))
               if old else []))


def round3_stage1_cells(tasks):
    """Round 3's new candidates over the extended grid."""
    return bench.tuning_cells(bench.Method("ppo_clip"),
                              design_protocol([t for t in tasks if t in ROUND3], ROUND3, LR_GRID_2))


ROUND2_TABLE = {**CANDIDATES, **ROUND2, **ROUND3}


def round2_runs(root: Path, random: dict[str, float], stage: int, upto: int = 2):
    """The runs of a stage up to round `upto`: round 1's of the tasks it kept (at their envs), and
    every run of rounds 2 … `upto`."""
    import pandas as pd

    from vaco_jax.study import sweep

    frames = []
    for path in (root / f"stage{stage}" / "runs",
                 *(root / f"round{n}" / f"stage{stage}" / "runs" for n in range(2, upto + 1))):
        if io.has_rows(path / sweep.CELLS):
            runs = per_run(sweep.load_results(path), random)
            if path.parent.parent == root:     # round 1: only the tasks it kept, at their envs
                runs = runs[runs.env.isin(list(ROUND1_KEPT))]
            frames.append(runs)
    return pd.concat(frames, ignore_index=True)


def stage2_cells(tasks, rates: dict[str, float], table=None):
    proto = design_protocol(tasks, table)
    method = bench.Method("ppo_clip")
    return [bench._cell(method, proto, t, "lag", bench.settings(proto, LAGS), (),
                        range(DESIGN_SEED, DESIGN_SEED + SEEDS), [rates[t.env]])
            for t in proto.tasks]


# --- reading the runs ----------------------------------------------------------------------------
def per_run(rows, random: dict[str, float]):
    """One row per run: env, learning rate, lag, seed, final (last 3 evaluations), AUC (mean of
    every evaluation), the curve; a diverged run scores random from its divergence on."""
    import pandas as pd

    frame = rows.assign(value=rows["eval_return"].astype(float))
    frame["value"] = frame["value"].fillna(frame["env"].map(random))
    frame["lag"] = frame["lag"].fillna(0).astype(int) if "lag" in frame else 0
    out = []
    for (env, lr, lag, seed), run in frame.sort_values("eval_index").groupby(
            ["env", "learning_rate", "lag", "seed"], sort=False):
        values = run["value"].to_numpy()
        out.append({"env": env, "learning_rate": float(lr), "lag": int(lag), "seed": int(seed),
                    "final": values[-3:].mean(), "auc": values.mean(), "curve": values,
                    "steps": run["step"].to_numpy()})
    return pd.DataFrame(out)


def apply_rule(runs, random: dict[str, float], grid=LR_GRID) -> dict[str, dict]:
    """The task rule (module docstring) on stage 1's runs, per task."""
    import numpy as np

    decisions = {}
    for env, g in runs.groupby("env", sort=False):
        aucs = g.groupby("learning_rate")["auc"].mean()
        lr = float(min(r for r, a in aucs.items() if a >= aucs.max() - 1e-9))
        h = g[g.learning_rate == lr]
        curve = np.mean(np.stack(h["curve"].to_list()), axis=0)
        steps = h["steps"].iloc[0]
        first = steps <= 0.75 * steps[-1]                   # evaluations in the first 3/4
        at_three_quarters = curve[first][-3:].mean()
        final, sd = h["final"].mean(), h["final"].std(ddof=1)
        rnd, cap = random[env], RETURN_CAP.get(env)
        if cap is not None:
            learns = learns_amended = final - rnd >= 0.25 * (cap - rnd)
            unsaturated = bool(np.all(curve[first] < rnd + 0.9 * (cap - rnd)))
            why_s = (f"seed-mean return reaches {curve[first].max():.1f} before 3/4 "
                     f"(0.9 of the way to the cap {rnd + 0.9 * (cap - rnd):.1f})")
        else:
            learns = final - rnd > 0 and final - rnd >= 3 * sd
            # L' (the amendment): the spread of the seeds is not a measure of noise around
            # random, so the seeds' standard error replaces their standard deviation, and
            # every seed must end above random.
            learns_amended = (h["final"].min() > rnd
                              and final - rnd >= 3 * sd / np.sqrt(len(h)))
            unsaturated = at_three_quarters < rnd + 0.95 * (final - rnd)
            why_s = (f"the last quarter adds {final - at_three_quarters:.1f} "
                     f"({(final - at_three_quarters) / max(final - rnd, 1e-9):.0%} of the gain): "
                     f"plateau")
        reasons = []
        if learns != learns_amended:
            reasons.append("L fails as written (final − random < 3 sd of the seeds), L' holds "
                           "(every seed above random, mean ≥ 3 standard errors above it)"
                           if learns_amended else "L holds, L' fails")
        if not learns_amended:
            reasons.append(f"does not learn well above random (final {final:.1f}, random "
                           f"{rnd:.1f}" + (f", cap {cap:.0f})" if cap else f", sd {sd:.1f})"))
        if not unsaturated:
            reasons.append(why_s)
        decisions[env] = {
            "learning_rate": lr, "edge": lr in (min(grid), max(grid)),
            "auc_by_lr": {repr(float(k)): float(v) for k, v in aucs.items()},
            "final": float(final), "final_sd": float(sd), "final_min": float(h["final"].min()),
            "auc": float(h["auc"].mean()), "at_three_quarters": float(at_three_quarters),
            "random": float(rnd), "cap": cap, "kept_as_written": bool(learns and unsaturated),
            "kept": bool(learns_amended and unsaturated),
            "why": "; ".join(reasons) or "learns, not at its cap before the last quarter"}
    return decisions


def cost_of(cells_records: list[dict], env: str) -> dict:
    """Stage 1's measured rate for `env` and the projected v3 cost per method for it (seconds at
    that rate: the loaded design machine's, an upper bound for a quiet one). K = 16 runs cost
    their training time plus 3 more learner times (4x the SGD steps)."""
    rec = next((r for r in cells_records if r["cell"].split("/")[1] == env), None)
    if rec is None:
        return {}
    runs = len(rec["runs"]) if isinstance(rec["runs"], list) else int(rec["runs"])
    steps = rec["env_steps_per_run"]
    per_run = rec["train_seconds"] / runs
    learn_share = rec.get("learn_seconds", 0) / runs
    p = PROJECTED
    seconds = (per_run * (p["tuning_runs"] + p["lag_runs"])
               + (per_run + 3 * learn_share) * p["forward_runs"] + 3 * rec["compile_seconds"])
    return {"sps": rec["sps"], "runs": runs, "steps_per_run": steps,
            "train_seconds": rec["train_seconds"], "compile_seconds": rec["compile_seconds"],
            "wall_seconds": rec["wall_seconds"], "projected_seconds": seconds}


V2_TIMING = "results/lag-bench/cpu-v2/ppo_clip/tuning/cells.jsonl"


def load_factor(records: list[dict]):
    """(median over tasks of this machine's learner seconds per env step ÷ v2's, number of tasks):
    how much slower the design machine ran than the one that made v2's PPO-Clip tuning cells
    (same machine kind, K = 4, k = 0), or None where no task is common."""
    import numpy as np

    path = Path(__file__).resolve().parent.parent / V2_TIMING
    if not path.exists():
        return None

    def per_step(rec):
        runs = len(rec["runs"]) if isinstance(rec["runs"], list) else int(rec["runs"])
        return rec["learn_seconds"] / (runs * rec["env_steps_per_run"])

    theirs = {r["cell"].split("/")[1]: per_step(r) for r in io.read_jsonl(path)}
    ratios = [per_step(r) / theirs[r["cell"].split("/")[1]] for r in records
              if r["cell"].split("/")[1] in theirs and r.get("learn_seconds")]
    return (float(np.median(ratios)), len(ratios)) if ratios else None


V2_RUNS = "results/lag-bench/cpu-v2/ppo_clip/runs/cells.jsonl"


def projected_from_v2(env: str, table=None) -> float | None:
    """The v3 cost per method of task `env` (seconds; `PROJECTED`'s runs at T iterations of its
    steps per iteration) at the rates of PPO-Clip's v2 scored cells on the same task (K = 4 and
    K = 16 learner seconds per env step, evaluation seconds per run scaled to 16 evaluations,
    their compile seconds): a quieter machine of this kind. None where v2 did not run `env`."""
    path = Path(__file__).resolve().parent.parent / V2_RUNS
    if not path.exists():
        return None
    rates = {}
    for rec in io.read_jsonl(path):
        _, task_env, _, variant = rec["cell"].split("/", 3)
        runs = len(rec["runs"]) if isinstance(rec["runs"], list) else int(rec["runs"])
        rates[task_env, variant] = (rec["learn_seconds"] / (runs * rec["env_steps_per_run"]),
                                    rec["eval_seconds"] / runs * NUM_EVALS / 20,
                                    rec["compile_seconds"])
    if (env, "lag") not in rates or (env, "forward") not in rates:
        return None
    steps = T * (table or CANDIDATES)[env][0] * UNROLL
    (c4, e4, compile_s), (c16, e16, _) = rates[env, "lag"], rates[env, "forward"]
    p = PROJECTED
    return ((p["tuning_runs"] + p["lag_runs"]) * (steps * c4 + e4)
            + p["forward_runs"] * (steps * c16 + e16) + 3 * compile_s)


def summarise(root: str, round_: int = 1) -> str:
    import numpy as np

    from vaco_jax.study import sweep

    root = Path(root)
    random = json.loads((root / "stage1" / bench.REFERENCES).read_text())
    if round_ >= 2:
        grid, table = LR_GRID_2, ROUND2_TABLE
        runs = round2_runs(root, random, 1, round_)
        records = [r for n in range(2, round_ + 1)
                   for r in io.read_jsonl(root / f"round{n}" / "stage1" / "runs" / sweep.CELLS)]
    else:
        grid, table = LR_GRID, CANDIDATES
        runs = per_run(sweep.load_results(root / "stage1" / "runs"), random)
        records = io.read_jsonl(root / "stage1" / "runs" / sweep.CELLS)
    decisions = apply_rule(runs, random, grid)
    lines = [f"T = {T} learner iterations per run, {NUM_EVALS} evaluations of 16 episodes; "
             f"K = 4 × M = 8; learning-rate grid {list(grid)}; design seeds "
             f"{DESIGN_SEED}–{DESIGN_SEED + SEEDS - 1}.", "",
             "## Stage 1: synchronous PPO-Clip on the candidates", "",
             "| task | suite | envs × steps = steps/iter | steps per run | lr (AUC-best) | random | "
             "cap | final [min] | at 3/4 | kept (L') | kept (L as written) | why |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for env, d in decisions.items():
        num_envs = table[env][0]
        lines.append(
            f"| `{env}` | {suite(env)}{', discrete' if env in DISCRETE else ''} | "
            f"{num_envs} × {UNROLL} = {num_envs * UNROLL:,} | {T * num_envs * UNROLL:,} | "
            f"{d['learning_rate']:g}{' (edge)' if d['edge'] else ''} | {d['random']:.1f} | "
            f"{'—' if d['cap'] is None else format(d['cap'], '.0f')} | {d['final']:.1f} "
            f"[{d['final_min']:.1f}] | {d['at_three_quarters']:.1f} | "
            f"{'**kept**' if d['kept'] else 'out'} | {'kept' if d['kept_as_written'] else 'out'} | "
            f"{d['why']} |")
    lines += ["", "Mean AUC over the design seeds per learning rate (the rate is chosen by it):", "",
              "| task | " + " | ".join(f"{lr:g}" for lr in grid) + " |",
              "|---|" + "---|" * len(grid)]
    for env, d in decisions.items():
        lines.append(f"| `{env}` | " + " | ".join(
            f"{d['auc_by_lr'].get(repr(float(lr)), float('nan')):.1f}" for lr in grid) + " |")
    lines += ["", "PPO-Clip's seed-mean evaluation return at the chosen rate, at each quarter of "
              "the run:", "", "| task | 1/4 | 1/2 | 3/4 | 1 |", "|---|---|---|---|---|"]
    for env, d in decisions.items():
        h = runs[(runs.env == env) & (runs.learning_rate == d["learning_rate"])]
        curve = np.mean(np.stack(h["curve"].to_list()), axis=0)
        n = len(curve)
        lines.append(f"| `{env}` | " + " | ".join(
            f"{curve[int(n * f) - 1]:.1f}" for f in (0.25, 0.5, 0.75, 1.0)) + " |")
    lines += ["", "## Cost (stage 1's cells, on the shared, loaded design machine)", "",
              "Projected v3 cost per method and task: 80 tuning runs + 100 lag runs at K = 4 and "
              "40 runs at K = 16 (training time plus 3 more learner times each), plus 3 compiles, "
              "at this machine's measured rate (a quiet machine is faster).", "",
              "| task | runs | steps/s (all runs of the cell) | compile s | wall s | "
              "projected v3 min/method | the same at v2's rates (quieter) |",
              "|---|---|---|---|---|---|---|"]
    total = 0.0
    for env, d in decisions.items():
        c = cost_of(records, env)
        if not c:
            continue
        total += c["projected_seconds"] if d["kept"] else 0
        lines.append(f"| `{env}` | {c['runs']} | {c['sps']:,.0f} | {c['compile_seconds']:.0f} | "
                     f"{c['wall_seconds']:.0f} | {c['projected_seconds'] / 60:.1f} | "
                     + (f"{v2 / 60:.1f} |" if (v2 := projected_from_v2(env, table)) else "— |"))
    factor = load_factor(records)
    if factor:
        lines += ["", f"Load factor: this machine's learner seconds per env step ÷ those of "
                  f"PPO-Clip's v2 learning-rate choice on the same tasks "
                  f"(`{V2_TIMING}`, made on a quieter machine of this kind), median over "
                  f"{factor[1]} common tasks: **{factor[0]:.1f}×**. At that rate the kept tasks "
                  f"would cost about {total / factor[0] / 60:.0f} min per method."]
    kept = [e for e, d in decisions.items() if d["kept"]]
    lines += ["", f"Kept: {len(kept)} tasks ({', '.join(f'`{e}`' for e in kept)}), "
              f"{len({suite(e) for e in kept})} suites, {len([e for e in kept if e in DISCRETE])} "
              f"with discrete actions; projected v3 cost per method over them "
              f"{total / 60:.0f} min at this machine's rate."]
    stage2 = root / "stage2" / "runs"
    if io.has_rows(stage2 / sweep.CELLS):
        r2 = (round2_runs(root, random, 2, round_) if round_ >= 2
              else per_run(sweep.load_results(stage2), random))
        # each kept task at its chosen rate (round 2: round 1's lag runs where the rate is the same)
        r2 = r2[[decisions.get(e, {}).get("kept", False)
                 and abs(lr - decisions[e]["learning_rate"]) < 1e-12
                 for e, lr in zip(r2.env, r2.learning_rate)]]
        lines += ["", "## Stage 2: PPO-Clip at constant lags, its stage-1 rate per task", "",
                  "(AUC_k − random) ÷ (AUC_0 − random), mean of the design seeds' AUCs:", "",
                  "| task | lr | " + " | ".join(f"k = {k}" for k in LAGS) + " |",
                  "|---|---|" + "---|" * len(LAGS)]
        ratios = {k: [] for k in LAGS}
        for env, g in r2.groupby("env", sort=False):
            auc = g.groupby("lag")["auc"].mean()
            rnd = random[env]
            row = []
            for k in LAGS:
                value = (auc[k] - rnd) / (auc[0] - rnd) if k in auc else float("nan")
                ratios[k].append(value)
                row.append(f"{value:.2f}")
            lines.append(f"| `{env}` | {g.learning_rate.iloc[0]:g} | " + " | ".join(row) + " |")
        lines.append("| **median** | | " + " | ".join(
            f"**{np.nanmedian(ratios[k]):.2f}**" for k in LAGS) + " |")
        chosen = next((k for k in LAGS[1:] if np.nanmedian(ratios[k]) <= 0.9), None)
        lines += ["", f"k_max by the rule (smallest k with median ≤ 0.9): "
                  f"{chosen if chosen is not None else f'none ≤ {max(LAGS)}'}"]
        # AMENDMENT K' (made after reading round 3's stage 2, PPO-Clip only): the protocol's lag
        # axis needs at least four values in 0..k_max, so k_max is the smallest k >= 3 the
        # median rule allows.
        four = next((k for k in LAGS if k >= 3 and np.nanmedian(ratios[k]) <= 0.9), None)
        lines += [f"k_max with at least four lags in 0..k_max (amendment K′): "
                  f"{four if four is not None else f'none ≤ {max(LAGS)}'}"]
    return "\n".join(lines) + "\n"


# --- running -------------------------------------------------------------------------------------
def plan(root: str, tasks, round_: int = 1) -> None:
    from vaco_jax.study import sweep

    records = bench.measured_cells(Path(root) / (f"round{round_}/stage1" if round_ >= 2
                                                 else "stage1"))
    cells = (stage1_cells(tasks) if round_ == 1 else round2_stage1_cells(tasks) if round_ == 2
             else round3_stage1_cells(tasks))
    size = bench.plan_size(cells, records)
    print(f"T = {T}; stage 1: {size['cells']} programs, {size['runs']} runs, "
          f"{size['env_steps']:,} env steps, {size['evaluation_episodes']:,} evaluation episodes")
    for cell in cells:
        print(f"  {cell.env:32s} {cell.config.num_envs:4d} envs  {cell.config.env_steps:>9,} "
              f"steps/run  {len(cell.runs)} runs  {cell.config.num_iterations} iterations")
    estimate = size["estimated_seconds"]
    print("estimated: " + (f"{estimate / 60:.0f} min (stage 1's measured rates)"
                           if estimate is not None else
                           f"unknown for {len(size['unmeasured'])} unmeasured programs"))
    for env in tasks:
        c = cost_of(records, env)
        if c:
            print(f"  {env:32s} {c['sps']:>9,.0f} steps/s; projected v3 "
                  f"{c['projected_seconds'] / 60:.1f} min per method")
    del sweep


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.design_cpu_v3",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--stage", type=int, choices=(1, 2), default=1)
    parser.add_argument("--round", type=int, choices=(1, 2, 3), default=1,
                        help="2, 3: that round's candidates and grid (module docstring)")
    parser.add_argument("--tasks", nargs="+", default=None)
    parser.add_argument("--summary", action="store_true",
                        help="write OUT/summary.md from the runs already in OUT and stop")
    parser.add_argument("--plan", action="store_true", help="print the size and cost and stop")
    args = parser.parse_args(argv)
    candidates = {1: list(CANDIDATES), 2: list(ROUND2) + list(ROUND1_KEPT),
                  3: list(ROUND3) + list(ROUND2) + list(ROUND1_KEPT)}[args.round]
    args.tasks = args.tasks or candidates
    unknown = [env for env in args.tasks if env not in candidates]
    if unknown:
        parser.error(f"not round-{args.round} candidates: {unknown} (held-out tasks never run "
                     f"here); the candidates are {candidates}")
    if args.plan:
        plan(args.out, args.tasks, args.round)
        return
    if args.summary:
        option = f"--round {args.round} " if args.round >= 2 else ""
        text = ("# Design-seed measurements for the benchmark's cpu protocol v3 (design stage)\n\n"
                f"Generated by `python -m experiments.design_cpu_v3 {args.out} {option}--summary`. "
                "Exploratory: 5 design seeds, no test; they choose tasks and lags, they say "
                "nothing about methods.\n\n" + summarise(args.out, args.round))
        name = f"{args.out}/{f'round{args.round}/' if args.round >= 2 else ''}summary.md"
        io.write_bytes_atomic(name, text.encode())
        print(name)
        return
    from vaco_jax.study import sweep

    root = Path(args.out)
    proto = design_protocol(args.tasks, ROUND2_TABLE if args.round >= 2 else None)
    random = bench.random_returns(root / "stage1", proto)
    if args.round == 2 and args.stage == 1:
        cells, runs = round2_stage1_cells(args.tasks), root / "round2" / "stage1" / "runs"
    elif args.round == 3 and args.stage == 1:
        cells, runs = round3_stage1_cells(args.tasks), root / "round3" / "stage1" / "runs"
    elif args.round >= 2:
        decisions = apply_rule(round2_runs(root, random, 1, args.round), random, LR_GRID_2)
        done = round2_runs(root, random, 2, args.round)[["env", "learning_rate"]].drop_duplicates()
        ran = set(zip(done.env, done.learning_rate))
        tasks = [env for env in args.tasks if decisions.get(env, {}).get("kept")
                 and (env, decisions[env]["learning_rate"]) not in ran]
        print("stage 2 (round 2) on", tasks)
        cells = stage2_cells(tasks, {env: decisions[env]["learning_rate"] for env in tasks},
                             ROUND2_TABLE)
        runs = root / f"round{args.round}" / "stage2" / "runs"
    elif args.stage == 1:
        cells, runs = stage1_cells(args.tasks), root / "stage1" / "runs"
    else:
        stage1 = per_run(sweep.load_results(root / "stage1" / "runs"), random)
        decisions = apply_rule(stage1, random)
        tasks = [env for env in args.tasks if decisions.get(env, {}).get("kept")]
        print("stage 2 on", tasks)
        cells = stage2_cells(tasks, {env: decisions[env]["learning_rate"] for env in tasks})
        runs = root / "stage2" / "runs"
    sweep.run_sweep(cells, runs, allow_code_change=True)
    bench.compact_when_finished(cells, runs)


if __name__ == "__main__":
    main()
