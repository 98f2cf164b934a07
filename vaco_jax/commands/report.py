"""The controlled-lag study's report: degradation with lag per task and method, VACO against each
baseline, break lags, a synchronous sanity check, realised lags, figures and summary.md; with
`--study settings`, the report of the forward × backward, step-size and δ × lag studies.

    vaco-report --sweeps runs/sweeps/lag-cpu   # -> runs/sweeps/lag-cpu/lag_report
    vaco-report --sweeps runs/lag/idp runs/lag/hopper \
        --references runs/lag/reference_returns.json --out runs/lag/report
    vaco-report --study settings --sweeps runs/forward/* runs/stepsize/* runs/delta-lag/* \
        --references results/lag-cpu/reference_returns.json --out runs/settings_report
    vaco-report --study controlled-lag            # a committed study, regenerated from its spec
    vaco-report --all                             # every committed study -> results/RESULTS.md, README
    vaco-report --all --check                     # exit 1, naming each stale committed file
    vaco-report --study capacity-cpu --check      # one study (an archived capacity sweep here)

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
    """Regenerate every committed study into a temporary directory and write results/RESULTS.md
    and the README's results table from it (one row per study)."""
    check: bool = False
    """With --all or a committed study's name: write nothing; exit 1, naming each committed report
    file (with --all, RESULTS.md and the README too) that differs from its regeneration, 0 when
    all are current."""
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

    studies = _studies()
    if args.all:
        return _all(studies, check=args.check)
    committed = {**studies, **specs.ARCHIVED}
    if args.check and args.study not in committed:
        print("error: option `check` is only valid with --all or a committed study's name",
              file=sys.stderr)
        return 2
    if args.check:
        problems = specs.check_study(committed[args.study])
        print("\n".join(f"stale: {p}" for p in problems)
              or f"every committed report file of {args.study} is current")
        return 1 if problems else 0
    if args.study in committed:
        spec = committed[args.study]
        written = specs.make(spec, Path(args.out or specs.ROOT / spec.report))
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



def _studies() -> dict:
    """Every committed study's spec, by name (the LLM's is defined with the LLM study)."""
    from vaco_jax.llm import experiment, scorecard
    from vaco_jax.study import specs

    board = scorecard.board_spec()
    return {**specs.STUDIES, experiment.SPEC.name: experiment.SPEC, board.name: board}


def _all(studies: dict, *, check: bool) -> int:
    """--all: RESULTS.md and the README's results table from every study regenerated; with
    --check, what is stale."""
    import tempfile
    import time

    from vaco_jax import io
    from vaco_jax.study import specs

    start = time.perf_counter()
    if check:
        problems = specs.check(studies)
        print("\n".join(f"stale: {p}" for p in problems) or
              f"every committed report file and {specs.RESULTS} is current "
              f"({len(studies)} studies, {time.perf_counter() - start:.0f} s)")
        return 1 if problems else 0
    with tempfile.TemporaryDirectory() as tmp:
        made = specs.regenerate(studies, Path(tmp))
        text = specs.results_markdown(studies, made)
        readme = specs.ROOT / specs.README
        block = specs.readme_block(studies, made) if readme.exists() else None
    io.write_bytes_atomic(specs.ROOT / specs.RESULTS, text.encode())
    print(specs.ROOT / specs.RESULTS)
    if block is not None:
        io.write_bytes_atomic(readme, specs.with_readme_block(readme.read_text(), block).encode())
        print(readme)
    return 0
