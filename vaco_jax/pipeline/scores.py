"""One normalisation: `(R − R_random) / (R_reference − R_random)`, random = 0, a reference = 1.

A diverged run's evaluations count as the random policy's from its divergence on (score 0). The
reference is per task and per metric (final, auc): the mean over a reference method's runs at one
setting (the same seeds)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from vaco_jax.pipeline import runs as runs_
from vaco_jax.analysis import stats

METRICS = ("final", "auc")


def run_score(returns, steps, random: float, reference: float | None = None,
              last_evals: int = runs_.LAST_EVALS, *, diverged=None,
              whole_run_fails: bool = False) -> tuple[float, float]:
    """(final, auc) of one run, every study's rule: its evaluations from its divergence on (those
    `diverged` marks, and a non-finite return) count as the random policy's; normalised by
    `random` and `reference` (None: returns as they are); final the mean of the last `last_evals`
    evaluations, auc the normalised area under the curve (`stats.area_under_curve`).

    `whole_run_fails`: a run that diverged at all, however late, has the random policy's final
    (a score of 0), not the mean of its last evaluations (the controlled-lag and settings
    studies' rule)."""
    returns = np.asarray(returns, np.float64)
    failed = ~np.isfinite(returns)
    if diverged is not None:
        failed |= np.asarray(diverged, bool)
    failed = np.maximum.accumulate(failed)
    curve = np.where(failed, random, returns)
    if reference is not None:
        curve = stats.normalize(curve, random, reference)
    if whole_run_fails and failed.any():
        final = 0.0 if reference is not None else random
    else:
        final = curve[-last_evals:].mean()
    return float(final), float(stats.area_under_curve(curve, steps))


def whole_run_scores(runs: pd.DataFrame, random: Mapping[str, float],
                     reference: Mapping[str, float], task: str = "task",
                     last_evals: int = runs_.LAST_EVALS) -> pd.DataFrame:
    """`runs` (`runs.tidy`'s: curves NaN from a divergence on) with `score` and `auc`: `run_score`
    normalised by the `random` and `reference` return of its task (the column `task`), a run that
    diverged at all scoring 0 (`whole_run_fails`)."""
    values = [run_score(returns, steps, random[t], reference[t], last_evals, whole_run_fails=True)
              for t, returns, steps in zip(runs[task], runs["returns"], runs["steps"])]
    return runs.assign(score=[v[0] for v in values], auc=[v[1] for v in values])


def _raw(run, random: float, last_evals: int) -> tuple[float, float]:
    """(final, auc) of one run's returns, diverged evaluations at the random return."""
    return run_score(run.returns, run.steps, random, None, last_evals)


def raw(runs: pd.DataFrame, random: Mapping[str, float],
        last_evals: int = runs_.LAST_EVALS) -> pd.DataFrame:
    """`runs` with `raw_final`, `raw_auc`: final and AUC with a diverged run's evaluations
    counted at its task's random return (`random`: task → return)."""
    values = [_raw(r, random[r.task], last_evals) for r in runs.itertuples()]
    return runs.assign(raw_final=[v[0] for v in values], raw_auc=[v[1] for v in values])


def reference_of_method(runs: pd.DataFrame, random: Mapping[str, float], method: str,
                        last_evals: int = runs_.LAST_EVALS, **setting) -> pd.DataFrame:
    """Per task, `method`'s mean final and AUC over its runs at `setting` (e.g. k=0, K=4): the
    reference of the "same seeds" normalisation. Columns task, final, auc, seeds."""
    chosen = runs[runs["method"] == method]
    for name, value in setting.items():
        chosen = chosen[chosen[name] == value]
    chosen = raw(chosen, random, last_evals)
    return (chosen.groupby("task", sort=False)
            .agg(final=("raw_final", "mean"), auc=("raw_auc", "mean"), seeds=("seed", "nunique"))
            .reset_index())


def normalised(runs: pd.DataFrame, random: Mapping[str, float], reference: pd.DataFrame,
               last_evals: int = runs_.LAST_EVALS) -> pd.DataFrame:
    """`runs` with `final_score` and `auc_score`: each metric normalised by its task's random
    return and `reference` (columns task, final, auc). Tasks without a reference are refused."""
    missing = sorted(set(runs["task"]) - set(reference["task"]))
    if missing:
        raise ValueError(f"no reference for tasks {missing}: normalise only tasks it covers")
    scored = raw(runs, random, last_evals)
    ref = reference.set_index("task")
    rand = scored["task"].map(random)
    for metric in METRICS:
        scored[f"{metric}_score"] = stats.normalize(scored[f"raw_{metric}"].to_numpy(),
                                                    rand.to_numpy(),
                                                    scored["task"].map(ref[metric]).to_numpy())
    return scored
