"""The lag-robustness benchmark's report (protocol v2): which method keeps its score under lag.

Per task, every run's final score and AUC are normalised, random = 0 and synchronous PPO-Clip
(k = 0 at the base K, the same seeds) = 1 (`pipeline.scores`). Over tasks (rliable):

* **primary ranking**: the IQM of normalised AUC at the largest constant lag, with a stratified
  bootstrap 95% CI, and the probability of improvement over PPO-Clip there;
* **robustness**: retention, the score at each lag ÷ the method's own synchronous score;
* **comparisons**: each method − PPO-Clip at the largest lag, on the per-seed mean over tasks of
  normalised AUC: the exact sign-flip test, Holm's correction over the family of methods;
* **reliability**: the ranking and verdicts on the first half of the seeds against the second,
  Spearman's ρ with the Spearman–Brown correction 2ρ/(1 + ρ), and every verdict that differs.

Verdict words ("higher", "lower", "no difference shown") only when every run was made at a commit
that descends from the protocol's pre-registration (`PREREGISTRATIONS`), and the runs hold exactly
the methods it names (`FAMILIES`); otherwise each test says what its adjusted p shows ("Holm
p < 0.05, estimate > 0"), and the report says why.

A section that cannot be computed (no reference runs, a method without synchronous runs) is
left out of the tables and named, with the reason, in the report's notes: a report never stops
with a traceback after a long run. There is no break rule."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from vaco_jax import io
from vaco_jax.analysis import paired
from vaco_jax.pipeline import estimates, figures, preregistration, runs as runs_, scores, tables
from vaco_jax.study import bench, stats, sweep, tuning

REFERENCE = "ppo_clip"
SETTING = ("k", "sampling", "K")
PREREGISTRATIONS = {("cpu", 2): "a5f50b2db9b939aa52f6a8b53bf0e140b03a16dd"}
"""(protocol, version) → the commit that pre-registered its tests (docs/preregistrations.md): data
beside the protocols, so naming it changes no protocol's definition or comparability key."""
FAMILIES = {("cpu", 2): ("vaco", "ppo_clip", "ppo_kl", "spo", "impala", "pg", "decoupled_ppo",
                         "appo", "icepop", "cispo", "dppo_tv", "m2po", "topr", "geppo",
                         "gae+tv_filter", "ppo_kl_adaptive", "ppo_kl_adaptive_learner")}
"""(protocol, version) → the methods its pre-registration names (`bench.LEADERBOARD_METHODS` at
that commit). Its tests are exactly these: Holm's correction over fewer or more methods is not
the registered test, so a board without exactly these methods gets no verdict words."""
TABLES = ("scores.csv", "aggregates.csv", "improvement.csv", "retention.csv", "comparisons.csv",
          "reliability.csv", "cost.csv")
"""The files `write` makes that `check` recomputes (leaderboard.md is written from them)."""
SCORE_COLUMNS = ("task", "method", "k", "sampling", "K", "lr", "seed", "diverged", "raw_final",
                 "raw_auc", "final_score", "auc_score")
"""scores.csv, one row per run: its setting, and its final score and AUC before (a diverged run's
evaluations counted at the random return from its divergence on) and after normalising. A run's
commit is in its cells' records (`runs/cells.jsonl`)."""


@dataclasses.dataclass(frozen=True)
class Spec:
    """What the report compares: the reference method, its base (synchronous) setting and the
    largest constant lag (column → value each); the pre-registration commit of its tests
    (`registration`; empty: none, every test exploratory) and the ancestry check that says
    whether a run's commit descends from it (`descends(commit, ancestor)`; None: git's,
    `preregistration.descends_from`); the methods it names (`family`; empty: whatever methods
    the runs hold)."""

    reference: str = REFERENCE
    base: Mapping = dataclasses.field(default_factory=lambda: {"k": 0, "sampling": "oldest", "K": 4})
    largest: Mapping = dataclasses.field(default_factory=lambda: {"k": 8, "sampling": "oldest",
                                                                  "K": 4})
    reps: int = 2000
    seed: int = 0
    registration: str = ""
    family: tuple = ()
    descends: Callable | None = dataclasses.field(default=None, compare=False, repr=False)
    fixed: tuple = ()
    """Per task (task, final, auc): a reference fixed before the scored runs (protocol v3: tuned
    PPO-Clip's design-seed means, `fixed_reference`); empty: the reference method's runs at
    `base`, seed-mean per task."""

    @classmethod
    def of(cls, runs: pd.DataFrame, reference: str = REFERENCE, **kwargs) -> "Spec":
        """The spec of a runs table: base K the most common K, the largest constant lag its
        largest k at that K with `oldest` sampling."""
        base_k = int(runs["K"].mode().iloc[0])
        constant = runs[(runs["sampling"] == "oldest") & (runs["K"] == base_k)]
        return cls(reference, {"k": 0, "sampling": "oldest", "K": base_k},
                   {"k": int(constant["k"].max()), "sampling": "oldest", "K": base_k}, **kwargs)


def setting_label(k: int, sampling: str, K: int, base_K: int) -> str:
    lag = f"k={k}" if sampling == "oldest" else f"{sampling} 0..{k}"
    return lag if K == base_K else f"{lag}, K={K}"


@dataclasses.dataclass
class Report:
    spec: Spec
    scores: pd.DataFrame = None
    aggregates: pd.DataFrame = None
    improvement: pd.DataFrame = None
    retention: pd.DataFrame = None
    comparisons: pd.DataFrame = None
    reliability: pd.DataFrame = None
    cost: pd.DataFrame = None
    """Per method: its learning rate and what its runs cost (`costs`); only from a directory."""
    notes: list = dataclasses.field(default_factory=list)
    remarks: list = dataclasses.field(default_factory=list)
    """What was not computed because the runs cannot give it (not a failure of `check`)."""
    status: str = "none"
    """Whether the runs were made after the pre-registration: "after" (verdict words), "before",
    "unknown", "none" (no pre-registration named) or "incomplete" (made after it, but not
    exactly the methods it names); `status_words` says it in words."""
    status_words: str = ""
    left_out: list = dataclasses.field(default_factory=list)
    """Methods of a leaderboard a board beside it (`beside`) leaves out, each with why."""

    @property
    def pre_registered(self) -> bool:
        return self.status == "after"

    def table(self, name: str) -> pd.DataFrame | None:
        return getattr(self, name.removesuffix(".csv"))


def _section(notes: list, name: str, make: Callable):
    """`make()`, or None with a note naming the section and why it was not computed."""
    try:
        return make()
    except Exception as error:   # noqa: BLE001 -- a report writes what it can, never a traceback
        notes.append(f"{name}: not computed ({type(error).__name__}: {error})")
        return None


def _matrix(scored: pd.DataFrame, value: str, setting: Mapping) -> np.ndarray:
    """`[seeds, tasks]` of `value` at `setting` (the seeds every task has)."""
    chosen = estimates._select(scored, setting)
    return chosen.pivot(index="seed", columns="task", values=value).dropna().to_numpy()


def _settings(scored: pd.DataFrame) -> list[dict]:
    keys = scored[list(SETTING)].drop_duplicates().sort_values(["K", "sampling", "k"])
    return [dict(zip(SETTING, (int(k), s, int(K)))) for k, s, K in keys.itertuples(index=False)]


def aggregates(scored: pd.DataFrame, spec: Spec) -> pd.DataFrame:
    """IQM (stratified bootstrap 95% CI) per method, setting and metric."""
    rows = []
    for setting in _settings(scored):
        for metric in scores.METRICS:
            matrices = {m: _matrix(g, f"{metric}_score", setting)
                        for m, g in scored.groupby("method", sort=True)}
            matrices = {m: x for m, x in matrices.items() if x.size}
            if not matrices:
                continue
            # a board with a fixed reference (v3) ranks on the mean over tasks × seeds, which
            # with every task's seeds equal in number is the mean over tasks of task means; one
            # bootstrap gives both (its resamples do not depend on the metrics)
            table = stats.interval_estimates(
                matrices, reps=spec.reps, seed=spec.seed,
                metrics=("iqm", "mean") if spec.fixed else ("iqm",)).set_index(["method", "metric"])
            for m in matrices:
                iqm = table.loc[(m, "iqm")]
                rows.append({"method": m, **setting, "metric": metric, "iqm": iqm.point,
                             "low": iqm.low, "high": iqm.high, "runs": matrices[m].size,
                             **({"mean": table.loc[(m, "mean"), "point"],
                                 "mean_low": table.loc[(m, "mean"), "low"],
                                 "mean_high": table.loc[(m, "mean"), "high"]}
                                if spec.fixed else {})})
    return pd.DataFrame(rows)


def improvement(scored: pd.DataFrame, spec: Spec) -> pd.DataFrame:
    """P(method > the reference) on normalised AUC at the largest lag."""
    matrices = {m: _matrix(g, "auc_score", spec.largest) for m, g in scored.groupby("method")}
    if not matrices.get(spec.reference, np.empty(0)).size:
        raise ValueError(f"no {spec.reference} runs at {dict(spec.largest)} to compare with")
    others = [m for m, x in matrices.items() if x.size and m != spec.reference]
    rows = []
    for method in others:
        table = stats.probability_of_improvement(
            {method: matrices[method], spec.reference: matrices[spec.reference]}, method,
            [spec.reference], reps=spec.reps, seed=spec.seed)
        rows += table.rename(columns={"target": "method"}).to_dict("records")
    return pd.DataFrame(rows)


def retention(scored: pd.DataFrame, spec: Spec) -> pd.DataFrame:
    """Per method, setting other than the base, metric and task (and pooled): retention."""
    parts = []
    for method, group in scored.groupby("method", sort=True):
        base = {**spec.base}
        for setting in _settings(group):
            if setting == dict(base):
                continue
            for metric in scores.METRICS:
                table = estimates.retention(group, f"{metric}_score", base, setting,
                                            reps=spec.reps, seed=spec.seed)
                parts.append(table.assign(method=method, metric=metric, **setting))
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return frame[["method", *SETTING, "metric", "task", "retention", "low", "high", "seeds"]]


def status(runs: pd.DataFrame, spec: Spec) -> tuple[str, str]:
    """(status, in words) of `runs` (their `commit`) against `spec.registration`
    (`preregistration.status`; "none" when the spec names no pre-registration); "incomplete"
    when they were made after it but their methods are not exactly `spec.family`."""
    if not spec.registration:
        return "none", ("no pre-registration named for these runs' protocol "
                        "(`robustness.PREREGISTRATIONS`)")
    found = preregistration.status(runs["commit"] if "commit" in runs else [], spec.registration,
                                   spec.descends)
    present = set(runs["method"]) if "method" in runs else set()
    missing = [m for m in spec.family if m not in present]
    extra = sorted(present - set(spec.family)) if spec.family else []
    if found[0] != "after" or not (missing or extra):
        return found
    parts = ([f"{len(missing)} without runs here ({', '.join(missing)})"] if missing else []) \
        + ([f"{len(extra)} here it does not name ({', '.join(extra)})"] if extra else [])
    return "incomplete", (f"{found[1]}; its family names {len(spec.family)} methods, "
                          f"{'; '.join(parts)}: Holm's correction over these is not the "
                          f"registered test")


def comparisons(scored: pd.DataFrame, spec: Spec, pre_registered: bool = False) -> pd.DataFrame:
    """Each method − the reference at the largest lag: the per-seed mean over tasks of
    normalised AUC, exact sign-flip test, Holm over the methods; verdict words only when
    `pre_registered` (the runs were made after the pre-registration)."""
    tests = []
    for method in sorted(set(scored["method"]) - {spec.reference}):
        pair = scored[scored["method"].isin([method, spec.reference])]
        d = estimates.paired_differences(pair, "auc_score", {"method": method, **spec.largest},
                                         {"method": spec.reference, **spec.largest})
        pooled = d.get(estimates.POOLED, next(iter(d.values()), None)) if d else None
        if pooled is None:
            continue
        tests.append({"method": method, "baseline": spec.reference, "differences": pooled})
    if not tests:
        raise ValueError(f"no method shares seeds with {spec.reference} at {dict(spec.largest)}")
    table = preregistration.family(tests, test="sign-flip", pre_registered=pre_registered)
    return table.drop(columns=["family"])


def _board(scored: pd.DataFrame, spec: Spec, pre_registered: bool) -> tuple[pd.Series, pd.Series]:
    """(IQM of normalised AUC at the largest lag, verdict vs the reference) per method."""
    iqm = pd.Series({m: stats.iqm(x) for m, g in scored.groupby("method")
                     if (x := _matrix(g, "auc_score", spec.largest)).size})
    verdicts = comparisons(scored, spec, pre_registered).set_index("method")["verdict"]
    return iqm, verdicts


def reliability(runs: pd.DataFrame, random: Mapping, spec: Spec,
                pre_registered: bool = False) -> pd.DataFrame:
    """The ranking and verdicts of the first half of the seeds against the second, each half
    normalised by its own reference runs (verdict words only when `pre_registered`). One row per
    method; ρ and 2ρ/(1 + ρ) in every row."""
    seeds = sorted(runs["seed"].unique())
    halves = [seeds[:len(seeds) // 2], seeds[len(seeds) // 2:]]
    boards = []
    for half in halves:
        part = runs[runs["seed"].isin(half)]
        boards.append(_board(normalise(part, random, spec), spec, pre_registered))
    (iqm_a, verdict_a), (iqm_b, verdict_b) = boards
    methods = sorted(set(iqm_a.index) & set(iqm_b.index))
    rho = float(scipy_stats.spearmanr(iqm_a[methods], iqm_b[methods]).statistic)
    rank_a, rank_b = (s[methods].rank(ascending=False) for s in (iqm_a, iqm_b))
    return pd.DataFrame({
        "method": methods, "seeds_a": f"{halves[0][0]}–{halves[0][-1]}",
        "seeds_b": f"{halves[1][0]}–{halves[1][-1]}",
        "iqm_a": iqm_a[methods].to_numpy(), "iqm_b": iqm_b[methods].to_numpy(),
        "rank_a": rank_a.to_numpy(), "rank_b": rank_b.to_numpy(),
        "verdict_a": [verdict_a.get(m, "reference") for m in methods],
        "verdict_b": [verdict_b.get(m, "reference") for m in methods],
        "spearman": rho, "spearman_brown": 2 * rho / (1 + rho)})


def normalise(runs: pd.DataFrame, random: Mapping, spec: Spec) -> pd.DataFrame:
    if spec.fixed:
        reference = pd.DataFrame(list(spec.fixed), columns=["task", "final", "auc"])
        return scores.normalised(runs[runs["task"].isin(reference["task"])], random, reference)
    reference = scores.reference_of_method(runs, random, spec.reference, **spec.base)
    if reference.empty:
        raise ValueError(f"no {spec.reference} runs at {dict(spec.base)}: nothing to normalise by")
    return scores.normalised(runs[runs["task"].isin(reference["task"])], random, reference)


def report(runs: pd.DataFrame, random: Mapping, spec: Spec | None = None) -> Report:
    """Every section of the report that can be computed from `runs` (`pipeline.runs` columns)
    and `random` (task → the random policy's return). Verdict words only when every run was made
    after `spec.registration` (`status`)."""
    spec = spec or Spec.of(runs)
    out = Report(spec)
    out.status, out.status_words = status(runs, spec)
    words = out.pre_registered
    scored = _section(out.notes, "normalised scores", lambda: normalise(runs, random, spec))
    if scored is None:
        return out
    out.scores = scored[list(SCORE_COLUMNS)]
    for name, make in (("aggregates", aggregates), ("improvement", improvement),
                       ("retention", retention)):
        setattr(out, name, _section(out.notes, name, lambda make=make: make(scored, spec)))
    out.comparisons = _section(out.notes, "comparisons",
                               lambda: comparisons(scored, spec, words))
    seeds = runs["seed"].nunique()
    if seeds >= 4:   # two halves of at least two seeds
        out.reliability = _section(out.notes, "reliability",
                                   lambda: reliability(runs, random, spec, words))
    else:
        out.remarks.append(f"Split-half reliability needs at least 4 seeds; these runs have "
                           f"{seeds}.")
    return out


# --- the committed files ----------------------------------------------------------------------
def read_method(method_dir: str | Path) -> tuple[pd.DataFrame, dict] | None:
    """One method directory's runs, named by its bench.json method, and its random returns;
    None when it has no per-run files."""
    method_dir = Path(method_dir)
    if not (method_dir / bench.RUNS).is_dir():
        return None
    info = json.loads((method_dir / bench.BENCH_FILE).read_text())
    last = info.get("protocol_definition", {}).get("last_evals", runs_.LAST_EVALS)
    return (runs_.read([method_dir / bench.RUNS], last).assign(method=info["method"]),
            json.loads((method_dir / bench.REFERENCES).read_text()))


def read(directory: str | Path) -> tuple[pd.DataFrame, dict]:
    """The runs and random returns of a leaderboard `directory` (one sub-directory per method:
    bench.json, random_returns.json, runs/), each run named by its bench.json method."""
    if not Path(directory).is_dir():
        raise FileNotFoundError(f"{directory} does not exist" if not Path(directory).exists()
                                else f"{directory} is not a directory")
    parts, random = [], {}
    for path in sorted(Path(directory).glob(f"*/{bench.BENCH_FILE}")):
        found = read_method(path.parent)
        if found is not None:
            # A method none of whose runs diverged holds only None there: typed as the step it
            # would be, so the table's dtype does not hang on which methods diverged.
            parts.append(found[0].astype({"diverged_at_step": "float64"}))
            random.update(found[1])
    if not parts:
        raise FileNotFoundError(f"{directory} holds no per-run files (<method>/{bench.RUNS}/)")
    return pd.concat(parts, ignore_index=True), random


BESIDE = "leaderboard"
"""The sub-directory of a method's directory where `vaco-bench` writes it beside the leaderboard."""


def beside(method_dir: str | Path, board: str | Path,
           comparable: Callable[[dict], tuple[bool, str]], **options) -> Report:
    """The report of `method_dir`'s method among the methods of the leaderboard `board` on its
    protocol and version that compute what this checkout computes (`comparable(bench.json)` →
    (whether, why), e.g. `bench.computed_here`). A leaderboard method of the same name gives way
    to it. `left_out` names each method not compared, with why. The leaderboard's pre-registered
    family did not name the method, so its tests are exploratory (Holm's p, no verdict words).
    `options`: the `Spec`'s (reps, seed)."""
    method_dir, board = Path(method_dir), Path(board)
    info = json.loads((method_dir / bench.BENCH_FILE).read_text())
    mine = read_method(method_dir)
    if mine is None:
        raise FileNotFoundError(f"{method_dir} holds no per-run files ({bench.RUNS}/)")
    protocol = (info["protocol"], info.get("protocol_version", 1))
    # typed as `read` types them, so no table's dtype hangs on which methods diverged
    typed = {"diverged_at_step": "float64"}
    parts, random, left_out = [mine[0].astype(typed)], dict(mine[1]), []
    for path in sorted(board.glob(f"*/{bench.BENCH_FILE}")) if board.is_dir() else []:
        other = json.loads(path.read_text())
        if path.parent.resolve() == method_dir.resolve() or other["method"] == info["method"]:
            continue
        if (other.get("protocol"), other.get("protocol_version", 1)) != protocol:
            continue
        same, why = comparable(other)
        found = read_method(path.parent) if same else None
        if found is None:
            left_out.append(f"{other['method']}: {why if not same else 'no per-run files'}")
            continue
        parts.append(found[0].astype(typed))
        random.update(found[1])
    runs = pd.concat(parts, ignore_index=True)
    # no pre-registration: exploratory; a per-task-tuned board's fixed reference
    out = report(runs, random, Spec.of(runs, **{"fixed": fixed_reference(board), **options}))
    out.status_words = (f"{info['method']} beside the leaderboard {io.portable_path(board)}, a "
                        "method its pre-registered family did not name: the same tests, without "
                        "verdicts")
    out.left_out = left_out
    return out


def _protocols(directory: str | Path) -> set[tuple[str, int]]:
    """The (protocol, version) pairs of a leaderboard directory's methods (their bench.json)."""
    return {(info.get("protocol"), info.get("protocol_version", 1))
            for info in (json.loads(path.read_text())
                         for path in Path(directory).glob(f"*/{bench.BENCH_FILE}"))}


def protocol_version(directory: str | Path) -> int | None:
    """The newest protocol version among a leaderboard directory's methods (None: no method)."""
    return max((version for _, version in _protocols(directory)), default=None)


def registration(directory: str | Path) -> str:
    """The pre-registration commit of a leaderboard directory's protocol (`PREREGISTRATIONS`,
    from each method's bench.json); empty when none is named or its methods differ in it."""
    found = {PREREGISTRATIONS.get(protocol, "") for protocol in _protocols(directory)}
    return found.pop() if len(found) == 1 else ""


def family(directory: str | Path) -> tuple:
    """The methods the pre-registration of a leaderboard directory's protocol names
    (`FAMILIES`); empty when none is named or its methods differ in protocol."""
    found = _protocols(directory)
    return FAMILIES.get(found.pop(), ()) if len(found) == 1 else ()


def costs(directory: str | Path) -> pd.DataFrame | None:
    """Per method of a leaderboard `directory`: the learning rate it ran at, and the wall,
    compile and training seconds of its learning-rate choice and of its scored runs, each the
    sum over the finished cells' records (`cells.jsonl`, kept across resumed calls); the hosts
    they ran on. Where every cell recorded it, the CPU seconds other processes used meanwhile
    (`others_cpu_seconds`: how quiet the machine was). None when no method has a cell record."""
    rows = []
    for path in sorted(Path(directory).glob(f"*/{bench.BENCH_FILE}")):
        info, row, hosts = json.loads(path.read_text()), {}, set()
        for phase, name in (("tuning", bench.TUNING_RUNS), ("runs", bench.RUNS)):
            if not io.has_rows(path.parent / name / sweep.CELLS):
                continue
            cells = sweep.load_cells(path.parent / name)
            row |= {f"{phase}_cells": len(cells),
                    **{f"{phase}_{k}": float(cells[k].sum())
                       for k in ("wall_seconds", "compile_seconds", "train_seconds")},
                    f"{phase}_env_steps": int((cells["runs"] * cells["env_steps_per_run"]).sum())}
            others = cells.get("others_cpu_seconds")
            if others is not None and others.notna().all():
                row[f"{phase}_others_cpu_seconds"] = float(others.sum())
            hosts |= set(map(tables.host, cells["host"]))
        if row:
            rate = info.get("learning_rate")
            rows.append({"method": info["method"],
                         "learning_rate": "per task" if isinstance(rate, dict) else rate,
                         "grid_edge": _grid_edge(path.parent / bench.TUNING_FILE),
                         **row, "hosts": ", ".join(sorted(hosts))})
    return pd.DataFrame(rows) if rows else None


def _grid_edge(tuning: Path) -> str:
    """"largest" or "smallest" when the learning-rate choice (`tuning.json`) chose an end of its
    grid, where a better rate may lie beyond it; per task (protocol v3) the tasks whose choice
    stayed at a ladder's end; else (or without a choice) empty."""
    if not tuning.exists():
        return ""
    choice = json.loads(tuning.read_text())
    if choice.get("per_task"):
        return ", ".join(env for env, task in choice["tasks"].items() if task["edge"])
    grid = choice["grid"]
    return ("largest" if choice["chosen"] == max(grid) else
            "smallest" if choice["chosen"] == min(grid) else "")


def fixed_reference(directory: str | Path) -> tuple:
    """Per task (task, final, auc) of a per-task-tuned board (protocol v3): its reference
    method's tuned configuration's means over the design seeds at k = 0, from
    `<directory>/<reference>/tuning.json`; empty for other boards (or before that tuning)."""
    path = Path(directory) / REFERENCE / bench.TUNING_FILE
    if not path.exists():
        return ()
    choice = json.loads(path.read_text())
    if not choice.get("per_task"):
        return ()
    out = []
    for env, task in choice["tasks"].items():
        row = next(r for r in task["configurations"] if tuning.matches(r, task["chosen"]))
        out.append((env, float(row["final"]), float(row["auc"])))
    return tuple(out)


def _recompute(directory: str | Path, spec: Spec | None) -> Report:
    """The report of `directory`'s per-run files, with what each method cost; without a `spec`,
    the runs' own with the pre-registration of the directory's protocol (and, for a per-task
    tuned board, its fixed reference)."""
    runs, random = read(directory)
    out = report(runs, random, spec or Spec.of(runs, registration=registration(directory),
                                                family=family(directory),
                                                fixed=fixed_reference(directory)))
    out.cost = costs(directory)
    return out


def write_leaderboard(directory: str | Path, out: str | Path | None = None) -> list[Path]:
    """The leaderboard of `directory` (`read`), recomputed from its per-run files and written
    into `out` (default: into it): what `check` compares with."""
    return write(_recompute(directory, None), directory if out is None else out)


def _words(setting: Mapping) -> str:
    """A setting in words: "k = 8, K = 4" (constant lag), "uniform 0..8, K = 4"."""
    lag = (f"k = {setting['k']}" if setting["sampling"] == "oldest"
           else f"{setting['sampling']} 0..{setting['k']}")
    return f"{lag}, K = {setting['K']}"


def markdown(r: Report) -> str:
    s = r.spec
    lines = ["# Lag-robustness leaderboard", "",
             (f"Normalised per task: random = 0, tuned {s.reference}'s mean over the design seeds "
              f"at its chosen configuration = 1 (fixed before any scored run). Ranked by the mean "
              f"normalised AUC at {_words(s.largest)} over tasks × seeds (95% stratified "
              f"bootstrap CI); the change is that mean at {_words(s.largest)} minus at "
              f"{_words(s.base)}, per seed (95% t interval). IQMs beside them."
              if s.fixed else
              f"Normalised per task: random = 0, {s.reference} at {_words(s.base)} = 1. Ranked by "
              f"the IQM of normalised AUC at {_words(s.largest)} (95% stratified bootstrap CI). "
              f"AUC retention, the robustness measure (not ranked on): a method's AUC there ÷ its "
              f"own at {_words(s.base)}, pooled over tasks."),
             "",
             f"Pre-registration: {r.status_words}; "
             + ("the verdicts are the pre-registered ones." if r.pre_registered else
                "exploratory, without verdict words."), ""]
    if r.aggregates is not None:
        at = estimates._select(r.aggregates, s.largest)
        auc, final = (at[at.metric == m].set_index("method") for m in ("auc", "final"))
        rows = auc.loc[ranking(r)]
        frame = pd.DataFrame({"method": rows.index})
        if s.fixed and "mean" in rows:
            frame["mean AUC"] = [tables.interval(*rows.loc[m, ["mean", "mean_low", "mean_high"]])
                                 for m in rows.index]
            frame["change from " + _words(s.base)] = [
                tables.interval(*change(r.scores, s, m)) for m in rows.index]
        frame = frame.assign(**{"IQM AUC": tables.intervals(rows, "iqm"),
                                "IQM final": [tables.interval(*final.loc[m, ["iqm", "low", "high"]])
                                              if m in final.index else tables.UNDEFINED
                                              for m in rows.index]})
        if r.retention is not None and len(r.retention):
            kept = estimates._select(r.retention, s.largest)
            kept = kept[(kept.metric == "auc") & (kept.task == estimates.POOLED)]
            kept = kept.set_index("method")
            frame["AUC retention"] = [
                tables.interval(*kept.loc[m, ["retention", "low", "high"]]) if m in kept.index
                else "" for m in rows.index]
        if r.improvement is not None and len(r.improvement):
            poi = r.improvement.set_index("method")
            frame[f"P(> {s.reference})"] = [tables.interval(*poi.loc[m, ["point", "low", "high"]])
                                            if m in poi.index else "" for m in rows.index]
        if r.comparisons is not None:
            c = r.comparisons.set_index("method")
            frame["Holm p"] = [f"{c.loc[m, 'p_holm']:.3f}" if m in c.index else ""
                               for m in rows.index]
            frame["verdict"] = [c.loc[m, "verdict"] if m in c.index else "" for m in rows.index]
        lines += [tables.markdown(frame), ""]
        if r.scores is not None and len(r.scores):
            per_task = estimates._select(r.scores, s.largest).pivot_table(
                index="method", columns="task", values="auc_score", aggfunc="mean")
            per_task = per_task.reindex([m for m in rows.index if m in per_task.index])
            lines += [f"Per task, the mean normalised AUC at {_words(s.largest)} over seeds "
                      "(exploratory):", "", tables.markdown(
                          per_task.map(lambda v: f"{v:.2f}").reset_index()), ""]
    if r.reliability is not None:
        rel = r.reliability
        differ = rel[rel.verdict_a != rel.verdict_b]
        lines += [f"Split-half reliability (seeds {rel.seeds_a.iloc[0]} against "
                  f"{rel.seeds_b.iloc[0]}): Spearman ρ = {rel.spearman.iloc[0]:.2f}, "
                  f"Spearman–Brown {rel.spearman_brown.iloc[0]:.2f}. Verdicts that differ: "
                  + (", ".join(f"{m} ({a} / {b})" for m, a, b in differ[
                      ["method", "verdict_a", "verdict_b"]].itertuples(index=False)) or "none")
                  + ".", ""]
    if r.cost is not None:
        columns = {"method": "method", "learning rate": "learning_rate",
                   "choice of learning rate": "tuning_wall_seconds",
                   "scored runs": "runs_wall_seconds", "hosts": "hosts"}
        quiet = any(c in r.cost for c in ("tuning_others_cpu_seconds", "runs_others_cpu_seconds"))
        if quiet:   # recorded by cells made since cells.jsonl holds it
            columns |= {"other processes, choice": "tuning_others_cpu_seconds",
                        "other processes, runs": "runs_others_cpu_seconds"}
        lines += ["Cost per method (wall minutes, the sum over its cells; machine named by host"
                  + ("; other processes: the CPU minutes the machine's other processes used "
                     "meanwhile, near 0 on a quiet machine" if quiet else "") + "):",
                  "", tables.cost(r.cost, columns), ""]
        for end in ("largest", "smallest"):
            at = sorted(r.cost.loc[r.cost["grid_edge"] == end, "method"]) \
                if "grid_edge" in r.cost else []
            if at:
                lines += [f"Chose the {end} learning rate of the grid (a better one may lie beyond "
                          f"it): {', '.join(at)}.", ""]
    if r.left_out:
        lines += ["Methods of the leaderboard left out, and why:",
                  *[f"* {n}" for n in r.left_out], ""]
    lines += [*r.remarks, ""] if r.remarks else []
    if r.notes:
        lines += ["Not computed:", *[f"* {n}" for n in r.notes], ""]
    return "\n".join(lines)


def ranking(r: Report) -> list[str]:
    """The methods as the leaderboard ranks them: by IQM of normalised AUC at the largest lag
    (with a fixed reference, protocol v3: by its mean over tasks × seeds, the pre-registered
    aggregate), highest first (the table's rows and the figure's, top to bottom)."""
    at = estimates._select(r.aggregates, r.spec.largest)
    by = "mean" if r.spec.fixed and "mean" in at else "iqm"
    return list(at[at.metric == "auc"].sort_values(by, ascending=False)["method"])


def change(scored: pd.DataFrame, spec: Spec, method: str) -> tuple[float, float, float]:
    """A method's change in normalised AUC from `spec.base` to `spec.largest`, paired by seed
    (`analysis.paired.paired_differences`: per seed, the mean over tasks of the largest lag minus
    the base); the mean over seeds and its 95% Student-t interval (NaN where it has no seed at
    both)."""
    by_task = paired.paired_differences(scored[scored["method"] == method], "auc_score",
                                        spec.largest, spec.base)
    d = by_task.get(paired.POOLED, next(iter(by_task.values()), pd.Series(dtype=float)))
    return stats.paired_t_interval(d.to_numpy()) if len(d) else (np.nan, np.nan, np.nan)


def figure(r: Report):
    """IQM of normalised AUC with its interval, one panel per setting on one x axis, the methods
    top to bottom as the leaderboard ranks them."""
    auc = r.aggregates[r.aggregates.metric == "auc"]
    # a board with a fixed reference (v3) plots its ranking's aggregate, the mean
    value, name = ("mean", "Mean") if r.spec.fixed and "mean" in auc else ("iqm", "IQM")
    one = ("tuned PPO-Clip" if r.spec.fixed else "synchronous PPO-Clip")
    fig = figures.intervals_figure(
        auc.assign(setting=[setting_label(k, s, K, r.spec.base["K"]) for k, s, K in
                            auc[list(SETTING)].itertuples(index=False)],
                   **({"low": auc["mean_low"], "high": auc["mean_high"]} if value == "mean"
                      else {})),
        "method", value, panel="setting", xlabel=f"{name} of normalised AUC\n(1 = {one})",
        order=ranking(r), sharex=True)
    fig.suptitle("Normalised AUC, per task: 0 = the random policy, 1 = "
                 + ("tuned PPO-Clip's mean over the design seeds at k = 0 (fixed before the "
                    "scored runs)" if r.spec.fixed else
                    f"synchronous PPO-Clip's mean (k = 0, K = {r.spec.base['K']})"), fontsize=10)
    fig.tight_layout()
    return fig


def write(r: Report, out: str | Path) -> list[Path]:
    """The tables (CSV), leaderboard.md and leaderboard.png: what can be written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in TABLES:
        frame = r.table(name)
        if frame is not None:
            frame.to_csv(out / name, index=False)
            written.append(out / name)
    if r.aggregates is not None:   # drawn first: a figure that fails is named in leaderboard.md
        def draw():
            figures.save(figure(r), out / "leaderboard.png", dpi=120)
            return out / "leaderboard.png"
        png = _section(r.notes, "figure", draw)
        if png:
            written.append(png)
    (out / "leaderboard.md").write_text(markdown(r))
    written.append(out / "leaderboard.md")
    return written


def check(directory: str | Path, spec: Spec | None = None) -> list[str]:
    """Recompute the leaderboard from `directory`'s per-run files and compare every committed
    table with it: one line per file that differs, is missing, or could not be recomputed."""
    directory = Path(directory)
    fresh = _recompute(directory, spec)
    problems = [f"{directory}: {note}" for note in fresh.notes]
    with tempfile.TemporaryDirectory() as tmp:
        write(fresh, tmp)
        for name in TABLES:
            committed, made = directory / name, Path(tmp) / name
            if not committed.exists() and not made.exists():
                continue   # a section not computed is named by its note above
            if not committed.exists():
                problems.append(f"{committed}: missing (the recomputation makes it)"
                                if made.exists() else f"{committed}: neither committed nor made")
            elif not made.exists():
                problems.append(f"{committed}: could not be recomputed")
            elif committed.read_bytes() != made.read_bytes():
                problems.append(f"{committed}: differs from its recomputation")
    return problems
