"""A method's lag-robustness scorecard (`vaco_jax.study.bench`): statistics only, no drawing.

Scores. A run's **final** return is the mean of its last `last_evals` evaluations, its **AUC** the
mean of all of them (equally spaced: the normalised area under the curve). Both are taken from
the random policy's return (`z = return − random`); a run that diverged counts as random (z = 0)
from its divergence on. The **normalised score** divides z by synchronous PPO-Clip's mean final z on
the task (PPO-Clip at k = 0 in the reference directory, made by the same code): 0 is random, 1 is
synchronous PPO-Clip.

What a scorecard says, per task and pooled over tasks (the mean of the tasks' values):
* **sanity** (k = 0): the method clears random (final z's 95% BCa interval above 0) and reaches at
  least half of synchronous PPO-Clip (normalised final score ≥ 0.5, point estimate);
* **retention** at each lag k > 0, and in the high-update-frequency setting: mean z at k over mean
  z at k = 0 (the method's own synchronous run, K = 4), for the final score and the AUC, with 95%
  BCa intervals over seeds (paired: seed s at every lag);
* **break-lag**: the smallest k whose final retention is below `BREAK_LEVEL` (0.8); "confirmed"
  when the interval's upper end is below it too;
* **comparisons named in advance**: the method minus each of the protocol's reference methods
  (PPO-Clip, APPO, VACO) in normalised score, final and AUC, at the largest lag and in the
  high-update-frequency setting, pooled over tasks: paired by seed (seed s of both methods used the
  same key), the exact sign-flip permutation test with Holm's correction over this family, and the
  95% interval that inverting the same test gives (the shifts it does not reject; it excludes 0
  exactly when the unadjusted p is below 0.05). The same comparisons with every other method of
  the leaderboard are reported as exploratory (unadjusted p-values).
A leaderboard method is compared only when both results are what one checkout computes
(`bench.computed_here`: the same programs, library versions and protocol version), and only when
its directory holds its per-seed runs. Any other is named with why it was not compared and the
command that recomputes it; a figure that cannot be drawn is said, not raised: a report never
ends a long run with a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from vaco_jax import io
from vaco_jax.pipeline import estimates, figures, scores, tables
from vaco_jax.pipeline.estimates import BREAK_LEVEL, REPS
from vaco_jax.pipeline.preregistration import ALPHA
from vaco_jax.study import bench, stats, sweep

SYNC_FRACTION = 0.5


@dataclasses.dataclass
class BenchResult:
    """One method's benchmark directory, read back."""

    directory: Path
    info: dict                   # bench.json
    runs: pd.DataFrame           # one row per (task, setting, lag, seed): final_z, auc_z
    random: dict                 # task → the random policy's return
    missing: list[str]           # planned cells not (yet) finished

    @property
    def method(self) -> str:
        return self.info["method"]


def load(directory: str | Path) -> BenchResult:
    """Read a benchmark directory (what is there: unfinished cells are listed in `missing`)."""
    directory = Path(directory)
    path = directory / bench.BENCH_FILE
    if not path.exists():
        raise FileNotFoundError(f"{directory} holds no benchmark ({path} is missing); run "
                                f"`vaco-bench --algo ... --out {directory}`")
    info = json.loads(path.read_text())
    random = json.loads((directory / bench.REFERENCES).read_text())
    proto = bench.VERSIONS.get((info["protocol"], info["protocol_version"]))
    overrides = tuple((name, tuple(value) if isinstance(value, list) else value)
                      for name, value in info["overrides"])   # JSON keeps tuples as lists
    method = bench.Method(info["algo"], overrides, info["method"]
                          if info["method"] != info["algo"] else "")
    runs_dir = directory / bench.RUNS
    results = (sweep.load_results(runs_dir) if io.has_rows(runs_dir / sweep.RESULTS)
               else pd.DataFrame())
    finished = set(results["cell"]) if len(results) else set()
    missing = []
    if proto is not None:
        missing = [c.cell_id for c in bench.bench_cells(method, proto, info.get("lag_profile", ()))
                   if c.cell_id not in finished]
    last = info["protocol_definition"]["last_evals"]
    return BenchResult(directory, info, run_scores(results, random, last), random, missing)


def run_scores(results: pd.DataFrame, random: dict, last_evals: int) -> pd.DataFrame:
    """Per run (task, setting, lag, seed): `final_z` and `auc_z`, returns above random
    (`scores.run_score` of `return − random`: a diverged run counts as random from its divergence
    on)."""
    columns = ["task", "setting", "lag", "seed", "final_z", "auc_z"]
    if not len(results):
        return pd.DataFrame(columns=columns)
    frame = results.assign(task=results["env"], setting=results["variant"],
                           lag=results["capacity"] - 1)
    z = frame["eval_return"].astype(np.float64) - frame["task"].map(random).astype(np.float64)
    failed = (frame["diverged"].astype(bool) if "diverged" in frame
              else pd.Series(False, index=frame.index))
    frame = frame.assign(z=z, failed=failed)
    rows = []
    for key, run in frame.sort_values("eval_index").groupby(["task", "setting", "lag", "seed"]):
        rows.append((*key, *scores.run_score(run["z"], run["step"], 0.0, None, last_evals,
                                             diverged=run["failed"])))
    return pd.DataFrame(rows, columns=columns)


# --- one method's numbers -----------------------------------------------------------------------
def _matrix(runs: pd.DataFrame, task: str, setting: str, lag: int, value: str) -> pd.Series:
    sel = runs[(runs.task == task) & (runs.setting == setting) & (runs.lag == lag)]
    return sel.set_index("seed")[value]


def retention(result: BenchResult, proto: bench.Protocol, *, reps: int = REPS) -> pd.DataFrame:
    """Final and AUC retention per task (and pooled) at each lag k > 0 of the lag axis, at
    each lag of the high-update-frequency setting and under the method's lag profile (when it
    ran one), with 95% BCa intervals over seeds."""
    runs = result.runs
    columns = [("lag", k) for k in proto.lags if k > 0]
    if proto.forward:
        columns += [("forward", k) for k in proto.forward_lags]
    if result.info.get("lag_profile"):   # the user's lag profile: its oldest age as the lag
        columns.append((bench.PROFILE, len(result.info["lag_profile"]) - 1))
    tables = []
    tasks = [t.env for t in proto.tasks]
    for value in ("final_z", "auc_z"):
        for setting, lag in columns:
            table = estimates.retention(runs, value, {"setting": "lag", "lag": 0},
                                        {"setting": setting, "lag": lag}, reps=reps, tasks=tasks)
            tables.append(table.assign(metric=value[:-2], setting=setting, lag=lag))
    rows = pd.concat(tables, ignore_index=True).to_dict("records") if tables else []
    return pd.DataFrame(rows, columns=["task", "metric", "setting", "lag", "retention", "low",
                                       "high", "seeds"])   # no rows while no cell pair finished


def break_lag(table: pd.DataFrame, level: float = BREAK_LEVEL) -> pd.DataFrame:
    """Per task: the smallest lag of the lag axis whose final retention is below `level`
    (None: none), and whether its interval's upper end is below it too."""
    rows = []
    final = table[(table.metric == "final") & (table.setting == "lag")]
    for task, group in final.groupby("task", sort=False):
        below = group[group.retention < level].sort_values("lag")
        if len(below):
            first = below.iloc[0]
            rows.append({"task": task, "break_lag": int(first.lag),
                         "confirmed": bool(first.high < level)})
        else:
            rows.append({"task": task, "break_lag": None, "confirmed": False})
    return pd.DataFrame(rows)


def reference_z(reference: BenchResult | None, result: BenchResult, task: str) -> float:
    """Synchronous PPO-Clip's mean final z on `task`: the reference's (or the method's own, when
    the method is PPO-Clip). NaN when neither is there."""
    source = reference if reference is not None else (
        result if result.info["method"] == "ppo_clip" else None)
    if source is None:
        return float("nan")
    values = _matrix(source.runs, task, "lag", 0, "final_z")
    return float(values.mean()) if len(values) else float("nan")


def sanity(result: BenchResult, proto: bench.Protocol, reference: BenchResult | None, *,
           reps: int = REPS) -> pd.DataFrame:
    rows = []
    for task in (t.env for t in proto.tasks):
        values = _matrix(result.runs, task, "lag", 0, "final_z")
        if len(values) < 2:
            continue
        point, low, high = stats.stratified_bca([values.to_numpy()], lambda s: s[0].mean(), reps=reps)
        denominator = reference_z(reference, result, task)
        score = float(point) / denominator if np.isfinite(denominator) and denominator > 0 else np.nan
        rows.append({"task": task, "final_z": float(point), "low": float(low), "high": float(high),
                     "clears_random": bool(low > 0), "vs_sync_ppo_clip": score,
                     "half_of_sync_ppo_clip": bool(score >= SYNC_FRACTION) if np.isfinite(score) else None})
    return pd.DataFrame(rows)


# --- comparisons with the leaderboard -----------------------------------------------------------
def comparable(result: BenchResult, other: BenchResult) -> list[str]:
    """Why `other` cannot be compared with `result` (empty: it can): another protocol version,
    other library versions, or either is not what this checkout computes (`bench.computed_here`)
    while the two were not made by the same code (result code)."""
    a, b = result.info, other.info
    if (a["protocol"], a["protocol_version"]) != (b["protocol"], b["protocol_version"]):
        return [f"protocol {b['protocol']} v{b['protocol_version']} (this one: {a['protocol']} "
                f"v{a['protocol_version']})"]
    versions = [_versions(info) for info in (a, b)]
    ours, theirs = versions   # a library either did not record counts for nothing
    changed = [name for name in bench.KEY_LIBRARIES
               if name in ours and name in theirs and ours[name] != theirs[name]]
    if changed:
        return ["made with " + ", ".join(f"{name} {theirs[name]} (this one: {ours[name]})"
                                         for name in changed)]
    if a["result_code"] == b["result_code"]:   # made by the same code
        return []
    reasons = []
    for info, whose in ((b, ""), (a, "this result: ")):
        same, why = _computed_here(info)
        if not same:
            reasons.append(whose + why)
    return reasons


def _versions(info: dict) -> dict:
    key = info.get("comparability")
    return key["versions"] if key else {name: value for name, value in
                                        info.get("versions", {}).items()
                                        if name in bench.KEY_LIBRARIES}


_HERE: dict[str, tuple[bool, str]] = {}


def _computed_here(info: dict) -> tuple[bool, str]:
    """`bench.computed_here`, once per result in this process."""
    key = json.dumps(info, sort_keys=True, default=str)
    if key not in _HERE:
        _HERE[key] = bench.computed_here(info)
    return _HERE[key]


def recompute_command(info: dict, out: Path) -> str:
    sets = "".join(f" --set {k}={json.dumps(v)}" for k, v in info["overrides"])
    label = f" --label {info['method']}" if info["overrides"] else ""
    return (f"vaco-bench --algo {info['algo']}{sets}{label} "
            f"--protocol {info['protocol']} --protocol-version {info['protocol_version']} --out {out}")


def comparisons(result: BenchResult, others: dict[str, BenchResult], proto: bench.Protocol,
                reference: BenchResult | None) -> pd.DataFrame:
    """The method minus each other method, per named comparison (setting, lag, metric), pooled
    over tasks and per task; the pre-registered family (`proto.references`) Holm-adjusted."""
    tasks = [t.env for t in proto.tasks]
    settings = [("lag", proto.largest_lag)]
    if proto.forward:
        settings.append(("forward", max(proto.forward_lags)))
    rows = []
    for name, other in others.items():
        for setting, lag in settings:
            for value in ("final_z", "auc_z"):
                per_task = {}
                for task in tasks:
                    denominator = reference_z(reference, result, task)
                    a, b = _matrix(result.runs, task, setting, lag, value), \
                        _matrix(other.runs, task, setting, lag, value)
                    seeds = sorted(set(a.index) & set(b.index))
                    if not seeds or not np.isfinite(denominator) or denominator <= 0:
                        continue
                    per_task[task] = (a[seeds] - b[seeds]) / denominator
                groups = dict(per_task)
                if len(per_task) == len(tasks) and len(tasks) > 1:
                    common = sorted(set.intersection(*(set(d.index) for d in per_task.values())))
                    groups["pooled"] = sum(d[common] for d in per_task.values()) / len(tasks)
                elif len(tasks) == 1 and per_task:
                    groups = {"pooled": next(iter(per_task.values()))}
                for task, diff in groups.items():
                    mean, low, high = stats.sign_flip_interval(diff.to_numpy())
                    rows.append({"against": name, "task": task, "setting": setting, "lag": lag,
                                 "metric": value[:-2], "difference": mean, "low": low,
                                 "high": high, "seeds": len(diff),
                                 "p": stats.sign_flip_test(diff.to_numpy()),
                                 "family": "pre-registered" if (name in proto.references
                                                                and task == "pooled")
                                 else "exploratory"})
    table = pd.DataFrame(rows)
    if len(table):
        family = table.family == "pre-registered"
        table["p_holm"] = np.nan
        table.loc[family, "p_holm"] = stats.holm(table.loc[family, "p"].to_numpy())
        table["verdict"] = [
            ("higher" if r.difference > 0 else "lower") if r.family == "pre-registered"
            and r.p_holm < ALPHA else ("no difference shown" if r.family == "pre-registered"
                                       else "exploratory")
            for r in table.itertuples()]
    return table


def leaderboard_results(directory: str | Path | None, exclude: str = "",
                        unreadable: list[dict] | None = None) -> dict[str, BenchResult]:
    """Every method's benchmark in `directory` (one sub-directory each), by method name. One
    that cannot be read is left out, and named with why in `unreadable` when given."""
    out = {}
    if directory is None or not Path(directory).is_dir():
        return out
    for path in sorted(Path(directory).iterdir()):
        if (path / bench.BENCH_FILE).exists():
            try:
                result = load(path)
            except (OSError, ValueError, KeyError) as error:
                if unreadable is not None:
                    unreadable.append({"method": path.name, "why": f"its directory cannot be "
                                       f"read ({type(error).__name__}: {error})", "recompute": ""})
                continue
            if result.method != exclude:
                out[result.method] = result
    return out


@dataclasses.dataclass
class Scorecard:
    method: str
    protocol: bench.Protocol
    info: dict
    missing: list[str]
    sanity: pd.DataFrame
    retention: pd.DataFrame
    break_lag: pd.DataFrame
    comparisons: pd.DataFrame
    not_compared: list[dict]
    references: dict = dataclasses.field(default_factory=dict, repr=False)
    """The leaderboard methods compared with (drawn in the figure)."""
    leaderboard: str | None = None

    def to_json(self) -> dict:
        records = lambda frame: json.loads(frame.to_json(orient="records"))  # noqa: E731
        return {"method": self.method, "protocol": self.protocol.name,
                "protocol_version": self.protocol.version,
                "result_code": self.info["result_code"],
                "comparability": self.info.get("comparability"),
                "git_commit": self.info.get("git_commit"),
                "missing_cells": self.missing, "sanity": records(self.sanity),
                "retention": records(self.retention), "break_lag": records(self.break_lag),
                "comparisons": records(self.comparisons), "not_compared": self.not_compared}


def scorecard(directory: str | Path, leaderboard: str | Path | None = None, *,
              reps: int = REPS) -> Scorecard:
    """The scorecard of the benchmark in `directory`, compared with the methods of `leaderboard`
    made by the same result code on the same protocol version."""
    result = load(directory)
    proto = bench.protocol(result.info["protocol"], result.info["protocol_version"])
    others, not_compared = {}, []
    entries = leaderboard_results(leaderboard, exclude=result.method, unreadable=not_compared)
    for name, other in entries.items():
        reasons = comparable(result, other)
        if not reasons and not len(other.runs):
            reasons = [f"its directory holds no per-seed runs ({other.directory / bench.RUNS} has "
                       f"no finished cell), so there is nothing to pair with"]
        if reasons:
            not_compared.append({"method": name, "why": "; ".join(reasons),
                                 "recompute": recompute_command(other.info, other.directory)})
        else:
            others[name] = other
    reference = others.get("ppo_clip")
    table = retention(result, proto, reps=reps)
    return Scorecard(result.method, proto, result.info, result.missing,
                     sanity(result, proto, reference, reps=reps), table, break_lag(table),
                     comparisons(result, others, proto, reference), not_compared, others,
                     None if leaderboard is None else str(leaderboard))


# --- text ----------------------------------------------------------------------------------------
def markdown(card: Scorecard) -> str:
    proto = card.protocol
    lines = [f"# Lag-robustness scorecard: `{card.method}`", "",
             f"Protocol `{proto.name}` v{proto.version} ({proto.description}); tasks "
             f"{', '.join(t.env for t in proto.tasks)}; constant lags k = "
             f"{', '.join(map(str, proto.lags))}; high update frequency "
             f"{', '.join(f'{k}={v}' for k, v in proto.forward)} at k = "
             f"{', '.join(map(str, proto.forward_lags))}. Result code `{card.info['result_code']}` "
             f"(commit {card.info.get('git_commit')}){_programs(card.info)}.", ""]
    if card.missing:
        lines += [f"**Incomplete**: {len(card.missing)} planned cells are not finished "
                  f"({', '.join(card.missing)}); the numbers below use what is there.", ""]
    lines += ["## Synchronous sanity (k = 0)", "",
              "| task | final − random (95% CI) | clears random | vs synchronous PPO-Clip | ≥ 0.5 |",
              "|---|---|---|---|---|"]
    for r in card.sanity.itertuples():
        score = f"{r.vs_sync_ppo_clip:.2f}" if np.isfinite(r.vs_sync_ppo_clip) else "–"
        lines.append(f"| {r.task} | {tables.interval(r.final_z, r.low, r.high, 1)} | {'yes' if r.clears_random else 'no'} "
                     f"| {score} | {'–' if r.half_of_sync_ppo_clip is None else ('yes' if r.half_of_sync_ppo_clip else 'no')} |")
    if len(card.sanity) and not np.isfinite(card.sanity.vs_sync_ppo_clip).all():
        lines += ["", "Not normalised by synchronous PPO-Clip (–): "
                  + ("its runs have no finished synchronous cell." if card.method == "ppo_clip" else
                     "the leaderboard holds no `ppo_clip` that could be compared with this result"
                     + (" (see \"Not compared\" below)." if any(
                         n["method"] == "ppo_clip" for n in card.not_compared) else "."))]
    lines += ["", "## Retention (score at k ÷ own score at k = 0; 95% BCa CI over seeds)", "",
              "| task | metric | " + " | ".join(
                  _column_name(s, k) for s, k in _columns(card.retention)) + " |",
              "|---|---|" + "---|" * len(_columns(card.retention))]
    for (task, metric), group in card.retention.groupby(["task", "metric"], sort=False):
        cells = []
        for setting, lag in _columns(card.retention):
            g = group[(group.setting == setting) & (group.lag == lag)]
            cells.append(tables.interval(g.retention.iloc[0], g.low.iloc[0], g.high.iloc[0]) if len(g) else "–")
        lines.append(f"| {task} | {metric} | " + " | ".join(cells) + " |")
    lines += ["", f"Break-lag (first k with final retention < {BREAK_LEVEL}; confirmed when the "
              f"CI's upper end is below it too): " + "; ".join(
                  f"{r.task}: {'none' if r.break_lag is None or pd.isna(r.break_lag) else int(r.break_lag)}"
                  f"{' (confirmed)' if r.confirmed else ''}" for r in card.break_lag.itertuples()), ""]
    lines += ["## Against the leaderboard (normalised score, paired by seed)", "",
              "Pre-registered family: against " + ", ".join(proto.references) +
              ", final and AUC, at the largest lag and in the high-update-frequency setting, "
              "pooled over tasks; exact sign-flip test, Holm-adjusted; 95% interval by inverting "
              "that test (the shifts it keeps at 5%, unadjusted). Every other row is exploratory "
              "(unadjusted p).", ""]
    if len(card.comparisons):
        lines += ["| against | task | setting | metric | difference (95% CI) | p | p (Holm) | verdict |",
                  "|---|---|---|---|---|---|---|---|"]
        order = card.comparisons.sort_values(["family", "against"], ascending=[False, True])
        for r in order.itertuples():
            holm = f"{r.p_holm:.3f}" if np.isfinite(r.p_holm) else "–"
            lines.append(f"| {r.against} | {r.task} | {r.setting} k={r.lag} | {r.metric} | "
                         f"{tables.interval(r.difference, r.low, r.high, sign=True)} | {r.p:.3f} | {holm} | {r.verdict} |")
    elif card.not_compared:
        lines.append(f"Compared with no leaderboard method: none of the {len(card.not_compared)} "
                     f"in {card.leaderboard} could be compared with this result (each is named "
                     f"below with why).")
    else:
        lines.append("Compared with no leaderboard method: "
                     + (f"{card.leaderboard} holds no other method." if card.leaderboard
                        else "no leaderboard was given."))
    if card.not_compared:
        lines += ["", "Not compared, and why:", ""]
        lines += [f"* `{n['method']}`: {n['why']}."
                  + (f" Recompute: `{n['recompute']}`" if n["recompute"] else "")
                  for n in card.not_compared]
    return "\n".join(lines) + "\n"


def _column_name(setting: str, lag: int) -> str:
    if setting == bench.PROFILE:
        return f"lag profile (ages 0–{lag})"
    return f"{'k' if setting == 'lag' else 'forward, k'} = {lag}"


def _programs(info: dict) -> str:
    key = info.get("comparability")
    if not key:
        return "; made before results recorded their programs"
    return "; programs " + ", ".join(f"{cell} `{digest}`"
                                     for cell, digest in key["programs"].items())


def _columns(table: pd.DataFrame) -> list[tuple[str, int]]:
    seen = []
    for r in table.itertuples():
        if (r.setting, r.lag) not in seen:
            seen.append((r.setting, r.lag))
    return seen


def scorecard_figure(card, leaderboard: dict, reps: int = 2000):
    """A scorecard's figure: final and AUC retention (pooled over tasks, or the one task) vs the
    constant lag, the method in black with its 95% CI, the protocol's reference methods in colour,
    and the high-update-frequency setting as a marker to the right of the axis."""
    proto = card.protocol
    tables = {card.method: card.retention}
    for name in proto.references:
        if name in leaderboard and name != card.method:
            tables[name] = retention(leaderboard[name], proto, reps=reps)
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
        ax.axhline(BREAK_LEVEL, color="grey", ls=":", lw=1)
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


def write(card: Scorecard, out: str | Path, leaderboard: dict[str, BenchResult] | None = None,
          log=None) -> list[Path]:
    """`scorecard.json`, `scorecard.md` and `scorecard.png` in `out`, the figure with the
    methods compared with (`card.references`, or `leaderboard`). What cannot be written is said
    in `log` (default: standard error) and left out of the paths returned, never raised: a report
    must not end a long run with a traceback."""
    out = Path(out)
    log = log or (lambda message: print(message, file=sys.stderr))
    steps = (("scorecard.json", lambda path: io.write_json_atomic(path, card.to_json())),
             ("scorecard.md", lambda path: io.write_bytes_atomic(path, markdown(card).encode())),
             ("scorecard.png", lambda path: _figure(card, card.references if leaderboard is None
                                                    else leaderboard, path)))
    written = []
    for name, step in steps:
        try:
            step(out / name)
        except Exception as error:  # noqa: BLE001 -- said, not raised: the rest is still written
            log(f"note: {out / name} was not written ({type(error).__name__}: {error}); the "
                f"other files of the scorecard were")
        else:
            written.append(out / name)
    return written


def _figure(card: Scorecard, leaderboard: dict, path: Path) -> None:
    figures.save(scorecard_figure(card, leaderboard), path, dpi=120, bbox_inches="tight")
