"""The sweep's figures (SPEC §7), drawn from `vaco_jax.study.capacity` tables with matplotlib.

(a) `aggregate_intervals`: the paper's Figure-3 style interval plot (median, IQM, mean,
    optimality gap with 95% CIs), one row per capacity;
(b) `metric_vs_capacity`: normalised IQM (or another metric) vs capacity, one line per method;
(c) `training_curves`: eval return vs env steps per env × capacity (IQM over seeds, 95% CI);
(d) `lag_diagnostics`: VACO's filtered fraction vs the baselines' clip fraction, and the TV
    estimate, vs capacity;
(e) `sensitivity`: (b) for the δ sweep and for the ablations, side by side;
(f) `run_diagnostics`: one training run's lag diagnostics (docs/diagnostics.md) per algorithm;
plus `improvement` (probability of improvement) and `performance_profiles`. The studies draw
their own figures (`lag`, `settings`, `scorecard`, `leaderboard`); this module imports none of them.
Every function returns a `matplotlib.figure.Figure`; a `title` (budget, seeds) is the caller's.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from vaco_jax import algorithms
from vaco_jax.study import stats
from vaco_jax.study.capacity import METRIC_NAMES, without_diverged



PREFERRED = ["vaco", "ppo_clip", "ppo_kl", "spo", "impala"]


def _interval_bars(ax, table, column, names, colors):
    """One horizontal bar per name (row y = its index): the CI as a bar, the point as a tick."""
    for y, name in enumerate(names):
        row = table[table[column] == name]
        if row.empty:
            continue
        row = row.iloc[0]
        ax.barh(y, row["high"] - row["low"], left=row["low"], height=0.6, color=colors[name],
                alpha=0.75)
        ax.vlines(row["point"], y - 0.3, y + 0.3, color="k", lw=1.2)


def _colors(methods: Sequence[str]) -> dict[str, tuple]:
    """The five algorithms keep their colour in every figure; other methods follow."""
    palette = plt.get_cmap("tab10")
    others = [m for m in methods if m not in PREFERRED]
    colors = {m: palette(i) for i, m in enumerate(PREFERRED)}
    colors.update({m: palette((len(PREFERRED) + i) % 10) for i, m in enumerate(others)})
    return {m: colors[m] for m in methods}


def _methods(table: pd.DataFrame) -> list[str]:
    found = list(dict.fromkeys(table["method"]))
    return [m for m in PREFERRED if m in found] + sorted(m for m in found if m not in PREFERRED)


def aggregate_intervals(table: pd.DataFrame, metrics: Sequence[str] = stats.METRICS,
                        title: str = ""):
    """(a) One row per capacity, one panel per metric: a bar per method from low to high CI."""
    capacities = sorted(table["capacity"].unique())
    methods = _methods(table)
    colors = _colors(methods)
    fig, axes = plt.subplots(len(capacities), len(metrics), squeeze=False,
                             figsize=(3.2 * len(metrics), 0.45 * len(methods) * len(capacities) + 1.2),
                             sharex="col")
    for r, capacity in enumerate(capacities):
        for c, metric in enumerate(metrics):
            ax = axes[r, c]
            sub = table[(table["capacity"] == capacity) & (table["metric"] == metric)]
            _interval_bars(ax, sub, "method", methods, colors)
            ax.set_yticks(range(len(methods)))
            ax.set_yticklabels(methods if c == 0 else [])
            ax.grid(axis="x", alpha=0.3)
            if r == 0:
                ax.set_title(METRIC_NAMES[metric])
            if c == 0:
                ax.set_ylabel(f"C = {capacity}")
    for ax in axes[-1]:
        ax.set_xlabel("normalised score")
    fig.suptitle(title or "Aggregate normalised scores (95% stratified bootstrap CIs)", fontsize=10)
    fig.tight_layout()
    return fig


def metric_vs_capacity(table: pd.DataFrame, metric: str = "iqm", title: str = "", ax=None):
    """(b) A metric vs capacity, one line per method with its 95% CI band (log₂ capacity axis)."""
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 4.5))
    sub = table[table["metric"] == metric]
    colors = _colors(_methods(sub))
    for method in _methods(sub):
        rows = sub[sub["method"] == method].sort_values("capacity")
        ax.plot(rows["capacity"], rows["point"], "o-", color=colors[method], label=method)
        ax.fill_between(rows["capacity"], rows["low"], rows["high"], color=colors[method], alpha=0.2)
    ax.set_xscale("log", base=2)
    capacities = sorted(sub["capacity"].unique())
    ax.set_xticks(capacities)
    ax.set_xticklabels([str(c) for c in capacities])
    ax.set_xlabel("buffer capacity C (policy lag)")
    ax.set_ylabel(f"normalised {METRIC_NAMES[metric]}")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or f"Normalised {METRIC_NAMES[metric]} vs capacity (95% CIs)", fontsize=9)
    if fig is not None:
        fig.tight_layout()
    return fig if fig is not None else ax.figure


def training_curves(results: pd.DataFrame, value: str = "eval_return", *, reps: int = 500,
                    seed: int = 0, title: str = ""):
    """(c) `value` vs env steps, one panel per env × capacity; IQM over seeds with 95% CIs."""
    envs = sorted(results["env"].unique())
    capacities = sorted(results["capacity"].unique())
    methods = _methods(results)
    colors = _colors(methods)
    fig, axes = plt.subplots(len(envs), len(capacities), squeeze=False,
                             figsize=(4 * len(capacities), 3.2 * len(envs)), sharey="row")
    for r, env in enumerate(envs):
        for c, capacity in enumerate(capacities):
            ax = axes[r, c]
            sub = results[(results["env"] == env) & (results["capacity"] == capacity)]
            curves = {}
            for method, group in sub.groupby("method"):
                group = without_diverged(group)   # no result after its divergence
                wide = group.pivot(index="seed", columns="step", values=value)
                curves[method] = wide.to_numpy(np.float64)[:, None, :]   # [seeds, 1 task, evals]
                steps = wide.columns.to_numpy()
            estimates = stats.curve_estimates(curves, reps=reps, seed=seed) if curves else {}
            for method in methods:
                if method not in estimates:
                    continue
                point, low, high = estimates[method]
                ax.plot(steps, point, color=colors[method], label=method)
                ax.fill_between(steps, low, high, color=colors[method], alpha=0.2)
            ax.set_title(f"{env}, C = {capacity}", fontsize=10)
            ax.grid(alpha=0.3)
            if r == len(envs) - 1:
                ax.set_xlabel("env steps per run")
            if c == 0:
                ax.set_ylabel(f"{value} (IQM over seeds)")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title or "Training curves (IQM over seeds, 95% CIs)", fontsize=10)
    fig.tight_layout()
    return fig


def _mean_ci(values: np.ndarray) -> tuple[float, float, float]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return np.nan, np.nan, np.nan
    half = 1.96 * values.std(ddof=1) / np.sqrt(values.size) if values.size > 1 else 0.0
    return values.mean(), values.mean() - half, values.mean() + half


def lag_diagnostics(results: pd.DataFrame, title: str = ""):
    """(d) Per env (rows): the fraction of samples VACO-style objectives filter and PPO-style
    objectives clip (other objectives: the fraction outside 1 ± ε, a diagnostic only) vs capacity,
    and the TV estimate `½ mean |π_θ/β − 1|` vs capacity. Each point: mean over a run's training
    (all evaluations), then mean over seeds ± 1.96 standard errors.
    """
    envs = sorted(results["env"].unique())
    methods = _methods(results)
    colors = _colors(methods)
    objective = {m: algorithms.parse(a).objective.name
                 for m, a in zip(results["method"], results["algo"])}
    per_run = results.groupby(["env", "method", "capacity", "seed"])[
        ["filtered_fraction", "clip_fraction", "tv_estimate"]].mean().reset_index()
    capacities = sorted(per_run["capacity"].unique())
    fig, axes = plt.subplots(len(envs), 2, squeeze=False, figsize=(11, 3.8 * len(envs) + 0.6))
    for r, env in enumerate(envs):
        for method in methods:
            rows = per_run[(per_run["env"] == env) & (per_run["method"] == method)]
            if rows.empty:
                continue
            if objective[method] == "tv_filter":
                column, name, style = "filtered_fraction", f"{method}: filtered", "o-"
            elif objective[method] == "ppo_clip":
                column, name, style = "clip_fraction", f"{method}: clipped", "s--"
            else:
                column, name, style = "clip_fraction", f"{method}: |w−1| > ε", "^:"
            for c, col, label in ((0, column, name), (1, "tv_estimate", method)):
                mean, low, high = np.array([_mean_ci(rows[rows["capacity"] == k][col].to_numpy())
                                            for k in capacities]).T
                axes[r, c].plot(capacities, mean, style if c == 0 else "o-", color=colors[method],
                                label=label)
                axes[r, c].fill_between(capacities, low, high, color=colors[method], alpha=0.15)
        for c, ylabel in ((0, "fraction of samples"), (1, "TV estimate ½ mean |π_θ/β − 1|")):
            ax = axes[r, c]
            ax.set_xscale("log", base=2)
            ax.set_xticks(capacities)
            ax.set_xticklabels([str(k) for k in capacities])
            ax.set_xlabel("buffer capacity C")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.set_title(f"{env}: " + ("filtered vs clipped" if c == 0 else "measured divergence"),
                         fontsize=10)
            ax.legend(fontsize=7)
    fig.suptitle(title or "Filtering vs clipping, and the measured divergence, vs capacity",
                 fontsize=10)
    fig.tight_layout()
    return fig


def run_diagnostics(runs: dict[str, list[dict]], title: str = ""):
    """(f) The lag diagnostics of training runs (`metrics.jsonl` rows, one list per run, keyed by
    its label), side by side: the update-age histogram (share of sample uses per bin, over the
    whole run), `tv_backward` (solid) and `tv_forward` (dashed) over training, the objective's
    `intervened_fraction` (with `ratio_clip_fraction`, |w − 1| > ε, dotted) and `eval_return`.
    Every value is the mean over the run's seeds."""
    colors = _colors(list(runs))
    fig, (ax_age, ax_tv, ax_int, ax_ret) = plt.subplots(1, 4, figsize=(18, 3.8))

    def seed_mean(rows, name):
        return np.array([np.nanmean(row[name]) if name in row else np.nan for row in rows])

    width = 0.8 / max(len(runs), 1)
    for i, (label, rows) in enumerate(runs.items()):
        c = colors[label]
        steps = np.array([row["step"] for row in rows])
        bins = sorted((tuple(int(x) for x in name.split("_")[-2:]), name) for name in rows[0]
                      if name.startswith("update_age_hist_"))
        shares = [np.nanmean(seed_mean(rows, name)) for _, name in bins]
        x = np.arange(len(bins)) + (i - (len(runs) - 1) / 2) * width
        mean_age = np.nanmean(seed_mean(rows, "update_age_mean"))
        ax_age.bar(x, shares, width, color=c, label=f"{label} (mean {mean_age:.0f})")
        ax_age.set_xticks(np.arange(len(bins)),
                          [str(lo) if lo == hi else f"{lo}–{hi}" for (lo, hi), _ in bins],
                          rotation=45, fontsize=7)
        ax_tv.plot(steps, seed_mean(rows, "tv_backward"), "-", color=c, label=f"{label}: backward")
        ax_tv.plot(steps, seed_mean(rows, "tv_forward"), "--", color=c, label=f"{label}: forward")
        ax_int.plot(steps, seed_mean(rows, "intervened_fraction"), "-", color=c,
                    label=f"{label}: intervened")
        ax_int.plot(steps, seed_mean(rows, "ratio_clip_fraction"), ":", color=c,
                    label=f"{label}: |w − 1| > ε")
        ax_ret.plot(steps, seed_mean(rows, "eval_return"), "-", color=c, label=label)
    ax_age.set_xlabel("update age (optimiser steps since the behaviour policy)")
    ax_age.set_ylabel("share of sample uses")
    ax_tv.set_ylabel("TV estimate (solid: backward, dashed: forward)")
    ax_int.set_ylabel("fraction of samples")
    ax_ret.set_ylabel("eval return")
    for ax in (ax_tv, ax_int, ax_ret):
        ax.set_xlabel("env steps per seed")
    for ax in (ax_age, ax_tv, ax_int, ax_ret):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title or "Lag diagnostics", fontsize=10)
    fig.tight_layout()
    return fig


def sensitivity(delta_table: pd.DataFrame | None, ablation_table: pd.DataFrame | None,
                metric: str = "iqm", title: str = ""):
    """(e) Normalised metric vs capacity for the δ sweep (left) and the ablations (right)."""
    panels = [(t, name) for t, name in ((delta_table, "VACO: δ sensitivity"),
                                       (ablation_table, "Align vs Filter, filter switches"))
              if t is not None and not t.empty]
    fig, axes = plt.subplots(1, max(len(panels), 1), squeeze=False, figsize=(6 * max(len(panels), 1), 4.2))
    for ax, (table, name) in zip(axes[0], panels):
        metric_vs_capacity(table, metric, title=name, ax=ax)
    fig.suptitle(title or f"Sensitivity and ablations (normalised {METRIC_NAMES[metric]}, 95% CIs)",
                 fontsize=10)
    fig.tight_layout()
    return fig


def improvement(table: pd.DataFrame, title: str = ""):
    """P(target > baseline) with 95% CIs; one panel per capacity."""
    capacities = sorted(table["capacity"].unique())
    baselines = list(dict.fromkeys(table["baseline"]))
    colors = _colors(baselines)
    fig, axes = plt.subplots(1, len(capacities), squeeze=False, sharey=True,
                             figsize=(3.3 * len(capacities), 0.5 * len(baselines) + 1.5))
    for ax, capacity in zip(axes[0], capacities):
        sub = table[table["capacity"] == capacity]
        _interval_bars(ax, sub, "baseline", baselines, colors)
        ax.axvline(0.5, color="grey", ls=":")
        ax.set_xlim(0, 1)
        ax.set_yticks(range(len(baselines)))
        ax.set_yticklabels(baselines)
        ax.set_title(f"C = {capacity}")
        ax.set_xlabel(f"P({table['target'].iloc[0]} > baseline)")
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(title or "Probability of improvement (95% CIs)", fontsize=10)
    fig.tight_layout()
    return fig


def performance_profiles(profile: dict, taus: np.ndarray, title: str = ""):
    """Fraction of runs with normalised score > τ, per method, with 95% CI bands."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    methods = [m for m in _methods(pd.DataFrame({"method": list(profile)}))]
    colors = _colors(methods)
    for method in methods:
        point, low, high = profile[method]
        ax.plot(taus, point, color=colors[method], label=method)
        ax.fill_between(taus, low, high, color=colors[method], alpha=0.2)
    ax.set_xlabel("normalised score τ")
    ax.set_ylabel("fraction of runs with score > τ")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "Performance profiles", fontsize=9)
    fig.tight_layout()
    return fig
