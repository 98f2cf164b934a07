"""The controlled-lag study (`presets.STUDIES["lag"]`): how much of its synchronous score each
method keeps at a constant policy lag k, and whether VACO keeps more than each baseline.

Every method runs at k = C − 1 (the oldest snapshot of a buffer of C; k = 0 is synchronous) and,
as a reference column, with uniform sampling over C = 16. Per run:

    score     mean of the last `FINAL_EVALS` evaluations, normalised per task,
              (R − R_random) / (R_sync − R_random), by a random policy and synchronous PPO-Clip
              measured by the same rule on disjoint seeds (`references`); a diverged run scores 0
    auc       the normalised area under its learning curve (0 from its divergence on)

and per (task, method):

    degradation(k) = mean_s score(k, s) / mean_s score(0, s)
    interaction(k) = degradation_vaco(k) − degradation_baseline(k)

Seed s uses the same key at every lag and in every method (common random numbers), so each
comparison resamples seeds *paired* (one row per seed holds every condition it compares), and
pooling over tasks resamples within each task (`stats.stratified_bootstrap`, BCa intervals). A
pooled figure is the mean over tasks of the per-task figures, reported after them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import EngFormatter
import numpy as np
import pandas as pd

from vaco_jax.errors import SweepError
from vaco_jax.pipeline import estimates, figures, preregistration, runs, scores, tables
from vaco_jax.pipeline.estimates import BREAK_LEVEL, POOLED
from vaco_jax.study import plotting, presets, references, stats, sweep
from vaco_jax.study.capacity import markdown_rows

FINAL_EVALS = presets.FINAL_EVALS
"""A run's final score averages its last this many evaluations (each of `eval_envs` episodes)."""
SYNC_FRACTION = 0.5
"""The sanity check: a method should reach this fraction of synchronous PPO-Clip at k = 0."""
FAMILY_ALPHA = 0.05
"""Error rate of the interaction family as a whole (Bonferroni: each CI at 1 − FAMILY_ALPHA/m)."""
MIN_TAIL = 25
"""Resamples expected beyond each simultaneous endpoint: sets the family's number of resamples."""
TARGET = "vaco"
"""The method this study is about: the statistics take it as a parameter (`target`), and the study
passes this, its declared value, to them (`analyse`)."""
METHODS = tuple(presets.method_label(algo, variant.name) for algo, variant in presets.LAG_METHODS)
BASELINES = tuple(m for m in METHODS if m != TARGET)
SYNC = ("oldest", 1)              # (sampling, capacity) of k = 0
RUN = ["env", "method", "sampling", "capacity", "seed"]
CELL = ["env", "method", "sampling", "capacity"]


def lag_label(sampling: str, capacity: int) -> str:
    """"k=7" for the oldest snapshot of C = 8; "uniform C=16" for the reference column."""
    return f"k={int(capacity) - 1}" if sampling == "oldest" else f"{sampling} C={int(capacity)}"


def _column_order(columns) -> list[tuple[str, int]]:
    """(sampling, capacity) pairs: constant lags in increasing k, then the other columns."""
    return sorted(set(columns), key=lambda c: (c[0] != "oldest", c[0], c[1]))


def _method_order(methods) -> list[str]:
    found = set(methods)
    return [m for m in (TARGET, *BASELINES) if m in found] + sorted(found - set(METHODS))


# --- loading --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Study:
    """The lag study's rows from one or more sweep directories."""

    results: pd.DataFrame
    """Tidy rows (`sweep.load_results`) with `sweep`, `method`, `sampling` and `lag` added."""
    cells: pd.DataFrame
    """One record per finished lag cell (`sweep.load_cells`), with `sweep`."""
    plans: dict
    """Sweep directory → its plan (sweep.json; {} when absent)."""


def load_study(directories: Sequence[str | Path], *, allow_code_change: bool = False) -> Study:
    """The lag-study rows of every sweep directory (one per task, say), refusing a cell found in
    two directories and, unless `allow_code_change`, cells made by different vaco_jax source."""
    parts, cells = read_sweeps(directories, ("lag",), allow_code_change)
    results = pd.concat([table for _, table, _ in parts], ignore_index=True)
    if results.empty:
        raise ValueError(f"no rows of the lag study in {[str(d) for d in directories]}; run "
                         f"`vaco-sweep --preset lag-cpu` first")
    return Study(with_columns(results), cells, {directory: plan for directory, _, plan in parts})


def read_sweeps(directories: Sequence[str | Path], studies: Sequence[str],
                allow_code_change: bool = False) -> tuple[list[tuple[str, pd.DataFrame, dict]],
                                                          pd.DataFrame]:
    """Per sweep directory, (the directory, its result rows of `studies` with `sweep`, its plan
    (sweep.json; {} when absent)); and the finished cells of `studies` in all of them, with
    `sweep`, checked by `check_one_code`."""
    parts, records = [], []
    for directory in map(Path, directories):
        table = sweep.load_results(directory)
        plan = directory / sweep.PLAN
        parts.append((str(directory), table[table["study"].isin(studies)].assign(
            sweep=str(directory)), json.loads(plan.read_text()) if plan.exists() else {}))
        cells = sweep.load_cells(directory)
        if len(cells):
            ours = cells["cell"].str.split("/").str[0].isin(studies)
            records.append(cells[ours].dropna(axis=1, how="all").assign(sweep=str(directory)))
    cells = (pd.concat(records, ignore_index=True) if records
             else pd.DataFrame(columns=["cell", "sweep"]))
    check_one_code(cells, allow_code_change, what=f"the {', '.join(studies)} cells")
    return parts, cells


def check_one_code(cells: pd.DataFrame, allow_code_change: bool = False,
                   what: str = "the lag cells") -> None:
    """Refuse a cell finished in two sweep directories (its runs would count twice), and cells
    made by different vaco_jax source (`io.source_hash`), naming each source's commits and
    directories (and `what` they are), unless `allow_code_change`."""
    twice = cells[cells.duplicated("cell", keep=False)]
    if len(twice):
        where = twice.groupby("cell")["sweep"].apply(list).to_dict()
        raise SweepError(f"cells finished in more than one sweep directory: {where}; their runs "
                         f"would count twice. Analyse each copy once")
    sources = cells.get("source", pd.Series(index=cells.index, dtype=object)).fillna("unrecorded")
    if sources.nunique() <= 1 or allow_code_change:
        return
    described = []
    for source, group in cells.groupby(sources):
        commits = sorted({str(c)[:12] for c in group.get("git_commit", ["unrecorded"])})
        described.append(f"{source} (commit {', '.join(commits)}; {len(group)} cells in "
                         f"{', '.join(sorted(group['sweep'].unique()))})")
    raise SweepError(f"{what} were made by different vaco_jax source: "
                     f"{'; '.join(described)}. Their results would mix; re-run the cells of one "
                     f"version, or pass --allow-code-change to combine them anyway")


def with_columns(results: pd.DataFrame) -> pd.DataFrame:
    """`method` (algorithm [method variant]), `sampling` and `lag` ("k=3", "uniform C=16")."""
    results = results.copy()
    results["method"] = [presets.method_label(a, v)
                         for a, v in zip(results["algo"], results["variant"])]
    if "snapshot_sampling" in results:
        results["sampling"] = results["snapshot_sampling"]
    else:
        results["sampling"] = [v.rpartition(",")[2] for v in results["variant"]]
    results["capacity"] = results["capacity"].astype(int)
    results["lag"] = [lag_label(s, c) for s, c in zip(results["sampling"], results["capacity"])]
    results["diverged"] = runs.diverged_from_then_on(results, RUN)
    return results



# --- the study's design and what is missing -------------------------------------------------------
def design(study: Study) -> pd.DataFrame:
    """The cells the study's presets call for (env, method, sampling, capacity): every lag-study
    method the preset runs, on each of its tasks, at each constant lag, and uniform C = 16 where the
    preset has that capacity; plus every cell present. A preset recorded by name is taken as
    defined in `presets.PRESETS` (so a sweep of one task still expects the preset's others)."""
    cells = set(map(tuple, study.results[CELL].drop_duplicates().itertuples(index=False)))
    for plan in study.plans.values():
        recorded = plan.get("preset") or {}
        if not recorded:
            continue
        named = presets.PRESETS.get(recorded.get("name"))
        if named is not None:
            envs, capacities, algos = named.envs, named.capacities, named.algos
        else:
            envs, capacities = recorded["envs"], recorded["capacities"]
            algos = recorded.get("algos")
        for env in envs:
            for algo, variant in presets.LAG_METHODS:
                if algos is not None and algo not in algos:
                    continue
                method = presets.method_label(algo, variant.name)
                cells |= {(env, method, "oldest", int(c)) for c in capacities}
                if presets.UNIFORM_REFERENCE_CAPACITY in capacities:
                    cells.add((env, method, "uniform", presets.UNIFORM_REFERENCE_CAPACITY))
    return pd.DataFrame(sorted(cells), columns=CELL)


def missing_cells(study: Study) -> pd.DataFrame:
    """The design's (task, method) columns with no finished runs: task, method, lags, status
    ("planned in <dir>, not finished" or "not run")."""
    present = set(map(tuple, study.results[CELL].drop_duplicates().itertuples(index=False)))
    planned = {}
    for directory, plan in study.plans.items():
        finished = set(study.cells.loc[study.cells["sweep"] == directory, "cell"])
        for cell_id, cell in plan.get("cells", {}).items():
            if cell["study"] != "lag" or cell_id in finished:
                continue
            method = presets.method_label(cell["algo"], cell["variant"])
            sampling = cell["config"].get("snapshot_sampling", "oldest")
            for run in cell["runs"]:
                planned[(cell["env"], method, sampling, int(run["capacity"]))] = directory
    rows = [dict(zip(CELL, c), status=(f"planned in {planned[c]}, not finished" if c in planned
                                       else "not run"))
            for c in map(tuple, design(study).itertuples(index=False)) if c not in present]
    if not rows:
        return pd.DataFrame(columns=["task", "method", "lags", "status"])
    frame = pd.DataFrame(rows)
    out = []
    for (env, method, status), group in frame.groupby(["env", "method", "status"], sort=False):
        columns = _column_order(zip(group["sampling"], group["capacity"]))
        out.append({"task": env, "method": method,
                    "lags": ", ".join(lag_label(*c) for c in columns), "status": status})
    return pd.DataFrame(out)


# --- scores ---------------------------------------------------------------------------------------
def task_references(table: dict, runs: pd.DataFrame, last_evals: int) -> dict[str, dict]:
    """Each task's reference entry at the budget of its runs (`references.lookup`), refusing a task
    run at several budgets (its settings are compared at one)."""
    budgets = runs.groupby("env")["budget"].unique()
    mixed = {env: sorted(map(int, b)) for env, b in budgets.items() if len(b) > 1}
    if mixed:
        raise ValueError(f"tasks with runs at several budgets {mixed}: a task's settings are "
                         f"compared at one budget; analyse one budget at a time")
    return {env: references.lookup(table, env, int(b[0]), last_evals)
            for env, b in budgets.items()}


def run_scores(evaluations: pd.DataFrame, table: dict,
               last_evals: int = FINAL_EVALS) -> pd.DataFrame:
    """One row per run (`runs.tidy`): its final raw return (the mean of the last `last_evals`
    evaluations; NaN if it diverged), its normalised `score` and `auc`
    (`scores.whole_run_scores`: a diverged run scores 0), when it diverged, its realised lag and
    behaviour TV, its task's references measured with the same `last_evals`, and its curve
    (`steps`, `returns`: NaN from its divergence on)."""
    entries = task_references(table, evaluations, last_evals)
    twice = evaluations.duplicated(RUN + ["eval_index"])
    if twice.any():
        first = evaluations.loc[twice, RUN + ["eval_index"]].iloc[0].to_dict()
        raise ValueError(f"{int(twice.sum())} evaluations appear twice (e.g. {first}); a run may "
                         f"be in two sweeps or at two δ: select one")
    random = {env: e["random_return"] for env, e in entries.items()}
    sync = {env: e["ppo_sync_return"] for env, e in entries.items()}
    frame = runs.tidy(evaluations.assign(sweep=evaluations.get("sweep", "")), last_evals,
                      run=[*RUN, "lag", "sweep"],
                      means=["snapshot_age", "behavior_tv", "sgd_steps_per_iteration"])
    frame = scores.whole_run_scores(frame, random, sync, "env", last_evals)
    return frame.assign(final_return=frame["final"],
                        snapshot_age_sgd_steps=frame["snapshot_age"]
                        * frame["sgd_steps_per_iteration"],
                        random_return=frame["env"].map(random),
                        sync_return=frame["env"].map(sync))[[
        *RUN, "lag", "budget", "evaluations", "final_return", "score", "auc", "diverged",
        "diverged_at_step", "snapshot_age", "snapshot_age_sgd_steps", "behavior_tv",
        "random_return", "sync_return", "sweep", "steps", "returns"]]


def score_table(runs: pd.DataFrame, value: str = "score", *, reps: int = 10_000, seed: int = 0,
                confidence: float = 0.95) -> pd.DataFrame:
    """Mean `value` (score or auc) per (task, method, lag) with its BCa CI over seeds, then pooled
    rows (task "pooled": the mean over the tasks that have the cell): `estimates.means`. Columns:
    task, method, sampling, capacity, lag, mean, low, high, seeds, tasks, snapshot_age (mean over
    seeds)."""
    table = estimates.means(runs, value, CELL, reps=reps, seed=seed, confidence=confidence)
    return _ordered(with_run_means(table.rename(columns={"point": "mean"}), runs,
                                   ["snapshot_age"], CELL))


def with_run_means(table: pd.DataFrame, runs: pd.DataFrame, names: Sequence[str],
                   columns: Sequence[str]) -> pd.DataFrame:
    """`table` (a row per task or POOLED and the other `columns`) with the mean over seeds of each
    of the runs' columns `names` in its cell; a pooled row, the mean over tasks of those means."""
    means = runs.groupby(list(columns))[list(names)].mean()
    pooled = means.groupby(level=list(range(1, len(columns)))).mean()
    keys = list(table[["task", *columns[1:]]].itertuples(index=False, name=None))
    return table.assign(**{name: [pooled.loc[k[1:], name] if k[0] == POOLED else means.loc[k, name]
                                  for k in keys] for name in names})


def _ordered(frame: pd.DataFrame, method: str = "method") -> pd.DataFrame:
    """`ordered`, lags in order (a `lag` label is added after `capacity`)."""
    if frame.empty or "capacity" not in frame:
        return ordered(frame, method)
    columns = _column_order(zip(frame["sampling"], frame["capacity"]))
    frame = frame.copy()
    frame.insert(frame.columns.get_loc("capacity") + 1, "lag",
                 [lag_label(s, c) for s, c in zip(frame["sampling"], frame["capacity"])])
    return ordered(frame, method, [columns.index(c) for c in zip(frame["sampling"],
                                                                 frame["capacity"])])


def ordered(frame: pd.DataFrame, method: str = "method", *then) -> pd.DataFrame:
    """Per-task rows first (tasks sorted), pooled rows last; methods VACO first; then by each of
    `then` (a sort key per row)."""
    if frame.empty:
        return frame
    tasks = sorted(t for t in frame["task"].unique() if t != POOLED) + [POOLED]
    methods = _method_order(frame[method].unique())
    keys = {"_task": frame["task"].map(tasks.index), "_method": frame[method].map(methods.index),
            **{f"_then{i}": list(key) for i, key in enumerate(then)}}
    return frame.assign(**keys).sort_values(list(keys)).drop(columns=list(keys)).reset_index(
        drop=True)


def degradation_table(runs: pd.DataFrame, value: str = "score", *, reps: int = 10_000,
                      seed: int = 0, confidence: float = 0.95) -> pd.DataFrame:
    """score(k)/score(0) (the final-score retention; with `value="auc"`, AUC(k)/AUC(0), the AUC
    retention) per (task, method) at every lag other than k = 0 (the uniform column included)
    with paired BCa CIs, then pooled rows: `estimates.ratios`. Columns: task, method, sampling,
    capacity, lag, degradation, low, high, seeds, tasks."""
    table = estimates.ratios(runs, value, CELL, lambda cell: (cell[0], *SYNC), reps=reps,
                             seed=seed, confidence=confidence)
    return _ordered(table.rename(columns={"point": "degradation"}))


def family_reps(reps: int, family_size: int) -> int:
    """Resamples for a family of `family_size` Bonferroni-adjusted intervals: enough that about
    `MIN_TAIL` resamples lie beyond each endpoint at level 1 − FAMILY_ALPHA / m (and at least
    `reps`)."""
    return max(reps, math.ceil(2 * MIN_TAIL * family_size / FAMILY_ALPHA))


def interaction_table(runs: pd.DataFrame, target: str, *, reps: int = 10_000, seed: int = 0,
                      confidence: float = 0.95) -> pd.DataFrame:
    """degradation_target(k) − degradation_baseline(k) per (task, baseline, constant lag k > 0),
    then pooled over tasks (the mean of the per-task differences), each with a paired BCa CI at
    `confidence` and a Bonferroni-adjusted one at 1 − FAMILY_ALPHA/m (m = the table's rows), from
    `family_reps` resamples. Columns: task, baseline, sampling, capacity, lag, interaction, low,
    high, simultaneous_low, simultaneous_high, seeds, tasks, family_size, simultaneous_confidence,
    reps."""
    values = estimates.cells(runs, "score", CELL)
    per_cell = {}
    for env, baseline, sampling, capacity in values:
        if baseline == target or sampling != "oldest" or capacity == SYNC[1]:
            continue
        per_cell[(env, baseline, capacity)] = [(env, [
            (target, "oldest", capacity), (target, *SYNC), (baseline, "oldest", capacity),
            (baseline, *SYNC)])]
    comparisons = estimates.with_pooled(values, per_cell)
    m = len(comparisons)
    columns = ["task", "baseline", "sampling", "capacity", "interaction", "low", "high",
               "simultaneous_low", "simultaneous_high", "seeds", "tasks", "family_size",
               "simultaneous_confidence", "reps"]
    if m == 0:
        return pd.DataFrame(columns=columns)
    simultaneous, n = 1 - FAMILY_ALPHA / m, family_reps(reps, m)
    results = estimates.estimate(values, comparisons, estimates.difference_of_ratios, reps=n,
                                 seed=seed, levels={"": confidence, "simultaneous_": simultaneous})
    rows = [{**e, "task": task, "baseline": baseline, "sampling": "oldest", "capacity": capacity,
             "interaction": e["point"], "family_size": m, "simultaneous_confidence": simultaneous,
             "reps": n} for (task, baseline, capacity), e in results.items()]
    return _ordered(pd.DataFrame(rows, columns=columns), method="baseline")


def break_lag_table(degradation: pd.DataFrame) -> pd.DataFrame:
    """Per (task, method): the smallest constant lag k whose degradation is below `BREAK_LEVEL`
    (`break_lag`), and the smallest whose CI's upper end is (`confidently_broken`); "none" if
    no lag tested is, "undefined" if no lag's degradation is (the synchronous score is not above
    random). `lags` lists the lags tested."""
    rows = []
    constant = degradation[degradation["sampling"] == "oldest"]
    for (task, method), group in constant.groupby(["task", "method"], sort=False):
        ks = (group.sort_values("capacity")["capacity"] - 1).to_numpy()
        broken, confidently = estimates.break_lag(group["capacity"] - 1, group["degradation"],
                                                  group["high"])
        rows.append({"task": task, "method": method, "break_lag": broken,
                     "confidently_broken": confidently,
                     "lags": ", ".join(str(int(k)) for k in ks)})
    return pd.DataFrame(rows, columns=["task", "method", "break_lag", "confidently_broken", "lags"])


def sanity_table(runs: pd.DataFrame, scores: pd.DataFrame) -> pd.DataFrame:
    """Synchronous (k = 0) runs per (task, method): mean final return (a diverged run counted at
    the random policy's return, as its score of 0 says), the references, the normalised score with
    its 95% BCa CI (the `score_table` row `scores` has at k = 0), whether it clears random (CI low
    > 0) and reaches `SYNC_FRACTION` of synchronous PPO-Clip (point estimate), and `fails`: the
    reasons it does not, or diverged runs."""
    sync = runs[(runs["sampling"] == SYNC[0]) & (runs["capacity"] == SYNC[1])]
    results = scores.rename(columns={"mean": "point"}).set_index(
        ["task", "method", "sampling", "capacity"])
    rows = []
    for (env, method), group in sync.groupby(["env", "method"], sort=False):
        e = results.loc[(env, method, *SYNC)]
        returns = group["final_return"].where(~group["diverged"], group["random_return"])
        clears, reaches = e["low"] > 0, e["point"] >= SYNC_FRACTION
        unclear = ("no CI (fewer than 2 seeds)" if np.isnan(e["low"])
                   else "does not clear random (CI low ≤ 0)")
        reasons = ([] if clears else [unclear]) + \
                  ([] if reaches else [f"below {SYNC_FRACTION:g} of sync PPO-Clip"]) + \
                  ([f"{int(group['diverged'].sum())} diverged"] if group["diverged"].any() else [])
        rows.append({"task": env, "method": method, "final_return": float(returns.mean()),
                     "random_return": float(group["random_return"].iloc[0]),
                     "sync_return": float(group["sync_return"].iloc[0]),
                     "score": e["point"], "low": e["low"], "high": e["high"], "seeds": len(group),
                     "clears_random": bool(clears), "reaches_fraction": bool(reaches),
                     "fails": "; ".join(reasons)})
    return _ordered(pd.DataFrame(rows)) if rows else pd.DataFrame(rows)


def realised_lag_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (task, method, lag): the mean over seeds of each run's mean snapshot age in iterations
    and in learner SGD steps, and of its mean behaviour TV."""
    table = (runs.groupby(CELL, sort=False)
             .agg(snapshot_age=("snapshot_age", "mean"),
                  snapshot_age_sgd_steps=("snapshot_age_sgd_steps", "mean"),
                  behavior_tv=("behavior_tv", "mean"), seeds=("seed", "nunique"))
             .reset_index().rename(columns={"env": "task"}))
    return _ordered(table)


def diverged_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Every diverged run (scored 0, never dropped): task, method, lag, seed, step, sweep."""
    bad = runs[runs["diverged"]]
    return (bad[["env", "method", "lag", "seed", "diverged_at_step", "sweep"]]
            .astype({"diverged_at_step": "Int64"}).rename(columns={"env": "task"})
            .reset_index(drop=True))


def sync_curves(runs: pd.DataFrame, *, reps: int = 2000, seed: int = 0,
                confidence: float = 0.95) -> pd.DataFrame:
    """Normalised score vs env steps at k = 0 per (task, method), 0 from a run's divergence on
    ("fails like a random policy"): the mean over seeds at each evaluation with a BCa CI.
    Columns: task, method, step, mean, low, high, seeds."""
    sync = runs[(runs["sampling"] == SYNC[0]) & (runs["capacity"] == SYNC[1])]
    frames = []
    for (env, method), group in sync.groupby(["env", "method"], sort=False):
        random, reference = group[["random_return", "sync_return"]].iloc[0]
        returns = np.stack(group["returns"].to_list())   # [seeds, evaluations]
        curves = stats.normalize(np.where(np.isnan(returns), random, returns), random, reference)
        if len(curves) >= 2:
            boot = stats.stratified_bootstrap([curves], lambda s: s[0].mean(-2), reps=reps,
                                              seed=seed, vectorized=True)
            point, (low, high) = boot.point, boot.interval(confidence)
        else:
            point, low, high = curves.mean(0), np.nan, np.nan
        frames.append(pd.DataFrame({"task": env, "method": method,
                                    "step": group["steps"].iloc[0].astype(np.int64),
                                    "mean": point, "low": low, "high": high,
                                    "seeds": len(curves)}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["task", "method", "step", "mean", "low", "high", "seeds"])


# --- the whole analysis ---------------------------------------------------------------------------
# --- the pre-registered tests (docs/preregistrations.md) ----------------------------------------
PRIMARY_BASELINES = ("ppo_clip", "appo")
HOLDS_METHODS = ("vaco", "ppo_clip", "appo")
MIN_SEEDS = 10
"""Tasks with fewer seeds than this are reported but left out of the claims (the sign-flip test
cannot go below p = 2/2^n, 0.0625 at 5 seeds)."""
PRE_REGISTRATION = "eaf6cd5250f21642a01e57fdc615bf0e983f66ae"
"""The commit that wrote the pre-registered tests (docs/preregistrations.md): results made by
code that descends from it are judged by them; results made before it are exploratory."""


git_descends_from = preregistration.descends_from


def pre_registration(cells: pd.DataFrame) -> tuple[str, str]:
    """(status, in words) of results against the pre-registered tests: "after" when every cell's
    git commit descends from `PRE_REGISTRATION` (the tests judge them); else "before" (a commit
    made before it) or "unknown" (no commit recorded, or one not in this checkout's git history):
    exploratory. Statuses: `preregistration.STATUS`."""
    recorded = cells["git_commit"] if "git_commit" in cells else pd.Series(dtype=object)
    # `git_descends_from` looked up at call time: the module's name for the ancestry check.
    return preregistration.status(recorded.dropna(), PRE_REGISTRATION,
                                  lambda commit, ancestor: git_descends_from(commit, ancestor))


def enough_seeds(rows: pd.DataFrame) -> list[bool]:
    """Per row (columns method, task, seeds) of a retention table at one setting, whether its
    verdict counts: a task with at least `MIN_SEEDS` seeds; a pooled row only when every task of
    its method has."""
    few = {r.method for r in rows.itertuples() if r.task != POOLED and r.seeds < MIN_SEEDS}
    return [r.method not in few if r.task == POOLED else r.seeds >= MIN_SEEDS
            for r in rows.itertuples()]


break_verdict = estimates.break_verdict
"""The break rule's verdict on a retention interval (`analysis.families.break_verdict`)."""


def paired_differences(at: pd.DataFrame, baseline: str, value: str,
                       target: str = TARGET) -> dict[str, tuple[pd.Series, bool]]:
    """task → (the seed-paired differences `target` − `baseline` of `value` among the runs `at`
    (one setting; columns env, method, seed, value), whether the task counts in the family: at
    least `MIN_SEEDS` seeds); tasks with fewer than 2 common seeds left out; and, when several
    tasks count, POOLED → the per-seed mean over them on the seeds they all have
    (`estimates.paired_differences`)."""
    def differences(runs: pd.DataFrame) -> dict[str, pd.Series]:
        return estimates.paired_differences(runs.rename(columns={"env": "task"}), value,
                                            {"method": target}, {"method": baseline})

    groups = {task: (d, len(d) >= MIN_SEEDS) for task, d in differences(at).items()
              if task != POOLED}
    counted = [task for task, (_, counts) in groups.items() if counts]
    if len(counted) > 1:
        groups[POOLED] = (differences(at[at["env"].isin(counted)])[POOLED], True)
    return groups


def family_tests(at: pd.DataFrame, setting: str, target: str = TARGET) -> list[dict]:
    """The family's paired tests at one setting (the runs `at`, labelled `setting`): `target` −
    each of `PRIMARY_BASELINES` (but the target itself) in final score and AUC, per task and
    pooled (`paired_differences`), as `paired_family` takes them."""
    return [{"comparison": f"{target} − {baseline}", "task": task, "setting": setting,
             "metric": "final score" if value == "score" else "AUC",
             "differences": diff.to_numpy(np.float64), "family": in_family}
            for baseline in PRIMARY_BASELINES if baseline != target for value in ("score", "auc")
            for task, (diff, in_family) in paired_differences(at, baseline, value, target).items()]


def holds_rows(retention: pd.DataFrame, setting: str, pre_registered: bool,
               point: str = "degradation", low: str = "low", high: str = "high") -> list[dict]:
    """The "holds" rows of `HOLDS_METHODS` in `retention` (final retention at one setting,
    labelled `setting`; its columns `point`, `low`, `high`): the non-inferiority test with margin
    0.2, the break rule's verdict (`break_verdict`) where the task has `MIN_SEEDS` seeds."""
    rows = retention[retention["method"].isin(HOLDS_METHODS)]
    return [{"comparison": f"{r['method']} retention", "task": r["task"], "setting": setting,
             "metric": "final score retention", "estimate": r[point], "low": r[low],
             "high": r[high], "seeds": r["seeds"],
             "test": f"non-inferiority: 95% BCa lower end > {BREAK_LEVEL:g}", "p": np.nan,
             "p_sign_flip": np.nan, "margin": 1 - BREAK_LEVEL, "family": False, "p_holm": np.nan,
             "verdict": (break_verdict(r[low], r[high], pre_registered) if enough
                         else f"left out (fewer than {MIN_SEEDS} seeds)")}
            for r, enough in zip(rows.to_dict("records"), enough_seeds(rows))]


def paired_family(tests: list[dict], pre_registered: bool) -> pd.DataFrame:
    """Paired tests of a family (`preregistration.family` with the paired t-test as `p`): each
    entry of `tests` has `comparison`, `task`, `setting`, `metric`, `differences` (one per seed)
    and `family` (whether it counts: at least `MIN_SEEDS` seeds). Columns: the entry's, the mean
    and its 95% Student-t interval, the t-test's p, the sign-flip test's, Holm's, the verdict."""
    table = preregistration.family(tests, test="t", pre_registered=pre_registered)
    if table.empty:
        return table
    labels = [k for k in tests[0] if k != "differences"]
    table = table.assign(test="paired t (two-sided)", margin=0.0, verdict=[
        v if f else f"left out (fewer than {MIN_SEEDS} seeds)"
        for v, f in zip(table["verdict"], table["family"])])
    return table[[*labels, "estimate", "low", "high", "seeds", "test", "p", "p_sign_flip",
                  "margin", "p_holm", "verdict"]]


def primary_table(runs: pd.DataFrame, degradation: pd.DataFrame, *, target: str,
                  pre_registered: bool = True) -> pd.DataFrame:
    """The pre-registered family and the "holds" verdicts, one row each: estimate, 95% CI, test,
    p-value, Holm-adjusted p-value, margin, verdict, and `analysis`: "pre-registered", or
    "exploratory" when not `pre_registered` (results made before the tests were written: the
    same tests, but `verdict` only says what the adjusted p-value or the interval shows).

    Family: `target` (VACO, in this study) − PPO-Clip and `target` − APPO (a baseline that is the
    target is left out) in normalised final score and in normalised AUC at the largest constant
    lag, per task (with at least `MIN_SEEDS` seeds) and pooled over those tasks
    (per seed, the mean over tasks), paired by seed: the paired t-test (two-sided), Holm over the
    family, the exact sign-flip test beside it. Holds: each of `HOLDS_METHODS`' final retention
    at the largest lag per task, the non-inferiority test with margin 0.2 (the 95% BCa interval's
    lower end above 0.8: holds; its upper end below 0.8: breaks; else undetermined)."""
    oldest = runs[runs["sampling"] == "oldest"]
    if not len(oldest):
        return pd.DataFrame()
    largest = int(oldest["capacity"].max())
    setting = f"k={largest - 1}"
    table = paired_family(family_tests(oldest[oldest["capacity"] == largest], setting, target),
                          pre_registered)
    final = degradation[(degradation["sampling"] == "oldest")
                        & (degradation["capacity"] == largest)]
    table = pd.concat([table, pd.DataFrame(holds_rows(final, setting, pre_registered))],
                      ignore_index=True)
    table["analysis"] = "pre-registered" if pre_registered else "exploratory"
    return table


def _primary_markdown(primary: pd.DataFrame) -> str:
    if not len(primary):
        return "No runs at a constant lag."
    last = "verdict" if set(primary.get("analysis", ["pre-registered"])) == {"pre-registered"} \
        else "what it shows (exploratory)"
    lines = ["| comparison | task | setting | metric | estimate [95% CI] | seeds | test | p | "
             f"p (Holm) | p (sign-flip) | {last} |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda x: "–" if not np.isfinite(x) else f"{x:.3g}"  # noqa: E731
    for r in primary.itertuples():
        lines.append(f"| {r.comparison} | {r.task} | {r.setting} | {r.metric} | "
                     f"{tables.interval(r.estimate, r.low, r.high, sign=r.margin == 0.0)} | "
                     f"{r.seeds} | "
                     f"{r.test} | {fmt(r.p)} | {fmt(r.p_holm)} | {fmt(r.p_sign_flip)} | {r.verdict} |")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Report:
    """Every table of the lag study (see the module docstring)."""

    runs: pd.DataFrame
    scores: pd.DataFrame
    auc: pd.DataFrame
    degradation: pd.DataFrame
    interaction: pd.DataFrame
    break_lag: pd.DataFrame
    sanity: pd.DataFrame
    realised_lag: pd.DataFrame
    curves: pd.DataFrame
    missing: pd.DataFrame
    diverged: pd.DataFrame
    provenance: pd.DataFrame
    tasks: pd.DataFrame
    reps: int
    last_evals: int
    primary: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)
    auc_retention: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)
    """AUC(k)/AUC(0), as `degradation` is score(k)/score(0)."""
    pre_registration: str = "after"
    """Whether the results were made after the tests were pre-registered: "after", "before" or
    "unknown" (`pre_registration`); only "after" gets verdicts."""
    pre_registration_detail: str = ""
    """The same in words, naming the commits."""


def analyse(study: Study, table: dict, *, reps: int = 10_000, seed: int = 0,
            last_evals: int = FINAL_EVALS) -> Report:
    """Score every run of `study` by the reference `table` and compute every table."""
    scored = run_scores(study.results, table, last_evals)
    runs = scored.drop(columns=["steps", "returns"])
    options = dict(reps=reps, seed=seed)
    degradation = degradation_table(runs, **options)
    final_scores = score_table(runs, **options)
    status, detail = pre_registration(study.cells)
    return Report(
        runs=runs, scores=final_scores, auc=score_table(runs, "auc", **options),
        degradation=degradation, interaction=interaction_table(runs, TARGET, **options),
        break_lag=break_lag_table(degradation), sanity=sanity_table(runs, final_scores),
        realised_lag=realised_lag_table(runs), curves=sync_curves(scored, **options),
        missing=missing_cells(study), diverged=diverged_runs(runs),
        provenance=provenance(study), tasks=task_table(runs, table, last_evals),
        reps=reps, last_evals=last_evals,
        primary=primary_table(runs, degradation, target=TARGET,
                              pre_registered=status == "after"),
        auc_retention=degradation_table(runs, "auc", **options), pre_registration=status,
        pre_registration_detail=detail)


def provenance(study: Study) -> pd.DataFrame:
    """Per sweep directory: finished lag cells, vaco_jax source hash(es), git commit(s) and the
    kinds of CPU that ran them (`cpu_tag` of the cells' `host`; cells recorded before it was
    kept say "unrecorded")."""
    rows = []
    for directory, group in study.cells.groupby("sweep", sort=True):
        sources = group["source"].fillna("unrecorded") if "source" in group else ["unrecorded"]
        commits = (group["git_commit"].fillna("unrecorded") if "git_commit" in group
                   else ["unrecorded"])
        hosts = group["host"] if "host" in group else [None]
        cpus = {(h.get("cpu_tag") if isinstance(h, dict) else None) or "unrecorded" for h in hosts}
        rows.append({"sweep": directory, "cells": len(group),
                     "source": ", ".join(sorted(set(sources))),
                     "commits": ", ".join(sorted({str(c)[:12] for c in commits})),
                     "cpus": ", ".join(sorted(cpus))})
    return pd.DataFrame(rows, columns=["sweep", "cells", "source", "commits", "cpus"])


def task_table(runs: pd.DataFrame, table: dict, last_evals: int) -> pd.DataFrame:
    """Per task: budget, seeds, evaluations per run, and the references used (with their seeds
    and the source hash and commit that measured them)."""
    rows = []
    for env, group in runs.groupby("env", sort=True):
        budget = int(group["budget"].iloc[0])
        entry = references.lookup(table, env, budget, last_evals)
        seeds = sorted(group["seed"].unique())
        rows.append({"task": env, "budget": f"{budget:,}", "seeds": _ranges(seeds),
                     "evaluations": int(group["evaluations"].max()),
                     "random_return": entry["random_return"],
                     "sync_return": entry["ppo_sync_return"],
                     "sync_seeds": _ranges(entry.get("ppo_sync_seeds", [])),
                     "reference_source": entry.get("source") or "unrecorded",
                     "reference_commit": str(entry.get("git_commit") or "unrecorded")[:12]})
    return pd.DataFrame(rows)


def _ranges(values) -> str:
    """[100, 101, 102, 105] → "100–102, 105"."""
    values, parts = sorted(int(v) for v in values), []
    for v in values:
        if parts and v == parts[-1][1] + 1:
            parts[-1][1] = v
        else:
            parts.append([v, v])
    return ", ".join(f"{a}–{b}" if b > a else f"{a}" for a, b in parts)


# --- the written report ---------------------------------------------------------------------------


def fewer_tasks(frame: pd.DataFrame, total: int | None = None) -> list[str]:
    """Per row of `frame`: "n of N tasks" where it is a pooled row over fewer tasks (n, its
    `tasks` column) than the N there are (`total`; default: the frame's other tasks), else "" —
    the mark every table and figure gives such a row."""
    if "tasks" not in frame:
        return [""] * len(frame)
    if total is None:
        total = frame.loc[frame["task"] != POOLED, "task"].nunique()
    return [f"{int(n)} of {total} tasks" if task == POOLED and n < total else ""
            for task, n in zip(frame["task"], frame["tasks"])]


def with_fewer(frame: pd.DataFrame, texts: Sequence[str], total: int | None = None) -> list[str]:
    """`texts`, one per row of `frame`, each marked as `fewer_tasks` marks its row ("(1 of 2
    tasks)"), as the figures' pooled rows are."""
    return [f"{text} ({fewer})" if fewer else text
            for text, fewer in zip(texts, fewer_tasks(frame, total))]


def _interval_texts(frame: pd.DataFrame, value: str, tasks: int, sign: bool = False) -> list[str]:
    """Each row's `value [low, high]` {its simultaneous interval, where it has one}; a pooled cell
    over fewer than all `tasks` says how many."""
    texts = tables.intervals(frame, value, sign=sign)
    if "simultaneous_low" in frame:
        texts = [f"{text} {{{low:.2f}, {high:.2f}}}" if np.isfinite(low) else text for text, low, high
                 in zip(texts, frame["simultaneous_low"], frame["simultaneous_high"])]
    return with_fewer(frame, texts, tasks)


def _wide(frame: pd.DataFrame, texts: Sequence[str], index: Sequence[str] = ("task", "method"),
          marks: dict | None = None) -> str:
    """A markdown table (`tables.wide`): one row per `index`, one column per lag, cells `texts`;
    `marks` (index tuple → mark) appended to the last index column."""
    if frame.empty:
        return "—"
    index, marks = list(index), marks or {}
    named = [f"{row[-1]} {marks[row]}" if row in marks else row[-1]
             for row in frame[index].itertuples(index=False, name=None)]
    lags = [lag_label(s, c) for s, c in zip(frame["sampling"], frame["capacity"])]
    order = [lag_label(*c) for c in _column_order(zip(frame["sampling"], frame["capacity"]))]
    return tables.wide(frame.assign(**{index[-1]: named, "lag": lags}), texts, index, "lag", order)


def _sanity_markdown(sanity: pd.DataFrame) -> str:
    if sanity.empty:
        return "No synchronous runs."
    yes_no = {True: "yes", False: "no"}
    return markdown_rows(pd.DataFrame({
        "task": sanity["task"], "method": sanity["method"],
        "final return": sanity["final_return"].map("{:,.1f}".format),
        "random": sanity["random_return"].map("{:,.1f}".format),
        "sync PPO-Clip": sanity["sync_return"].map("{:,.1f}".format),
        "score": [tables.interval(*v) for v in zip(sanity["score"], sanity["low"], sanity["high"])],
        "seeds": sanity["seeds"], "clears random": sanity["clears_random"].map(yes_no),
        f"≥ {SYNC_FRACTION:g} sync": sanity["reaches_fraction"].map(yes_no),
        "fails": sanity["fails"].replace("", "—")}))


def _family(interaction: pd.DataFrame) -> str:
    if interaction.empty:
        return "no comparison"
    m = int(interaction["family_size"].iloc[0])
    return (f"m = {m} comparisons (every row and lag below, undefined ones included), each "
            f"simultaneous CI at level 1 − 0.05/{m} = {1 - FAMILY_ALPHA / m:.5f}, from "
            f"{int(interaction['reps'].iloc[0]):,} resamples per comparison")


def _primary_section(r: Report) -> list[str]:
    """The pre-registered tests: verdicts when the results were made after they were written,
    else the same tests labelled exploratory, without verdicts."""
    tests = ("VACO minus PPO-Clip and minus APPO at the largest lag, final score and AUC, paired "
             "t-tests with Holm's correction over the family (the exact sign-flip test beside "
             f"them); the final retention's 95% BCa interval against {BREAK_LEVEL:g} for VACO, "
             f"PPO-Clip and APPO. Tasks with fewer than {MIN_SEEDS} seeds are left out")
    made = f" (these results were {r.pre_registration_detail})" if r.pre_registration_detail \
        else ""
    if r.pre_registration == "after":
        return ["## Pre-registered tests", "",
                f"The family and rules fixed before the runs (docs/experiments.md, "
                f"\"Pre-registered tests\"{made}): {tests} of the claims; \"holds\": the "
                f"interval above {BREAK_LEVEL:g}. Everything after this table is exploratory.", "",
                _primary_markdown(r.primary), ""]
    why = preregistration.STATUS[r.pre_registration]
    return [f"## The pre-registered tests, computed on these results (exploratory: {why})", "",
            f"The tests of docs/experiments.md, \"Pre-registered tests\"{made}: {tests}. They "
            f"were not shown to be fixed before these results were seen, so they are exploratory "
            f"here and call no verdict (no \"holds\", \"breaks\", \"higher\" or \"lower\"); "
            f"the last column says what the adjusted p-value or the interval shows. Every table "
            f"in this report is exploratory.", "",
            _primary_markdown(r.primary), ""]


def summary(report: Report, *, sweeps: Sequence[str], references_path: str,
            figures: dict[str, str], figure_notes: str = "") -> str:
    """summary.md: how the figures are computed, then every table of `report`; `figures`: file
    name → caption, `figure_notes` below them."""
    r = report
    tasks = r.runs["env"].nunique()
    failing = {(row.task, row.method): "†" for row in r.sanity.itertuples()
               if not row.clears_random}
    failing.update({(POOLED, method): "†" for _, method in list(failing)})
    realised = [f"{a:.2f} ({g:,.0f}), {t:.3f}" for a, g, t in zip(
        r.realised_lag["snapshot_age"], r.realised_lag["snapshot_age_sgd_steps"],
        r.realised_lag["behavior_tv"])]
    tasks_table = r.tasks.assign(random_return=r.tasks["random_return"].map("{:,.1f}".format),
                                 sync_return=r.tasks["sync_return"].map("{:,.1f}".format))
    lines = [
        "# The controlled-lag study", "",
        f"Sweeps: {', '.join(f'`{s}`' for s in sweeps)}; references: `{references_path}`.", "",
        f"Each method runs at a constant policy lag k = C − 1 (the oldest of C snapshots) and with "
        f"uniform sampling over C = 16 as a reference column. A run's score is the mean of its "
        f"last {r.last_evals} evaluations, normalised per task by a random policy (0) and "
        f"synchronous PPO-Clip at the same budget on disjoint seeds, scored by the same rule (1); "
        f"a diverged run scores 0. Degradation = mean score(k) / mean score(0) per task and "
        f"method. CIs are BCa over seeds, resampled paired (a seed uses the same key at every lag "
        f"and in every method), {r.reps:,} resamples; pooled figures are the mean over tasks of "
        f"the per-task figures, seeds resampled within each task.", "",
        *_primary_section(r),
        "## Provenance", "", markdown_rows(r.provenance), "",
        markdown_rows(tasks_table), "",
        "## Missing cells", "",
        markdown_rows(r.missing) if len(r.missing) else
        "None: every cell of the study's design has finished runs.", "",
        "## Diverged runs (scored 0: they fail like a random policy)", "",
        markdown_rows(r.diverged) if len(r.diverged) else "None.", "",
        "## Sanity check: synchronous runs (k = 0)", "",
        f"Mean final return (a diverged run counted at the random policy's return), the "
        f"references, and the normalised score [95% CI]; a method should clear random (CI low "
        f"> 0) and reach {SYNC_FRACTION:g} of synchronous PPO-Clip (point estimate).", "",
        _sanity_markdown(r.sanity), "",
        "## Normalised final score vs lag", "",
        _wide(r.scores, _interval_texts(r.scores, "mean", tasks)), "",
        "## Degradation: score(k) / score(0)", "",
        "†: the method does not clear random at k = 0, so the fraction it keeps means little. "
        "Undefined: the synchronous score is not above random.", "",
        _wide(r.degradation, _interval_texts(r.degradation, "degradation", tasks),
              marks=failing), "",
        f"## Break lag: the smallest k with degradation < {BREAK_LEVEL:g}", "",
        f"`break_lag`: the point estimate is below {BREAK_LEVEL:g}; `confidently_broken`: the 95% "
        f"CI's upper end is; none: at no lag tested.", "",
        markdown_rows(r.break_lag.replace({"task": {POOLED: "pooled (mean over tasks)"}}))
        if len(r.break_lag) else "—", "",
        "## VACO's degradation minus each baseline's", "",
        f"Positive: VACO keeps more of its synchronous score. Cells: difference [95% CI] "
        f"{{Bonferroni-adjusted simultaneous CI}}; {_family(r.interaction)}.", "",
        _wide(r.interaction, _interval_texts(r.interaction, "interaction", tasks, sign=True),
              index=("task", "baseline")), "",
        "## Realised lag", "",
        "Mean snapshot age in iterations (in learner SGD steps), and mean behaviour TV "
        "½ E|π_θ/β − 1|, over each run, then over seeds. A buffer of C fills over its first "
        "C − 1 iterations, so a short run's mean age is below k.", "",
        _wide(r.realised_lag, realised), "",
        "## Sample efficiency: normalised area under the curve", "",
        _wide(r.auc, _interval_texts(r.auc, "mean", tasks)), "",
        *(["## AUC retention: AUC(k) / AUC(0)", "",
           "The fraction of its synchronous AUC a method keeps (how much lag slows its learning), "
           "as the degradation above is for the final score.", "",
           _wide(r.auc_retention, _interval_texts(r.auc_retention, "degradation", tasks),
                 marks=failing), ""] if len(r.auc_retention) else []),
        "## Figures", "", *[f"* [{name}]({name}): {caption}" for name, caption in figures.items()],
        *(["", figure_notes] if figure_notes else []),
    ]
    return "\n".join(lines) + "\n"


# --- the figures (`write` draws them from a `Report`) ------------------------------------------
# Every figure is a grid: a column per task (and a pooled one where there are several), a row per
# group of at most `LAG_PER_PANEL` methods (`lag_method_groups`), the groups and each method's
# colour the same in every figure: (a) normalised final score vs constant lag k, (b) learning
# curves at k = 0, (c) final-score retention score(k)/score(0), (d) AUC retention AUC(k)/AUC(0).
# In the pooled column a method that ran on fewer tasks than the others is dashed with hollow
# markers, and the footnote says over how many tasks it pools.
LAG_PER_PANEL = 4
"""The most methods one panel shows."""
LAG_REFERENCES = (TARGET, *PRIMARY_BASELINES)
"""The first row: VACO and the methods it is compared with in the pre-registered family."""


def lag_colors(methods: Sequence[str]) -> dict[str, tuple]:
    """One colour per method, the same in every figure of the study: the sweep figures' colours
    (`plotting.PREFERRED`) first, the other lag-study methods after, then any other name."""
    palette = plt.get_cmap("tab10")
    order = list(plotting.PREFERRED) + [m for m in METHODS if m not in plotting.PREFERRED]
    order += sorted(m for m in methods if m not in order)
    return {m: palette(order.index(m) % 10) for m in methods}


def _largest_lag_retention(retention: pd.DataFrame) -> tuple[int | None, dict[str, float]]:
    """(k, method → final retention at the largest constant lag k): the pooled row where there
    is one, else the single task's."""
    oldest = retention[retention["sampling"] == "oldest"]
    if oldest.empty:
        return None, {}
    largest = int(oldest["capacity"].max())
    at = oldest[oldest["capacity"] == largest]
    tasks = set(at["task"])
    if POOLED in tasks:
        at = at[at["task"] == POOLED]
    elif len(tasks) > 1:            # no pooled rows: no single figure per method to group by
        return largest - 1, {}
    return largest - 1, dict(zip(at["method"], at["degradation"].astype(float)))


def lag_method_groups(methods: Sequence[str],
                      retention: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """The figures' rows, `(description, methods)`: VACO, PPO-Clip and APPO (`LAG_REFERENCES`);
    then the other methods whose final-score retention at the largest constant lag (pooled over
    tasks, point estimate) is below `BREAK_LEVEL`; then the rest (retention ≥ it, or undefined).
    Each group in the report's method order, cut into rows of at most `LAG_PER_PANEL`; empty
    groups left out. A display rule, not a test: the report's tables give the intervals."""
    ordered = _method_order(methods)
    k, kept = _largest_lag_retention(retention)
    references = [m for m in ordered if m in LAG_REFERENCES]
    others = [m for m in ordered if m not in LAG_REFERENCES]
    below = [m for m in others if np.isfinite(kept.get(m, np.nan)) and kept[m] < BREAK_LEVEL]
    where = "pooled " if (retention["task"] == POOLED).any() else ""
    groups = [("the references (VACO, PPO-Clip, APPO)", references),
              (f"{where}final-score retention at k = {k} below {BREAK_LEVEL:g}", below),
              ("the others" if not below else f"the others ({where}final-score retention at "
               f"k = {k} ≥ {BREAK_LEVEL:g} or undefined)", [m for m in others if m not in below])]
    rows = []
    for description, members in groups:
        chunks = [members[i:i + LAG_PER_PANEL] for i in range(0, len(members), LAG_PER_PANEL)]
        for i, chunk in enumerate(chunks):
            part = f" ({i + 1} of {len(chunks)})" if len(chunks) > 1 else ""
            rows.append((description + part, chunk))
    return rows


def lag_rule_caption(groups: list[tuple[str, list[str]]]) -> str:
    """The grouping rule in words, for the figures' footnotes and summary.md."""
    rows = "; ".join(f"{description} — {', '.join(members)}" for description, members in groups)
    return (f"Rows, at most {LAG_PER_PANEL} methods to a panel and the same in every figure: "
            f"{rows}. The retention that sorts them is a point estimate: a grouping for "
            f"legibility, not a test.")


LAG_LEGEND_WIDTH = 2.0
"""Inches of the legend slot at the end of each row."""


def _lag_panels(rows: int, columns: int, *, sharex: str, width: float = 3.3,
                height: float = 2.55, footer: float = 0.0):
    """`rows` × `columns` panels sharing y within a column (and x as `sharex`: "all" or "col"),
    a legend slot at the end of each row, and `footer` inches below for the footnote."""
    fig = plt.figure(figsize=(width * columns + LAG_LEGEND_WIDTH, height * rows + 0.7 + footer))
    spec = fig.add_gridspec(rows, columns + 1,
                            width_ratios=[1.0] * columns + [LAG_LEGEND_WIDTH / width])
    axes = [[None] * columns for _ in range(rows)]
    for r in range(rows):
        for c in range(columns):
            x_with = axes[0][0] if sharex == "all" and (r or c) else axes[0][c] if r else None
            axes[r][c] = fig.add_subplot(spec[r, c], sharey=axes[0][c] if r else None,
                                         sharex=x_with)
    legends = [fig.add_subplot(spec[r, columns]) for r in range(rows)]
    for ax in legends:
        ax.axis("off")
    return fig, axes, legends


def _lag_legend(ax, methods, palette, description, fewer: dict[str, str], uniform: bool,
            marker: str = "o") -> None:
    handles = [plt.Line2D([], [], color=palette[m], lw=2.2 if m == TARGET else 1.4,
                          marker=marker, ms=3, label=m + (f"\n(pooled: {fewer[m]})" if m in fewer
                                                          else ""))
               for m in methods]
    if uniform:
        handles.append(plt.Line2D([], [], color="k", marker="D", ls="",
                                  label="uniform C = 16, at its\nmean snapshot age"))
    ax.legend(handles=handles, loc="center left", fontsize=8, frameon=False,
              title="\n".join(_lag_wrap(description, 28)), title_fontsize=8,
              alignment="left")


def _lag_wrap(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` characters, never broken inside a hyphenated word."""
    return textwrap.wrap(text, width, break_on_hyphens=False)


def _lag_note_width(columns: int, width: float = 3.3) -> int:
    """Characters of an 8-point footnote line across a figure of `columns` panels."""
    return int(14 * (width * columns + LAG_LEGEND_WIDTH))


def _lag_finish(fig, title: str, notes: Sequence[str], footer: float, columns: int) -> None:
    fig.suptitle(title, fontsize=11)
    if notes:
        lines = [line for note in notes for line in _lag_wrap(note, _lag_note_width(columns))]
        fig.text(0.01, 0.01, "\n".join(lines), fontsize=8, va="bottom", ha="left", color="0.25")
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, footer / height, 1, 1 - 0.25 / height))


def _lag_footer(notes: Sequence[str], columns: int) -> float:
    """Inches the footnote `notes` take below `columns` panels."""
    return 0.2 + 0.16 * sum(len(_lag_wrap(note, _lag_note_width(columns))) for note in notes)


def _lag_fewer(table: pd.DataFrame) -> dict[str, str]:
    """method → "n of N tasks" for each method whose pooled rows pool fewer than the N tasks of
    `table`."""
    marked = table.assign(_fewer=fewer_tasks(table))
    marked = marked[marked["_fewer"] != ""]
    if marked.empty:
        return {}
    least = marked.sort_values(["method", "tasks"]).drop_duplicates("method")
    return dict(zip(least["method"], least["_fewer"]))


def _lag_absent(ax, not_run: Sequence[str], undefined: Sequence[str] = ()) -> None:
    """Name the panel's methods that did not run on its task, and those whose ratio is undefined
    there (the synchronous score is not above random)."""
    lines = ([f"not run: {', '.join(not_run)}"] if not_run else []) + \
            ([f"undefined: {', '.join(undefined)}"] if undefined else [])
    if lines:
        ax.text(0.02, 0.97, "\n".join(lines), transform=ax.transAxes, va="top", ha="left",
                fontsize=7, color="0.35")


def _lag_axis(ax, capacities: Sequence[int], bottom: bool) -> None:
    """x = k + 1 on a log₂ axis, labelled by k."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(capacities))
    ax.set_xticklabels([str(c - 1) for c in capacities])
    ax.tick_params(labelbottom=bottom, labelsize=8)
    if bottom:
        ax.set_xlabel("constant policy lag k (iterations)", fontsize=9)
    ax.grid(alpha=0.3)


def _lag_lines(table: pd.DataFrame, value: str, ylabel: str, title: str,
              reference_lines: Sequence[float], groups, notes: Sequence[str] = (),
              ran: set | None = None):
    """One panel per (group, task): `value` vs constant lag k per method with its 95% CI band;
    the uniform C = 16 column a diamond at its mean snapshot age. `ran`: the (task, method)
    pairs that have runs (default: the table's); one without rows in `table` is undefined."""
    tasks = list(dict.fromkeys(table["task"]))   # the report's order: tasks, then pooled
    palette = lag_colors([*table["method"].unique(), *(m for _, ms in groups for m in ms)])
    ran = set(zip(table["task"], table["method"])) if ran is None else ran
    capacities = sorted(table.loc[table["sampling"] == "oldest", "capacity"].unique())
    fewer = _lag_fewer(table)
    uniform = (table["sampling"] != "oldest").any()
    notes = list(notes)
    if fewer:
        notes.insert(0, "Pooled column, dashed with hollow markers: pooled over fewer tasks than "
                        "the others (" + "; ".join(f"{m}: {n}" for m, n in fewer.items())
                     + "); a panel's \"not run\" names the group's methods that did not run on "
                       "that task.")
    footer = _lag_footer(notes, len(tasks))
    fig, axes, legends = _lag_panels(len(groups), len(tasks), sharex="all", footer=footer)
    for r, (description, methods) in enumerate(groups):
        for c, task in enumerate(tasks):
            ax, absent = axes[r][c], []
            ax.set_gid(task)
            for method in methods:
                rows = table[(table["task"] == task) & (table["method"] == method)]
                if rows.empty:
                    absent.append(method)
                    continue
                hollow = task == POOLED and method in fewer
                style = dict(color=palette[method], mfc="none" if hollow else palette[method],
                             gid=method)
                line = rows[rows["sampling"] == "oldest"].sort_values("capacity")
                ax.plot(line["capacity"], line[value], "o--" if hollow else "o-", ms=3.5,
                        lw=2.2 if method == TARGET else 1.4, **style)
                ax.fill_between(line["capacity"], line["low"], line["high"],
                                color=palette[method], alpha=0.12)
                for row in rows[rows["sampling"] != "oldest"].to_dict("records"):
                    y = row[value]
                    ax.errorbar(row["snapshot_age"] + 1, y, yerr=[[y - row["low"]],
                                                                [row["high"] - y]],
                                fmt="D", ms=4, capsize=2, alpha=0.85, **style)
            _lag_absent(ax, [m for m in absent if (task, m) not in ran and task != POOLED],
                    [m for m in absent if (task, m) in ran])
            for y in reference_lines:
                ax.axhline(y, color="grey", lw=0.8, ls=":")
            _lag_axis(ax, capacities, bottom=r == len(groups) - 1)
            if r == 0:
                ax.set_title("pooled: mean over tasks" if task == POOLED else task, fontsize=10)
            if c == 0:
                ax.set_ylabel(ylabel, fontsize=9)
        _lag_legend(legends[r], methods, palette, description, fewer, uniform)
    _lag_finish(fig, title, notes, footer, len(tasks))
    return fig


def lag_score_figure(scores: pd.DataFrame, groups, notes=()):
    """(a) Normalised final score vs constant lag k."""
    return _lag_lines(scores, "mean", "normalised final score",
                      "Normalised final score vs constant lag (mean over seeds, 95% BCa CIs)",
                      (0.0, 1.0), groups, notes)


def lag_retention_figure(retention: pd.DataFrame, scores: pd.DataFrame, groups, *,
                         auc: bool = False, notes=()):
    """(c) Final-score retention score(k)/score(0), or (d) with `auc` AUC retention
    AUC(k)/AUC(0), vs k, a line per method with its 95% CI band (paired seeds); k = 0 is 1 by
    definition; the break rule's level dotted."""
    cell = ["task", "method", "sampling", "capacity"]
    sync = scores[(scores["sampling"] == SYNC[0]) & (scores["capacity"] == SYNC[1])]
    anchor = sync[cell + ["tasks"]].assign(degradation=1.0, low=1.0, high=1.0)
    table = pd.concat([anchor, retention], ignore_index=True)
    defined = retention[np.isfinite(retention["degradation"])]
    table = table[table.set_index(["task", "method"]).index.isin(
        defined.set_index(["task", "method"]).index)]
    table = table.merge(scores[cell + ["snapshot_age"]], on=cell, how="left")
    name = "AUC" if auc else "score"
    return _lag_lines(table, "degradation", f"{name}(k) / {name}(0)",
                      f"{'AUC' if auc else 'Final-score'} retention vs constant lag "
                      f"(95% BCa CIs, paired seeds)", (BREAK_LEVEL, 1.0), groups, notes,
                      ran=set(zip(scores["task"], scores["method"])))


def lag_curves_figure(curves: pd.DataFrame, groups, notes=()):
    """(b) Normalised score vs env steps at k = 0, one panel per (group, task), the mean over
    seeds with its 95% CI band per method: whether synchronous PPO-Clip (1 = its final level)
    has flattened."""
    tasks = sorted(curves["task"].unique())
    palette = lag_colors([*curves["method"].unique(), *(m for _, ms in groups for m in ms)])
    footer = _lag_footer(notes, len(tasks))
    fig, axes, legends = _lag_panels(len(groups), len(tasks), sharex="col", footer=footer)
    for r, (description, methods) in enumerate(groups):
        for c, task in enumerate(tasks):
            ax, absent = axes[r][c], []
            ax.set_gid(task)
            for method in methods:
                rows = curves[(curves["task"] == task) & (curves["method"] == method)]
                if rows.empty:
                    absent.append(method)
                    continue
                ax.plot(rows["step"], rows["mean"], color=palette[method], gid=method,
                        lw=2.2 if method == TARGET else 1.4)
                ax.fill_between(rows["step"], rows["low"], rows["high"], color=palette[method],
                                alpha=0.12)
            _lag_absent(ax, absent)
            ax.axhline(1.0, color="grey", lw=0.8, ls=":")
            ax.axhline(0.0, color="grey", lw=0.8, ls=":")
            bottom = r == len(groups) - 1
            ax.tick_params(labelbottom=bottom, labelsize=8)
            ax.xaxis.set_major_formatter(EngFormatter(sep=""))   # 200k, 1M: never overlapping
            if bottom:
                ax.set_xlabel("env steps per run", fontsize=9)
            if r == 0:
                ax.set_title(task, fontsize=10)
            if c == 0:
                ax.set_ylabel("normalised score", fontsize=9)
            ax.grid(alpha=0.3)
        _lag_legend(legends[r], methods, palette, description, {}, uniform=False, marker="")
    _lag_finish(fig, "Learning curves at k = 0 (mean over seeds, 95% BCa CIs)", notes,
                footer, len(tasks))
    return fig


def lag_report_figures(report) -> tuple[dict[str, tuple[object, str]], str]:
    """({file name: (figure, caption)}, the grouping rule in words) for a `Report`:
    (a)–(d)."""
    methods = list(dict.fromkeys([*report.scores.get("method", []),
                                  *report.curves.get("method", [])]))
    groups = lag_method_groups(methods, report.degradation)
    rule = lag_rule_caption(groups)
    drawn = {}
    if len(report.scores):
        drawn["fig_a_score_vs_lag.png"] = (
            lag_score_figure(report.scores, groups, notes=[rule]),
            "normalised final score vs constant lag k, per task and pooled (95% BCa CIs)")
    if len(report.curves):
        drawn["fig_b_sync_curves.png"] = (
            lag_curves_figure(report.curves, groups, notes=[rule]),
            "learning curves at k = 0 (mean over seeds, 95% BCa CIs)")
    if len(report.degradation):
        drawn["fig_c_degradation.png"] = (
            lag_retention_figure(report.degradation, report.scores, groups, notes=[rule]),
            "final-score retention score(k) / score(0) vs k (95% BCa CIs, paired seeds)")
    if len(report.auc_retention) and len(report.auc):
        drawn["fig_d_auc_retention.png"] = (
            lag_retention_figure(report.auc_retention, report.auc, groups, auc=True, notes=[rule]),
            "AUC retention AUC(k) / AUC(0) vs k, to read beside (c) (95% BCa CIs, paired seeds)")
    return drawn, rule


def save_lag_figures(report, out: Path, dpi: int = 120) -> tuple[dict[str, str], str]:
    """Draw `lag_report_figures(report)` into the directory `out`; ({file name: caption}, a note
    on how to read them: the rule of the rows, the pooled column's markers)."""
    drawn, rule = lag_report_figures(report)
    for name, (fig, _) in drawn.items():
        figures.save(fig, Path(out) / name, dpi=dpi)
    pooled = (" In the pooled column, a method pooled over fewer tasks than the others is dashed "
              "with hollow markers, and its legend entry says over how many.")
    return {name: caption for name, (_, caption) in drawn.items()}, rule + pooled


def write(report: Report, out: str | Path, *, sweeps: Sequence[str], references_path: str,
          dpi: int = 120) -> list[Path]:
    """Figures (PNG), every table (CSV) and summary.md into `out`; returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    tables = {"runs": report.runs, "scores": report.scores, "auc": report.auc,
              "degradation": report.degradation, "interaction": report.interaction,
              "break_lag": report.break_lag, "sanity": report.sanity,
              "realised_lag": report.realised_lag, "sync_curves": report.curves,
              "missing": report.missing, "diverged": report.diverged,
              "provenance": report.provenance, "tasks": report.tasks, "primary": report.primary,
              "auc_retention": report.auc_retention}
    for name, frame in tables.items():
        frame.to_csv(out / f"{name}.csv", index=False)
        written.append(out / f"{name}.csv")
    captions, rule = save_lag_figures(report, out, dpi=dpi)
    written += [out / name for name in captions]
    (out / "summary.md").write_text(summary(report, sweeps=sweeps, references_path=references_path,
                                            figures=captions, figure_notes=rule))
    written.append(out / "summary.md")
    return written
