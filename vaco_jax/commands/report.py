"""The controlled-lag study's report: degradation with lag per task and method, VACO against each
baseline, break lags, a synchronous sanity check, realised lags, figures and summary.md; with
`--study settings`, the report of the forward × backward, step-size and δ × lag studies.

    vaco-report --sweeps runs/sweeps/lag-cpu   # -> runs/sweeps/lag-cpu/lag_report
    vaco-report --sweeps runs/lag/idp runs/lag/hopper \
        --references runs/lag/reference_returns.json --out runs/lag/report
    vaco-report --study settings --sweeps runs/forward/* runs/stepsize/* runs/delta-lag/* \
        --references results/lag-cpu/reference_returns.json --out runs/settings_report
    vaco-report --study controlled-lag            # a committed study, regenerated from its spec
    vaco-report --all                             # every study -> results/RESULTS.md, results/README.md, README
    vaco-report --all --check                     # exit 1, naming each stale committed file
                                                  # (a study file's estimates.csv and report.md
                                                  # too, and each archived file whose checksum
                                                  # changed)
    vaco-report --study capacity-cpu --check      # one study (an archived capacity sweep here)
    vaco-report --study-file studies/leaderboard-v2-level.toml [--check]   # a study as one TOML file

The sweeps are `vaco-sweep --preset lag-cpu` (one directory, or one per task); the references
`vaco-references --preset lag-cpu --last-evals 3` (the analysis scores a run by its last 3
evaluations and refuses references measured otherwise).
Cells made by different vaco_jax source are refused unless `--allow-code-change`. The method of
analysis: docs/studies/controlled-lag.md; the tests: docs/preregistrations.md; the committed
studies' specs: `vaco_jax.study.specs` (docs/experiments.md, "Regenerating the results").
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import tyro

from vaco_jax.errors import SweepError
from vaco_jax.study import presets


@dataclasses.dataclass
class Args:
    sweeps: tuple[str, ...] = ()
    """Sweep directories holding the study (results.jsonl, cells.jsonl, sweep.json)."""
    study: str = "lag"
    """lag: the controlled-lag study; settings: the forward × backward (update frequency × lag),
    step-size and δ × lag studies, whichever the sweeps hold (scores normalised by their own
    synchronous PPO-Clip runs on the same seeds; the references give the random returns); or a
    committed study's name (the first column of results/RESULTS.md, or an archived capacity sweep:
    capacity-cpu, capacity-ablations, capacity-dmc, capacity-hopper-1m): regenerated from its
    committed per-run files into --out (default: its committed report directory), no sweeps."""
    all: bool = False
    """Regenerate every committed study into a temporary directory (and every study file,
    studies/*.toml, in memory) and write results/RESULTS.md, the results index results/README.md
    (every study, its report, the commits of its runs, its pre-registration) and the README's
    results table from it (one row per study; a study file's: its first headline)."""
    study_file: str = ""
    """A study as one TOML file (studies/*.toml): its estimates.csv and report.md, written to its
    `output` folder (or --out); with --check, compared with the committed ones instead."""
    check: bool = False
    """With --all, a committed study's name or --study-file: write nothing; exit 1, naming each
    committed report file (with --all, each study file's estimates.csv and report.md, RESULTS.md,
    results/README.md and the README too) that differs from its regeneration (with --all, also
    each archived file whose SHA-256 is not the one results/archive/SHA256SUMS lists), 0 when all
    are current."""
    references: str = ""
    """Reference-returns table (default <first sweep>/reference_returns.json)."""
    out: str = ""
    """Where figures, CSV tables and summary.md go (default <first sweep>/<study>_report)."""
    reps: int = 10_000
    """Bootstrap resamples per 95% interval (the Bonferroni family gets more: see summary.md)."""
    seed: int = 0
    """Seed of the bootstrap's resampling."""
    last_evals: int = presets.FINAL_EVALS
    """A run's score averages its last this many evaluations (the references must match)."""
    allow_code_change: bool = False
    """Combine cells made by different vaco_jax source (normally refused)."""


def main(argv: list[str] | None = None, prog: str = "vaco-report") -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.split("\n\n")[0], prog=prog)
    # The library is imported once the flags are parsed: --help imports no JAX.
    import matplotlib

    matplotlib.use("Agg")
    from vaco_jax.study import lag, lag_by_setting, references, specs

    root = specs.checkout()
    if root != specs.ROOT:
        print(f"note: the committed results of {root} (the working directory's checkout), "
              f"regenerated by the vaco_jax installed from {specs.ROOT}", file=sys.stderr)
    if args.study_file:
        return _study_file(args.study_file, root, check=args.check, out=args.out)
    studies = _studies()
    if args.all:
        return _all(studies, check=args.check, root=root)
    committed = {**studies, **specs.ARCHIVED}
    if args.check and args.study not in committed:
        print("error: option `check` is only valid with --all or a committed study's name",
              file=sys.stderr)
        return 2
    if args.check:
        problems = specs.check_study(committed[args.study], root)
        print("\n".join(f"stale: {p}" for p in problems)
              or f"every committed report file of {args.study} in {root} is current")
        return 1 if problems else 0
    if args.study in committed:
        spec = committed[args.study]
        written = specs.make(spec, Path(args.out or root / spec.report), root)
        print("\n".join(str(p) for p in written))
        return 0
    if args.study not in ("lag", "settings"):
        print(f"error: option `study` = {args.study!r} is invalid: must be lag, settings or a "
              f"committed study ({', '.join(committed)})", file=sys.stderr)
        return 2
    if not args.sweeps:
        print(f"error: option `sweeps` is required for --study {args.study}", file=sys.stderr)
        return 2
    first = Path(args.sweeps[0])
    references_path = args.references or str(first / references.FILE_NAME)
    out = Path(args.out or first / f"{args.study}_report")
    module = lag if args.study == "lag" else lag_by_setting
    try:
        if not Path(references_path).exists():
            raise FileNotFoundError(f"no reference returns at {references_path}: pass "
                                    f"--references (`vaco-references` measures them)")
        study = module.load_study(args.sweeps, allow_code_change=args.allow_code_change)
        report = module.analyse(study, references.load(references_path), reps=args.reps,
                                seed=args.seed, last_evals=args.last_evals)
    except (SweepError, ValueError, KeyError, FileNotFoundError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        print(f"error: {message}", file=sys.stderr)
        return 2
    written = module.write(report, out, sweeps=args.sweeps, references_path=references_path)
    print("\n".join(str(p) for p in written))
    return 0



def _study_file(path: str, root: Path, *, check: bool, out: str) -> int:
    """--study-file: a study's TOML file, its paths read from the checkout `root`."""
    from vaco_jax.analysis import study

    try:
        loaded = study.load(path, root=root)
        if check:
            problems = study.check_study(loaded, root)
            print("\n".join(f"stale: {p}" for p in problems) or
                  f"{loaded.output}/ in {root} is current ({', '.join(study.FILES)})")
            return 1 if problems else 0
        written = study.write(loaded, root, out or None)
    except (ValueError, KeyError, FileNotFoundError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        print(f"error: {message}", file=sys.stderr)
        return 2
    print("\n".join(str(p) for p in written))
    return 0


def _studies() -> dict:
    """Every committed study's spec, by name (the LLM's is defined with the LLM study)."""
    from vaco_jax.llm import experiment, scorecard
    from vaco_jax.study import specs

    board = scorecard.board_spec()
    return {**specs.STUDIES, experiment.SPEC.name: experiment.SPEC, board.name: board}


def _all(studies: dict, *, check: bool, root: Path) -> int:
    """--all: RESULTS.md, the results index and the README's results table of the checkout `root`
    from every study and study file regenerated; with --check, what is stale there."""
    import tempfile
    import time

    from vaco_jax import io
    from vaco_jax.analysis.check import CHECKSUMS
    from vaco_jax.study import specs

    start = time.perf_counter()
    if check:
        problems = specs.check(studies, root)
        print("\n".join(f"stale: {p}" for p in problems) or
              f"every committed report file (each study file's too), {specs.RESULTS}, "
              f"{specs.INDEX} and {specs.README}'s results table "
              f"in {root} is current, and every file {CHECKSUMS} lists matches its checksum "
              f"({len(studies)} studies, {len(specs.study_files(root))} study files, "
              f"{time.perf_counter() - start:.0f} s)")
        return 1 if problems else 0
    with tempfile.TemporaryDirectory() as tmp:
        made = specs.regenerate(studies, Path(tmp), root)
        made_files = specs.regenerate_study_files(root)
        text = specs.results_markdown(studies, made, root, made_files)
        index = specs.index_markdown(studies, made, root)
        readme = root / specs.README
        block = (specs.readme_block(studies, made, root, made_files) if readme.exists()
                 else None)
    for name, written in ((specs.RESULTS, text), (specs.INDEX, index)):
        io.write_bytes_atomic(root / name, written.encode())
        print(root / name)
    if block is not None:
        io.write_bytes_atomic(readme, specs.with_readme_block(readme.read_text(), block).encode())
        print(readme)
    return 0
