"""The LLM leaderboard's pre-registered test families (docs/preregistrations.md, section 2),
computed across every entry of a leaderboard directory into its `primary.csv`.

* **F1, primary** (objective vs PPO-Clip under lag): each objective other than the reference − the
  reference at the largest constant lag, per N and per metric;
* **F2** (does lag change the objective's own accuracy): each objective, the reference included,
  at the largest constant lag − itself at k = 0, per N and per metric.

The metrics are held-out greedy and sampled accuracy at the end of training (the rows'
`final_accuracy` and `final_sampled_accuracy`). Each test pairs by seed: the two-sided paired
t-test, the mean difference with its unadjusted 95% t interval, and Holm's correction over every
test of its family that is present (`pipeline.preregistration.family`). Only constant lags enter;
the stochastic lag, the middle lags and normalised scores stay exploratory (the scorecards).

A test whose conditions lack any of the protocol's seeds is left out and named in the notes, with
how many tests each family holds. Verdict words only when every entry's runs were made at commits
(bench.json's `commits`) that descend from the protocol's `preregistration`; otherwise the verdict
says why the tests are exploratory.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from vaco_jax.llm import bench
from vaco_jax.pipeline import preregistration

PRIMARY = "primary.csv"
METRICS = ("final_accuracy", "final_sampled_accuracy")
COLUMNS = ("family", "objective", "N", "metric", "mean", "ci_low", "ci_high", "p", "p_holm",
           "verdict", "n_seeds")
WORDS = {"F1": ("higher than PPO-Clip under lag", "lower than PPO-Clip under lag",
                "no difference shown"),
         "F2": ("lag raises it", "lag lowers it", "no change shown")}
"""Each family's verdicts: Holm's p below 0.05 with a positive mean difference, a negative one,
else."""
SHORT_WORDS = {WORDS["F1"][0]: "higher", WORDS["F1"][1]: "lower"}
"""F1's verdicts in a word, where the reference is named beside them (the answer's grid)."""
REGISTERED = {("llm-cpu", 1): ("ppo_clip", "vaco", "pg", "decoupled_ppo", "spo", "impala",
                               "icepop", "cispo", "dppo_tv", "m2po", "topr", "geppo", "gspo")}
"""The objectives a protocol's pre-registration names (docs/preregistrations.md section 2): its
families are exactly their tests. Another entry (an alias such as `tis`, your own objective) is
left out of the families and named; verdict words need every registered test present."""
EXPLORATORY = {"before": "made before the pre-registration",
               "unknown": "not known to follow the pre-registration",
               "none": "no pre-registration named"}


@dataclasses.dataclass
class Families:
    """Both families' tests (`COLUMNS`), what was left out, and whether the verdicts are the
    pre-registered ones (`status`: "after", "before", "unknown" or "none"; `status_words`)."""

    table: pd.DataFrame
    notes: list
    status: str
    status_words: str
    largest_lag: int
    reference: str

    @property
    def pre_registered(self) -> bool:
        return self.status == "after"


def finals(entries) -> pd.DataFrame:
    """One row per run of every entry (`scorecard.Entry`: method, rows): objective, sampling, k,
    N, seed and `METRICS`."""
    from vaco_jax.llm.experiment import lag_of

    out = []
    for entry in entries:
        for row in entry.rows:
            sampling, k = lag_of(row)
            out.append({"objective": entry.method, "sampling": sampling, "k": k, "N": row["n"],
                        "seed": row["seed"], **{m: float(row[m]) for m in METRICS}})
    return pd.DataFrame(out, columns=["objective", "sampling", "k", "N", "seed", *METRICS])


def _status(proto: bench.LLMProtocol, entries) -> tuple[str, str]:
    if not proto.preregistration:
        return "none", (f"protocol {proto.name} v{proto.version} names no pre-registration "
                        "commit (`LLMProtocol.preregistration`)")
    made = [c for entry in entries for c in bench.commits(entry.info)]
    return preregistration.status(made, proto.preregistration)


def compute(entries) -> Families:
    """F1 and F2 over the LLM leaderboard's `entries` (`scorecard.Entry`s), on the reference's
    protocol (else the first entry's)."""
    notes = []
    by_method = {}
    for entry in entries:
        if entry.method in by_method:
            notes.append(f"`{entry.method}` is in both {by_method[entry.method].directory} and "
                         f"{entry.directory}: the families use the first")
            continue
        by_method[entry.method] = entry
    if not by_method:
        raise FileNotFoundError("no LLM benchmark entry to test")
    first = next(iter(by_method.values()))

    def proto_of(entry):
        return bench.protocol(entry.info["protocol"], entry.info["protocol_version"])

    reference = by_method.get(proto_of(first).reference)
    proto = proto_of(reference or first)
    kept = []
    for method, entry in by_method.items():
        if (entry.info["protocol"], entry.info["protocol_version"]) != (proto.name, proto.version):
            notes.append(f"`{method}` is on protocol {entry.info['protocol']} "
                         f"v{entry.info['protocol_version']}, not {proto.name} v{proto.version}: "
                         "left out of both families")
        else:
            kept.append(entry)
    registered = REGISTERED.get((proto.name, proto.version))
    if registered is not None:
        extra = [e.method for e in kept if e.method not in registered]
        if extra:
            notes.append(f"{', '.join(f'`{m}`' for m in extra)}: not among the objectives the "
                         f"pre-registration names for {proto.name} v{proto.version}; left out "
                         "of both families")
        kept = [e for e in kept if e.method in registered]
    runs = finals(kept)
    runs = runs[runs.sampling == "constant"]
    K, seeds = proto.largest_lag, list(range(proto.seeds))
    missing_said = set()

    def values(method: str, k: int, n: int) -> pd.DataFrame | None:
        """`[seeds, METRICS]` of `method` at constant lag k and N, or None (said in the notes)
        when any of the protocol's seeds is missing."""
        at = runs[(runs.objective == method) & (runs.k == k) & (runs.N == n)].set_index("seed")
        absent = [s for s in seeds if s not in at.index]
        if absent:
            if (method, k, n) not in missing_said:
                missing_said.add((method, k, n))
                what = ("no runs" if len(absent) == len(seeds) else
                        f"seeds {', '.join(map(str, absent))} missing (the protocol has "
                        f"{len(seeds)})")
                notes.append(f"`{method}` at k = {k}, N = {n}: {what}; its tests there are left "
                             "out")
            return None
        return at.loc[seeds, list(METRICS)]

    tests = {"F1": [], "F2": []}
    expected = {"F1": 0, "F2": 0}
    comparable = {}
    for entry in kept:
        if reference is None or entry is reference:
            continue
        reasons = bench.key_differences(reference.info.get("comparability") or {},
                                        entry.info.get("comparability") or {})
        comparable[entry.method] = not reasons
        if reasons:
            notes.append(f"`{entry.method}` is not comparable with `{proto.reference}` "
                         f"({'; '.join(reasons)}): left out of F1")
    if reference is None:
        notes.append(f"the board holds no `{proto.reference}` entry on {proto.name} "
                     f"v{proto.version}: F1 not computed")
    for entry in kept:
        method = entry.method
        for n in proto.ns:
            pairs = {"F2": (method, 0)}
            if reference is not None and entry is not reference:
                pairs["F1"] = (proto.reference, K)
            for name, (other, k_other) in pairs.items():
                expected[name] += len(METRICS)
                if name == "F1" and not comparable[method]:
                    continue
                a, b = values(method, K, n), values(other, k_other, n)
                if a is None or b is None:
                    continue
                for metric in METRICS:
                    tests[name].append({"objective": method, "N": n, "metric": metric,
                                        "differences": (a[metric] - b[metric]).to_numpy()})
    status, status_words = _status(proto, kept)
    if registered is not None:   # the registered family's size, whatever the board holds
        expected = {"F1": (len(registered) - 1) * len(proto.ns) * len(METRICS),
                    "F2": len(registered) * len(proto.ns) * len(METRICS)}
    frames = []
    for name, family_tests in tests.items():
        present = len(family_tests)
        complete = present >= expected[name]
        if expected[name] and not complete:
            notes.append(f"{name}: {present} of the {expected[name]} tests the "
                         f"{'pre-registration names' if registered else 'board' + chr(39) + 's objectives make'} "
                         f"are present; Holm's correction is over these {present}"
                         + (", and no verdict is given until all are" if registered else ""))
        if not family_tests:
            continue
        judged = status == "after" and (complete or registered is None)
        table = preregistration.family(family_tests, test="t", pre_registered=judged,
                                       words=WORDS[name])
        if status != "after":
            table["verdict"] = f"exploratory ({EXPLORATORY[status]})"
        elif not judged:
            table["verdict"] = f"exploratory ({present} of the {expected[name]} tests present)"
        frames.append(table.assign(family=name).rename(columns={
            "estimate": "mean", "low": "ci_low", "high": "ci_high", "seeds": "n_seeds"}))
    table = (pd.concat(frames, ignore_index=True)[list(COLUMNS)] if frames
             else pd.DataFrame(columns=list(COLUMNS)))
    return Families(table, notes, status, status_words, K, proto.reference)


def answer(families: Families) -> str:
    """The pre-registered reading of the families (docs/preregistrations.md section 2): does
    backward lag hurt the reference (its F2 rows), and which objectives differ from it under lag
    (F1), one cell per N and metric. A cell is the verdict when the families are the
    pre-registered ones, else the difference with its interval under an exploratory heading."""
    from vaco_jax.pipeline import tables

    K, ref, table = families.largest_lag, families.reference, families.table
    judged = families.pre_registered and not table.verdict.str.startswith("exploratory").any()
    metric_words = {"final_accuracy": "greedy", "final_sampled_accuracy": "sampled"}

    def grid(part: pd.DataFrame) -> str:
        texts = (part.verdict.replace(SHORT_WORDS) if judged else
                 tables.intervals(part, "mean", "ci_low", "ci_high", digits=3, sign=True))
        wide = part.assign(text=list(texts), column=[
            f"N={n} {metric_words[m]}" for n, m in zip(part.N, part.metric)])
        order = [f"N={n} {metric_words[m]}" for n in sorted(set(part.N)) for m in METRICS]
        frame = wide.pivot(index="objective", columns="column", values="text").reindex(
            columns=[c for c in order if c in set(wide.column)]).reset_index()
        frame["objective"] = [f"`{o}`" for o in frame["objective"]]
        return tables.markdown(frame.fillna("—").rename_axis(columns=None))

    lines = ["## The answer" + ("" if judged else " (exploratory: no verdict words)"), ""]
    f2 = table[(table.family == "F2") & (table.objective == ref)]
    f1 = table[table.family == "F1"]
    lines += [f"Does backward lag hurt `{ref}`? F2: its accuracy at k = {K} − at k = 0.", "",
              grid(f2) if not f2.empty else "No test is present.", "",
              f"Which objectives differ from `{ref}` under lag? F1: each − `{ref}` at k = {K}.",
              "", grid(f1) if not f1.empty else "No test is present.", ""]
    return "\n".join(lines)


def markdown(families: Families) -> str:
    """The families' section of leaderboard.md: the answer, one table per family, the notes."""
    from vaco_jax.pipeline import tables

    K, ref = families.largest_lag, families.reference
    lines = [answer(families), "## The pre-registered test families", "",
             "Paired by seed; final held-out accuracy (greedy: `final_accuracy`, sampled: "
             "`final_sampled_accuracy`); mean difference with its unadjusted 95% t interval; "
             "two-sided paired t-test, Holm's correction over each family. Constant lags only "
             "(docs/preregistrations.md, section 2).", "",
             f"Pre-registration: {families.status_words}; "
             + ("the verdicts are the pre-registered ones." if families.pre_registered else
                "exploratory, without verdict words."), ""]
    headings = {"F1": f"F1 (primary): the objective − `{ref}` at k = {K}",
                "F2": f"F2: the objective at k = {K} − itself at k = 0"}
    for name, heading in headings.items():
        part = families.table[families.table.family == name]
        if part.empty:
            lines += [f"### {heading}", "", "No test is present.", ""]
            continue
        frame = part.assign(objective=[f"`{o}`" for o in part.objective],
                            difference=tables.intervals(part, "mean", "ci_low", "ci_high",
                                                        digits=3, sign=True),
                            seeds=part.n_seeds)
        columns = ["objective", "N", "metric", "difference", "p", "p_holm", "verdict", "seeds"]
        lines += [f"### {heading} ({len(part)} tests)", "", tables.markdown(frame, columns), ""]
    if families.notes:
        lines += ["Left out of the families:", *[f"* {n}" for n in families.notes], ""]
    return "\n".join(lines)
