"""The studies over settings that docs/preregistrations.md pre-registers beside the controlled-lag
study (`presets.STUDIES`):

* `forward`: both sources of policy lag at once, the update frequency (K epochs per batch, the
  learning rate) crossed with a constant lag k = C − 1;
* `stepsize`: PPO-Clip's and VACO's synchronous learning rates, and the Align/Filter ablations;
* `delta-lag`: VACO's δ at k = 0 and at a constant lag.

A run is scored as the pre-registration says: its final score is the mean of its last
`FINAL_EVALS` evaluations and its AUC the mean of all its evaluations, each normalised per task,
(R − R_random) / (R_sync − R_random), R_random the uniform random policy's return (the references
file) and R_sync the mean final return of synchronous PPO-Clip at the base setting (K = 4,
lr 3·10⁻⁴, k = 0) **on the same seeds**, from these sweeps; a diverged run scores 0 from its
divergence on (a diverged PPO-Clip run counts at R_random in R_sync).

Retention in a setting = the method's mean score there / its mean score in its base setting
(K = 4, lr 3·10⁻⁴, k = 0; for δ, the same δ at k = 0), paired by seed, with a 95% BCa interval over
seeds (tasks as strata when pooled): the final-score retention and, alike, the AUC retention. The
break rule: "breaks" when the interval's upper end is below 0.8, "holds" when its lower end is
above 0.8 (non-inferiority, margin 0.2), else "undetermined"; in the forward study these are
pre-registered verdicts (for results made after the pre-registration), elsewhere exploratory and
worded by where the interval lies.

The pre-registered family of the forward study: VACO − PPO-Clip and VACO − APPO, final score and
AUC, (i) at the largest lag with K = 4 (lr 3·10⁻⁴) and (ii) at the highest update frequency,
K = 32 at k = 0 (lr 3·10⁻⁴), per task with at least `lag.MIN_SEEDS` seeds and pooled: paired
t-tests with Holm's correction over the family, the exact sign-flip test beside each.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter
import numpy as np
import pandas as pd

from vaco_jax.pipeline import estimates, figures, preregistration, runs as runs_, scores, tables
from vaco_jax.pipeline.estimates import BREAK_LEVEL
from vaco_jax.study import lag, presets, stats
from vaco_jax.study.capacity import markdown_rows

STUDIES = ("forward", "stepsize", "delta-lag")
FINAL_EVALS = presets.FINAL_EVALS
BASE_EPOCHS = 4
BASE_LR = 3e-4
BASE_DELTA = 0.2
SYNC_METHOD = "ppo_clip"
TARGET = lag.TARGET
POOLED = lag.POOLED
PRIMARY_BASELINES = lag.PRIMARY_BASELINES
HOLDS_METHODS = lag.HOLDS_METHODS
HIGHEST_EPOCHS = 32
"""The pre-registered high-update-frequency setting of the forward study: K = 32 at k = 0."""
KL_NOTE = ("`approx_kl` estimates KL(β ‖ π_θ), behaviour policy to learner, averaged over a run's "
           "updates: at k = 0 (β = π_T) it is an update's step; at k > 0 it holds the lag between "
           "β and π_T as well, so it is not a step size across lags.")
"""What the reports' approx_kl measures, said beside each of its tables that spans lags."""
RUN = ["study", "env", "method", "setting", "capacity", "seed"]
COLUMN = ["method", "setting", "capacity"]
CELL = ["env", *COLUMN]


def forward_setting(epochs: int, learning_rate: float) -> str:
    return f"K={int(epochs)}, lr={learning_rate:g}"


def lr_setting(learning_rate: float) -> str:
    return f"lr={learning_rate:g}"


def delta_setting(delta: float) -> str:
    return f"δ={delta:g}"


BASE_FORWARD = forward_setting(BASE_EPOCHS, BASE_LR)
BASE_STEPSIZE = lr_setting(BASE_LR)


# --- loading --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Sweeps:
    """Rows of the settings studies (`results`, with `tidy`'s columns) and their cell records."""

    results: pd.DataFrame
    cells: pd.DataFrame
    forward_tasks: tuple[str, ...] = ()
    """The forward study's planned tasks: every task of the presets its sweeps were made with (a
    named preset's whole list, though each task may fill its own directory), so that a task with
    no runs yet counts as missing from the pre-registered family rather than as not planned."""


def _planned_tasks(plan: dict) -> tuple[str, ...]:
    """The tasks of the preset a sweep's plan names (its own list if the name is not a preset)."""
    preset = plan.get("preset", {})
    known = presets.PRESETS.get(preset.get("name", ""))
    return tuple(known.envs if known is not None else preset.get("envs", ()))


def load_study(directories: Sequence[str | Path], *,
               allow_code_change: bool = False) -> Sweeps:
    """The rows of `STUDIES` in every sweep directory, refusing a cell found in two directories
    and, unless `allow_code_change`, cells made by different vaco_jax source."""
    parts, cells = lag.read_sweeps(directories, STUDIES, allow_code_change)
    forward_tasks = {task for _, table, plan in parts if (table["study"] == "forward").any()
                     for task in _planned_tasks(plan)}
    tables = [tidy(table, plan.get("cells", {})) for _, table, plan in parts]
    results = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    if results.empty:
        raise ValueError(f"no rows of the {', '.join(STUDIES)} studies in "
                         f"{[str(d) for d in directories]}; run `vaco-sweep --preset forward-cpu` "
                         f"(or stepsize-cpu, delta-lag-cpu) first")
    return Sweeps(results, cells, tuple(sorted(forward_tasks)))


def tidy(results: pd.DataFrame, plan_cells: dict) -> pd.DataFrame:
    """`results` as `runs.evaluations` reads them (K and the default learning rate from each cell's
    config in the plan, `plan_cells`; a swept learning rate from the row; `diverged` from then on),
    with `method` (the algorithm), `epochs` (K), `learning_rate` and `setting` (the study's label:
    "K=16, lr=0.0003", "lr=0.001", "δ=0.1")."""
    if results.empty:
        return results.assign(method=[], epochs=[], learning_rate=[], k=[], setting=[])
    missing = sorted(set(results["cell"]) - set(plan_cells))
    if missing:
        raise ValueError(f"cells {missing[:3]} are not in the sweep's plan (sweep.json): their "
                         f"K and learning rate are unknown")
    frame = runs_.evaluations(results, plan_cells)
    frame = frame.assign(method=frame["algo"], epochs=frame["K"].astype(int),
                         learning_rate=frame["lr"], capacity=frame["capacity"].astype(int))
    return frame.assign(setting=[
        forward_setting(e, lr) if s == "forward" else lr_setting(lr) if s == "stepsize"
        else delta_setting(d)
        for s, e, lr, d in zip(frame["study"], frame["epochs"], frame["learning_rate"],
                               frame["delta"])])


# --- scores ---------------------------------------------------------------------------------------
def raw_runs(results: pd.DataFrame, last_evals: int = FINAL_EVALS) -> pd.DataFrame:
    """One row per run (`runs.tidy`): its final return (the mean of its last `last_evals`
    evaluations; NaN if it diverged), whether and when it diverged, its mean in-update `approx_kl`
    and behaviour TV, and its curve (`steps`, `returns`, with NaN from its divergence on)."""
    return runs_.tidy(results.assign(sweep=results.get("sweep", "")), last_evals,
                      run=[*RUN, "k", "epochs", "learning_rate", "delta", "sweep"],
                      means=["approx_kl", "behavior_tv"]).rename(columns={"final": "final_return"})


def sync_references(runs: pd.DataFrame, random: dict[str, float]) -> pd.DataFrame:
    """Per task: R_sync, the mean final return of synchronous PPO-Clip at the base setting over
    its seeds (a diverged run counted at R_random), from the forward study where it has them, else
    the step-size study; R_random; the seeds and where they come from."""
    base = runs[(runs["method"] == SYNC_METHOD) & (runs["k"] == 0)
                & (runs["epochs"] == BASE_EPOCHS) & np.isclose(runs["learning_rate"], BASE_LR)
                & np.isclose(runs["delta"], BASE_DELTA) & runs["study"].isin(("forward", "stepsize"))]
    rows = []
    for env in sorted(runs["env"].unique()):
        here = base[base["env"] == env]
        study = next((s for s in ("forward", "stepsize") if (here["study"] == s).any()), None)
        if study is None:
            raise ValueError(
                f"no synchronous PPO-Clip runs (K = {BASE_EPOCHS}, lr {BASE_LR:g}, k = 0) on "
                f"{env}: the scores are normalised by them on the same seeds; add the sweep "
                f"directory of the forward or step-size study of {env} to --sweeps")
        here = here[here["study"] == study]
        finals = here["final_return"].fillna(random[env]).to_numpy(np.float64)
        rows.append({"task": env, "random_return": random[env],
                     "sync_return": float(finals.mean()), "sync_seeds": len(finals),
                     "sync_from": study, "sync_diverged": int(here["diverged"].sum())})
    return pd.DataFrame(rows)


# --- tables ---------------------------------------------------------------------------------------
def _estimates(table: pd.DataFrame, name: str) -> pd.DataFrame:
    """An `estimates.means` or `estimates.ratios` table with its point named `name` and its
    interval `<name>_low`, `<name>_high`."""
    return table.rename(columns={"point": name, "low": f"{name}_low", "high": f"{name}_high"})


def score_table(runs: pd.DataFrame, *, reps: int, seed: int) -> pd.DataFrame:
    """Mean final score and mean AUC per (task, method, setting, k) with 95% BCa intervals, then
    pooled over tasks; and the mean `approx_kl` and behaviour TV over seeds."""
    score, auc = (_estimates(estimates.means(runs, value, CELL, reps=reps, seed=seed), value)
                  for value in ("score", "auc"))
    out = score.merge(auc, on=["task", *COLUMN, "seeds", "tasks"])
    out = lag.with_run_means(out, runs, ["approx_kl", "behavior_tv"], CELL)
    return _ordered(out.assign(k=out["capacity"] - 1))


def _setting_order(settings) -> list[str]:
    def key(s: str):
        parts = dict(p.split("=") for p in s.replace(" ", "").split(","))
        return tuple(float(parts.get(name, 0)) for name in ("K", "lr", "δ"))
    return sorted(set(settings), key=key)


def _ordered(frame: pd.DataFrame) -> pd.DataFrame:
    """`lag.ordered`: tasks, methods (as the lag study), settings, then k."""
    if frame.empty:
        return frame
    settings = _setting_order(frame["setting"])
    return lag.ordered(frame, "method", frame["setting"].map(settings.index), frame["capacity"])


def retention_table(runs: pd.DataFrame, base: dict[str, tuple[str, int]] | None = None, *,
                    reps: int, seed: int, pre_registered: bool) -> pd.DataFrame:
    """Final-score and AUC retention per (task, method, setting, k) against the method's base
    column — `base(setting)` → (base setting, base capacity); default: the forward study's
    (K = 4, lr 3·10⁻⁴, k = 0) — with 95% BCa intervals and the break rule's verdicts; pooled over
    tasks (seeds resampled within each task): `estimates.ratios`."""
    def base_of(column: tuple) -> tuple:
        method, setting, _ = column
        return (method, *(base[setting] if base is not None else (BASE_FORWARD, 1)))

    out = None
    for value, name in (("score", "retention"), ("auc", "auc_retention")):
        frame = _estimates(estimates.ratios(runs, value, CELL, base_of, reps=reps, seed=seed),
                           name)
        frame.insert(frame.columns.get_loc("seeds"), f"{name}_verdict", [
            lag.break_verdict(low, high, pre_registered)
            for low, high in zip(frame[f"{name}_low"], frame[f"{name}_high"])])
        out = frame if out is None else out.merge(frame, on=["task", *COLUMN, "seeds", "tasks"],
                                                  how="outer")
    return _ordered(out.assign(k=out["capacity"] - 1))


# --- the pre-registered family ----------------------------------------------------------------------
def forward_primary_settings(runs: pd.DataFrame) -> dict[str, tuple[str, int]]:
    """The family's two settings in the forward study: (i) the largest lag at the base setting,
    (ii) K = 32 (lr 3·10⁻⁴) at k = 0; as name → (setting, capacity)."""
    largest = int(runs["capacity"].max())
    return {f"k={largest - 1}, {BASE_FORWARD}": (BASE_FORWARD, largest),
            f"k=0, {forward_setting(HIGHEST_EPOCHS, BASE_LR)}":
                (forward_setting(HIGHEST_EPOCHS, BASE_LR), 1)}


def primary_table(runs: pd.DataFrame, retention: pd.DataFrame, *, pre_registered: bool,
                  planned_tasks: Sequence[str] = ()) -> pd.DataFrame:
    """The forward study's pre-registered family (module docstring) and the "holds" verdicts of
    VACO, PPO-Clip and APPO in its two settings; columns as `lag.primary_table`'s. The family is
    whole only with every task of `planned_tasks` (and of `runs`) in it, pooled too."""
    family_settings = forward_primary_settings(runs)
    tests = [test for label, (setting, capacity) in family_settings.items()
             for test in lag.family_tests(runs[(runs["setting"] == setting)
                                               & (runs["capacity"] == capacity)], label)]
    table = lag.paired_family(tests, pre_registered)
    # Holm over part of the family would be another test than the one fixed in advance: until
    # every comparison is in (each setting, baseline, metric, task of the study, pooled), none has
    # a verdict.
    planned = sorted(set(runs["env"]) | set(planned_tasks))
    tasks = planned + ([POOLED] if len(planned) > 1 else [])
    expected = {(f"{TARGET} − {b}", t, label, m) for label in family_settings
                for b in PRIMARY_BASELINES for m in ("final score", "AUC") for t in tasks}
    present = set() if table.empty else {
        (r.comparison, r.task, r.setting, r.metric) for r in table.itertuples() if r.family}
    if pre_registered and not table.empty and not expected <= present:
        table.loc[table["family"].astype(bool), "verdict"] = (
            f"no verdict: {len(expected & present)} of the family's {len(expected)} comparisons "
            "are in (Holm needs them all)")
    holds = [row for label, (setting, capacity) in family_settings.items()
             for row in lag.holds_rows(
                 retention[(retention["setting"] == setting) & (retention["capacity"] == capacity)],
                 label, pre_registered, "retention", "retention_low", "retention_high")]
    table = pd.concat([table, pd.DataFrame(holds)], ignore_index=True)
    table["analysis"] = "pre-registered" if pre_registered else "exploratory"
    return table


def forward_answer(retention: pd.DataFrame, pre_registered: bool,
                   planned_tasks: Sequence[str] = ()) -> str:
    """The forward study's question in one sentence: is there a setting where PPO-Clip breaks
    (the break rule on its final-score retention), and does VACO hold there? Planned tasks with
    no runs yet are named after it."""
    missing = sorted(set(planned_tasks) - set(retention["task"]))
    return _forward_answer(retention, pre_registered) + (
        f" Not yet run: {', '.join(missing)}." if missing else "")


def _forward_answer(retention: pd.DataFrame, pre_registered: bool) -> str:
    ppo = retention[retention["method"] == SYNC_METHOD]
    vaco = retention[retention["method"] == TARGET].set_index(["task", "setting", "capacity"])
    if ppo.empty:
        return "PPO-Clip has no runs outside its base setting: the question cannot be answered."
    broken = ppo[ppo["retention_high"] < BREAK_LEVEL]
    word = "breaks" if pre_registered else f"has its 95% CI below {BREAK_LEVEL:g}"
    settings = "; ".join(_setting_order(ppo["setting"]))
    if broken.empty:
        worst = ppo.loc[ppo["retention_high"].idxmin()]
        return (f"PPO-Clip {word} in no setting tested ({settings}; k up to "
                f"{int(ppo['k'].max())}): its lowest retention interval is "
                f"{tables.interval(worst.retention, worst.retention_low, worst.retention_high)} "
                f"({worst.task}, {worst.setting}, k = {int(worst.k)}).")
    parts = []
    for r in broken.itertuples():
        key = (r.task, r.setting, r.capacity)
        there = (f"VACO {vaco.loc[key, 'retention_verdict']} "
                 f"({tables.interval(*vaco.loc[key, ['retention', 'retention_low', 'retention_high']])})"
                 if key in vaco.index else "VACO not run there")
        parts.append(f"{r.task}, {r.setting}, k = {int(r.k)}: PPO-Clip "
                     f"{tables.interval(r.retention, r.retention_low, r.retention_high)}; {there}")
    return f"PPO-Clip {word} in {len(broken)} setting(s): " + "; ".join(parts) + "."


# --- the step-size study --------------------------------------------------------------------------
def best_learning_rates(scores: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per task (pooled too) and method of the learning-rate sweep (PPO-Clip, VACO): the learning
    rate with the highest mean final score (ties: AUC), its score, AUC and approx_kl; and, per
    task, VACO − PPO-Clip at their best learning rates (paired t interval; exploratory)."""
    swept = scores[scores["method"].isin((SYNC_METHOD, TARGET))]
    rates = swept.groupby(["task", "method"])["setting"].nunique()
    rows = []
    for (task, method), group in swept.groupby(["task", "method"], sort=False):
        if rates[(task, method)] < 2:
            continue
        best = group.sort_values(["score", "auc"], ascending=False).iloc[0]
        rows.append({"task": task, "method": method, "best": best["setting"],
                     **{c: best[c] for c in ("score", "score_low", "score_high", "auc", "auc_low",
                                             "auc_high", "approx_kl", "seeds")}})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    best = table.set_index(["task", "method"])["best"]
    diffs = []
    for task in table["task"].unique():
        if (task, TARGET) not in best.index or (task, SYNC_METHOD) not in best.index:
            continue
        d = _difference(runs, task, (TARGET, best[(task, TARGET)]),
                        (SYNC_METHOD, best[(task, SYNC_METHOD)]))
        mean, low, high = stats.paired_t_interval(d)
        diffs.append({"task": task, "vaco_minus_ppo_clip": mean, "difference_low": low,
                      "difference_high": high})
    return table.merge(pd.DataFrame(diffs), on="task", how="left") if diffs else table


def _difference(runs: pd.DataFrame, task: str, a: tuple[str, str], b: tuple[str, str],
                value: str = "score") -> np.ndarray:
    """Per seed: `value` of (method, setting) a minus b at k = 0, on `task` (pooled: the mean
    over tasks of the per-task differences, on the seeds every task has):
    `estimates.paired_differences`; empty where the task has fewer than 2 common seeds."""
    a, b = ({"method": method, "setting": setting} for method, setting in (a, b))
    d = estimates.paired_differences(
        runs[runs["capacity"] == 1].rename(columns={"env": "task"}), value, a, b)
    return d[task].to_numpy(np.float64) if task in d else np.array([])


def matched_kl(scores: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per task: the learning rates of VACO and PPO-Clip whose mean in-update approx_kl are
    closest (on a log scale: the smallest |log KL_VACO − log KL_PPO-Clip|), their KLs, and VACO −
    PPO-Clip in final score and AUC there (paired t intervals; exploratory)."""
    rows = []
    for task, group in scores[scores["task"] != POOLED].groupby("task", sort=True):
        v = group[group["method"] == TARGET]
        p = group[group["method"] == SYNC_METHOD]
        if len(v) < 2 or len(p) < 2:
            continue
        pairs = [(abs(math.log(a.approx_kl) - math.log(b.approx_kl)), a, b)
                 for a in v.itertuples() for b in p.itertuples()
                 if a.approx_kl > 0 and b.approx_kl > 0]
        if not pairs:
            continue
        _, a, b = min(pairs, key=lambda x: x[0])
        row = {"task": task, "vaco_lr": a.setting, "vaco_approx_kl": a.approx_kl,
               "ppo_clip_lr": b.setting, "ppo_clip_approx_kl": b.approx_kl}
        for value in ("score", "auc"):
            d = _difference(runs, task, (TARGET, a.setting), (SYNC_METHOD, b.setting), value)
            mean, low, high = stats.paired_t_interval(d)
            row.update({f"{value}_difference": mean, f"{value}_low": low, f"{value}_high": high})
        rows.append(row)
    return pd.DataFrame(rows)


def ablation_table(runs: pd.DataFrame) -> pd.DataFrame:
    """At the base learning rate, synchronous: each method minus VACO in final score and AUC per
    task and pooled (paired t intervals; exploratory) — the Align/Filter ablations against VACO."""
    base = runs[(runs["setting"] == BASE_STEPSIZE) & (runs["capacity"] == 1)]
    rows = []
    tasks = sorted(base["env"].unique())
    for method in lag._method_order(base["method"].unique()):
        if method == TARGET:
            continue
        for task in tasks + ([POOLED] if len(tasks) > 1 else []):
            row = {"task": task, "method": method}
            for value in ("score", "auc"):
                d = _difference(base, task, (method, BASE_STEPSIZE), (TARGET, BASE_STEPSIZE), value)
                mean, low, high = stats.paired_t_interval(d) if len(d) else (np.nan,) * 3
                row.update({f"{value}_minus_vaco": mean, f"{value}_low": low,
                            f"{value}_high": high, "seeds": len(d)})
            rows.append(row)
    return pd.DataFrame(rows)


# --- the report -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Report:
    """Every table of the settings studies present in the sweeps (empty frames for absent ones)."""

    runs: pd.DataFrame
    tasks: pd.DataFrame
    forward_scores: pd.DataFrame
    forward_retention: pd.DataFrame
    primary: pd.DataFrame
    answer: str
    stepsize_scores: pd.DataFrame
    best_lr: pd.DataFrame
    matched: pd.DataFrame
    ablations: pd.DataFrame
    delta_scores: pd.DataFrame
    delta_retention: pd.DataFrame
    diverged: pd.DataFrame
    provenance: pd.DataFrame
    pre_registration: str
    pre_registration_detail: str
    reps: int
    last_evals: int


def analyse(sweeps: Sweeps, table: dict, *, reps: int = 10_000, seed: int = 0,
            last_evals: int = FINAL_EVALS) -> Report:
    raw = raw_runs(sweeps.results, last_evals)
    tasks = sync_references(raw, {env: float(entry["random_return"]) for env, entry in
                                  lag.task_references(table, raw, last_evals).items()})
    by_task = tasks.set_index("task")
    runs = scores.whole_run_scores(raw, by_task["random_return"], by_task["sync_return"],
                                   "env", last_evals)
    status, detail = lag.pre_registration(sweeps.cells)
    pre_registered = status == "after"
    options = dict(reps=reps, seed=seed)
    empty = pd.DataFrame()
    forward = runs[runs["study"] == "forward"]
    stepsize = runs[(runs["study"] == "stepsize") & (runs["k"] == 0)]   # synchronous, as defined
    delta = runs[runs["study"] == "delta-lag"]
    f_scores = score_table(forward, **options) if len(forward) else empty
    f_retention = (retention_table(forward, **options, pre_registered=pre_registered)
                   if len(forward) else empty)
    s_scores = score_table(stepsize, **options) if len(stepsize) else empty
    d_retention = empty
    if len(delta):
        bases = {s: (s, 1) for s in delta["setting"].unique()}
        d_retention = retention_table(delta, bases, **options, pre_registered=False)
    diverged = runs.loc[runs["diverged"], [*RUN, "diverged_at_step"]].reset_index(drop=True)
    return Report(
        runs=runs[[*RUN, "k", "epochs", "learning_rate", "delta", "budget", "evaluations",
                   "final_return", "diverged", "diverged_at_step", "approx_kl", "behavior_tv",
                   "sweep", "score", "auc"]], tasks=tasks, forward_scores=f_scores,
        forward_retention=f_retention,
        primary=(primary_table(forward, f_retention, pre_registered=pre_registered,
                               planned_tasks=sweeps.forward_tasks) if len(forward) else empty),
        answer=(forward_answer(f_retention, pre_registered, sweeps.forward_tasks)
                if len(forward) else ""),
        stepsize_scores=s_scores,
        best_lr=best_learning_rates(s_scores, stepsize) if len(stepsize) else empty,
        matched=matched_kl(s_scores, stepsize) if len(stepsize) else empty,
        ablations=ablation_table(stepsize) if len(stepsize) else empty,
        delta_scores=score_table(delta, **options) if len(delta) else empty,
        delta_retention=d_retention, diverged=diverged, provenance=lag.provenance(sweeps),
        pre_registration=status, pre_registration_detail=detail, reps=reps,
        last_evals=last_evals)


def _ci_text(frame: pd.DataFrame, value: str) -> list[str]:
    """Each row's `value [low, high]`, a pooled row over fewer tasks marked (`lag.with_fewer`)."""
    return lag.with_fewer(frame, tables.intervals(frame, value, f"{value}_low", f"{value}_high"))


def _wide(frame: pd.DataFrame, texts: Sequence[str], index: Sequence[str], columns: str) -> str:
    """A markdown table (`tables.wide`): one row per `index`, one column per value of `columns`
    (lags in increasing k, or settings in order), cells `texts`."""
    if frame.empty:
        return "—"
    order = (sorted(set(frame[columns]), key=lambda c: int(c.split("=")[1])) if columns == "lag"
             else _setting_order(frame[columns]))
    return tables.wide(frame, texts, index, columns, order)


def _k_label(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(lag=[f"k={int(k)}" for k in frame["k"]])


def _retention_texts(frame: pd.DataFrame, name: str) -> list[str]:
    return [f"{t} ({v})" for t, v in zip(_ci_text(frame, name), frame[f"{name}_verdict"])]


def summary(r: Report, *, sweeps: Sequence[str], references_path: str,
            figures: dict[str, str]) -> str:
    """summary.md: the pre-registered family first, then every table."""
    lines = ["# The settings studies: update frequency × lag, step size, δ × lag", "",
             f"Sweeps: {', '.join(f'`{s}`' for s in sweeps)}; random returns: "
             f"`{references_path}`.", "",
             f"A run's final score is the mean of its last {r.last_evals} evaluations and its AUC "
             f"the mean of all its evaluations, normalised per task by the random policy (0) and "
             f"synchronous PPO-Clip at K = {BASE_EPOCHS}, lr {BASE_LR:g}, k = 0 on the same seeds "
             f"(1); a diverged run scores 0 from its divergence on. Retention = the mean score in "
             f"a setting / the method's mean score in its base setting, paired by seed; 95% BCa "
             f"intervals over seeds ({r.reps:,} resamples), tasks as strata when pooled.", ""]
    made = r.pre_registration_detail
    if len(r.primary):
        if r.pre_registration == "after":
            lines += ["## Pre-registered tests", "",
                      f"Fixed before the runs (docs/experiments.md, \"Pre-registered tests\"; "
                      f"these results were {made}): VACO minus PPO-Clip and minus APPO, final "
                      f"score and AUC, at the largest lag with K = {BASE_EPOCHS} and at K = "
                      f"{HIGHEST_EPOCHS} with k = 0 (both at lr {BASE_LR:g}), paired t-tests with "
                      f"Holm's correction over the family, the exact sign-flip test beside "
                      f"them; the retention's 95% BCa interval against {BREAK_LEVEL:g} for VACO, "
                      f"PPO-Clip and APPO. Everything "
                      f"after the answer below is exploratory unless it says otherwise.", ""]
        else:
            lines += [f"## The pre-registered tests, computed on these results (exploratory: "
                      f"{preregistration.STATUS[r.pre_registration]})", "",
                      f"These results were {made}; the tests call no verdict here.", ""]
        lines += [lag._primary_markdown(r.primary), "",
                  "## The forward × backward question", "",
                  "Is there a setting, reachable on a CPU, where PPO-Clip breaks — and does VACO "
                  "hold there? " + r.answer, ""]
    lines += ["## Tasks and references", "", markdown_rows(_rounded(r.tasks)), "",
              "## Provenance", "", markdown_rows(r.provenance), "",
              "## Diverged runs (scored 0)", "",
              markdown_rows(r.diverged) if len(r.diverged) else "None.", ""]
    if len(r.forward_retention):
        fr = _k_label(r.forward_retention)
        fs = _k_label(r.forward_scores)
        lines += ["## Forward × backward: final-score retention", "",
                  "Against the method's own score at K = 4, lr 3e-4, k = 0; the verdict by the "
                  "break rule in brackets.", "",
                  _wide(fr, _retention_texts(fr, "retention"), ("task", "method", "setting"), "lag"),
                  "", "## Forward × backward: AUC retention", "",
                  _wide(fr, _retention_texts(fr, "auc_retention"), ("task", "method", "setting"),
                        "lag"), "",
                  "## Forward × backward: normalised final score", "",
                  _wide(fs, _ci_text(fs, "score"), ("task", "method", "setting"), "lag"), "",
                  "## Forward × backward: mean in-update approx_kl (exploratory)", "",
                  KL_NOTE, "",
                  _wide(fs, lag.with_fewer(fs, [f"{x:.4f}" for x in fs["approx_kl"]]),
                        ("task", "method", "setting"), "lag"), ""]
    if len(r.stepsize_scores):
        ss = r.stepsize_scores
        lines += ["## Step size (synchronous; exploratory)", "",
                  "Normalised final score [95% CI], and mean in-update approx_kl, per learning "
                  "rate.", "",
                  _wide(ss, [f"{t}; KL {kl:.4f}" for t, kl in zip(_ci_text(ss, "score"),
                                                                ss["approx_kl"])],
                        ("task", "method"), "setting"), "",
                  "### Each method at its best learning rate", "",
                  "The highest mean final score (ties: AUC); then VACO − PPO-Clip, each at its "
                  "best learning rate, paired by seed (Student-t interval).", "",
                  _best_markdown(r.best_lr), "",
                  "### At matched in-update KL", "",
                  "The learning rates at which the two methods' mean approx_kl are closest (log "
                  "scale); VACO − PPO-Clip there, paired by seed (Student-t intervals).", "",
                  _matched_markdown(r.matched), "",
                  "### The Align/Filter ablations against VACO at lr 3e-4", "",
                  "Each method − VACO, synchronous, paired by seed (Student-t intervals).", "",
                  _ablation_markdown(r.ablations), ""]
    if len(r.delta_scores):
        ds, dr = _k_label(r.delta_scores), _k_label(r.delta_retention)
        lines += ["## VACO's δ at a constant lag (exploratory)", "",
                  "Normalised final score [95% CI]:", "",
                  _wide(ds, _ci_text(ds, "score"), ("task", "setting"), "lag"), "",
                  "Normalised AUC [95% CI] (a capped final score shows collapse, never a "
                  "slowdown; the AUC shows both):", "",
                  _wide(ds, _ci_text(ds, "auc"), ("task", "setting"), "lag"), "",
                  "Final-score retention against the same δ at k = 0:", "",
                  _wide(dr, _retention_texts(dr, "retention"), ("task", "setting"), "lag"), "",
                  "AUC retention against the same δ at k = 0:", "",
                  _wide(dr, _retention_texts(dr, "auc_retention"), ("task", "setting"), "lag"),
                  "", f"Mean in-update approx_kl and behaviour TV. {KL_NOTE}", "",
                  _wide(ds, [f"{kl:.4f}; TV {tv:.3f}" for kl, tv in
                             zip(ds["approx_kl"], ds["behavior_tv"])], ("task", "setting"), "lag"),
                  ""]
    lines += ["## Figures", "", *[f"* [{name}]({name}): {caption}"
                                  for name, caption in figures.items()]]
    return "\n".join(lines) + "\n"


def _best_markdown(best: pd.DataFrame) -> str:
    if best.empty:
        return "—"
    table = pd.DataFrame({
        "task": best["task"].replace({POOLED: "pooled (mean over tasks)"}),
        "method": best["method"], "best learning rate": best["best"],
        "final score": _ci_text(best, "score"), "AUC": _ci_text(best, "auc"),
        "approx_kl": best["approx_kl"].map("{:.4f}".format)})
    lines = [markdown_rows(table)]
    if "vaco_minus_ppo_clip" in best:
        for task, row in best.drop_duplicates("task").set_index("task").iterrows():
            if np.isfinite(row["vaco_minus_ppo_clip"]):
                lines.append(f"* {task}: VACO − PPO-Clip at their best learning rates "
                             f"{tables.interval(row['vaco_minus_ppo_clip'], row['difference_low'], row['difference_high'], sign=True)}")
    return "\n\n".join(lines[:1]) + ("\n\n" + "\n".join(lines[1:]) if len(lines) > 1 else "")


def _matched_markdown(matched: pd.DataFrame) -> str:
    if matched.empty:
        return "—"
    return markdown_rows(pd.DataFrame({
        "task": matched["task"], "VACO lr (approx_kl)": [
            f"{s} ({k:.4f})" for s, k in zip(matched["vaco_lr"], matched["vaco_approx_kl"])],
        "PPO-Clip lr (approx_kl)": [
            f"{s} ({k:.4f})" for s, k in zip(matched["ppo_clip_lr"],
                                            matched["ppo_clip_approx_kl"])],
        "VACO − PPO-Clip, final score": _signed(matched, "score_difference", "score"),
        "VACO − PPO-Clip, AUC": _signed(matched, "auc_difference", "auc")}))


def _signed(frame: pd.DataFrame, value: str, prefix: str) -> list[str]:
    return tables.intervals(frame, value, f"{prefix}_low", f"{prefix}_high", sign=True)


def _ablation_markdown(ablations: pd.DataFrame) -> str:
    if ablations.empty:
        return "—"
    return markdown_rows(pd.DataFrame({
        "task": ablations["task"].replace({POOLED: "pooled (mean over tasks)"}),
        "method": ablations["method"],
        "final score − VACO": _signed(ablations, "score_minus_vaco", "score"),
        "AUC − VACO": _signed(ablations, "auc_minus_vaco", "auc"), "seeds": ablations["seeds"]}))


def _rounded(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.apply(lambda c: c.map(lambda x: f"{x:.3g}") if c.dtype.kind == "f" else c)


# --- the figures (drawn as the controlled-lag study's: `lag.lag_colors`) -----------------------
def _settings_groups(methods: Sequence[str]) -> list[list[str]]:
    """Rows of at most `lag.LAG_PER_PANEL` methods: VACO, PPO-Clip, APPO and decoupled PPO first,
    then the others beside VACO and PPO-Clip (so every panel can be read against the two)."""
    ordered = lag._method_order(methods)
    first = [m for m in ordered if m in (*lag.LAG_REFERENCES, "decoupled_ppo")]
    others = [m for m in ordered if m not in first]
    anchors = [m for m in (lag.TARGET, "ppo_clip") if m in ordered]
    step = lag.LAG_PER_PANEL - len(anchors)
    return [first] + [anchors + others[i:i + step] for i in range(0, len(others), step)]


def forward_figure(retention: pd.DataFrame, methods: Sequence[str], task: str):
    """One task (or the pooled rows) of the forward × backward study: final-score retention (top)
    and AUC retention (bottom) against the update-frequency setting, one column per constant lag k,
    one colour per method (95% BCa CIs); the break level dashed. The settings vary along two arms
    from the base (K = 4, lr 3·10⁻⁴): the learning rate at K = 4, then the larger K, drawn apart (a
    rule between them); a line joins a method's points along one arm, never across the two. In
    the pooled rows a method pooled over fewer tasks than the study has is dashed with hollow
    markers, its legend entry saying how many."""
    rows = retention[(retention["task"] == task) & retention["method"].isin(methods)]
    lags = sorted(int(k) for k in rows["k"].unique())
    order = _setting_order(retention["setting"])
    parsed = {s: dict(p.split("=") for p in s.replace(" ", "").split(",")) for s in order}
    epochs = {s: int(v["K"]) for s, v in parsed.items()}
    arms = [[s for s in order if epochs[s] == BASE_EPOCHS],
            [s for s in order if epochs[s] != BASE_EPOCHS]]
    colors = lag.lag_colors(list(methods))
    fewer = lag._lag_fewer(retention) if task == lag.POOLED else {}
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
            ax.axhline(BREAK_LEVEL, color="0.5", ls="--", lw=0.8)
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
    fig.suptitle(f"Update frequency × constant lag: {where} (against K = 4, lr 3e-4, "
                          f"k = 0; dashed: {BREAK_LEVEL:g})\nleft of the rule: the learning rate "
                          f"at K = 4; right of it: more epochs K at lr 3e-4", fontsize=10)
    fig.tight_layout()
    return fig


def stepsize_figure(scores: pd.DataFrame):
    """Synchronous learning-rate sweep: normalised final score (top) and mean in-update approx_kl
    (bottom, log scale) against the learning rate, per task and pooled, PPO-Clip and VACO."""
    swept = scores[scores["method"].isin(("ppo_clip", lag.TARGET))]
    tasks = sorted(t for t in swept["task"].unique() if t != lag.POOLED)
    tasks += [lag.POOLED] if (swept["task"] == lag.POOLED).any() else []
    colors = lag.lag_colors(["ppo_clip", lag.TARGET])
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
    fig.suptitle("Synchronous step size (k = 0, K = 4; 95% BCa CIs)", fontsize=10)
    fig.tight_layout()
    return fig


def delta_lag_figure(scores: pd.DataFrame, retention: pd.DataFrame):
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
                axes[i][j].axhline(BREAK_LEVEL, color="0.5", ls="--", lw=0.8)
        axes[0][j].set_title("pooled over tasks" if task == lag.POOLED else task, fontsize=10)
    for i, (_, _, label) in enumerate(rows):
        axes[i][0].set_ylabel(label)
    axes[0][-1].legend(fontsize=8)
    fig.suptitle("VACO's δ at a constant lag (95% BCa CIs)", fontsize=10)
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
        figures.save(fig, Path(out) / name, dpi=dpi)
    return {name: caption for name, (_, caption) in drawn.items()}


def write(report: Report, out: str | Path, *, sweeps: Sequence[str], references_path: str,
          dpi: int = 120) -> list[Path]:
    """Every table (CSV; the family as primary.csv), the figures and summary.md into `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tables = {"runs": report.runs, "tasks": report.tasks, "primary": report.primary,
              "forward_scores": report.forward_scores,
              "forward_retention": report.forward_retention,
              "stepsize_scores": report.stepsize_scores, "best_learning_rate": report.best_lr,
              "matched_kl": report.matched, "ablations": report.ablations,
              "delta_scores": report.delta_scores, "delta_retention": report.delta_retention,
              "diverged": report.diverged, "provenance": report.provenance}
    written = []
    for name, frame in tables.items():
        if len(frame):
            frame.to_csv(out / f"{name}.csv", index=False)
            written.append(out / f"{name}.csv")
    captions = save_settings_figures(report, out, dpi=dpi)
    written += [out / name for name in captions]
    (out / "summary.md").write_text(summary(report, sweeps=sweeps,
                                            references_path=references_path, figures=captions))
    written.append(out / "summary.md")
    return written
