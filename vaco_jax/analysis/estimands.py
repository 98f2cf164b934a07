"""Each estimand a pure function `(runs, spec) -> rows of the estimates table` (`ESTIMATES`).

`runs` is the run table (`schema.COLUMNS`); `spec` a dict (one `[[estimands]]` table of a study's
TOML file): `metric` (a run column, default "auc"); `at` (column → value: the setting compared,
default every run); `over` (a column: one estimate per value it takes at `at`); `base` (column →
value replacing `at`'s: the setting a retention or a change starts from); `methods` (default
every method, sorted); `baseline`; `reps`, `seed`, `confidence`; for tests `test` ("sign-flip" or
"t"), `family` ("pooled": the pooled rows are the Holm family, "tasks": the per-task rows, "all": both, "none"),
`pre_registered` (verdict words, else what Holm's p shows), `words` (the three verdict words);
for a retention `level` (the break rule's, 0.8: its verdict on each interval).
Pooled rows (task "pooled") weight tasks equally."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from vaco_jax.analysis import families, paired, stats
from vaco_jax.analysis.paired import POOLED

ESTIMATES = ("study", "estimand", "metric", "method", "baseline", "task", "setting", "point",
             "low", "high", "seeds", "p", "p_holm", "verdict")
LOW_DENOMINATOR = 0.5
"""A retention whose base mean is below this is flagged: its ratio swings with small changes."""


# --- settings and shapes --------------------------------------------------------------------------
def settings(runs: pd.DataFrame, spec: Mapping) -> list[dict]:
    """`spec["at"]`, or, with `over`, one setting per value `over` takes there (sorted)."""
    at, over = dict(spec.get("at", {})), spec.get("over")
    if not over:
        return [at]
    return [{**at, over: v} for v in sorted(paired._select(runs, at)[over].dropna().unique())]


def label(setting: Mapping) -> str:
    """A setting in words: `k=8, K=4`."""
    return ", ".join(f"{c}={v:g}" if isinstance(v, float) else f"{c}={v}"
                     for c, v in setting.items())


def methods(runs: pd.DataFrame, spec: Mapping) -> list[str]:
    return list(spec.get("methods") or sorted(runs["method"].unique()))


def matrix(runs: pd.DataFrame, metric: str, setting: Mapping) -> np.ndarray:
    """`[seeds, tasks]` of `metric` at `setting` (rliable's layout; the seeds every task has)."""
    chosen = paired._select(runs, setting)
    return chosen.pivot(index="seed", columns="task", values=metric).dropna().to_numpy()


def rows(spec: Mapping, estimand: str, records: list[dict]) -> pd.DataFrame:
    """`records` as estimates rows: the study, estimand and metric from `spec`; missing cells
    empty (text) or NaN (numbers)."""
    filled = [{"study": spec.get("study", ""), "estimand": estimand,
               "metric": spec.get("metric", "auc"), "method": "", "baseline": "", "task": POOLED,
               "setting": "", "low": np.nan, "high": np.nan, "seeds": 0, "p": np.nan,
               "p_holm": np.nan, "verdict": "", **r} for r in records]
    return pd.DataFrame(filled, columns=list(ESTIMATES))


def _options(spec: Mapping, reps: int) -> dict:
    return {"reps": spec.get("reps", reps), "seed": spec.get("seed", 0),
            "confidence": spec.get("confidence", 0.95)}


# --- means, ratios --------------------------------------------------------------------------------
def mean(runs: pd.DataFrame, spec: Mapping) -> pd.DataFrame:
    """Per method, task and pooled: the mean of `metric` over seeds with its stratified BCa
    interval (`paired.means`)."""
    out = []
    for setting in settings(runs, spec):
        chosen = paired._select(runs[runs["method"].isin(methods(runs, spec))], setting)
        table = paired.means(chosen, spec.get("metric", "auc"), ["task", "method"],
                             **_options(spec, paired.REPS))
        out += [{"method": r.method, "task": r.task, "setting": label(setting), "point": r.point,
                 "low": r.low, "high": r.high, "seeds": r.seeds} for r in table.itertuples()]
    return rows(spec, "mean", out)


def retention(runs: pd.DataFrame, spec: Mapping) -> pd.DataFrame:
    """Per method, task and pooled: mean at `at` ÷ mean at `base`, paired by seed, stratified BCa
    (`paired.retention`). Verdict: with `level`, the break rule's on the interval
    (`families.break_verdict`, its words when `pre_registered`); "denominator below 0.5" where a
    task's base mean (for pooled: any task's) is below `LOW_DENOMINATOR`."""
    metric, out = spec.get("metric", "auc"), []
    for setting in settings(runs, spec):
        base = {**setting, **spec["base"]}
        for method in methods(runs, spec):
            group = runs[runs["method"] == method]
            table = paired.retention(group, metric, base, setting, **_options(spec, paired.REPS))
            low = paired._select(group, base).groupby("task")[metric].mean() < LOW_DENOMINATOR
            for r in table.itertuples():
                flagged = low.any() if r.task == POOLED else low.get(r.task, False)
                verdict = ([families.break_verdict(r.low, r.high, spec.get("pre_registered", False),
                                                   spec["level"])] if "level" in spec else [])
                verdict += ["denominator below 0.5"] if flagged else []
                out.append({"method": method, "task": r.task, "setting": label(setting),
                            "point": r.retention, "low": r.low, "high": r.high, "seeds": r.seeds,
                            "verdict": "; ".join(verdict)})
    return rows(spec, "retention", out)


# --- paired tests ----------------------------------------------------------------------------------
def _tested(spec: Mapping, estimand: str, tests: list[dict]) -> pd.DataFrame:
    """A family of paired tests (`families.family`) as estimates rows: the mean difference, its
    Student-t interval, the test's p, Holm's p over the family and the verdict."""
    if not tests:
        return rows(spec, estimand, [])
    table = families.family(tests, test=spec.get("test", "sign-flip"),
                            pre_registered=spec.get("pre_registered", False),
                            alpha=spec.get("alpha", families.ALPHA),
                            words=tuple(spec.get("words", families.WORDS)),
                            exact=bool(spec.get("exact", False)),
                            interval=spec.get("interval", "t"))
    return rows(spec, estimand, [
        {"method": r.method, "baseline": spec.get("baseline", ""), "task": r.task,
         "setting": r.setting,
         "point": r.estimate, "low": r.low, "high": r.high, "seeds": r.seeds, "p": r.p,
         "p_holm": r.p_holm, "verdict": r.verdict} for r in table.itertuples()])


def _tests(spec: Mapping, per_method: dict, setting: Mapping) -> list[dict]:
    """method → task → seed-indexed differences, as a family's entries: the family is the pooled
    rows (`family` "pooled"; a lone task's row when there is one), the tasks', "all" (tasks and
    pooled) or "none"."""
    which = spec.get("family", "pooled")
    tests = [{"method": method, "task": task, "setting": label(setting), "differences": d,
              "family": which == "all" or which != "none" and (task == POOLED) == (
                  which == "pooled" and len(by_task) - (POOLED in by_task) > 1)}
             for method, by_task in per_method.items() for task, d in by_task.items()]
    return [t for t in tests if t["family"]] if spec.get("family_only") else tests


def difference(runs: pd.DataFrame, spec: Mapping) -> pd.DataFrame:
    """Per method but the baseline, task and pooled: method − baseline at each setting, paired
    by seed (pooled: the per-seed mean over tasks); tests and Holm over the family."""
    metric, base, tests = spec.get("metric", "auc"), spec["baseline"], []
    for setting in settings(runs, spec):
        per_method = {m: paired.paired_differences(runs, metric, {"method": m, **setting},
                                                   {"method": base, **setting})
                      for m in methods(runs, spec) if m != base}
        tests += _tests(spec, per_method, setting)
    return _tested(spec, "difference", tests)


def change(runs: pd.DataFrame, spec: Mapping) -> pd.DataFrame:
    """Per method: its own change from `base` (k = 0) to `at`, paired by seed (pooled: the
    per-seed mean over tasks); tests and Holm as `difference`'s. Does lag change the method's
    own score?"""
    metric, tests = spec.get("metric", "auc"), []
    for setting in settings(runs, spec):
        start = {**setting, **spec["base"]}
        per_method = {m: paired.paired_differences(runs, metric, {"method": m, **setting},
                                                   {"method": m, **start})
                      for m in methods(runs, spec)}
        tests += _tests(spec, per_method, setting)
    return _tested(spec, "change", tests)


def change_difference(runs: pd.DataFrame, spec: Mapping) -> pd.DataFrame:
    """The robustness estimand: per method but the baseline, its change from `base` (k = 0) to
    `at` (k_max) minus the baseline's change, paired by seed: positive where the method loses
    less (or gains more) than the baseline. Tests and Holm as `difference`'s."""
    metric, b, tests = spec.get("metric", "auc"), spec["baseline"], []
    for setting in settings(runs, spec):
        start = {**setting, **spec["base"]}
        per_method = {}
        for m in methods(runs, spec):
            if m == b:
                continue
            conditions = [{"method": x, **s} for x in (m, b) for s in (setting, start)]
            per_method[m] = paired.with_pooled_seeds(
                {t: (x[0] - x[1]) - (x[2] - x[3])
                 for t, x in paired.paired(runs, metric, conditions).items()})
        tests += _tests(spec, per_method, setting)
    return _tested(spec, "change_difference", tests)


def welch(runs: pd.DataFrame, spec: Mapping) -> pd.DataFrame:
    """Per method but the baseline, task and setting: method − baseline where their runs are not
    paired (independent runs, such as two networks' on the same seed numbers): the difference of
    the means over seeds, its Welch t interval (`confidence`) and two-sided p
    (`paired.welch_difference`), Holm's p over the rows and the verdict (`families.verdict`, in
    `words`); seeds: the fewer of the two arms'. No pooled row (runs of different tasks are not
    paired either)."""
    metric, b, out = spec.get("metric", "auc"), spec["baseline"], []
    for setting in settings(runs, spec):
        chosen = paired._select(runs, setting)
        for task, group in chosen.groupby("task", sort=True):
            y = group.loc[group["method"] == b, metric].to_numpy(np.float64)
            for m in methods(runs, spec):
                x = group.loc[group["method"] == m, metric].to_numpy(np.float64)
                if m == b or len(x) < 2 or len(y) < 2:
                    continue
                point, low, high, p = paired.welch_difference(x, y, spec.get("confidence", 0.95))
                out.append({"method": m, "baseline": b, "task": task, "setting": label(setting),
                            "point": point, "low": low, "high": high,
                            "seeds": min(len(x), len(y)), "p": p})
    table = rows(spec, "welch", out)
    if table.empty:
        return table
    table["p_holm"] = stats.holm(table["p"].to_numpy())
    table["verdict"] = [families.verdict(r.point, r.p_holm, spec.get("pre_registered", False),
                                         spec.get("alpha", families.ALPHA),
                                         tuple(spec.get("words", families.WORDS)))
                        for r in table.itertuples()]
    return table


# --- aggregates over tasks × seeds (rliable) -------------------------------------------------------
def _aggregate(runs: pd.DataFrame, spec: Mapping, name: str) -> pd.DataFrame:
    """Per method: `stats.AGGREGATES[name]` of its `[seeds, tasks]` matrix with rliable's
    stratified bootstrap interval; seeds counts the runs."""
    metric, out = spec.get("metric", "auc"), []
    for setting in settings(runs, spec):
        matrices = {m: matrix(runs[runs["method"] == m], metric, setting)
                    for m in methods(runs, spec)}
        matrices = {m: x for m, x in matrices.items() if x.size}
        if not matrices:
            continue
        table = stats.interval_estimates(matrices, metrics=(name,), **_options(spec, 2000))
        out += [{"method": r.method, "setting": label(setting), "point": r.point, "low": r.low,
                 "high": r.high, "seeds": matrices[r.method].size} for r in table.itertuples()]
    return rows(spec, name, out)


def iqm(runs: pd.DataFrame, spec: Mapping) -> pd.DataFrame:
    """Per method: the interquartile mean of all its runs × tasks (rliable)."""
    return _aggregate(runs, spec, "iqm")


def task_iqm_mean(runs: pd.DataFrame, spec: Mapping) -> pd.DataFrame:
    """Per method: the mean over tasks of each task's IQM over seeds, which weights tasks equally
    (a pooled IQM weights them by how their scores spread)."""
    return _aggregate(runs, spec, "task_iqm_mean")


def improvement(runs: pd.DataFrame, spec: Mapping) -> pd.DataFrame:
    """Per method but the baseline: P(a run of the method beats one of the baseline on a task
    drawn at random), rliable's, with its stratified bootstrap interval."""
    metric, b, out = spec.get("metric", "auc"), spec["baseline"], []
    for setting in settings(runs, spec):
        y = matrix(runs[runs["method"] == b], metric, setting)
        for m in methods(runs, spec):
            x = matrix(runs[runs["method"] == m], metric, setting)
            if m == b or not x.size or not y.size:
                continue
            r = stats.probability_of_improvement({m: x, b: y}, m, [b],
                                                 **_options(spec, 2000)).iloc[0]
            out.append({"method": m, "baseline": b, "setting": label(setting), "point": r.point,
                        "low": r.low, "high": r.high, "seeds": x.size})
    return rows(spec, "improvement", out)


# --- how far the conclusions hold ------------------------------------------------------------------
def reliability(runs: pd.DataFrame, spec: Mapping) -> pd.DataFrame:
    """Split-half: the methods' IQMs (`statistic`, default "iqm") on the first half of the
    sorted seeds against the second's; Spearman's ρ (p: its test's) and the Spearman–Brown
    reliability of the whole, 2ρ / (1 + ρ) (undefined at ρ = −1)."""
    metric, name, out = spec.get("metric", "auc"), spec.get("statistic", "iqm"), []
    seeds = sorted(runs["seed"].unique())
    halves = [runs[runs["seed"].isin(h)] for h in (seeds[:len(seeds) // 2], seeds[len(seeds) // 2:])]
    for setting in settings(runs, spec):
        values = [[stats.AGGREGATES[name](matrix(h[h["method"] == m], metric, setting))
                   for m in methods(runs, spec)] for h in halves]
        rho, p = scipy_stats.spearmanr(*values)
        out += [{"estimand": "reliability", "setting": label(setting), "point": rho, "p": p,
                 "seeds": len(seeds)},
                {"estimand": "reliability_spearman_brown", "setting": label(setting),
                 "point": 2 * rho / (1 + rho) if rho > -1 else np.nan, "seeds": len(seeds)}]
    return rows(spec, "reliability", out)


def _resampled(runs: pd.DataFrame, chosen: np.ndarray, seeds: np.ndarray) -> pd.DataFrame:
    """The runs of `seeds[chosen]`, the i-th draw relabelled seed i (every method and task of a
    seed drawn together)."""
    by_seed = dict(tuple(runs.groupby("seed")))
    return pd.concat([by_seed[seeds[j]].assign(seed=i) for i, j in enumerate(chosen)],
                     ignore_index=True)


def joint(table: pd.DataFrame, specs: list[Mapping]) -> pd.DataFrame:
    """`table` (the rows of the estimands `specs`, in order) with one Holm's correction over
    every family row of them all (rows whose `p_holm` is set), and each row's verdict again in
    its own estimand's words: a family that spans estimands (a change and a level)."""
    table = table.copy()
    counted = table["p_holm"].notna() & table["p"].notna()
    table.loc[counted, "p_holm"] = stats.holm(table.loc[counted, "p"].to_numpy())
    by_estimand = {s["estimand"]: s for s in specs}
    table.loc[counted, "verdict"] = [
        families.verdict(r.point, r.p_holm, by_estimand[r.estimand].get("pre_registered", False),
                         by_estimand[r.estimand].get("alpha", families.ALPHA),
                         tuple(by_estimand[r.estimand].get("words", families.WORDS)))
        for r in table[counted].itertuples()]
    return table


def family_table(runs: pd.DataFrame, members: list[Mapping]) -> pd.DataFrame:
    """The rows of every estimand of a family (`members`: their specs), Holm over them jointly."""
    table = pd.concat([ESTIMANDS[m["estimand"]](runs, m) for m in members], ignore_index=True)
    return joint(table, members) if len(members) > 1 else table


def stability(runs: pd.DataFrame, spec: Mapping) -> pd.DataFrame:
    """How often each family verdict holds: under `reps` (default 200) seed bootstraps that
    resample seeds jointly across methods, tasks and settings ("stability_bootstrap"), and with
    each task left out ("stability_leave_one_task_out"). The family is `members` (the specs of
    its estimands, Holm over them jointly, as `family_table`), else `difference` with this spec.
    point: the fraction that agree; verdict: the verdict on all runs."""
    key = ["estimand", "method", "task", "setting"]
    members = list(spec.get("members") or [{**spec, "estimand": "difference"}])
    full = family_table(runs, members)
    full = full[full["p_holm"].notna()].set_index(key)[["verdict", "baseline"]]
    rng, seeds = np.random.default_rng(spec.get("seed", 0)), np.sort(runs["seed"].unique())
    # a replica needs only the family's tests and their verdicts (no intervals)
    fast = [{**m, "interval": "t", "family_only": True} for m in members]
    boot = [family_table(_resampled(runs, rng.integers(0, len(seeds), len(seeds)), seeds),
                         fast) for _ in range(spec.get("reps", 200))]
    tasks = sorted(runs["task"].unique())
    left = ([family_table(runs[runs["task"] != t], fast) for t in tasks]
            if len(tasks) > 2 else [])
    out = []
    for estimand, replicas in (("stability_bootstrap", boot),
                               ("stability_leave_one_task_out", left)):
        for (of, m, task, setting), (verdict, baseline) in full.iterrows():
            agree = [r.set_index(key)["verdict"].get((of, m, task, setting)) == verdict
                     for r in replicas]
            out.append({"estimand": estimand, "method": m, "baseline": baseline,
                        "task": task, "setting": f"{of}: {setting}" if len(members) > 1 else setting,
                        "verdict": verdict,
                        "point": float(np.mean(agree)) if agree else np.nan,
                        "seeds": len(seeds)})
    return rows(spec, "stability", out)


def argmax(runs: pd.DataFrame, spec: Mapping) -> pd.DataFrame:
    """Per method: the value of the setting column `over` whose pooled mean (`mean`'s; the task's
    own with one task) is highest, with that mean and its interval."""
    means = mean(runs, spec)
    tasks = runs["task"].nunique()
    means = means[(means["task"] == POOLED) == (tasks > 1)]
    best = means.loc[means.groupby("method", sort=True)["point"].idxmax()]
    return best.assign(estimand="argmax").reset_index(drop=True)


ESTIMANDS = {"mean": mean, "retention": retention, "difference": difference,
             "change": change, "change_difference": change_difference, "welch": welch,
             "iqm": iqm, "task_iqm_mean": task_iqm_mean,
             "improvement": improvement, "reliability": reliability, "stability": stability,
             "argmax": argmax}


def estimate(runs: pd.DataFrame, study: Mapping) -> pd.DataFrame:
    """A study's estimates table: each entry of `study["estimands"]` (a spec with its
    `estimand`, the study's name added) in order, one table."""
    parts = [ESTIMANDS[e["estimand"]](runs, {"study": study.get("study", ""), **e})
             for e in study["estimands"]]
    return pd.concat(parts, ignore_index=True) if parts else rows(study, "", [])
