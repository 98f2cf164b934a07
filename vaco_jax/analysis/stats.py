"""Statistics done right (SPEC §7), built on rliable (Agarwal et al., 2021).

Scores are normalised per env by measured references, `(R − R_random) / (R_ref − R_random)`, so 0 is
a uniformly random policy and 1 is synchronous PPO-Clip at the same budget. Aggregates over
envs × seeds — median, interquartile mean (IQM), mean and optimality gap — come with stratified
bootstrap 95% confidence intervals (seeds are resampled within each env). Also: probability of
improvement, normalised area under the curve (sample efficiency) and performance profiles. For
paired comparisons of any statistic (seeds as common random numbers across conditions), a
stratified BCa bootstrap: `stratified_bootstrap`, `stratified_bca`.

Layout (rliable's): a score matrix is `[num_runs, num_tasks]` (runs = seeds, tasks = envs); curves
are `[num_runs, num_tasks, num_evals]`. rliable draws bootstrap indices from NumPy's *global* RNG,
so every function here takes a `seed` and restores the global state afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from rliable import library as rly
from rliable import metrics as rly_metrics
from scipy.special import ndtr, ndtri

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
def iqm(scores: np.ndarray) -> float:
    """The interquartile mean of all runs × tasks: rliable's `aggregate_iqm` (SciPy's
    `trim_mean(scores, 0.25, axis=None)`) computed the same way, value for value, without SciPy's
    per-call argument handling, which made it about 15× slower (the bootstrap calls it thousands
    of times per interval; `tests/test_stats.py` checks the two agree exactly)."""
    flat = np.asarray(scores).ravel()
    low = int(0.25 * flat.size)
    high = flat.size - low
    return np.mean(np.partition(flat, (low, high - 1))[low:high])


def task_iqm_mean(scores: np.ndarray) -> float:
    """The mean over tasks of each task's IQM over runs: every task weighs the same."""
    scores = np.asarray(scores)
    return float(np.mean([iqm(scores[:, task]) for task in range(scores.shape[1])]))


AGGREGATES = {"median": rly_metrics.aggregate_median, "iqm": iqm,
              "mean": rly_metrics.aggregate_mean,
              "optimality_gap": rly_metrics.aggregate_optimality_gap,
              "task_iqm_mean": task_iqm_mean}
"""Each of `METRICS` (and the mean of per-task IQMs) of a `[num_runs, num_tasks]` score matrix."""


def aggregate(scores: np.ndarray, metrics: Sequence[str] = METRICS) -> np.ndarray:
    """`[median, IQM, mean, optimality gap]` (or those of `metrics`) of a `[num_runs, num_tasks]`
    score matrix.

    Median and mean are over per-task means (rliable's definition); IQM and optimality gap
    (threshold 1 = the reference) pool all runs × tasks.
    """
    return np.array([AGGREGATES[metric](scores) for metric in metrics])


def improvement_probability(scores_x: np.ndarray, scores_y: np.ndarray) -> float:
    """P(X > Y) averaged over tasks: rliable's `probability_of_improvement` (per task, the
    Mann–Whitney U of X's runs against Y's ÷ (n·m), ties counting ½), computed by counting the
    pairs at once; the same value exactly, without one SciPy test per task (about 100× faster;
    `tests/test_stats.py` checks the two agree)."""
    x, y = np.asarray(scores_x)[:, None, :], np.asarray(scores_y)[None, :, :]
    pairs = (x > y).sum(axis=(0, 1)) + 0.5 * (x == y).sum(axis=(0, 1))
    return np.mean(pairs / (x.shape[0] * y.shape[1]))


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
                       confidence: float = 0.95, metrics: Sequence[str] = METRICS) -> pd.DataFrame:
    """Median, IQM, mean and optimality gap (or those of `metrics`) with stratified bootstrap
    CIs, per method. The resamples do not depend on the metrics, so one metric's rows are the
    same whether it is computed alone or among others (alone is cheaper: the IQM alone takes
    about a third of the time of all four).

    `score_dict`: method → `[num_runs, num_tasks]` normalised scores (no NaNs).
    Returns a tidy table: method, metric, point, low, high.
    """
    _check_scores(score_dict)
    unknown = [m for m in metrics if m not in AGGREGATES]
    if unknown or not metrics:
        raise ValueError(f"metrics {list(metrics)!r}: each must be one of {', '.join(METRICS)}")
    with _numpy_seed(seed):
        points, intervals = rly.get_interval_estimates(
            dict(score_dict), functools.partial(aggregate, metrics=tuple(metrics)), reps=reps,
            confidence_interval_size=confidence)
    rows = [{"method": name, "metric": metric, "point": float(points[name][i]),
             "low": float(intervals[name][0, i]), "high": float(intervals[name][1, i])}
            for name in score_dict for i, metric in enumerate(metrics)]
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
            pairs, improvement_probability, reps=reps,
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


# --- stratified BCa bootstrap ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Bootstrap:
    """A statistic's stratified bootstrap distribution with its BCa corrections (Efron &
    Tibshirani 1993, §14.3; Davison & Hinkley 1997, §3.2 for strata).

    `point [*S]` is the statistic of the data, `distribution [reps, *S]` its value on each
    resample, `bias_correction` (z₀) and `acceleration` (a, from the jackknife) are `[*S]`.
    """

    point: np.ndarray
    distribution: np.ndarray
    bias_correction: np.ndarray
    acceleration: np.ndarray

    def interval(self, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """The two-sided BCa interval `(low [*S], high [*S])` at level `confidence`.

        NaN where some resample's statistic is not finite (e.g. a ratio whose denominator a
        resample drives to zero): the interval is then undefined, not narrower.
        """
        if not 0 < confidence < 1:
            raise ValueError(f"confidence = {confidence} is invalid: must be in (0, 1)")
        z_tail = ndtri((1 - confidence) / 2)
        ends = []
        for z in (z_tail, -z_tail):
            shifted = self.bias_correction + z
            with np.errstate(invalid="ignore"):   # z₀ = ±inf (no resample on one side): NaN
                level = ndtr(self.bias_correction + shifted / (1 - self.acceleration * shifted))
            ends.append(_quantiles(self.ordered, level))
        return ends[0], ends[1]

    @functools.cached_property
    def ordered(self) -> np.ndarray:
        """The distribution sorted along its resamples (NaN last), for every interval."""
        return np.sort(self.distribution, axis=0)


TIE_TOLERANCE = 1e-12
"""Two bootstrap statistics closer than this, relative to the distribution's largest magnitude,
are equal: rounding in the last bits, not a difference."""


def stratified_bootstrap(strata: Sequence[np.ndarray], statistic: Callable, *, reps: int = 10_000,
                         seed: int = 0, vectorized: bool = False,
                         batch: int = 10_000) -> Bootstrap:
    """Resample the rows of every stratum (with replacement, within that stratum) `reps` times.

    `strata`: arrays `[n_i, ...]` whose rows are the resampled units (seeds of one task); put
    everything measured on one seed in its row (e.g. `[n_seeds, conditions]`) so that a comparison
    resamples seeds *paired*. `statistic(strata) -> scalar or [*S]`; with `vectorized`, it takes
    arrays `[batch, n_i, ...]` and returns `[batch, *S]` (one call per `batch` resamples, which
    bounds the memory of the resampled arrays).
    Stratum i's indices are `default_rng(seed).integers(0, n_i, (reps, n_i))`, drawn in order.
    """
    strata = [np.asarray(s, np.float64) for s in strata]
    short = [s.shape for s in strata if s.ndim < 1 or s.shape[0] < 2]
    if not strata or short:
        raise ValueError(f"every stratum needs at least 2 rows (the jackknife leaves one out); got "
                         f"shapes {[s.shape for s in strata]}")
    if reps < 1:
        raise ValueError(f"reps = {reps} is invalid: must be at least 1")

    def batched(arrays):   # statistic over a leading batch axis: [batch, *S]
        if vectorized:
            return np.asarray(statistic(arrays), np.float64)
        return np.stack([np.asarray(statistic([a[b] for a in arrays]), np.float64)
                         for b in range(arrays[0].shape[0])])

    rng = np.random.default_rng(seed)
    indices = [rng.integers(0, s.shape[0], (reps, s.shape[0])) for s in strata]
    distribution = np.concatenate([
        batched([s[i[start:start + batch]] for s, i in zip(strata, indices)])
        for start in range(0, reps, max(batch, 1))])
    point = batched([s[None] for s in strata])[0]

    # z₀ counts a resample whose statistic ties the data's as half below: a tie is equal up to
    # rounding (`TIE_TOLERANCE` of the distribution's scale), as a resample that permutes a
    # stratum's rows is, whose float sum may round either side of the data's.
    values = np.concatenate([distribution, point[None]])
    scale = np.max(np.where(np.isfinite(values), np.abs(values), 0.0), axis=0)
    with np.errstate(invalid="ignore"):
        tie = np.abs(distribution - point) <= TIE_TOLERANCE * scale
        below = 2 * ((distribution < point) & ~tie).sum(0) + tie.sum(0)
    bias_correction = ndtri(below / (2 * reps))

    # Jackknife influence values within each stratum, U_ij = (n_i − 1)(θ̄_(i·) − θ_(ij)).
    cubes, squares = 0.0, 0.0
    for i, s in enumerate(strata):
        n = s.shape[0]
        keep = ~np.eye(n, dtype=bool)
        left_out = [np.broadcast_to(t[None], (n,) + t.shape) for t in strata]
        left_out[i] = np.stack([s[row] for row in keep])
        values = batched(left_out)
        influence = (n - 1) * (values.mean(0) - values)
        cubes = cubes + (influence ** 3).sum(0) / n ** 3
        squares = squares + (influence ** 2).sum(0) / n ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        acceleration = np.where(squares > 0, cubes / (6 * squares ** 1.5), 0.0)
    return Bootstrap(point, distribution, bias_correction, acceleration)


def stratified_bca(strata: Sequence[np.ndarray], statistic: Callable, reps: int = 10_000,
                   seed: int = 0, confidence: float = 0.95, *,
                   vectorized: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(point, low, high)`: the statistic and its stratified BCa interval at `confidence`
    (`stratified_bootstrap`; on one stratum of paired samples this is SciPy's
    `bootstrap(..., method="BCa", paired=True)`)."""
    boot = stratified_bootstrap(strata, statistic, reps=reps, seed=seed, vectorized=vectorized)
    low, high = boot.interval(confidence)
    return boot.point, low, high


def _quantiles(ordered: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Column-wise quantiles `[*S]` of a distribution `ordered [reps, *S]` (sorted along reps) at
    `levels [*S]`, interpolated linearly between order statistics (NumPy's default method); NaN
    where a column holds a non-finite value or its level is NaN."""
    reps = ordered.shape[0]
    levels = np.broadcast_to(np.asarray(levels, np.float64), ordered.shape[1:])
    defined = np.isfinite(levels) & np.all(np.isfinite(ordered), axis=0)
    position = np.where(defined, levels, 0.0) * (reps - 1)
    low = np.clip(np.floor(position).astype(np.int64), 0, reps - 1)
    high = np.minimum(low + 1, reps - 1)
    below = np.take_along_axis(ordered, low[None], axis=0)[0]
    above = np.take_along_axis(ordered, high[None], axis=0)[0]
    with np.errstate(invalid="ignore"):   # inf − inf in columns that are reported as NaN
        value = below + (position - low) * (above - below)
    return np.where(defined, value, np.nan)


# --- paired tests -------------------------------------------------------------------------------
EXACT_SIGN_FLIPS = 16   # up to 2**16 sign patterns are enumerated; more are sampled
MOST_EXACT_SIGN_FLIPS = 24   # `exact=True` enumerates up to 2**24 patterns, in two halves


def _finite_and_mean(differences) -> tuple[np.ndarray, float]:
    """The finite differences and their mean (NaN if none)."""
    d = np.asarray(differences, np.float64)
    d = d[np.isfinite(d)]
    return d, float(d.mean()) if d.size else float("nan")


def _sign_patterns(n: int, samples: int, seed: int, exact: bool = False) -> tuple[np.ndarray, bool]:
    """The sign patterns of the sign-flip test: all 2**n (exact) for n ≤ `EXACT_SIGN_FLIPS` or
    when `exact` (up to `MOST_EXACT_SIGN_FLIPS`), else `samples` random ones; and whether they are
    exact."""
    if n <= EXACT_SIGN_FLIPS:
        return _all_signs(n), True
    if exact and n <= MOST_EXACT_SIGN_FLIPS:
        return None, True            # enumerated in two halves (`_split_sign_flip_p`)
    return np.random.default_rng(seed).choice((-1.0, 1.0), size=(samples, n)), False


@functools.lru_cache(maxsize=4)
def _all_signs(n: int) -> np.ndarray:
    patterns = (((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1) * 2 - 1).astype(np.float64)
    patterns.flags.writeable = False
    return patterns


def _split_sign_flip_p(d: np.ndarray, threshold: float) -> float:
    """The share of all 2**n sign patterns s with |s·d| / n ≥ `threshold`, counted exactly by
    meeting in the middle: the 2**(n/2) signed sums of each half, one half sorted, so a pattern
    is a pair (a, b) with |a + b| ≥ n × threshold."""
    n, h = d.size, d.size // 2
    a = _all_signs(h) @ d[:h]
    b = np.sort(_all_signs(n - h) @ d[h:])
    t = n * threshold
    if t <= 0:
        return 1.0
    hits = (b.size - np.searchsorted(b, t - a, side="left")) + np.searchsorted(b, -t - a,
                                                                             side="right")
    return float(hits.sum() / 2 ** n)


def _sign_flip_p(d: np.ndarray, patterns: np.ndarray | None, exact: bool) -> float:
    observed = abs(d.mean())
    tolerance = 1e-12 * max(1.0, np.abs(d).max())
    if patterns is None:
        return _split_sign_flip_p(d, observed - tolerance)
    hits = np.sum(np.abs(patterns @ d) / d.size >= observed - tolerance)
    return float(hits / len(patterns)) if exact else float((hits + 1) / (len(patterns) + 1))


def sign_flip_test(differences, *, samples: int = 200_000, seed: int = 0,
                   exact: bool = False) -> float:
    """Two-sided p-value of the paired permutation (sign-flip) test that the mean of `differences`
    (one per seed: method A − method B on the same seed) is 0.

    Under the null each difference is as likely to have either sign; the p-value is the fraction
    of the 2**n sign patterns whose |mean| is at least the observed one (exact for n ≤
    `EXACT_SIGN_FLIPS`, or with `exact` up to `MOST_EXACT_SIGN_FLIPS`; else estimated from
    `samples` random patterns, the observed one counted). The smallest p-value n seeds can give is
    2 / 2**n (0.0625 at n = 5, 0.002 at n = 10).
    """
    d = np.asarray(differences, np.float64)
    d = d[np.isfinite(d)]
    if d.size == 0:
        return float("nan")
    return _sign_flip_p(d, *_sign_patterns(d.size, samples, seed, exact))


def sign_flip_interval(differences, confidence: float = 0.95, *, samples: int = 200_000,
                       seed: int = 0, exact: bool = False) -> tuple[float, float, float]:
    """(mean, low, high): the mean of paired differences and the interval of shifts Δ that the
    sign-flip test of `differences − Δ` does not reject at 1 − `confidence` (p ≥ 1 − confidence).

    Inverting the test makes the interval agree with it: 0 lies outside exactly when the test's p
    at 0 is below 1 − confidence, which a Student-t interval beside the test does not promise on
    skewed few-seed differences. The ends are found by bisection between the mean (p = 1) and the
    extreme differences, where p is its floor 2 / 2**n: with so few seeds that the floor itself is
    not below 1 − confidence (n ≤ 5 at 95%) no shift is rejected and the ends are ∓inf. The same
    patterns (exact or seeded) serve every Δ, so the ends are reproducible.
    """
    d, mean = _finite_and_mean(differences)
    n = d.size
    if n < 2:
        return mean, float("nan"), float("nan")
    patterns, exact = _sign_patterns(n, samples, seed, exact)
    alpha = 1.0 - confidence

    def kept(shift: float) -> bool:
        return _sign_flip_p(d - shift, patterns, exact) >= alpha

    span = float(d.max() - d.min()) or max(1.0, abs(mean))

    def end(direction: float) -> float:
        inside, outside = mean, mean + direction * span
        if kept(outside):                       # beyond every difference: the p-value's floor
            return direction * float("inf")
        for _ in range(100):
            middle = 0.5 * (inside + outside)
            if middle in (inside, outside):
                break
            inside, outside = (middle, outside) if kept(middle) else (inside, middle)
        return inside

    return mean, end(-1.0), end(1.0)


def paired_t_interval(differences, confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the mean of paired differences and its Student-t interval."""
    from scipy import stats as scipy_stats

    d, mean = _finite_and_mean(differences)
    n = d.size
    if n < 2:
        return mean, float("nan"), float("nan")
    half = scipy_stats.t.ppf(0.5 + confidence / 2, n - 1) * d.std(ddof=1) / np.sqrt(n)
    return mean, float(mean - half), float(mean + half)


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control), in the input's order; a
    NaN p-value is left out of the family and stays NaN."""
    p = np.asarray(p_values, np.float64)
    adjusted = np.full_like(p, np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    m = finite.size
    running = 0.0
    for rank, index in enumerate(finite[np.argsort(p[finite], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[index]))
        adjusted[index] = running
    return adjusted
