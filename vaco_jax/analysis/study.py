"""A study as one TOML file (`studies/*.toml`): its question, the per-run table it reads, its
estimands, the pre-registered family (if any) and its headline rows. `load` reads one; `make`
regenerates its estimates.csv and report.md in memory; `write` writes them; `check_study` compares
them with the committed files (`check.check_files`); `headline` picks a headline row by its key. A
new study is a new file, not new code.

    study = "name"                  # also the default output folder's name
    question = "..."
    output = "results/studies/name" # where estimates.csv and report.md go (relative to the checkout)
    exploratory = "why"             # a study with no [family]: said in its report

    [runs]
    table = "results/.../scores.csv"  # the per-run table (a glob pattern: every file it matches;
                                      # CSV, Parquet, or JSONL: vaco-train's metrics.jsonl)
    adapter = "bench"                 # schema's adapter: bench, sweeps, settings, llm, train
    commits = "results/.../*/runs/cells.jsonl"  # where the runs' commits are (their git_commit)
    merge_identical = ["N"]           # optional: entries with the same runs within each N are
                                      # reported once (`schema.merge_identical`); the family's
                                      # `size` counts its tests before that, Holm those after

    [family]                        # the pre-registered tests: verdict words only when every run's
    registration = "<commit>"       # commit descends from this one and the family has `size` tests
    section = "docs/preregistrations.md#..."
    size = 16
    correction = "holm"

    [[estimands]]                   # each an `estimands.estimate` spec; `in_family = true` marks
    estimand = "difference"         # those the [family] registers (one Holm over their tests; a
                                    # retention with `level`: the break rule's words, no Holm);
                                    # `of_family = true` on a `stability` entry: of their verdicts
    ...

    [[headlines]]                   # rows picked by key (`report.headline`): label, estimand,
    label = "..."                   # method, setting (metric and task optional)
"""

from __future__ import annotations

import dataclasses
import glob
import tomllib
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from vaco_jax import io
from vaco_jax.analysis import check, estimands, families, report, schema

ADAPTERS = {"bench": schema.from_bench, "sweeps": schema.from_sweeps,
            "settings": schema.from_settings, "llm": schema.from_llm, "train": schema.from_train}
FILES = ("estimates.csv", "report.md")
LEVELS = ("mean", "retention", "iqm")
"""Estimands that are a level or a ratio, not a difference: printed without a sign."""
_KEYS = {"study", "question", "output", "exploratory", "runs", "family", "estimands", "headlines"}


@dataclasses.dataclass(frozen=True)
class StudyFile:
    """One study's TOML file, read (`load`); paths are relative to the checkout."""

    path: Path
    name: str
    question: str
    runs: Mapping
    estimands: list[dict]
    output: str
    family: Mapping | None = None
    exploratory: str = ""
    headlines: list[dict] = dataclasses.field(default_factory=list)


def load(path: str | Path, root: str | Path | None = None) -> StudyFile:
    """The study of the TOML file `path` (named relative to the checkout `root` when it lies in
    it); a ValueError naming the file and what is wrong."""
    path = Path(path)
    data = tomllib.loads(path.read_text())
    problem = _problem(data)
    if problem:
        raise ValueError(f"{path}: {problem}")
    if root is not None and path.resolve().is_relative_to(Path(root).resolve()):
        path = path.resolve().relative_to(Path(root).resolve())
    return StudyFile(path, data["study"], data["question"], data["runs"], data["estimands"],
                     data.get("output", f"results/studies/{data['study']}"), data.get("family"),
                     data.get("exploratory", ""), data.get("headlines", []))


def _problem(data: Mapping) -> str | None:
    """What is wrong with a study file's contents, in words (None: nothing)."""
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        return f"unknown keys {unknown} (known: {sorted(_KEYS)})"
    missing = [k for k in ("study", "question", "runs", "estimands") if k not in data]
    if missing:
        return f"no {missing[0]!r}"
    if "table" not in data["runs"]:
        return "[runs] has no 'table'"
    if data["runs"].get("adapter", "bench") not in ADAPTERS:
        return f"[runs] adapter {data['runs']['adapter']!r} is not one of {sorted(ADAPTERS)}"
    within, keys = data["runs"].get("merge_identical", []), [k for k in schema.KEY if k != "method"]
    if not isinstance(within, list) or set(within) - set(keys):
        return f"[runs] merge_identical {within!r} is not a list of run-table keys {keys}"
    for entry in data["estimands"]:
        if entry.get("estimand") not in estimands.ESTIMANDS:
            return (f"estimand {entry.get('estimand')!r} is not one of "
                    f"{sorted(estimands.ESTIMANDS)}")
    family = data.get("family")
    if family and ("registration" not in family or family.get("correction", "holm") != "holm"):
        return "[family] needs 'registration' and correction = \"holm\" (the one implemented)"
    if family and not any(e.get("in_family") for e in data["estimands"]):
        return "[family] registers estimands: mark each in_family = true"
    if not family and not data.get("exploratory"):
        return "a study with no [family] says why it is exploratory ('exploratory')"
    return None


def runs(study: StudyFile, root: str | Path) -> pd.DataFrame:
    """The run table (`schema.COLUMNS`) of the study's per-run file, through its adapter; a
    pattern (`results/.../*/results.parquet`) reads every file it matches, in sorted order, as
    one table."""
    pattern = study.runs["table"]
    paths = (sorted(Path(root).glob(pattern)) if any(c in pattern for c in "*?[")
             else [Path(root) / pattern])
    if not paths:
        raise FileNotFoundError(f"{study.path}: [runs] table {pattern!r} matches no file")
    frame = pd.concat([_read(p) for p in paths], ignore_index=True)
    return ADAPTERS[study.runs.get("adapter", "bench")](frame, study=study.name)


def _read(path: Path) -> pd.DataFrame:
    """One per-run file as a table: Parquet, CSV, or a JSONL table (`io.read_rows`: a vaco-train
    run's metrics.jsonl) with the directory that holds it (`directory`: where its config.json is)."""
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".jsonl":
        return pd.DataFrame(io.read_rows(path)).assign(directory=str(path.parent))
    return pd.read_csv(path)


def commits(study: StudyFile, root: str | Path) -> list[str]:
    """The commits that made the runs: each record's `git_commit` in the files `[runs] commits`
    matches (sorted glob), else the run table's own `commit` column."""
    pattern = study.runs.get("commits")
    if not pattern:
        return sorted(set(runs(study, root)["commit"]) - {""})
    return families.record_commits(sorted(glob.glob(str(Path(root) / pattern))))


def status(study: StudyFile, root: str | Path, tested: int | None = None,
           descends=None, distinct: int | None = None) -> tuple[bool, str]:
    """(whether the family's tests give verdict words, why in words): the runs' commits descend
    from the registration (`families.status`) and the family holds `size` tests (`tested`)."""
    if not study.family:
        return False, f"exploratory, not pre-registered: {study.exploratory}"
    family = study.family
    found, words = families.status(commits(study, root), family["registration"], descends)
    where = f" ({family['section']})" if family.get("section") else ""
    if found != "after":
        return False, f"exploratory: {words}{where}"
    if tested is not None and family.get("size") not in (None, tested):
        return False, (f"exploratory: {words}{where}, but {tested} tests here where the "
                       f"registration names {family['size']}")
    over = tested if distinct in (None, tested) else (
        f"the {distinct} distinct tests of the {tested} registered")
    return True, f"pre-registered: {words}{where}; Holm's correction over {over} tests"


def estimate(study: StudyFile, root: str | Path, descends=None) -> tuple[pd.DataFrame, str]:
    """(the estimates table, the pre-registration status in words): every estimand of the study
    (`estimands.estimate`), the family's verdict words only when `status` allows them."""
    every = runs(study, root)
    within = study.runs.get("merge_identical")
    baselines = [e["baseline"] for e in study.estimands if e.get("baseline")]
    table, merged = (schema.merge_identical(every, within, first=baselines) if within
                     else (every, []))
    specs = [{"study": study.name, **{k: v for k, v in e.items() if k not in ("in_family", "of_family")}}
             for e in study.estimands]
    members = [spec for spec, entry in zip(specs, study.estimands) if entry.get("in_family")]
    # the family's tests: the rows of its estimands that Holm's correction counts (all of them,
    # and the distinct ones once identical entries are merged)
    count = lambda t: len(estimands.family_table(t, members).query("p_holm == p_holm"))  # noqa: E731
    tested = count(every) if members else None
    distinct = count(table) if members and merged else None
    registered, words = status(study, root, tested, descends, distinct)
    if merged:
        words += "; " + "; ".join(
            f"{', '.join(f'{k} = {v}' for k, v in zip(within, where))}: "
            f"{', '.join(f'`{m}`' for m in group[1:])} gave `{group[0]}`'s runs on every seed "
            f"and setting, reported once as `{group[0]}`" for where, group in merged)
    for spec in members:
        spec["pre_registered"] = registered
    for spec, entry in zip(specs, study.estimands):
        if entry.get("of_family"):           # stability of the family's own verdicts
            spec["members"] = members
    estimates = estimands.estimate(table, {"study": study.name, "estimands": specs})
    if len(members) > 1:                     # one Holm's correction over every estimand in it
        mine = estimates["estimand"].isin([m["estimand"] for m in members])
        estimates = pd.concat([estimates[~mine], estimands.joint(estimates[mine], members)]
                              ).sort_index()
    return estimates, words


def render(study: StudyFile, estimates: pd.DataFrame, words: str) -> str:
    """report.md: the question, where the runs and this file are, the pre-registration status,
    the headline rows, then every estimand's table (`report.render`)."""
    lines = [f"# {study.question}", "",
             f"Study `{study.name}`, from `{study.path.as_posix()}` (regenerate: `vaco-report "
             f"--study-file {study.path.as_posix()}`). Runs: `{study.runs['table']}` "
             f"({study.runs.get('adapter', 'bench')} adapter). Intervals are 95%.", "",
             f"Tests: {words}.", ""]
    if study.headlines:
        lines += ["## Headlines", ""]
        for h in study.headlines:
            row, shown = headline(study, estimates, h)
            lines.append(f"* {h['label']}: {shown}" + (f" ({row.verdict})" if row.verdict else ""))
        lines.append("")
    body = report.render(estimates, study.question).split("\n", 2)[2]   # less its title
    return "\n".join(lines) + "\n" + body + "\n"


def headline(study: StudyFile, estimates: pd.DataFrame, entry: Mapping) -> tuple[pd.Series, str]:
    """A `[[headlines]]` entry's row of `estimates`, picked by its key (`report.headline`), and
    its estimate [interval] as the report prints it (`report.interval`)."""
    row = report.headline(estimates, task=entry.get("task", estimands.POOLED), study=study.name,
                          **{k: v for k, v in entry.items() if k not in ("label", "task")})
    return row, report.interval(row.point, row.low, row.high, sign=row.estimand not in LEVELS)


def make(study: StudyFile, root: str | Path, descends=None) -> dict[str, str]:
    """estimates.csv and report.md of `study`, as texts (file name → text)."""
    return texts(study, *estimate(study, root, descends))


def texts(study: StudyFile, table: pd.DataFrame, words: str) -> dict[str, str]:
    """estimates.csv and report.md of `study` from its estimates table and pre-registration status
    in words (`estimate`'s), as texts (file name → text)."""
    return {"estimates.csv": table[list(estimands.ESTIMATES)].to_csv(index=False),
            "report.md": render(study, table, words)}


def write(study: StudyFile, root: str | Path, out: str | Path | None = None) -> list[Path]:
    """Write `make`'s files into `out` (default: the study's `output` under `root`)."""
    directory = Path(out) if out else Path(root) / study.output
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in make(study, root).items():
        io.write_bytes_atomic(directory / name, text.encode())
        written.append(directory / name)
    return written


def check_study(study: StudyFile, root: str | Path, descends=None) -> list[str]:
    """Each committed file of the study whose regeneration differs: "path: first difference"."""
    made = {f"{study.output}/{name}": text for name, text in make(study, root, descends).items()}
    return check.check_files(root, made)
