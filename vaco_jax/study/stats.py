"""Statistics done right (SPEC §7), built on rliable (Agarwal et al., 2021).

Scores are normalised per env by measured references, `(R − R_random) / (R_ref − R_random)`, so 0 is
a uniformly random policy and 1 is synchronous PPO-Clip at the same budget. Aggregates over
envs × seeds — median, interquartile mean (IQM), mean and optimality gap — come with stratified
bootstrap 95% confidence intervals (seeds are resampled within each env). Also: probability of
improvement, normalised area under the curve (sample efficiency) and performance profiles.

Layout (rliable's): a score matrix is `[num_runs, num_tasks]` (runs = seeds, tasks = envs); curves
are `[num_runs, num_tasks, num_evals]`. rliable draws bootstrap indices from NumPy's *global* RNG,
so every function here takes a `seed` and restores the global state afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from rliable import library as rly
from rliable import metrics as rly_metrics

METRICS = ("median", "iqm", "mean", "optimality_gap")
"""The aggregate metrics, in the order `aggregate` returns them."""


# --- normalisation ------------------------------------------------------------------------------
def normalize(returns, random_return, reference_return):
    """`(R − R_random) / (R_ref − R_random)`: 0 = random policy, 1 = the reference (sync PPO-Clip).

    Broadcasts; raises if the reference is not better than random (the score would be meaningless
    or flip sign).
    """
    random_return = np.asarray(random_return, np.float64)
    reference_return = np.asarray(reference_return, np.float64)
    span = reference_return - random_return
    if np.any(~np.isfinite(span)) or np.any(span <= 0):
        raise ValueError(
            f"reference return {reference_return} must exceed the random-policy return "
            f"{random_return}: the normalised score (R − R_random) / (R_ref − R_random) needs a "
            f"positive span; re-measure the references at a budget where the reference learns")
    return (np.asarray(returns, np.float64) - random_return) / span


# --- aggregates ---------------------------------------------------------------------------------
def aggregate(scores: np.ndarray) -> np.ndarray:
    """`[median, IQM, mean, optimality gap]` of a `[num_runs, num_tasks]` score matrix.

    Median and mean are over per-task means (rliable's definition); IQM and optimality gap
    (threshold 1 = the reference) pool all runs × tasks.
    """
    return np.array([rly_metrics.aggregate_median(scores), rly_metrics.aggregate_iqm(scores),
                     rly_metrics.aggregate_mean(scores), rly_metrics.aggregate_optimality_gap(scores)])


@contextlib.contextmanager
def _numpy_seed(seed: int):
    """rliable resamples with `np.random.choice`: seed the global RNG, then put it back."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def interval_estimates(score_dict: Mapping[str, np.ndarray], *, reps: int = 2000, seed: int = 0,
                       confidence: float = 0.95) -> pd.DataFrame:
    """Median, IQM, mean and optimality gap with stratified bootstrap CIs, per method.

    `score_dict`: method → `[num_runs, num_tasks]` normalised scores (no NaNs).
    Returns a tidy table: method, metric, point, low, high.
    """
    _check_scores(score_dict)
    with _numpy_seed(seed):
        points, intervals = rly.get_interval_estimates(
            dict(score_dict), aggregate, reps=reps, confidence_interval_size=confidence)
    rows = [{"method": name, "metric": metric, "point": float(points[name][i]),
             "low": float(intervals[name][0, i]), "high": float(intervals[name][1, i])}
            for name in score_dict for i, metric in enumerate(METRICS)]
    return pd.DataFrame(rows)


def probability_of_improvement(score_dict: Mapping[str, np.ndarray], target: str,
                               baselines: Sequence[str] | None = None, *, reps: int = 2000,
                               seed: int = 0, confidence: float = 0.95) -> pd.DataFrame:
    """P(target > baseline): the probability that a run of `target` beats one of the baseline on a
    randomly chosen task (Mann–Whitney U / (n·m), averaged over tasks), with CIs from an independent
    stratified bootstrap of both methods' runs. Returns: target, baseline, point, low, high.
    """
    _check_scores(score_dict)
    baselines = [b for b in (baselines or score_dict) if b != target]
    pairs = {b: [score_dict[target], score_dict[b]] for b in baselines}
    with _numpy_seed(seed):
        points, intervals = rly.get_interval_estimates(
            pairs, rly_metrics.probability_of_improvement, reps=reps,
            confidence_interval_size=confidence)
    rows = []
    for b in baselines:
        low, high = np.ravel(intervals[b])
        rows.append({"target": target, "baseline": b, "point": float(points[b]),
                     "low": float(low), "high": float(high)})
    return pd.DataFrame(rows)


def area_under_curve(curves: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Normalised area under the learning curve: `(1 / t_N) ∫_0^{t_N} score(t) dt`.

    `curves [..., num_evals]` are normalised scores evaluated at `steps [num_evals]` (increasing,
    > 0). Evaluation i stands for the chunk `(t_{i−1}, t_i]` (t_0 = 0), a right Riemann sum; with
    equally spaced evaluations this is the mean over evaluations. In score units: 1 means "as
    good as the reference's final score, from the first step".
    """
    steps = np.asarray(steps, np.float64)
    if steps.ndim != 1 or steps.shape[0] != np.shape(curves)[-1] or np.any(np.diff(steps) <= 0) \
            or steps[0] <= 0:
        raise ValueError(f"steps must be increasing, positive and match the curves' last axis; "
                         f"got {steps} for curves of shape {np.shape(curves)}")
    widths = np.diff(steps, prepend=0.0)
    return np.asarray(curves, np.float64) @ widths / steps[-1]


def curve_estimates(curve_dict: Mapping[str, np.ndarray], *, metric: str = "iqm",
                    reps: int = 1000, seed: int = 0, confidence: float = 0.95) -> dict:
    """A metric (default IQM) at every evaluation, with stratified bootstrap CIs.

    `curve_dict`: method → `[num_runs, num_tasks, num_evals]`. Returns method → `(point [E],
    low [E], high [E])`.
    """
    index = METRICS.index(metric)

    def per_eval(curves):
        return np.array([aggregate(curves[..., t])[index] for t in range(curves.shape[-1])])

    _check_scores(curve_dict)
    with _numpy_seed(seed):
        points, intervals = rly.get_interval_estimates(
            dict(curve_dict), per_eval, reps=reps, confidence_interval_size=confidence)
    return {name: (points[name], intervals[name][0], intervals[name][1]) for name in curve_dict}


def performance_profiles(score_dict: Mapping[str, np.ndarray], taus: np.ndarray, *,
                         reps: int = 1000, seed: int = 0) -> dict:
    """Score distributions: the fraction of runs × tasks with a score above each τ, with CIs.

    Returns method → `(profile [len(taus)], low, high)`.
    """
    _check_scores(score_dict)
    with _numpy_seed(seed):
        profiles, cis = rly.create_performance_profile(dict(score_dict), np.asarray(taus), reps=reps)
    return {name: (profiles[name], cis[name][0], cis[name][1]) for name in score_dict}


def _check_scores(score_dict: Mapping[str, np.ndarray]) -> None:
    for name, scores in score_dict.items():
        scores = np.asarray(scores)
        if scores.ndim < 2 or scores.shape[0] < 1 or scores.shape[1] < 1:
            raise ValueError(f"scores of {name!r} must be [num_runs, num_tasks, ...]; "
                             f"got shape {scores.shape}")
        if not np.all(np.isfinite(scores)):
            raise ValueError(f"scores of {name!r} contain NaN or inf (a diverged run?) at "
                             f"[run, task] {np.argwhere(~np.isfinite(scores))[:5].tolist()}")
