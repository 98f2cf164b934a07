"""One per-run table for every study, and an adapter from each older per-run vocabulary.

One row per run; `KEY` tells runs apart. Columns (`COLUMNS`, in this order), then free metrics
(numbers only, e.g. `raw_final`, `final_sampled_accuracy`):

    study, task, method   str      the study; its task (an env, or "llm"); an algorithm or variant
    k                     Int64    the constant lag (capacity − 1; a stochastic lag's oldest age)
    sampling              str      how actors draw snapshots: oldest (constant lag), profile, uniform
    K                     Int64    epochs per batch (<NA> where the study does not record it)
    lr                    float64  learning rate (NaN where not recorded)
    constraint            float64  the method's trust-region size (VACO's δ; NaN where none)
    N                     Int64    updates per generated batch (the LLM's forward lag), else <NA>
    seed                  int64    the run's seed (the same key in every setting and method)
    final, auc            float64  final score and area under the curve (NaN: diverged, or unscored)
    diverged              bool
    commit                str      the git commit that made the run ("" when not recorded)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from vaco_jax.analysis import stats

COLUMNS = {"study": "str", "task": "str", "method": "str", "k": "Int64", "sampling": "str",
           "K": "Int64", "lr": "float64", "constraint": "float64", "N": "Int64", "seed": "int64",
           "final": "float64", "auc": "float64", "diverged": "bool", "commit": "str"}
KEY = ("study", "task", "method", "k", "sampling", "K", "lr", "constraint", "N", "seed")
DEFAULTS = {"study": "", "k": pd.NA, "sampling": "oldest", "K": pd.NA, "lr": np.nan,
            "constraint": np.nan, "N": pd.NA, "diverged": False, "commit": ""}
LAST_EVALS = 3
"""A run's final score averages its last this many evaluations."""
_KINDS = {"str": pd.api.types.is_object_dtype, "Int64": pd.api.types.is_integer_dtype,
          "int64": pd.api.types.is_integer_dtype, "float64": pd.api.types.is_float_dtype,
          "bool": pd.api.types.is_bool_dtype}


def validate(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` itself when it has every column of `COLUMNS` with its dtype, free columns that are
    numbers and one row per `KEY`; else a ValueError naming the first column (or run) that is
    wrong."""
    for name, dtype in COLUMNS.items():
        if name not in runs.columns:
            raise ValueError(f"the run table has no column {name!r} ({dtype})")
        column = runs[name]
        if not _KINDS[dtype](column) or (dtype == "str" and not column.map(type).eq(str).all()):
            raise ValueError(f"column {name!r} is {column.dtype}, not {dtype}")
    for name in runs.columns.difference(list(COLUMNS)):
        if not pd.api.types.is_numeric_dtype(runs[name]):
            raise ValueError(f"free column {name!r} is {runs[name].dtype}, not a number")
    twice = runs.duplicated(list(KEY))
    if twice.any():
        raise ValueError(f"{int(twice.sum())} runs appear twice, e.g. "
                         f"{runs.loc[twice, list(KEY)].iloc[0].to_dict()}")
    return runs


def conform(frame: pd.DataFrame, free: Sequence[str] = (), **defaults) -> pd.DataFrame:
    """`frame` (named in `COLUMNS`' words already) as the run table: missing columns from
    `defaults` or `DEFAULTS`, each cast to its dtype, then the `free` columns that it has."""
    out = pd.DataFrame(index=frame.index)
    for name, dtype in COLUMNS.items():
        value = frame[name] if name in frame else {**DEFAULTS, **defaults}[name]
        out[name] = pd.Series(value, index=frame.index).astype(dtype if dtype != "str" else object)
        if dtype == "str":
            out[name] = out[name].map(str)
    for name in free:
        if name in frame:
            out[name] = frame[name].astype(np.float64)
    return validate(out.reset_index(drop=True))


def final_and_auc(returns, steps, last_evals: int = LAST_EVALS) -> tuple[float, float, bool]:
    """(final, auc, diverged) of one run's evaluation returns at `steps`: a non-finite return (or
    a divergence marked NaN) fails the run, whose final and AUC are then NaN; else the mean of
    the last `last_evals` returns and the area under the curve (`stats.area_under_curve`)."""
    returns = np.asarray(returns, np.float64)
    if not np.isfinite(returns).all():
        return np.nan, np.nan, True
    return (float(returns[-last_evals:].mean()),
            float(stats.area_under_curve(returns, np.asarray(steps, np.float64))), False)


# --- adapters: each older per-run vocabulary -> the run table ------------------------------------
def from_bench(table: pd.DataFrame, study: str = "bench") -> pd.DataFrame:
    """The bench's per-run tables: the pipeline's (task, method, k, sampling, K, lr, delta, seed,
    final, auc, diverged, commit) or a leaderboard's scores.csv (… raw_final, raw_auc,
    final_score, auc_score). Normalised scores, where there are, become final and auc."""
    frame = table.rename(columns={"delta": "constraint"})
    if "final_score" in frame:
        frame = frame.drop(columns=["final", "auc"], errors="ignore").rename(
            columns={"final_score": "final", "auc_score": "auc"})
    return conform(frame, ("raw_final", "raw_auc"), study=frame.get("study", study))


SWEEP_NAMES = {"env": "task", "snapshot_sampling": "sampling", "num_epochs": "K",
               "learning_rate": "lr", "delta": "constraint"}
SWEEP_RUN = ("cell", "study", "env", "algo", "variant", "capacity", "snapshot_sampling", "num_epochs",
             "learning_rate", "delta", "seed")
"""The columns of a sweep's evaluation rows that tell its runs apart (those it has)."""


def from_sweeps(table: pd.DataFrame, study: str = "", method: Callable | None = None,
                commits: Mapping[str, str] | None = None,
                last_evals: int = LAST_EVALS) -> pd.DataFrame:
    """The sweeps' vocabulary (env, capacity): a sweep's evaluation rows (results.parquet: env,
    algo, variant, capacity, seed, eval_index, step, eval_return, diverged, …), reduced to runs by
    `final_and_auc` (a run fails from the first evaluation marked diverged), or a per-run table of
    it (the lag study's runs.csv: env, method, capacity, seed, score, final_return, auc). k is
    capacity − 1; `method(algo, variant)` names a method (default: the algorithm); `commits`:
    cell → commit."""
    if "eval_index" in table:
        table = _runs_of_evaluations(table, last_evals)
    frame = table.rename(columns=SWEEP_NAMES).assign(k=table["capacity"] - 1)
    if "method" not in frame:
        frame["method"] = [method(a, v) if method else a
                           for a, v in zip(frame["algo"], frame["variant"])]
    if "score" in frame:                 # a normalised per-run table: its final score
        frame = frame.rename(columns={"final": "raw_final"}).rename(columns={"score": "final"})
    if commits and "cell" in frame:
        frame["commit"] = frame["cell"].map(commits).fillna("")
    return conform(frame, ("final_return", "raw_final"), study=frame.get("study", study))


def _runs_of_evaluations(rows: pd.DataFrame, last_evals: int) -> pd.DataFrame:
    """One row per run of a sweep's evaluation rows: `SWEEP_RUN` (those present), final, auc,
    diverged."""
    run = [c for c in SWEEP_RUN if c in rows]
    failed = rows["diverged"].fillna(False).astype(bool) if "diverged" in rows else False
    rows = rows.assign(value=np.where(failed, np.nan, rows["eval_return"].astype(np.float64)))
    out = []
    for key, group in rows.sort_values("eval_index").groupby(run, sort=True, dropna=False):
        final, auc, diverged = final_and_auc(group["value"], group["step"], last_evals)
        out.append({**dict(zip(run, key)), "final": final, "auc": auc, "diverged": diverged})
    return pd.DataFrame(out)


def from_settings(table: pd.DataFrame, study: str = "settings") -> pd.DataFrame:
    """The settings studies' runs.csv (env, setting, capacity, k, epochs, learning_rate, delta,
    final_return, score, auc, …): score (normalised final) becomes final."""
    frame = table.rename(columns={"env": "task", "epochs": "K", "learning_rate": "lr",
                                  "delta": "constraint", "score": "final"})
    return conform(frame, ("final_return", "approx_kl", "behavior_tv"),
                   study=frame.get("study", study))


LLM_SAMPLING = {"constant": "oldest"}
"""The LLM's lag sampling in the run table's words (a constant lag is the oldest snapshot)."""


def from_llm(table: pd.DataFrame, study: str = "llm", task: str = "llm",
             commit: str = "") -> pd.DataFrame:
    """The LLM's per-run tables (results.parquet: n, objective, seed, k, lag_sampling,
    final_accuracy, final_sampled_accuracy, eval_iterations, eval_accuracy): N = n, final the
    held-out greedy accuracy, auc the area under its curve, the sampled ones free columns. A
    table that names its entries (`method`, with `lr` and `constraint`: a tuned protocol's
    runs.parquet) keeps those names; its objective is then a detail of the entry."""
    if "method" in table:
        table = table.drop(columns="objective")
    frame = table.rename(columns={"n": "N", "objective": "method", "final_accuracy": "final"})
    frame["sampling"] = frame.get("lag_sampling", pd.Series("constant", index=frame.index)).map(
        lambda s: LLM_SAMPLING.get(s, s))
    frame["k"], frame["diverged"] = frame.get("k", 0), ~np.isfinite(frame["final"].astype(float))
    frame["auc"] = ([stats.area_under_curve(a, s) for a, s in zip(frame["eval_accuracy"],
                                                                   frame["eval_iterations"])]
                    if "eval_accuracy" in frame else np.nan)
    return conform(frame, ("final_sampled_accuracy", "final_sampled_auc", "filtered_fraction"),
                   study=study, task=task, commit=commit)


def from_train(table: pd.DataFrame, study: str = "train") -> pd.DataFrame:
    """vaco-train's runs: the rows of each output directory's metrics.jsonl (step, eval_return:
    one per seed, …) with that `directory`, whose config.json gives the task (its env), k
    (capacity − 1), K, lr, the seeds (its seed + index) and the commit (git_commit). The method is
    the directory's name (the setting the runs compare, such as the network). final is the last
    evaluation's return (summary.json's final_eval_return), auc the area under the curve
    (`stats.area_under_curve`) and the free column curve_mean the mean return over the
    evaluations (trapezoids from the first to the last, ÷ the steps between them); a run with a
    return that is not finite has diverged, and these are NaN."""
    out = []
    for directory, rows in table.groupby("directory", sort=True):
        info = json.loads((Path(directory) / "config.json").read_text())
        config = info["config"]
        rows = rows.sort_values("step")
        steps = rows["step"].to_numpy(np.float64)
        returns = np.array(rows["eval_return"].tolist(), np.float64).T    # [seeds, evals]
        for i, curve in enumerate(returns):
            diverged = not np.isfinite(curve).all()
            out.append({"task": config["env"], "method": Path(directory).name,
                        "k": config["capacity"] - 1, "K": config["num_epochs"],
                        "lr": config["learning_rate"], "seed": config["seed"] + i,
                        "diverged": diverged,
                        "final": np.nan if diverged else curve[-1],
                        "auc": np.nan if diverged else stats.area_under_curve(curve, steps),
                        "curve_mean": np.nan if diverged else
                        np.trapezoid(curve, steps) / (steps[-1] - steps[0]),
                        "commit": info.get("git_commit", "")})
    return conform(pd.DataFrame(out), ("curve_mean",), study=study)


def merge_identical(runs: pd.DataFrame, within: Sequence[str] = ("N",), first: Sequence[str] = (),
                    rtol: float = 1e-5) -> tuple[pd.DataFrame, list[tuple[tuple, list[str]]]]:
    """Entries that compute the same thing, reported once: within each value of `within` (an
    LLM board: each N), a method whose runs equal an earlier method's on every other key (task,
    k, sampling, K, seed) and every number (final, auc and the free columns; relative `rtol`,
    absolute 1e-9) is dropped there, and kept under the earlier one's name. Methods are taken in
    the order of `first` (a baseline keeps its name), then by name. Returns the table and the
    groups, `((within values), [kept, same, ...])`, of two or more."""
    numbers = ["final", "auc", *runs.columns.difference(list(COLUMNS))]
    keys = [k for k in KEY if k not in ("study", "method", "lr", "constraint", *within)]
    order = lambda m: (list(first).index(m) if m in first else len(first), m)  # noqa: E731
    groups, drop = [], []
    for where, part in runs.groupby(list(within), sort=True, dropna=False):
        by_method = {m: part[part["method"] == m].set_index(keys).sort_index()[numbers]
                     .astype(float) for m in sorted(part["method"].unique(), key=order)}
        found: list[list[str]] = []
        for method, values in by_method.items():
            home = next((g for g in found if by_method[g[0]].index.equals(values.index)
                         and np.allclose(by_method[g[0]].to_numpy(), values.to_numpy(),
                                         rtol=rtol, atol=1e-9, equal_nan=True)), None)
            if home is None:
                found.append([method])
            else:
                home.append(method)
                drop.append(part.index[part["method"] == method])
        where = where if isinstance(where, tuple) else (where,)
        groups += [(tuple(where), g) for g in found if len(g) > 1]
    kept = runs.drop(index=np.concatenate(drop)) if drop else runs
    return kept.reset_index(drop=True), groups
