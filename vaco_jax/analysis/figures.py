"""Generic figures that know no study: each draws rows of an estimates table (`estimands`), or
score matrices in rliable's layout, and returns the Matplotlib figure (saving is the caller's)."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from vaco_jax.analysis import stats


def setting_value(setting: str, column: str) -> float:
    """The value of `column` in a setting label (`estimands.label`: "k=8, K=4" → 8.0 for k)."""
    values = dict(part.split("=", 1) for part in setting.split(", "))
    return float(values[column])


def lines(estimates: pd.DataFrame, x: str, *, ylabel: str = "", title: str = ""):
    """One line per method of `estimates` (rows of one estimand, metric and task) over the
    setting column `x`, its interval a band."""
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for method, part in estimates.groupby("method", sort=True):
        part = part.assign(_x=[setting_value(s, x) for s in part["setting"]]).sort_values("_x")
        ax.plot(part["_x"], part["point"], marker="o", label=method)
        ax.fill_between(part["_x"], part["low"], part["high"], alpha=0.2)
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def ranked(estimates: pd.DataFrame, scores: Mapping[str, np.ndarray] | None = None, *,
           taus: np.ndarray | None = None, xlabel: str = "", reps: int = 1000, seed: int = 0):
    """Left: each method's point and interval (one row each of `estimates`), best on top. Right,
    with `scores` (method → `[seeds, tasks]`): rliable's performance profiles, the fraction of
    runs scoring above τ, with bootstrap bands."""
    order = estimates.sort_values("point", ascending=True)
    fig, axes = plt.subplots(1, 2 if scores else 1, figsize=(9 if scores else 4.5,
                                                           0.3 * len(order) + 1.5), squeeze=False)
    ax = axes[0][0]
    p, lo, hi = (order[c].to_numpy(np.float64) for c in ("point", "low", "high"))
    ax.errorbar(p, range(len(order)), xerr=np.abs(np.stack([p - lo, hi - p])), fmt="o", capsize=3)
    ax.set_yticks(range(len(order)), order["method"])
    ax.set_xlabel(xlabel)
    if scores:
        taus = np.linspace(0, 1.5, 31) if taus is None else taus
        for method, (profile, low, high) in stats.performance_profiles(
                scores, taus, reps=reps, seed=seed).items():
            axes[0][1].plot(taus, profile, label=method)
            axes[0][1].fill_between(taus, low, high, alpha=0.15)
        axes[0][1].set_xlabel("score τ")
        axes[0][1].set_ylabel("fraction of runs above τ")
        axes[0][1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


def curves(curves_by_method: Mapping[str, np.ndarray], steps: np.ndarray, *,
           metric: str = "iqm", reps: int = 1000, seed: int = 0, ylabel: str = ""):
    """Learning curves: per method (`[seeds, tasks, evaluations]`), `metric` over runs × tasks
    at each evaluation with its stratified bootstrap band (`stats.curve_estimates`)."""
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for method, (point, low, high) in stats.curve_estimates(
            curves_by_method, metric=metric, reps=reps, seed=seed).items():
        ax.plot(steps, point, label=method)
        ax.fill_between(steps, low, high, alpha=0.2)
    ax.set_xlabel("environment steps")
    ax.set_ylabel(ylabel or metric)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
