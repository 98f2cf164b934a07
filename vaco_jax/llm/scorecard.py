"""The scorecard of one objective on an LLM protocol, and the LLM leaderboard.

Per run, two tasks: held-out greedy accuracy and held-out sampled accuracy (one answer per problem
at temperature 1). Each has two metrics: `final` (the last evaluation, `final_accuracy` and
`final_sampled_accuracy`) and `auc` (the mean over the evaluations, `stats.area_under_curve` of
equally spaced ones). The normalised score (`pipeline.scores`) is 0 at the warm start's accuracy and
1 at synchronous PPO-Clip's mean (k = 0, N = 1, the same seeds): the leaderboard's `ppo_clip`
entry, or the method's own runs when it is PPO-Clip.

* **scores**: the mean normalised score over seeds at every (lag, N), with its 95% t interval;
* **retention** (`pipeline.estimates`): the score at each lag ÷ the method's own score at k = 0,
  the same N, with a 95% BCa interval over seeds. The normalisation is linear with the warm start
  at 0, so this ratio is the accuracy gains' ratio and needs no PPO-Clip runs;
* **comparisons** (exploratory, `pipeline.preregistration`): the method − PPO-Clip in final
  accuracy at the largest constant lag, at the smallest and largest N, greedy and sampled, paired
  by seed; the two-sided paired t-test, Holm over these four, the adjusted p without verdict
  words. The pre-registered tests are the leaderboard's families (`vaco_jax.llm.families`);
* **lag diagnostics** per lag and N: the update-age histogram (share of sample uses per age bin),
  `tv_backward`, `tv_forward_mean`, `intervened_fraction_mean`, means over iterations and seeds.

A section that cannot be computed is left out and named in `notes`, with the reason.

The leaderboard (`board`, `write_board`, `check`) holds one row per objective, and the
pre-registered families F1 and F2 over every entry (`families`, its `primary.csv`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from vaco_jax import io
from vaco_jax.llm import bench, families
from vaco_jax.pipeline import estimates, figures, preregistration, scores, tables
from vaco_jax.study import stats

TASKS = {"greedy": ("eval_accuracy", "final_accuracy"),
         "sampled": ("eval_sampled_accuracy", "final_sampled_accuracy")}
"""Task → (its evaluation curve, its final value) in a result row."""
LAST_EVALS = 1
"""A run's final score is its last evaluation."""
REPS = 2000
DIAGNOSTICS = ("tv_backward", "tv_forward_mean", "intervened_fraction_mean", "update_age_mean",
               "update_age_max")
AGES = ("snapshot_age", "snapshot_age_max")
"""The realised age of the snapshots that generated the batches (`snapshot_age`, one per
iteration): the mean over iterations and seeds, and the largest. A lag k is nominal: before the
snapshot k iterations old exists, the oldest there is generates (age min(t, k) at iteration t)."""
AGE_HISTOGRAM = "update_age_hist_"
SCORECARD = "scorecard"
LEADERBOARD = "leaderboard"


@dataclasses.dataclass
class Entry:
    """One method's directory: bench.json and its result rows."""

    directory: Path
    info: dict
    rows: list

    @property
    def method(self) -> str:
        return self.info["method"]

    @property
    def random(self) -> dict[str, float]:
        """The warm start's accuracy per task: the normalised score's 0."""
        warm = self.info["warm_start"]
        return {"greedy": warm["greedy"], "sampled": warm["sampled"]}


def load(directory: str | Path) -> Entry:
    directory = Path(directory)
    path = directory / bench.BENCH_FILE
    if not path.exists():
        raise FileNotFoundError(f"{directory} holds no {bench.BENCH_FILE}: not an LLM benchmark "
                                "directory (vaco-bench --protocol llm-... --out DIR writes one)")
    return Entry(directory, json.loads(path.read_text()), io.read_rows(directory / bench.RESULTS))


def runs_table(rows, method: str) -> pd.DataFrame:
    """One row per (run, task): task, method, k, sampling (lag mode), N, seed, the evaluation
    iterations (`steps`) and accuracies (`returns`) — `pipeline.runs`' columns."""
    from vaco_jax.llm.experiment import lag_of

    out = []
    for row in rows:
        mode, k = lag_of(row)
        for task, (curve, final) in TASKS.items():
            returns = np.asarray(row[curve], np.float64)
            out.append({"task": task, "method": method, "k": k, "sampling": mode, "N": row["n"],
                        "seed": row["seed"], "steps": np.asarray(row["eval_iterations"], np.float64),
                        "returns": returns, "final": float(row[final])})
    return pd.DataFrame(out)


def settings(frame: pd.DataFrame) -> list[dict]:
    keys = frame[["sampling", "k", "N"]].drop_duplicates().sort_values(["N", "sampling", "k"])
    return [{"sampling": s, "k": int(k), "N": int(n)} for s, k, n in keys.itertuples(index=False)]


def _section(notes: list, name: str, make):
    try:
        return make()
    except Exception as error:  # noqa: BLE001 -- a report writes what it can, never a traceback
        notes.append(f"{name}: not computed ({type(error).__name__}: {error})")
        return None


@dataclasses.dataclass
class Card:
    method: str
    info: dict
    reference: str
    scores: pd.DataFrame | None = None
    retention: pd.DataFrame | None = None
    comparisons: pd.DataFrame | None = None
    diagnostics: pd.DataFrame | None = None
    notes: list = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        records = lambda f: None if f is None else json.loads(f.to_json(orient="records"))  # noqa: E731
        return {"method": self.method, "protocol": self.info["protocol"],
                "protocol_version": self.info["protocol_version"],
                "git_commit": self.info.get("git_commit"),
                "comparability": self.info.get("comparability"),
                "warm_start": self.info.get("warm_start"), "cost": self.info.get("cost"),
                "reference": self.reference, "scores": records(self.scores),
                "retention": records(self.retention), "comparisons": records(self.comparisons),
                "diagnostics": records(self.diagnostics), "notes": self.notes}


def reference_entry(entry: Entry, leaderboard, notes: list) -> tuple[Entry | None, str]:
    """The entry whose runs at k = 0, N = 1 are the normalised score's 1, and in words: the
    method's own when it is the protocol's reference, else the leaderboard's, if comparable."""
    proto = bench.protocol(entry.info["protocol"], entry.info["protocol_version"])
    if entry.method == proto.reference:
        return entry, "its own runs at k = 0, N = 1"
    if leaderboard is None or not Path(leaderboard).is_dir():
        notes.append(f"normalised score and comparisons: no {proto.reference} to compare with "
                     f"(no leaderboard directory{f' at {leaderboard}' if leaderboard else ''})")
        return None, "none"

    def shown(path):   # relative to the scorecard's directory: the same in every checkout
        return Path(os.path.relpath(Path(path).resolve(), entry.directory.resolve())).as_posix()

    for path in sorted(Path(leaderboard).glob(f"*/{bench.BENCH_FILE}")):
        info = json.loads(path.read_text())
        if info.get("method") != proto.reference or path.parent.resolve() == entry.directory.resolve():
            continue
        reasons = bench.key_differences(entry.info.get("comparability") or {},
                                        info.get("comparability") or {})
        if reasons:
            notes.append(f"normalised score and comparisons: {shown(path.parent)} "
                         f"({proto.reference}) is not comparable: {'; '.join(reasons)}")
            return None, "none"
        return load(path.parent), f"{shown(path.parent)} at k = 0, N = 1"
    notes.append(f"normalised score and comparisons: {shown(leaderboard)} holds no "
                 f"{proto.reference} entry")
    return None, "none"


def score_table(raw: pd.DataFrame, scored: pd.DataFrame | None) -> pd.DataFrame:
    """Per task, metric and setting: the mean raw accuracy and the mean normalised score (NaN
    when not normalised) over seeds, with its 95% t interval."""
    rows = []
    for task in TASKS:
        for setting in settings(raw):
            chosen = estimates._select(raw[raw.task == task], setting)
            if chosen.empty:
                continue
            for metric in scores.METRICS:
                point = low = high = np.nan
                if scored is not None:
                    point, low, high = stats.paired_t_interval(
                        estimates._select(scored[scored.task == task], setting)[f"{metric}_score"])
                rows.append({"task": task, "metric": metric, **setting,
                             "accuracy": float(chosen[f"raw_{metric}"].mean()), "score": point,
                             "low": low, "high": high, "seeds": int(chosen.seed.nunique())})
    return pd.DataFrame(rows)


def retention_table(raw: pd.DataFrame, random: dict, reps: int = REPS) -> pd.DataFrame:
    """Per task, metric and setting other than k = 0: the gain over the warm start there ÷ the
    gain at k = 0, the same N, paired by seed (BCa interval)."""
    gains = raw.assign(**{f"{m}_gain": raw[f"raw_{m}"] - raw.task.map(random)
                          for m in scores.METRICS})
    rows = []
    for task in TASKS:
        part = gains[gains.task == task]
        for setting in settings(part):
            if setting["k"] == 0:
                continue
            base = {"sampling": "constant", "k": 0, "N": setting["N"]}
            for metric in scores.METRICS:
                table = estimates.retention(part, f"{metric}_gain", base, setting, reps=reps)
                for r in table.itertuples():
                    rows.append({"task": task, "metric": metric, **setting,
                                 "retention": r.retention, "low": r.low, "high": r.high,
                                 "seeds": r.seeds})
    return pd.DataFrame(rows)


def comparison_table(raw: pd.DataFrame, reference_raw: pd.DataFrame, method: str,
                     proto: bench.LLMProtocol) -> pd.DataFrame:
    """The method − the reference in final accuracy at the largest constant lag, at the smallest
    and largest N, greedy and sampled: paired t-test, Holm over these four; exploratory (the
    adjusted p, no verdict words: the leaderboard's families are the pre-registered tests)."""
    both = pd.concat([raw, reference_raw], ignore_index=True)
    tests = []
    for n in sorted({min(proto.ns), max(proto.ns)}):
        for task in TASKS:
            at = {"k": proto.largest_lag, "sampling": "constant", "N": n}
            d = estimates.paired_differences(both[both.task == task], "raw_final",
                                             {"method": method, **at},
                                             {"method": proto.reference, **at})
            if task in d:
                tests.append({"against": proto.reference, "task": task, "k": proto.largest_lag,
                              "N": n, "differences": d[task].to_numpy()})
    if not tests:
        raise ValueError(f"no seeds shared with {proto.reference} at k = {proto.largest_lag}")
    return preregistration.family(tests, test="t", pre_registered=False).drop(
        columns=["family"])


def diagnostics_table(rows) -> pd.DataFrame:
    """Per lag and N: the lag diagnostics, means over iterations and seeds; the update-age
    histogram as {age bin: share of sample uses}."""
    from vaco_jax.llm.experiment import lag_of

    groups = {}
    for row in rows:
        mode, k = lag_of(row)
        groups.setdefault((row["n"], mode, k), []).append(row)
    out = []
    for (n, mode, k), runs in sorted(groups.items()):
        entry = {"sampling": mode, "k": k, "N": n}
        for key in DIAGNOSTICS:
            if all(key in r for r in runs):
                entry[key] = float(np.mean([np.mean(r[key]) for r in runs]))
        if all(AGES[0] in r for r in runs):
            ages = [np.asarray(r[AGES[0]], np.float64) for r in runs]
            entry[AGES[0]] = float(np.mean([a.mean() for a in ages]))
            entry[AGES[1]] = float(max(a.max() for a in ages))
        bins = sorted((b for b in runs[0] if b.startswith(AGE_HISTOGRAM)),
                      key=lambda b: int(b.removeprefix(AGE_HISTOGRAM).split("_")[0]))
        entry["update_age_hist"] = {b.removeprefix(AGE_HISTOGRAM): float(np.mean(
            [np.mean(r[b]) for r in runs])) for b in bins if all(b in r for r in runs)}
        out.append(entry)
    return pd.DataFrame(out)


def scorecard(directory: str | Path, leaderboard: str | Path | None = None,
              reps: int = REPS) -> Card:
    """Every section of the scorecard of `directory` that can be computed."""
    entry = load(directory)
    proto = bench.protocol(entry.info["protocol"], entry.info["protocol_version"])
    notes = []
    ref, ref_words = reference_entry(entry, leaderboard, notes)
    card = Card(entry.method, entry.info, ref_words, notes=notes)
    runs = runs_table(entry.rows, entry.method)
    raw = scores.raw(runs, entry.random, LAST_EVALS)
    ref_raw = None
    if ref is not None:
        ref_raw = raw if ref is entry else scores.raw(runs_table(ref.rows, ref.method),
                                                     ref.random, LAST_EVALS)
    scored = None
    if ref_raw is not None:
        def normalise():
            reference = scores.reference_of_method(ref_raw, entry.random, proto.reference,
                                                   LAST_EVALS, k=0, sampling="constant", N=1)
            if reference.empty:
                raise ValueError(f"{proto.reference} has no runs at k = 0, N = 1")
            for r in reference.itertuples():
                if not r.final > entry.random[r.task]:
                    raise ValueError(
                        f"{proto.reference}'s mean final {r.task} accuracy at k = 0, N = 1 "
                        f"({r.final:.3f}) does not exceed the warm start's "
                        f"({entry.random[r.task]:.3f}): the score (accuracy − warm start) ÷ "
                        "(reference − warm start) is undefined")
            return scores.normalised(runs, entry.random, reference, LAST_EVALS)
        scored = _section(notes, "normalised score", normalise)
    card.scores = _section(notes, "scores", lambda: score_table(raw, scored))
    card.retention = _section(notes, "retention", lambda: retention_table(raw, entry.random, reps))
    if entry.method == proto.reference:
        notes.append(f"comparisons: not computed (the method is the reference, {proto.reference})")
    elif ref_raw is not None:
        card.comparisons = _section(notes, "comparisons", lambda: comparison_table(
            raw, ref_raw, entry.method, proto))
    card.diagnostics = _section(notes, "lag diagnostics", lambda: diagnostics_table(entry.rows))
    return card


# --- text and figure -------------------------------------------------------------------------------
def _lag(sampling: str, k: int) -> str:
    return f"k = {k}" if sampling == "constant" else f"uniform 0..{k}"


def _bin(name: str) -> str:
    low, _, high = name.partition("_")
    return low if low == high or not high else f"{low}–{high}"


def _wide(frame: pd.DataFrame, point: str, extra: str = "") -> pd.DataFrame:
    """One row per (task, N, lag): the final and AUC `point` with its interval (and the final
    `extra`, e.g. the mean accuracy), seeds."""
    rows = []
    for (task, n, sampling, k), group in frame.groupby(["task", "N", "sampling", "k"],
                                                       sort=False):
        by = group.set_index("metric")
        row = {"task": task, "N": n, "lag": _lag(sampling, k)}
        for metric in scores.METRICS:
            if metric in by.index:
                r = by.loc[metric]
                row[f"{metric} {point}"] = tables.interval(r[point], r["low"], r["high"])
        if extra:
            row[f"final {extra}"] = by.loc["final", extra] if "final" in by.index else np.nan
        row["seeds"] = int(group["seeds"].min())
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(card: Card) -> str:
    info = card.info
    proto = bench.protocol(info["protocol"], info["protocol_version"])
    warm, cost = info.get("warm_start", {}), info.get("cost", {})
    key = info.get("comparability") or {}
    lines = [f"# LLM lag-robustness scorecard: `{card.method}`", "",
             f"Protocol `{proto.name}` v{proto.version} (preset `{proto.preset}`; constant lags "
             f"k = {', '.join(map(str, proto.ks))}"
             + (f", uniform 0..{proto.largest_lag}" if proto.uniform else "")
             + f"; N = {', '.join(map(str, proto.ns))}; seeds {proto.seed}–"
             f"{proto.seed + proto.seeds - 1}). Commit {info.get('git_commit')}; configuration "
             f"{key.get('config')}, objective {key.get('objective')}.", "",
             f"Warm start {warm.get('digest')}: held-out greedy {warm.get('greedy', np.nan):.3f}, "
             f"sampled {warm.get('sampled', np.nan):.3f} (score 0). Score 1: "
             f"{proto.reference}, {card.reference}. Cost: {cost.get('compile_seconds', 0):.0f} s "
             f"compiling and {cost.get('training_seconds', 0):.0f} s training (every program); "
             f"{cost.get('wall_seconds', 0):.0f} s wall in the calls that wrote bench.json.", ""]
    if card.scores is not None:
        lines += ["## Normalised score (mean over seeds, 95% t interval) and accuracy", ""]
        lines += [tables.markdown(_wide(card.scores, "score", "accuracy")), ""]
    if card.retention is not None:
        lines += ["## Retention (score at the lag ÷ own score at k = 0, same N; 95% BCa)", ""]
        lines += [tables.markdown(_wide(card.retention, "retention")), ""]
    if card.comparisons is not None:
        lines += [f"## Against {proto.reference} at k = {proto.largest_lag}, exploratory (final "
                  "accuracy, paired by seed; paired t-test, Holm over these four; the "
                  "leaderboard's families are the pre-registered tests)", ""]
        frame = card.comparisons.assign(
            difference=tables.intervals(card.comparisons, "estimate", sign=True, digits=3))
        lines += [tables.markdown(frame, ["against", "task", "N", "difference", "seeds", "p_t",
                                          "p_holm", "verdict"]), ""]
    if card.diagnostics is not None:
        lines += ["## Lag diagnostics (means over iterations and seeds; `snapshot_age_max`: the "
                  "largest realised snapshot age)", ""]
        frame = card.diagnostics.assign(
            lag=[_lag(s, k) for s, k in zip(card.diagnostics.sampling, card.diagnostics.k)],
            update_ages=[", ".join(f"{_bin(b)}: {v:.2f}" for b, v in h.items() if v > 0)
                         for h in card.diagnostics.update_age_hist])
        columns = ["N", "lag", *[c for c in (*AGES, *DIAGNOSTICS) if c in frame], "update_ages"]
        lines += [tables.markdown(frame, columns), ""]
    if card.notes:
        lines += ["Not computed:", *[f"* {n}" for n in card.notes], ""]
    return "\n".join(lines)


def figure(card: Card):
    """Per task, the normalised final score (the accuracy gain over the warm start where there
    is no PPO-Clip) against the constant lag, a line per N, the uniform lag as a hollow mark."""
    import matplotlib.pyplot as plt

    frame = card.scores[card.scores.metric == "final"]
    normalised = bool(np.isfinite(frame.score).any())
    warm = {"greedy": card.info["warm_start"]["greedy"],
            "sampled": card.info["warm_start"]["sampled"]}
    fig, axes = plt.subplots(1, len(TASKS), figsize=(9, 3.4), squeeze=False)
    for ax, task in zip(axes[0], TASKS):
        part = frame[frame.task == task]
        for n, group in part.groupby("N"):
            constant = group[group.sampling == "constant"].sort_values("k")
            y = constant.score if normalised else constant.accuracy - warm[task]
            err = (np.abs(np.stack([y - constant.low, constant.high - y])) if normalised
                   else None)
            line = ax.errorbar(constant.k, y, yerr=err, marker="o", capsize=3, label=f"N = {n}")
            for r in group[group.sampling != "constant"].itertuples():
                value = r.score if normalised else r.accuracy - warm[task]
                ax.plot([r.k], [value], marker="s", mfc="none", color=line[0].get_color(),
                        label=f"N = {n}, uniform 0..{r.k}")
        ax.axhline(1.0 if normalised else 0.0, color="grey", ls=":")
        ax.set_xlabel("backward lag k")
        ax.set_title(f"held-out {task} accuracy", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("normalised final score" if normalised
                          else "final accuracy − warm start")
    fig.suptitle(f"{card.method} on {card.info['protocol']} v{card.info['protocol_version']}")
    fig.tight_layout()
    return fig


def write(card: Card, out: str | Path, log=None) -> list[Path]:
    """scorecard.json, scorecard.md and scorecard.png in `out`: what can be written (a file that
    cannot is said in `log`, never raised)."""
    import sys

    out = Path(out)
    log = log or (lambda message: print(message, file=sys.stderr))

    def png(path):
        figures.save(figure(card), path, dpi=120)
    written = []
    for name, step in ((f"{SCORECARD}.json", lambda p: io.write_json_atomic(p, card.to_json())),
                       (f"{SCORECARD}.md", lambda p: io.write_bytes_atomic(p, markdown(card).encode())),
                       (f"{SCORECARD}.png", png)):
        try:
            step(out / name)
        except Exception as error:  # noqa: BLE001 -- said, not raised
            log(f"note: {out / name} was not written ({type(error).__name__}: {error})")
        else:
            written.append(out / name)
    return written


# --- the leaderboard ------------------------------------------------------------------------------
def is_llm_board(directory: str | Path) -> bool:
    """Whether `directory` holds LLM benchmark entries (`<method>/bench.json` of an LLM
    protocol)."""
    return any(json.loads(p.read_text()).get("protocol", "") in bench.NAMES
               for p in Path(directory).glob(f"*/{bench.BENCH_FILE}"))


def entries(directory: str | Path) -> list[Path]:
    return sorted(p.parent for p in Path(directory).glob(f"*/{bench.BENCH_FILE}")
                  if json.loads(p.read_text()).get("protocol", "") in bench.NAMES)


def board(directory: str | Path, reps: int = REPS) -> tuple[pd.DataFrame, dict[str, Card]]:
    """One row per objective of the leaderboard `directory`: per task and at the smallest and
    largest N, the normalised final score at k = 0 and at the largest constant lag, the retention
    there, and the verdict (adjusted p) against the reference; with the cost. And each card."""
    rows, cards = [], {}
    for path in entries(directory):
        card = scorecard(path, directory, reps)
        cards[path.name] = card
        proto = bench.protocol(card.info["protocol"], card.info["protocol_version"])
        K = proto.largest_lag
        row = {"method": card.method}
        for task in TASKS:
            for n in sorted({min(proto.ns), max(proto.ns)}):
                pick = lambda f, **at: (f if f is None or f.empty else estimates._select(  # noqa: E731
                    f, {"task": task, "N": n, **at}))
                prefix = f"{task}_N{n}"
                s = pick(card.scores, metric="final", sampling="constant")
                for k in (0, K):
                    value = s[s.k == k].score if s is not None and not s.empty else []
                    row[f"{prefix}_k{k}"] = float(value.iloc[0]) if len(value) else np.nan
                r = pick(card.retention, metric="final", sampling="constant", k=K)
                for col in ("retention", "low", "high"):
                    row[f"{prefix}_retention{'' if col == 'retention' else '_' + col}"] = (
                        float(r[col].iloc[0]) if r is not None and len(r) else np.nan)
                c = pick(card.comparisons)
                row[f"{prefix}_verdict"] = (c.verdict.iloc[0] if c is not None and len(c) else
                                            "reference" if card.method == proto.reference else
                                            "not compared")
        cost = card.info.get("cost") or {}
        row["wall_seconds"] = cost.get("wall_seconds", np.nan)
        row["program_seconds"] = (cost.get("compile_seconds", np.nan)
                                  + cost.get("training_seconds", np.nan))
        row["host"] = tables.host(card.info.get("host"))
        row["commit"] = card.info.get("git_commit")
        rows.append(row)
    if not rows:
        raise FileNotFoundError(f"{directory} holds no LLM benchmark entry (<method>/"
                                f"{bench.BENCH_FILE})")
    return pd.DataFrame(rows), cards


def realised_ages(cards: dict[str, Card]) -> dict[tuple[str, int], tuple[float, float]]:
    """(lag sampling, k) → (the mean, the largest) realised snapshot age of the batches, over
    every entry's runs (`AGES`, from the cards' lag diagnostics); a setting whose runs did not
    record it is left out."""
    frames = [c.diagnostics for c in cards.values()
              if c.diagnostics is not None and AGES[0] in c.diagnostics]
    if not frames:
        return {}
    ages = pd.concat(frames, ignore_index=True).dropna(subset=list(AGES))
    return {(s, int(k)): (float(g[AGES[0]].mean()), float(g[AGES[1]].max()))
            for (s, k), g in ages.groupby(["sampling", "k"])}


def _nominal(sampling: str, k: int, ages: dict) -> str:
    """A lag setting in words with its realised snapshot age, e.g. "k = 32 (realised mean age
    15.50, at most 31)"; the bare setting where the runs did not record their ages."""
    words = _lag(sampling, k)
    if (sampling, k) not in ages:
        return words
    mean, most = ages[(sampling, k)]
    return f"{words} (realised mean age {mean:.2f}, at most {most:.0f})"


def board_markdown(table: pd.DataFrame, cards: dict[str, Card],
                   tests: families.Families | None = None) -> str:
    any_card = next(iter(cards.values()))
    proto = bench.protocol(any_card.info["protocol"], any_card.info["protocol_version"])
    K, ns = proto.largest_lag, sorted({min(proto.ns), max(proto.ns)})
    ages = realised_ages(cards)
    lines = [f"# LLM lag-robustness leaderboard: `{proto.name}` v{proto.version}", "",
             f"Normalised final score: the warm start's held-out accuracy = 0, {proto.reference} "
             f"at k = 0, N = 1 = 1 (the same seeds). Retention: the score at k = {K} ÷ the "
             f"method's own at k = 0, the same N (95% BCa). Versus {proto.reference} "
             f"(exploratory): the method − {proto.reference} at k = {K} in final accuracy, "
             "paired t-test, Holm over each scorecard's four. The pre-registered tests are the "
             "families below.", ""]
    if ages:
        lines += ["Each lag is nominal: a batch is generated by the snapshot k learner iterations "
                  "old once it exists, and before that by the oldest there is (the warm start "
                  "first), so iteration t (from 0) is generated at age min(t, k), or, for the "
                  "stochastic lag, at an age drawn from 0..min(t, k). The realised snapshot ages "
                  "of the batches (over every iteration and run): "
                  + "; ".join(_nominal(s, k, ages) for s, k in proto.lag_settings) + ".", ""]
    for task in TASKS:
        header = ["method"]
        for n in ns:
            header += [f"N={n} k=0", f"N={n} k={K}", f"N={n} retention",
                       f"N={n} vs {proto.reference} (exploratory)"]
        lines += [f"## Held-out {task} accuracy", "", "| " + " | ".join(header) + " |",
                  "|" + "---|" * len(header)]
        for r in table.to_dict("records"):
            cells = [f"`{r['method']}`"]
            for n in ns:
                p = f"{task}_N{n}"
                cells += [tables.interval(r[f"{p}_k0"], np.nan, np.nan).replace(" [n/a]", ""),
                          tables.interval(r[f"{p}_k{K}"], np.nan, np.nan).replace(" [n/a]", ""),
                          tables.interval(r[f"{p}_retention"], r[f"{p}_retention_low"],
                                          r[f"{p}_retention_high"]), r[f"{p}_verdict"]]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["Cost per objective (minutes compiling and training, summed over its programs: a "
              "call stopped and resumed counts each finished program once; machine named by host):",
              "", tables.cost(table.assign(method=[f"`{m}`" for m in table["method"]]), {
                  "objective": "method", "compiling and training": "program_seconds",
                  "host": "host"}), ""]
    notes = [f"`{name}`: {note}" for name, card in cards.items() for note in card.notes]
    if notes:
        lines += ["Not computed:", *[f"* {n}" for n in notes], ""]
    if tests is not None:
        lines += [families.markdown(tests)]
    return "\n".join(lines)


def board_figure(table: pd.DataFrame, cards: dict[str, Card]):
    from vaco_jax.pipeline import figures

    any_card = next(iter(cards.values()))
    proto = bench.protocol(any_card.info["protocol"], any_card.info["protocol_version"])
    K, parts = proto.largest_lag, []
    for task in TASKS:
        for n in sorted({min(proto.ns), max(proto.ns)}):
            p = f"{task}_N{n}"
            parts.append(pd.DataFrame({"method": table.method, "panel": f"{task}, N = {n}",
                                       "point": table[f"{p}_retention"],
                                       "low": table[f"{p}_retention_low"],
                                       "high": table[f"{p}_retention_high"]}))
    fig = figures.intervals_figure(pd.concat(parts, ignore_index=True), "method", panel="panel",
                                   xlabel=f"final-score retention at k = {K}")
    fig.suptitle(f"Retention at {_nominal('constant', K, realised_ages(cards))}: the score "
                 "there ÷ the objective's own at k = 0, the same N", fontsize=10)
    fig.tight_layout()
    return fig


BOARD_FILES = (f"{LEADERBOARD}.csv", f"{LEADERBOARD}.md", families.PRIMARY)
"""The leaderboard's files that `check` recomputes (the figure is drawn from the same table)."""


def board_files(directory: str | Path) -> tuple[dict[str, bytes], pd.DataFrame, dict[str, Card]]:
    """`BOARD_FILES`' contents recomputed from the per-run files of `directory`; the table and
    the cards."""
    table, cards = board(directory)
    tests = families.compute([load(path) for path in entries(directory)])
    contents = {BOARD_FILES[0]: table.to_csv(index=False).encode(),
                BOARD_FILES[1]: board_markdown(table, cards, tests).encode(),
                BOARD_FILES[2]: tests.table.to_csv(index=False).encode()}
    return contents, table, cards


def write_board(directory: str | Path, out: str | Path | None = None, *,
                scorecards: bool = True) -> list[Path]:
    """leaderboard.csv, .md and .png and primary.csv (the families) of the LLM leaderboard
    `directory` (into `out`, default the directory), and each entry's scorecard."""
    directory = Path(directory)
    out = Path(out or directory)
    contents, table, cards = board_files(directory)
    written = []
    for name, content in contents.items():
        io.write_bytes_atomic(out / name, content)
        written.append(out / name)
    try:
        fig = board_figure(table, cards)
        figures.save(fig, out / f"{LEADERBOARD}.png", dpi=120, bbox_inches="tight")
        written.append(out / f"{LEADERBOARD}.png")
    except Exception as error:  # noqa: BLE001 -- the tables stand without the figure
        print(f"note: {out / f'{LEADERBOARD}.png'} was not drawn ({type(error).__name__}: {error})")
    if scorecards:
        for name, card in cards.items():
            written += write(card, directory / name)
    return written


def check(directory: str | Path) -> list[str]:
    """Recompute the LLM leaderboard (`BOARD_FILES`) and each entry's scorecard.json from the
    per-run files and compare: one line per file that differs, is missing or could not be
    recomputed."""
    directory = Path(directory)
    contents, _, cards = board_files(directory)
    problems = []
    for name, content in contents.items():
        committed = directory / name
        if not committed.exists():
            problems.append(f"{committed}: missing (the recomputation makes it)")
        elif committed.read_bytes() != content:
            problems.append(f"{committed}: differs from its recomputation")
    for name, card in cards.items():
        committed = directory / name / f"{SCORECARD}.json"
        if not committed.exists():
            problems.append(f"{committed}: missing (the recomputation makes it)")
        elif _canonical(committed.read_text()) != _canonical(json.dumps(card.to_json())):
            problems.append(f"{committed}: differs from its recomputation")
    return problems


def _canonical(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True)


# --- the committed leaderboard, as a spec (`vaco-report --study leaderboard-llm`) --------------
def _board_make(spec, out: Path) -> list[Path]:
    return write_board(spec.directories[0], out, scorecards=False)


def _primary_verdicts(directory: Path) -> str:
    """F1's verdicts in the leaderboard's primary.csv, counted; its exploratory label when the
    family gives none (made before the pre-registration, or tests missing)."""
    table = pd.read_csv(Path(directory) / families.PRIMARY)
    f1 = table[table["family"] == "F1"]
    if f1.empty:
        return "none: no F1 test present"
    if not set(f1["verdict"]) <= set(families.WORDS["F1"]):
        return f"none: {f1['verdict'].iloc[0]}"
    counts = f1["verdict"].replace(families.SHORT_WORDS).value_counts()
    return f"F1, family of {len(f1)}: " + ", ".join(f"{n} {v}" for v, n in counts.items())


def board_spec():
    """The LLM leaderboard (`results/lag-bench/llm-cpu`) as a study spec."""
    from vaco_jax.study import specs

    retention = lambda label, method, accuracy: specs.Cell(
        label, f"{LEADERBOARD}.md", "N=8 retention", (("method", f"`{method}`"),),
        f"Held-out {accuracy} accuracy")
    return specs.Spec(
        "leaderboard-llm", "Which GRPO objectives keep their accuracy under backward lag?",
        ("results/lag-bench/llm-cpu",), "PPO-Clip at k = 0, N = 1 (score 1); the warm start 0",
        "each objective − PPO-Clip at k = 32, N = 1 and 8, greedy and sampled (Holm over 48)",
        "results/lag-bench/llm-cpu", (f"{LEADERBOARD}.md", f"{LEADERBOARD}.csv", families.PRIMARY),
        "0a5f72c", _board_make,
        (retention("PPO-Clip's retention at k = 32, N = 8, greedy accuracy", "ppo_clip", "greedy"),
         retention("sampled", "ppo_clip", "sampled"),
         retention("VACO's greedy", "vaco", "greedy")),
        _primary_verdicts, specs.seeds_of(families.PRIMARY, "n_seeds"),
        registration=bench.protocol("llm-cpu", 1).preregistration)
