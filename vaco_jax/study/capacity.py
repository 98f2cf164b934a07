"""From a sweep's tidy table (`vaco_jax.study.sweep`) to the paper's statistics (SPEC §7).

The inputs are tidy tables with a `score` column (normalised return, `references.add_scores`).
A *method* is whatever is being compared (an algorithm, an ablation, a δ); capacities are
compared separately. For each (capacity, method) the score matrix is `[seeds, envs]` of the score
at the **final evaluation** (or the normalised area under the curve), as rliable expects.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from vaco_jax.study import stats

METRIC_NAMES = {"median": "Median", "iqm": "IQM", "mean": "Mean",
                "optimality_gap": "Optimality gap"}


def label(algo: str, variant: str) -> str:
    return algo if variant == "default" else f"{algo} [{variant}]"


def with_methods(results: pd.DataFrame, by: str = "algo") -> pd.DataFrame:
    """Add a `method` column: `by="algo"` (algorithm + variant) or `by="delta"` ("δ=0.2")."""
    results = results.copy()
    if by == "algo":
        results["method"] = [label(a, v) for a, v in zip(results["algo"], results["variant"])]
    elif by == "delta":
        results["method"] = [f"δ={d:g}" for d in results["delta"]]
    else:
        raise ValueError(f"by must be 'algo' or 'delta', got {by!r}")
    return results


def final(results: pd.DataFrame) -> pd.DataFrame:
    """The rows of each run's last evaluation."""
    last = results.groupby("cell")["eval_index"].transform("max")
    return results[results["eval_index"] == last]


def markdown_rows(frame: pd.DataFrame) -> str:
    """A plain table as markdown (one line per row)."""
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def _diverged(frame: pd.DataFrame) -> pd.Series:
    """The rows at or after a run's divergence (the sweep's `diverged` column; NaN counts as no)."""
    return frame["diverged"].fillna(False).astype(bool)


def diverged_runs(results: pd.DataFrame) -> pd.DataFrame:
    """One row per diverged run (env, algorithm, variant, capacity, δ, seed), from the sweep's
    `diverged` column (empty for tables without it)."""
    columns = ["env", "algo", "variant", "capacity", "delta", "seed"]
    if "diverged" not in results:
        return pd.DataFrame(columns=columns)
    return results.loc[_diverged(results), columns].drop_duplicates().reset_index(drop=True)


def without_diverged(group: pd.DataFrame) -> pd.DataFrame:
    """A group without the seeds that diverged on any env. Only for raw returns (training curves),
    where a failure has no value to stand for it; scores count a diverged run as a failure
    (`diverged_as_failures`)."""
    if "diverged" not in group:
        return group
    bad = group.loc[_diverged(group), "seed"].unique()
    return group[~group["seed"].isin(bad)]


def diverged_as_failures(frame: pd.DataFrame, value: str = "score") -> pd.DataFrame:
    """`value`, a normalised score, set to 0 from a run's divergence on: a diverged run fails like a
    random policy and stays in every aggregate (dropping it would flatter its method)."""
    if "diverged" not in frame:
        return frame
    return frame.assign(**{value: frame[value].astype(np.float64).mask(_diverged(frame), 0.0)})


def score_matrices(results: pd.DataFrame, value: str = "score") -> dict[tuple[int, str], np.ndarray]:
    """(capacity, method) → `[seeds, envs]` of `value`, a normalised score, at the final evaluation.

    A diverged run scores 0 from its divergence on (`diverged_as_failures`; `diverged_runs` lists
    them). Raises if a method lacks a seed on some env (rliable needs the same runs on every task)
    or if a run appears twice.
    """
    rows = diverged_as_failures(final(results), value)
    envs = sorted(rows["env"].unique())
    out = {}
    for (capacity, method), group in rows.groupby(["capacity", "method"], sort=True):
        if group.duplicated(["env", "seed"]).any():
            raise ValueError(f"capacity {capacity}, {method}: some (env, seed) runs appear twice; "
                             f"select one study/δ before aggregating")
        matrix = group.pivot(index="seed", columns="env", values=value).reindex(columns=envs)
        if matrix.isna().any().any():
            missing = matrix.columns[matrix.isna().any()].tolist()
            raise ValueError(f"capacity {capacity}, {method}: missing seeds on env(s) {missing}")
        out[(int(capacity), method)] = matrix.to_numpy(np.float64)
    return out


def auc_matrices(results: pd.DataFrame, value: str = "score") -> dict[tuple[int, str], np.ndarray]:
    """(capacity, method) → `[seeds, envs]` normalised area under the learning curve of `value`
    (a diverged run's curve is 0 from its divergence on, as in `score_matrices`)."""
    results = diverged_as_failures(results, value)
    envs = sorted(results["env"].unique())
    out = {}
    for (capacity, method), group in results.groupby(["capacity", "method"], sort=True):
        per_run = []
        for (env, seed), run in group.groupby(["env", "seed"]):
            run = run.sort_values("step")
            per_run.append({"env": env, "seed": seed, "auc": float(stats.area_under_curve(
                run[value].to_numpy(), run["step"].to_numpy()))})
        matrix = pd.DataFrame(per_run).pivot(index="seed", columns="env", values="auc")
        matrix = matrix.reindex(columns=envs)
        if matrix.isna().any().any():
            raise ValueError(f"capacity {capacity}, {method}: missing runs for the AUC")
        out[(int(capacity), method)] = matrix.to_numpy(np.float64)
    return out


def _by_capacity(matrices: dict) -> dict[int, dict[str, np.ndarray]]:
    grouped: dict[int, dict[str, np.ndarray]] = {}
    for (capacity, method), matrix in matrices.items():
        grouped.setdefault(capacity, {})[method] = matrix
    return grouped


def aggregate_table(results: pd.DataFrame, *, auc: bool = False, reps: int = 2000,
                    seed: int = 0) -> pd.DataFrame:
    """Median, IQM, mean, optimality gap with stratified bootstrap 95% CIs per capacity × method.

    Columns: capacity, method, metric, point, low, high, seeds, envs.
    """
    matrices = auc_matrices(results) if auc else score_matrices(results)
    tables = []
    for capacity, score_dict in sorted(_by_capacity(matrices).items()):
        table = stats.interval_estimates(score_dict, reps=reps, seed=seed)
        table.insert(0, "capacity", capacity)
        table["seeds"] = [score_dict[m].shape[0] for m in table["method"]]
        table["envs"] = [score_dict[m].shape[1] for m in table["method"]]
        tables.append(table)
    return pd.concat(tables, ignore_index=True)


def improvement_table(results: pd.DataFrame, target: str = "vaco", *, reps: int = 2000,
                      seed: int = 0) -> pd.DataFrame:
    """P(target > baseline) with 95% CIs, per capacity and baseline."""
    tables = []
    for capacity, score_dict in sorted(_by_capacity(score_matrices(results)).items()):
        if target not in score_dict or len(score_dict) < 2:
            continue
        table = stats.probability_of_improvement(score_dict, target, reps=reps, seed=seed)
        table.insert(0, "capacity", capacity)
        tables.append(table)
    if not tables:
        raise ValueError(f"no capacity has both {target!r} and a baseline")
    return pd.concat(tables, ignore_index=True)


def profiles(results: pd.DataFrame, capacity: int, taus: Sequence[float], *, reps: int = 1000,
             seed: int = 0) -> dict:
    """Performance profiles (score distributions) of every method at one capacity."""
    score_dict = _by_capacity(score_matrices(results))[capacity]
    return stats.performance_profiles(score_dict, np.asarray(taus), reps=reps, seed=seed)


def markdown(table: pd.DataFrame, metrics: Sequence[str] = stats.METRICS, digits: int = 2) -> str:
    """An aggregate table as Markdown: one row per (capacity, method), `point [low, high]` cells."""
    cells = table.assign(text=[f"{p:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"
                               for p, lo, hi in zip(table["point"], table["low"], table["high"])])
    wide = cells.pivot(index=["capacity", "method"], columns="metric", values="text")[list(metrics)]
    header = "| C | method | " + " | ".join(METRIC_NAMES[m] for m in metrics) + " |"
    lines = [header, "|" + "---|" * (len(metrics) + 2)]
    for (capacity, method), row in wide.iterrows():
        lines.append(f"| {capacity} | {method} | " + " | ".join(row) + " |")
    return "\n".join(lines)


# --- the studies of a sweep (vaco_jax.study.presets.STUDIES) -------------------------------
def main_study(results: pd.DataFrame) -> pd.DataFrame:
    """The five algorithms vs capacity; method = algorithm."""
    return with_methods(results[results["study"] == "main"], by="algo")


def delta_study(results: pd.DataFrame) -> pd.DataFrame:
    """VACO (default variant) at every δ run (main supplies the default δ); method = "δ=…"."""
    rows = results[results["study"].isin(["main", "delta"]) & (results["algo"] == "vaco")
                   & (results["variant"] == "default")]
    return with_methods(rows, by="delta")


def ablation_study(results: pd.DataFrame) -> pd.DataFrame:
    """The ablations next to VACO and PPO-Clip from the main study; method = algorithm [variant]."""
    rows = results[(results["study"] == "ablations")
                   | ((results["study"] == "main") & results["algo"].isin(["vaco", "ppo_clip"]))]
    return with_methods(rows, by="algo")


def describe(results: pd.DataFrame) -> str:
    """"envs …; N seeds; budget" — the label every figure and table carries."""
    budgets = sorted({int(b) for b in results["budget"]})
    per_env = results.groupby("env")["budget"].first()
    budget = (f"{budgets[0]:,} env steps/run" if len(budgets) == 1 else
              ", ".join(f"{env} {int(b):,}" for env, b in per_env.items()) + " env steps/run")
    seeds = results.groupby(["cell", "capacity", "delta"])["seed"].nunique().min()
    return f"{', '.join(sorted(results['env'].unique()))}; {seeds} seeds; {budget}"
