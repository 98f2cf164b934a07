"""The estimates every study reports, one definition each, on scored runs (`scores.normalised`).

    retention(at)         mean score at a setting ÷ mean score at the base setting (the method's
                          own synchronous score), paired by seed, per task and pooled over tasks
                          (the mean of the tasks' retentions), with a stratified BCa interval
    paired_differences    a − b per seed, per task, and pooled: the per-seed mean over tasks
    break_lag             the smallest constant lag whose retention is below BREAK_LEVEL
    welch_difference      mean(a) − mean(b) of unpaired arms, Welch's t interval and p

Seed s uses the same key in every setting and method (common random numbers), so a comparison
resamples seeds paired: one row per seed holds every condition it compares."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from vaco_jax.study import stats

BREAK_LEVEL = 0.8
"""A method breaks at the smallest lag whose retention is below this."""
POOLED = "pooled"
REPS = 10_000


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


def retention(runs: pd.DataFrame, value: str, base: Mapping, at: Mapping, *, reps: int = REPS,
              seed: int = 0, confidence: float = 0.95,
              tasks: Sequence[str] | None = None) -> pd.DataFrame:
    """Per task and pooled (when several tasks): mean `value` at `at` ÷ mean at `base`, with its
    stratified BCa interval over seeds. `tasks`: the tasks, in the order they are stratified
    (default: every task of `runs`, sorted). Columns task, retention, low, high, seeds."""
    matrices = {t: m.to_numpy() for t, m in paired(runs, value, [base, at]).items()}
    if tasks is not None:
        matrices = {t: matrices[t] for t in tasks if t in matrices}
    groups = [(t, [m]) for t, m in matrices.items()]
    if len(matrices) > 1:
        groups.append((POOLED, list(matrices.values())))
    rows = []
    for task, strata in groups:
        point, low, high = stats.stratified_bca(
            strata, lambda s: np.mean([ratio(x[:, 1].mean(), x[:, 0].mean()) for x in s]),
            reps=reps, seed=seed, confidence=confidence)
        rows.append({"task": task, "retention": float(point), "low": float(low),
                     "high": float(high), "seeds": int(min(len(m) for m in strata))})
    return pd.DataFrame(rows, columns=["task", "retention", "low", "high", "seeds"])


def paired_differences(runs: pd.DataFrame, value: str, a: Mapping,
                       b: Mapping) -> dict[str, pd.Series]:
    """task → the seed-indexed differences `a` − `b` of `value` (tasks with at least 2 common
    seeds: `paired`), and, when several tasks, POOLED → the per-seed mean over them on the seeds
    they all have."""
    per_task = {task: m[0] - m[1] for task, m in paired(runs, value, [a, b]).items()}
    if len(per_task) > 1:
        common = sorted(set.intersection(*(set(d.index) for d in per_task.values())))
        per_task[POOLED] = sum(d[common] for d in per_task.values()) / len(per_task)
    return per_task


def break_lag(lags, retentions, highs, level: float = BREAK_LEVEL) -> tuple[str, str]:
    """(break lag, confidently broken): the smallest lag of `lags` whose retention is below
    `level`, and the smallest whose interval's upper end is; "none" if no lag is, "undefined" if
    no retention is defined."""
    order = np.argsort(lags)
    lags, retentions, highs = (np.asarray(x)[order] for x in (lags, retentions, highs))
    if np.isnan(np.asarray(retentions, np.float64)).all():
        return "undefined", "undefined"

    def first(mask):
        return str(int(lags[mask][0])) if mask.any() else "none"
    return first(retentions < level), first(highs < level)


def welch_difference(a, b, confidence: float = 0.95) -> tuple[float, float, float, float]:
    """(mean(a) − mean(b), its Welch t interval's ends, the two-sided p): two arms whose runs are
    not paired (different networks on the same seeds do not share a key's use)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    test = scipy_stats.ttest_ind(a, b, equal_var=False)
    low, high = test.confidence_interval(confidence)
    return float(a.mean() - b.mean()), float(low), float(high), float(test.pvalue)
