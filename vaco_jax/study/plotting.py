"""The sweep's figures (SPEC §7), drawn from `vaco_jax.study.analysis` tables with matplotlib.

(a) `aggregate_intervals`: the paper's Figure-3 style interval plot (median, IQM, mean,
    optimality gap with 95% CIs), one row per capacity;
(b) `metric_vs_capacity`: normalised IQM (or another metric) vs capacity, one line per method;
(c) `training_curves`: eval return vs env steps per env × capacity (IQM over seeds, 95% CI);
(d) `lag_diagnostics`: VACO's filtered fraction vs the baselines' clip fraction, and the TV
    estimate, vs capacity;
(e) `sensitivity`: (b) for the δ sweep and for the ablations, side by side;
(f) `run_diagnostics`: one training run's lag diagnostics (docs/diagnostics.md) per algorithm;
plus `improvement` (probability of improvement) and `performance_profiles`; the lag benchmark's
scorecard and leaderboard; and the controlled-lag study's report (`save_lag_figures`).
Every function returns a `matplotlib.figure.Figure`; a `title` (budget, seeds) is the caller's.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import EngFormatter, NullFormatter
import numpy as np
import pandas as pd

from vaco_jax import algorithms
from vaco_jax.study import analysis, lag, stats

METRIC_NAMES = analysis.METRIC_NAMES


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
                group = analysis.without_diverged(group)   # no result after its divergence
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


# --- the lag benchmark ----------------------------------------------------------------------------
BENCH_REFERENCES = ("ppo_clip", "appo", "vaco")


def scorecard_figure(card, leaderboard: dict, reps: int = 2000):
    """A scorecard's figure: final and AUC retention (pooled over tasks, or the one task) vs the
    constant lag, the method in black with its 95% CI, the protocol's reference methods in colour,
    and the high-update-frequency setting as a marker to the right of the axis."""
    from vaco_jax.study import scorecard as sc

    proto = card.protocol
    tables = {card.method: card.retention}
    for name in proto.references:
        if name in leaderboard and name != card.method:
            tables[name] = sc.retention(leaderboard[name], proto, reps=reps)
    task = "pooled" if len(proto.tasks) > 1 else proto.tasks[0].env
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.6), sharey=True)
    lags = [k for k in proto.lags if k > 0]
    forward_x = max(lags) * 1.35 + 1
    colors = dict(zip(proto.references, plt.get_cmap("tab10").colors[:len(proto.references)]))
    for ax, metric in zip(axes, ("final", "auc")):
        for name, table in tables.items():
            rows = table[(table.task == task) & (table.metric == metric)]
            lag_rows = rows[rows.setting == "lag"].sort_values("lag")
            color = "k" if name == card.method else colors.get(name, "grey")
            width = 2.2 if name == card.method else 1.2
            xs = [0] + list(lag_rows.lag)
            ax.plot(xs, [1.0] + list(lag_rows.retention), marker="o", color=color, lw=width,
                    label=name)
            if name == card.method:
                ax.fill_between(lag_rows.lag, lag_rows.low, lag_rows.high, color=color, alpha=0.15)
            forward = rows[(rows.setting == "forward") & (rows.lag == max(proto.forward_lags))]
            for r in forward.itertuples():
                ax.errorbar(forward_x, r.retention, yerr=[[r.retention - r.low], [r.high - r.retention]],
                            fmt="s", color=color, capsize=3)
        ax.axhline(sc.BREAK_LEVEL, color="grey", ls=":", lw=1)
        ax.set_xticks([0] + lags + [forward_x])
        forward = ", ".join(f"{k}={v}" for k, v in proto.forward)
        ax.set_xticklabels([str(k) for k in [0] + lags] + [f"{forward}\n(k={max(proto.forward_lags)})"])
        ax.set_xlabel("constant lag k (learner iterations)")
        ax.set_title(f"{'final score' if metric == 'final' else 'AUC'} retention ({task})")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("score at k ÷ score at k = 0")
    axes[1].legend(fontsize=8, loc="best")
    fig.suptitle(f"{card.method} on protocol {proto.name} v{proto.version}")
    fig.tight_layout()
    return fig


def leaderboard_figure(table: pd.DataFrame):
    """The leaderboard: each method's final-score retention at the protocol's largest lag (and in
    the high-update-frequency setting) with 95% CIs, best first."""
    table = table.sort_values("lag_retention")
    fig, ax = plt.subplots(figsize=(7.5, 0.35 * len(table) + 1.2))
    y = np.arange(len(table))
    column = lambda name: table[name].to_numpy(np.float64)  # noqa: E731 (arrays: no pandas in mpl)
    for prefix, shift, fmt, color, label in (("lag", 0.0, "o", "k", "largest lag"),
                                             ("forward", 0.2, "s", "tab:orange",
                                              "high update frequency")):
        if f"{prefix}_retention" not in table:
            continue
        point = column(f"{prefix}_retention")
        ax.errorbar(point, y + shift, xerr=[point - column(f"{prefix}_low"),
                                            column(f"{prefix}_high") - point],
                    fmt=fmt, color=color, capsize=2, label=label)
    ax.axvline(0.8, color="grey", ls=":", lw=1)
    ax.set_yticks(y)
    ax.set_yticklabels(table.method)
    ax.set_xlabel("final-score retention (score ÷ own synchronous score; 95% BCa CI)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


# --- the controlled-lag study (`lag.write` draws these from a `lag.Report`) ----------------------
# Every figure is a grid: a column per task (and a pooled one where there are several), a row per
# group of at most `LAG_PER_PANEL` methods (`lag_method_groups`), the groups and each method's
# colour the same in every figure: (a) normalised final score vs constant lag k, (b) learning
# curves at k = 0, (c) final-score retention score(k)/score(0), (d) AUC retention AUC(k)/AUC(0).
# In the pooled column a method that ran on fewer tasks than the others is dashed with hollow
# markers, and the footnote says over how many tasks it pools.
LAG_PER_PANEL = 4
"""The most methods one panel shows."""
LAG_REFERENCES = (lag.TARGET, *lag.PRIMARY_BASELINES)
"""The first row: VACO and the methods it is compared with in the pre-registered family."""


def lag_colors(methods: Sequence[str]) -> dict[str, tuple]:
    """One colour per method, the same in every figure of the study: the sweep figures' colours
    (`PREFERRED`) first, the other lag-study methods after, then any other name."""
    palette = plt.get_cmap("tab10")
    order = list(PREFERRED) + [m for m in lag.METHODS if m not in PREFERRED]
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
    if lag.POOLED in tasks:
        at = at[at["task"] == lag.POOLED]
    elif len(tasks) > 1:            # no pooled rows: no single figure per method to group by
        return largest - 1, {}
    return largest - 1, dict(zip(at["method"], at["degradation"].astype(float)))


def lag_method_groups(methods: Sequence[str], retention: pd.DataFrame,
                      level: float = lag.BREAK_LEVEL) -> list[tuple[str, list[str]]]:
    """The figures' rows, `(description, methods)`: VACO, PPO-Clip and APPO (`LAG_REFERENCES`);
    then the other methods whose final-score retention at the largest constant lag (pooled over
    tasks, point estimate) is below `level`; then the rest (retention ≥ `level`, or undefined).
    Each group in the report's method order, cut into rows of at most `LAG_PER_PANEL`; empty
    groups left out. A display rule, not a test: the report's tables give the intervals."""
    ordered = lag._method_order(methods)
    k, kept = _largest_lag_retention(retention)
    references = [m for m in ordered if m in LAG_REFERENCES]
    others = [m for m in ordered if m not in LAG_REFERENCES]
    below = [m for m in others if np.isfinite(kept.get(m, np.nan)) and kept[m] < level]
    where = "pooled " if (retention["task"] == lag.POOLED).any() else ""
    groups = [("the references (VACO, PPO-Clip, APPO)", references),
              (f"{where}final-score retention at k = {k} below {level:g}", below),
              ("the others" if not below else f"the others ({where}final-score retention at "
               f"k = {k} ≥ {level:g} or undefined)", [m for m in others if m not in below])]
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
    handles = [plt.Line2D([], [], color=palette[m], lw=2.2 if m == lag.TARGET else 1.4,
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
    marked = table.assign(_fewer=lag.fewer_tasks(table))
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
                hollow = task == lag.POOLED and method in fewer
                style = dict(color=palette[method], mfc="none" if hollow else palette[method],
                             gid=method)
                line = rows[rows["sampling"] == "oldest"].sort_values("capacity")
                ax.plot(line["capacity"], line[value], "o--" if hollow else "o-", ms=3.5,
                        lw=2.2 if method == lag.TARGET else 1.4, **style)
                ax.fill_between(line["capacity"], line["low"], line["high"],
                                color=palette[method], alpha=0.12)
                for row in rows[rows["sampling"] != "oldest"].to_dict("records"):
                    y = row[value]
                    ax.errorbar(row["snapshot_age"] + 1, y, yerr=[[y - row["low"]],
                                                                [row["high"] - y]],
                                fmt="D", ms=4, capsize=2, alpha=0.85, **style)
            _lag_absent(ax, [m for m in absent if (task, m) not in ran and task != lag.POOLED],
                    [m for m in absent if (task, m) in ran])
            for y in reference_lines:
                ax.axhline(y, color="grey", lw=0.8, ls=":")
            _lag_axis(ax, capacities, bottom=r == len(groups) - 1)
            if r == 0:
                ax.set_title("pooled: mean over tasks" if task == lag.POOLED else task, fontsize=10)
            if c == 0:
                ax.set_ylabel(ylabel, fontsize=9)
        _lag_legend(legends[r], methods, palette, description, fewer, uniform)
    _lag_finish(fig, title, notes, footer, len(tasks))
    return fig


def lag_score_figure(scores: pd.DataFrame, groups, title: str = "", notes=()):
    """(a) Normalised final score vs constant lag k."""
    return _lag_lines(scores, "mean", "normalised final score", title or
                      "Normalised final score vs constant lag (mean over seeds, 95% BCa CIs)",
                      (0.0, 1.0), groups, notes)


def lag_retention_figure(retention: pd.DataFrame, scores: pd.DataFrame, groups, *,
                         auc: bool = False, title: str = "", notes=()):
    """(c) Final-score retention score(k)/score(0), or (d) with `auc` AUC retention
    AUC(k)/AUC(0), vs k, a line per method with its 95% CI band (paired seeds); k = 0 is 1 by
    definition; the break rule's level dotted."""
    cell = ["task", "method", "sampling", "capacity"]
    sync = scores[(scores["sampling"] == lag.SYNC[0]) & (scores["capacity"] == lag.SYNC[1])]
    anchor = sync[cell + ["tasks"]].assign(degradation=1.0, low=1.0, high=1.0)
    table = pd.concat([anchor, retention], ignore_index=True)
    defined = retention[np.isfinite(retention["degradation"])]
    table = table[table.set_index(["task", "method"]).index.isin(
        defined.set_index(["task", "method"]).index)]
    table = table.merge(scores[cell + ["snapshot_age"]], on=cell, how="left")
    name = "AUC" if auc else "score"
    return _lag_lines(table, "degradation", f"{name}(k) / {name}(0)", title or
                      f"{'AUC' if auc else 'Final-score'} retention vs constant lag "
                      f"(95% BCa CIs, paired seeds)", (lag.BREAK_LEVEL, 1.0), groups, notes,
                      ran=set(zip(scores["task"], scores["method"])))


def lag_curves_figure(curves: pd.DataFrame, groups, title: str = "", notes=()):
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
                        lw=2.2 if method == lag.TARGET else 1.4)
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
    _lag_finish(fig, title or "Learning curves at k = 0 (mean over seeds, 95% BCa CIs)", notes,
                footer, len(tasks))
    return fig


def lag_report_figures(report) -> tuple[dict[str, tuple[object, str]], str]:
    """({file name: (figure, caption)}, the grouping rule in words) for a `lag.Report`:
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
        fig.savefig(Path(out) / name, dpi=dpi)
        plt.close(fig)
    pooled = (" In the pooled column, a method pooled over fewer tasks than the others is dashed "
              "with hollow markers, and its legend entry says over how many.")
    return {name: caption for name, (_, caption) in drawn.items()}, rule + pooled


# --- the settings studies (vaco_jax.study.settings) ---------------------------------------------
def _settings_groups(methods: Sequence[str]) -> list[list[str]]:
    """Rows of at most `LAG_PER_PANEL` methods: VACO, PPO-Clip, APPO and decoupled PPO first, then
    the others beside VACO and PPO-Clip (so every panel can be read against the two)."""
    ordered = lag._method_order(methods)
    first = [m for m in ordered if m in (*LAG_REFERENCES, "decoupled_ppo")]
    others = [m for m in ordered if m not in first]
    anchors = [m for m in (lag.TARGET, "ppo_clip") if m in ordered]
    step = LAG_PER_PANEL - len(anchors)
    return [first] + [anchors + others[i:i + step] for i in range(0, len(others), step)]


def forward_figure(retention: pd.DataFrame, methods: Sequence[str], task: str, title: str = ""):
    """One task (or the pooled rows) of the forward × backward study: final-score retention (top)
    and AUC retention (bottom) against the update-frequency setting, one column per constant lag k,
    one colour per method (95% BCa CIs); the break level dashed. The settings vary along two arms
    from the base (K = 4, lr 3·10⁻⁴): the learning rate at K = 4, then the larger K, drawn apart (a
    rule between them); a line joins a method's points along one arm, never across the two. In
    the pooled rows a method pooled over fewer tasks than the study has is dashed with hollow
    markers, its legend entry saying how many."""
    from vaco_jax.study import settings

    rows = retention[(retention["task"] == task) & retention["method"].isin(methods)]
    lags = sorted(int(k) for k in rows["k"].unique())
    order = settings._setting_order(retention["setting"])
    parsed = {s: dict(p.split("=") for p in s.replace(" ", "").split(",")) for s in order}
    epochs = {s: int(v["K"]) for s, v in parsed.items()}
    arms = [[s for s in order if epochs[s] == settings.BASE_EPOCHS],
            [s for s in order if epochs[s] != settings.BASE_EPOCHS]]
    colors = lag_colors(list(methods))
    fewer = _lag_fewer(retention) if task == lag.POOLED else {}
    fig, axes = plt.subplots(2, len(lags), figsize=(3.6 * len(lags) + 0.4, 6.4), squeeze=False,
                             sharey="row")
    for j, k in enumerate(lags):
        for i, (value, label) in enumerate((("retention", "final-score retention"),
                                            ("auc_retention", "AUC retention"))):
            ax = axes[i][j]
            for n, method in enumerate(methods):
                here = rows[(rows["method"] == method) & (rows["k"] == k)].set_index("setting")
                shift = (n - (len(methods) - 1) / 2) * 0.07
                labelled = False
                for arm in arms:
                    line = here.reindex([s for s in arm if s in here.index])
                    if line.empty:
                        continue
                    x = np.array([order.index(s) for s in line.index]) + shift
                    y = line[value].to_numpy(np.float64)
                    err = np.abs(np.stack([y - line[f"{value}_low"], line[f"{value}_high"] - y]))
                    drawn = ax.errorbar(
                        x, y, yerr=np.nan_to_num(err), marker="o", ms=4, lw=1.2, capsize=2,
                        color=colors[method], ls="--" if method in fewer else "-",
                        mfc="none" if method in fewer else colors[method],
                        label=None if labelled else
                        f"{method} ({fewer[method]})" if method in fewer else method)
                    drawn.lines[0].set_gid(method)
                    labelled = True
            if arms[0] and arms[1]:
                ax.axvline(len(arms[0]) - 0.5, color="0.6", lw=0.8)
            ax.axhline(lag.BREAK_LEVEL, color="0.5", ls="--", lw=0.8)
            ax.axhline(1.0, color="0.8", lw=0.8)
            ax.set_xticks(range(len(order)))
            ax.set_xticklabels([s.replace(", ", "\n") for s in order], fontsize=7)
            if i == 0:
                ax.set_title(f"k = {k}", fontsize=10)
            if j == 0:
                ax.set_ylabel(label)
    axes[0][-1].legend(fontsize=8, loc="best")
    where = "pooled over tasks" if task == lag.POOLED else task
    if fewer:
        where += " (hollow markers: pooled over fewer tasks)"
    fig.suptitle(title or f"Update frequency × constant lag: {where} (against K = 4, lr 3e-4, "
                          f"k = 0; dashed: {lag.BREAK_LEVEL:g})\nleft of the rule: the learning rate "
                          f"at K = 4; right of it: more epochs K at lr 3e-4", fontsize=10)
    fig.tight_layout()
    return fig


def stepsize_figure(scores: pd.DataFrame, title: str = ""):
    """Synchronous learning-rate sweep: normalised final score (top) and mean in-update approx_kl
    (bottom, log scale) against the learning rate, per task and pooled, PPO-Clip and VACO."""
    swept = scores[scores["method"].isin(("ppo_clip", lag.TARGET))]
    tasks = sorted(t for t in swept["task"].unique() if t != lag.POOLED)
    tasks += [lag.POOLED] if (swept["task"] == lag.POOLED).any() else []
    colors = lag_colors(["ppo_clip", lag.TARGET])
    fig, axes = plt.subplots(2, len(tasks), figsize=(3.4 * len(tasks) + 0.4, 5.8), squeeze=False)
    for j, task in enumerate(tasks):
        for method in ("ppo_clip", lag.TARGET):
            line = swept[(swept["task"] == task) & (swept["method"] == method)]
            if line.empty:
                continue
            lr = np.array([float(s.split("=")[1]) for s in line["setting"]])
            order = np.argsort(lr)
            y = line["score"].to_numpy(np.float64)[order]
            err = np.abs(np.stack([y - line["score_low"].to_numpy()[order],
                                   line["score_high"].to_numpy()[order] - y]))
            axes[0][j].errorbar(lr[order], y, yerr=np.nan_to_num(err), marker="o", ms=4,
                                capsize=2, color=colors[method], label=method)
            axes[1][j].plot(lr[order], line["approx_kl"].to_numpy()[order], marker="o", ms=4,
                            color=colors[method], label=method)
        axes[0][j].set_title("pooled over tasks" if task == lag.POOLED else task, fontsize=10)
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xscale("log")
            ax.set_xlabel("learning rate")
        axes[1][j].set_yscale("log")
    axes[0][0].set_ylabel("normalised final score")
    axes[1][0].set_ylabel("mean in-update approx KL")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(title or "Synchronous step size (k = 0, K = 4; 95% BCa CIs)", fontsize=10)
    fig.tight_layout()
    return fig


def delta_lag_figure(scores: pd.DataFrame, retention: pd.DataFrame, title: str = ""):
    """VACO's δ: normalised final score and AUC at each constant lag (top rows) and their retention
    at the lags above 0 (bottom rows) against δ, per task and pooled (95% BCa CIs)."""
    tasks = sorted(t for t in scores["task"].unique() if t != lag.POOLED)
    tasks += [lag.POOLED] if (scores["task"] == lag.POOLED).any() else []
    rows = ((scores, "score", "normalised final score"), (scores, "auc", "normalised AUC"),
            (retention, "retention", "final-score retention\nvs the same δ at k = 0"),
            (retention, "auc_retention", "AUC retention\nvs the same δ at k = 0"))
    fig, axes = plt.subplots(len(rows), len(tasks), figsize=(3.4 * len(tasks) + 0.6, 11.0),
                             squeeze=False)
    palette = ("tab:blue", "tab:orange", "tab:red", "tab:purple", "tab:green")
    lags = sorted(int(k) for k in scores["k"].unique())
    deltas = sorted({float(s.split("=")[1]) for s in scores["setting"]})
    for j, task in enumerate(tasks):
        for i, (frame, value, _) in enumerate(rows):
            for n, k in enumerate(lags):
                line = frame[(frame["task"] == task) & (frame["k"] == k)]
                if line.empty:
                    continue
                d = np.array([float(s.split("=")[1]) for s in line["setting"]])
                order = np.argsort(d)
                y = line[value].to_numpy(np.float64)[order]
                err = np.abs(np.stack([y - line[f"{value}_low"].to_numpy()[order],
                                       line[f"{value}_high"].to_numpy()[order] - y]))
                axes[i][j].errorbar(d[order], y, yerr=np.nan_to_num(err), marker="o", ms=4,
                                    capsize=2, color=palette[n % len(palette)],
                                    label=f"k = {k}")
            axes[i][j].set_xscale("log")
            axes[i][j].set_xticks(deltas, [f"{d:g}" for d in deltas])
            axes[i][j].xaxis.set_minor_formatter(NullFormatter())
            axes[i][j].set_xlabel("δ")
        for i, (frame, _, _) in enumerate(rows):
            if frame is retention:
                axes[i][j].axhline(lag.BREAK_LEVEL, color="0.5", ls="--", lw=0.8)
        axes[0][j].set_title("pooled over tasks" if task == lag.POOLED else task, fontsize=10)
    for i, (_, _, label) in enumerate(rows):
        axes[i][0].set_ylabel(label)
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(title or "VACO's δ at a constant lag (95% BCa CIs)", fontsize=10)
    fig.tight_layout()
    return fig


def save_settings_figures(report, out: Path, dpi: int = 120) -> dict[str, str]:
    """The figures of a `settings.Report` into `out`; {file name: caption}."""
    drawn = {}
    if len(report.forward_retention):
        retention = report.forward_retention
        tasks = sorted(t for t in retention["task"].unique() if t != lag.POOLED)
        tasks += [lag.POOLED] if (retention["task"] == lag.POOLED).any() else []
        for g, methods in enumerate(_settings_groups(retention["method"].unique())):
            for task in tasks:
                name = (f"fig_forward_{g + 1}_{task.replace('dmc:', '').replace(':', '_')}"
                        f".png")
                drawn[name] = (forward_figure(retention, methods, task),
                               f"{'pooled over tasks' if task == lag.POOLED else task}: "
                               f"final-score and AUC retention of {', '.join(methods)} against "
                               f"the update-frequency setting, per constant lag k")
    if len(report.stepsize_scores):
        drawn["fig_stepsize.png"] = (stepsize_figure(report.stepsize_scores),
                                     "normalised final score and in-update KL vs learning rate")
    if len(report.delta_scores):
        drawn["fig_delta_lag.png"] = (delta_lag_figure(report.delta_scores,
                                                       report.delta_retention),
                                      "VACO's δ: final score, AUC and their retention at each "
                                      "lag")
    for name, (fig, _) in drawn.items():
        fig.savefig(Path(out) / name, dpi=dpi)
        plt.close(fig)
    return {name: caption for name, (_, caption) in drawn.items()}
