"""Sweep directories → one tidy table, one row per run.

Columns: study, task, method, k (constant lag: capacity − 1), sampling, K (epochs), lr, delta,
seed, final (mean of the last `last_evals` evaluation returns), auc (the normalised area under
the return curve: `analysis.schema.final_and_auc`), diverged, commit, and the run's curve (`steps`,
`returns`). A run diverges from the first evaluation the sweep marks diverged or whose return is
not finite; its returns are NaN from then on, and so are its final and AUC (`scores` counts them
as a random policy's)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from vaco_jax.analysis import schema
from vaco_jax.study import presets, sweep

LAST_EVALS = schema.LAST_EVALS
"""A run's final score averages its last this many evaluations."""
RUN = ("study", "task", "method", "k", "sampling", "K", "lr", "delta", "seed")
COLUMNS = (*RUN, "budget", "final", "auc", "diverged", "diverged_at_step", "evaluations", "commit",
           "steps", "returns")


def diverged_from_then_on(results: pd.DataFrame, run: Sequence[str]) -> pd.Series:
    """Per evaluation row, whether its run (the columns `run`) has diverged by then: the sweep's
    `diverged`, or a non-finite return, either failing the run from that evaluation on."""
    diverged = (results["diverged"].fillna(False).astype(bool) if "diverged" in results
                else pd.Series(False, index=results.index))
    diverged = diverged | ~np.isfinite(results["eval_return"].to_numpy(np.float64))
    order = results.assign(diverged=diverged).sort_values([*run, "eval_index"])
    return order.groupby(list(run), sort=False)["diverged"].cummax()   # aligned by index


SETTING_VARIANTS = ("K=", "lr=", "δ=")
"""Variants that name a setting (its own columns), not a method."""


def method(algo: str, variant: str) -> str:
    """A cell's method: the algorithm, with its method variant in brackets where it has one
    (`presets.method_label`); a variant naming a setting (K, lr, δ) is not a method."""
    if presets.method_variant(variant).startswith(SETTING_VARIANTS):
        return algo
    return presets.method_label(algo, variant)


def evaluations(results: pd.DataFrame, plan: dict | None = None,
                commits: dict | None = None) -> pd.DataFrame:
    """A sweep's result rows with the run's columns `RUN` (K and lr from each cell's config in
    `plan`, a swept lr from the row) and `commit` (per cell, from `commits`)."""
    plan, commits = plan or {}, commits or {}
    config = {c: plan.get(c, {}).get("config", {}) for c in results["cell"].unique()}
    frame = results.assign(
        study=results.get("study", ""), task=results["env"],
        method=[method(a, v) for a, v in zip(results["algo"], results["variant"])],
        k=results["capacity"].astype(int) - 1,
        sampling=results.get("snapshot_sampling", pd.Series("oldest", index=results.index)),
        K=results["cell"].map({c: v.get("num_epochs", np.nan) for c, v in config.items()}),
        lr=results["cell"].map({c: v.get("learning_rate", np.nan) for c, v in config.items()}),
        commit=results["cell"].map(commits).fillna(""))
    if "learning_rate" in results:
        frame["lr"] = results["learning_rate"].fillna(frame["lr"])
    frame["diverged"] = diverged_from_then_on(frame, RUN)
    return frame


def mean_of_finite(values) -> float:
    """The mean of the finite `values` (NaN where none is)."""
    values = np.asarray(values, np.float64)
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else np.nan


def tidy(evaluation_rows: pd.DataFrame, last_evals: int = LAST_EVALS, *,
         run: Sequence[str] = RUN, means: Sequence[str] = ()) -> pd.DataFrame:
    """One row per run of `evaluations`' rows (COLUMNS): `run` names the columns that tell runs
    apart (default `RUN`); each column of `means` (a diagnostic such as `behavior_tv`) holds the
    mean of the run's finite values (NaN where it has none, or the rows lack the column)."""
    columns = [*run, *COLUMNS[len(RUN):], *means]
    if evaluation_rows.empty:
        return pd.DataFrame(columns=columns)
    twice = evaluation_rows.duplicated([*run, "eval_index"])
    if twice.any():
        first = evaluation_rows.loc[twice, [*run, "eval_index"]].iloc[0].to_dict()
        raise ValueError(f"{int(twice.sum())} evaluations appear twice (e.g. {first}); a run may "
                         f"be in two sweep directories: read each once")
    rows = []
    for key, group in evaluation_rows.sort_values([*run, "eval_index"]).groupby(
            list(run), sort=False, dropna=False):
        if len(group) < last_evals:
            raise ValueError(f"run {dict(zip(run, key))} has {len(group)} evaluations; its final "
                             f"score averages the last {last_evals}")
        diverged = group["diverged"].to_numpy(bool)
        steps = group["step"].to_numpy(np.float64)
        returns = np.where(diverged, np.nan, group["eval_return"].to_numpy(np.float64))
        final, auc, failed = schema.final_and_auc(returns, steps, last_evals)
        rows.append({**dict(zip(run, key)),
                     "budget": int(group["budget"].iloc[0]) if "budget" in group else None,
                     "final": final, "auc": auc,
                     "diverged": failed,
                     "diverged_at_step": int(steps[diverged].min()) if failed else None,
                     "evaluations": len(group),
                     "commit": group["commit"].iloc[0] if "commit" in group else "",
                     "steps": steps, "returns": returns,
                     **{name: mean_of_finite(group[name]) if name in group else np.nan
                        for name in means}})
    return pd.DataFrame(rows, columns=columns)


def read(directories: Sequence[str | Path], last_evals: int = LAST_EVALS) -> pd.DataFrame:
    """The tidy runs of every finished cell of the sweep `directories` (read by `sweep`'s one
    reader), K and lr from each sweep's plan (sweep.json), the commit from its cells."""
    parts = []
    for directory in map(Path, directories):
        plan = json.loads((directory / "sweep.json").read_text()).get("cells", {})
        cells = sweep.load_cells(directory)
        commits = dict(zip(cells["cell"], cells["git_commit"])) if "git_commit" in cells else {}
        parts.append(evaluations(sweep.load_results(directory), plan, commits))
    return tidy(pd.concat(parts, ignore_index=True), last_evals)
