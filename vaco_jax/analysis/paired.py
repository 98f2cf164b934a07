"""Estimates of seeds paired across conditions, one definition each, on a table of scored runs.

    estimate              any statistic of conditions' seed means (`mean_of`, `ratio_of`,
                          `difference_of_ratios`), per task and pooled over tasks (the mean of the
                          tasks' values), with stratified BCa intervals: comparisons that draw the
                          same seeds of the same tasks share one vectorised bootstrap
    retention(at)         mean score at a setting ÷ mean score at the base setting (the method's
                          own synchronous score), paired by seed: `estimate` of `ratio_of`
    paired_differences    a − b per seed, per task, and pooled: the per-seed mean over tasks
    welch_difference      mean(a) − mean(b) of unpaired arms, Welch's t interval and p

Seed s uses the same key in every setting and method (common random numbers), so a comparison
resamples seeds paired: one row per seed holds every condition it compares."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from vaco_jax.analysis import stats

POOLED = "pooled"
REPS = 10_000
ESTIMATE = ("point", "low", "high", "seeds", "tasks")
"""The columns of an estimate in a table (`means`, `ratios`)."""


def ratio(numerator, denominator):
    """numerator / denominator, NaN where the denominator is not positive (a synchronous score at
    or below random leaves the fraction kept undefined)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.asarray(denominator) > 0, np.divide(numerator, denominator), np.nan)


def _select(runs: pd.DataFrame, setting: Mapping) -> pd.DataFrame:
    for name, value in setting.items():
        runs = runs[runs[name] == value]
    return runs


def paired(runs: pd.DataFrame, value: str, conditions: list[Mapping]) -> dict[str, pd.DataFrame]:
    """task → `[seeds, conditions]` (indexed by seed): `value` of each condition (a setting:
    column → value) on the seeds every condition has; tasks with fewer than 2 such seeds left
    out."""
    matrices = {}
    for task, group in runs.groupby("task", sort=True):
        series = [_select(group, c).set_index("seed")[value] for c in conditions]
        seeds = sorted(set(series[0].index).intersection(*(s.index for s in series[1:])))
        if len(seeds) >= 2:
            matrices[task] = pd.DataFrame({i: s[seeds].astype(np.float64)
                                           for i, s in enumerate(series)})
    return matrices


def cells(runs: pd.DataFrame, value: str, columns: Sequence[str]) -> dict[tuple, pd.Series]:
    """(*`columns`) → the seed-indexed `value` of the runs there; the first column is the
    task."""
    return {key: group.set_index("seed")[value]
            for key, group in runs.groupby(list(columns), sort=False)}


def _common_seeds(values: dict, task, conditions: Sequence[tuple]) -> tuple[int, ...]:
    """The seeds of `task` present in every condition (none if a condition has no runs)."""
    series = [values.get((task, *condition)) for condition in conditions]
    if any(s is None for s in series):
        return ()
    return tuple(sorted(set(series[0].index).intersection(*(s.index for s in series[1:]))))


def with_pooled(values: dict, per_cell: dict) -> dict:
    """A comparison is a list of strata, one per task: (task, conditions), a condition being the
    key of `values` after its task. The comparisons of `per_cell` ((task, *rest) → a one-task
    comparison) that have seeds in common and, with several tasks, (POOLED, *rest) → the
    comparison over every task that has it."""
    comparisons = {key: strata for key, strata in per_cell.items()
                   if all(_common_seeds(values, task, c) for task, c in strata)}
    if len({key[0] for key in values}) > 1:     # one task's pool is the task itself
        for (task, *rest), strata in list(comparisons.items()):
            comparisons.setdefault((POOLED, *rest), []).extend(strata)
    return comparisons


def mean_of(means: np.ndarray) -> np.ndarray:
    """One condition: its mean."""
    return means[..., 0]


def ratio_of(means: np.ndarray) -> np.ndarray:
    """Conditions (a setting, the base setting): mean at the setting ÷ mean at the base."""
    return ratio(means[..., 0], means[..., 1])


def difference_of_ratios(means: np.ndarray) -> np.ndarray:
    """Conditions (A at a setting, A at the base, B at the setting, B at the base): A's ratio
    minus B's."""
    return ratio_of(means[..., :2]) - ratio_of(means[..., 2:])


def estimate(values: dict, comparisons: dict, per_task: Callable, *, reps: int = REPS,
             seed: int = 0, levels: Mapping[str, float] | None = None) -> dict[object, dict]:
    """Each comparison's `point` (the mean over its tasks of `per_task` of its conditions' means
    over the task's common seeds), `seeds` (over its tasks), `tasks` and, per name → confidence of
    `levels` (default {"": 0.95}), `<name>low` and `<name>high`: the stratified BCa interval, seeds
    resampled paired within each task (NaN with fewer than 2 seeds in a task). Comparisons
    without common seeds on some task are left out.

    Comparisons that draw the same seeds of the same tasks share one bootstrap (a vector
    statistic): a table costs one resampling per set of tasks, not one per cell."""
    levels = {"": 0.95} if levels is None else levels
    groups: dict[tuple, list] = {}
    for key, strata in comparisons.items():
        signature = tuple((task, _common_seeds(values, task, c)) for task, c in strata)
        if all(seeds for _, seeds in signature):
            groups.setdefault(signature, []).append(key)
    out = {}
    for signature, keys in groups.items():
        out.update(_estimate_group(values, signature, {k: comparisons[k] for k in keys},
                                   per_task, reps=reps, seed=seed, levels=levels))
    return out


def _estimate_group(values, signature, comparisons, per_task, *, reps, seed, levels) -> dict:
    """`estimate` for comparisons sharing `signature`: ((task, seeds), ...)."""
    unions = [list(dict.fromkeys(c for strata in comparisons.values() for c in strata[i][1]))
              for i in range(len(signature))]
    arrays = [np.stack([values[(task, *c)].loc[list(seeds)].to_numpy(np.float64) for c in union],
                       axis=1)
              for (task, seeds), union in zip(signature, unions)]
    positions = [[[unions[i].index(c) for c in strata[i][1]] for i in range(len(signature))]
                 for strata in comparisons.values()]

    def statistic(strata):   # [batch, seeds_i, conditions_i] per task → [batch, comparisons]
        means = [x.mean(-2) for x in strata]
        return np.stack([np.mean([per_task(means[i][..., index]) for i, index in enumerate(where)],
                                 axis=0) for where in positions], axis=-1)

    if min(len(seeds) for _, seeds in signature) < 2:
        point = statistic([a[None] for a in arrays])[0]
        intervals = {name: (np.full_like(point, np.nan),) * 2 for name in levels}
    else:
        row_size = sum(a.shape[0] * a.shape[1] for a in arrays)
        boot = stats.stratified_bootstrap(arrays, statistic, reps=reps, seed=seed, vectorized=True,
                                          batch=max(1, 25_000_000 // row_size))
        point = boot.point
        intervals = {name: boot.interval(level) for name, level in levels.items()}
    out = {}
    for j, key in enumerate(comparisons):
        out[key] = {"point": float(point[j]), "seeds": sum(len(s) for _, s in signature),
                    "tasks": len(signature)}
        for name, (low, high) in intervals.items():
            out[key][f"{name}low"], out[key][f"{name}high"] = float(low[j]), float(high[j])
    return out


def means(runs: pd.DataFrame, value: str, columns: Sequence[str], *, reps: int = REPS,
          seed: int = 0, confidence: float = 0.95) -> pd.DataFrame:
    """Mean `value` per cell (`columns`, the first the task) with its stratified BCa interval over
    seeds, then pooled rows (task POOLED: the mean over the tasks that have the cell). Columns
    task, the other `columns`, point, low, high, seeds, tasks."""
    values = cells(runs, value, columns)
    comparisons = with_pooled(values, {key: [(key[0], [key[1:]])] for key in values})
    return _frame(estimate(values, comparisons, mean_of, reps=reps, seed=seed,
                           levels={"": confidence}), columns)


def ratios(runs: pd.DataFrame, value: str, columns: Sequence[str], base: Callable[[tuple], tuple],
           *, reps: int = REPS, seed: int = 0, confidence: float = 0.95) -> pd.DataFrame:
    """Mean `value` in each cell ÷ mean in its base cell, paired by seed (`ratio_of`), per task
    and pooled over tasks (the mean of the tasks' ratios, seeds resampled within each task), with
    stratified BCa intervals. `base(condition)`: the condition (a cell's key after its task) a
    condition is compared with; the base cells themselves are left out. Columns as `means`'."""
    values = cells(runs, value, columns)
    per_cell = {(task, *condition): [(task, [tuple(condition), base(tuple(condition))])]
                for task, *condition in values if tuple(condition) != base(tuple(condition))}
    comparisons = with_pooled(values, per_cell)
    return _frame(estimate(values, comparisons, ratio_of, reps=reps, seed=seed,
                           levels={"": confidence}), columns)


def _frame(estimated: dict, columns: Sequence[str]) -> pd.DataFrame:
    names = ["task", *columns[1:]]
    return pd.DataFrame([{**dict(zip(names, key)), **{k: e[k] for k in ESTIMATE}}
                         for key, e in estimated.items()], columns=[*names, *ESTIMATE])


def retention(runs: pd.DataFrame, value: str, base: Mapping, at: Mapping, *, reps: int = REPS,
              seed: int = 0, confidence: float = 0.95,
              tasks: Sequence[str] | None = None) -> pd.DataFrame:
    """Per task and pooled (when several tasks): mean `value` at `at` ÷ mean at `base`
    (`ratio_of`), with its stratified BCa interval over seeds. `tasks`: the tasks, in the order
    they are stratified (default: every task of `runs`, sorted). Columns task, retention, low,
    high, seeds (the fewest of a task)."""
    matrices = paired(runs, value, [at, base])
    order = [t for t in (matrices if tasks is None else tasks) if t in matrices]
    values = {(t, c): matrices[t][c] for t in order for c in (0, 1)}
    comparisons = with_pooled(values, {(t,): [(t, [(0,), (1,)])] for t in order})
    estimated = estimate(values, comparisons, ratio_of, reps=reps, seed=seed,
                         levels={"": confidence})
    rows = [{"task": task, "retention": e["point"], "low": e["low"], "high": e["high"],
             "seeds": min(len(matrices[t]) for t, _ in comparisons[(task,)])}
            for (task,), e in estimated.items()]
    return pd.DataFrame(rows, columns=["task", "retention", "low", "high", "seeds"])


def paired_differences(runs: pd.DataFrame, value: str, a: Mapping,
                       b: Mapping) -> dict[str, pd.Series]:
    """task → the seed-indexed differences `a` − `b` of `value` (tasks with at least 2 common
    seeds: `paired`), and, when several tasks, POOLED → the per-seed mean over them on the seeds
    they all have."""
    return with_pooled_seeds({task: m[0] - m[1] for task, m in paired(runs, value, [a, b]).items()})


def with_pooled_seeds(per_task: dict[str, pd.Series]) -> dict[str, pd.Series]:
    """task → seed-indexed values, and, when several tasks, POOLED → their per-seed mean on the
    seeds every task has."""
    if len(per_task) > 1:
        common = sorted(set.intersection(*(set(d.index) for d in per_task.values())))
        per_task[POOLED] = sum(d[common] for d in per_task.values()) / len(per_task)
    return per_task


def welch_difference(a, b, confidence: float = 0.95) -> tuple[float, float, float, float]:
    """(mean(a) − mean(b), its Welch t interval's ends, the two-sided p): two arms whose runs are
    not paired (different networks on the same seeds do not share a key's use)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    test = scipy_stats.ttest_ind(a, b, equal_var=False)
    low, high = test.confidence_interval(confidence)
    return float(a.mean() - b.mean()), float(low), float(high), float(test.pvalue)
