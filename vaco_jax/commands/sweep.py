"""The paper's MuJoCo lag sweep (SPEC §7): algorithms × buffer capacities × envs × seeds.

    vaco-sweep --preset cpu                     # ~45 min, 2 CPU cores
    vaco-sweep --preset cpu --studies delta ablations
    vaco-sweep --preset paper                   # an accelerator
    vaco-sweep --preset cpu-dmc                 # DM Control, 2 CPU cores
    vaco-sweep --preset smoke --out /tmp/smoke  # minutes: pipeline check
    vaco-sweep --preset lag-cpu --envs dmc:CartpoleSwingup  # constant lag
    vaco-sweep --preset lag-cpu --lag-profile docs/lag_profiles/example.json  # your system's lag

Each (env, algorithm, variant) is one compiled program that vmaps every capacity × δ × seed and
spreads them over every device of every process (`vaco_jax.program`; multi-host with
`--distributed`, see `vaco_jax.runtime`). Results go to `--out` (default `runs/sweeps/<preset>`)
as a tidy table, written cell by cell by process 0; running the same command again resumes
(finished cells are skipped). `--plan` prints the plan; `--dry-run` compiles every program ahead
of time and prints its per-device memory, choosing `--runs-per-call` when a cell does not fit the
device (`--device-memory`). `--logger tensorboard wandb` also logs every run of a cell, per
(capacity, δ, seed), as the cell runs (`vaco_jax.loggers`).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Annotated, Literal

import tyro

from vaco_jax.config import read_lag_profile
from vaco_jax.errors import CheckpointError, ConfigError, SweepError, invalid_option
from vaco_jax.options import Cluster, LoggerOptions, validate_logging
from vaco_jax.study import presets


PresetName = Literal[tuple(presets.PRESETS)]
StudyName = Literal[tuple(presets.STUDIES)]


@dataclasses.dataclass
class Args:
    preset: PresetName = "cpu"
    """Scale (vaco_jax.study.presets.PRESETS): tiny and smoke check the pipeline, cpu is the
    2-core CPU study, hopper-1m hopper at 1M steps, paper the paper's scale for accelerators;
    cpu-dmc (DM Control's cartpole tasks on a CPU) and paper-dmc (every DM Control task at MuJoCo
    Playground's PPO settings, for accelerators) need the dmc extra; lag-cpu (4 tasks, hours on
    a CPU; dmc extra), lag-gpu (hopper and inverted_double_pendulum at the paper's shapes, one GPU)
    and lag-tiny (tests) run the controlled-lag study."""
    studies: tuple[StudyName, ...] | None = None
    """main (5 algorithms vs capacity), delta (VACO δ sensitivity), ablations (pairings and filter
    switches), lag (every method vs a constant lag k = C − 1, and uniform C = 16). Default: the
    preset's (lag for the lag-* presets, main otherwise)."""
    out: str = ""
    """Output directory (default runs/sweeps/<preset>)."""
    algos: tuple[str, ...] | None = None
    """Run only these algorithms of the studies (default: the preset's, else all)."""
    envs: tuple[str, ...] | None = None
    """Override the preset's envs."""
    capacities: tuple[int, ...] | None = None
    """Override the preset's capacities."""
    lag_profile: str = ""
    """A lag profile, a JSON file {"probabilities": [p_0, ..., p_{C-1}]} (e.g.
    docs/lag_profiles/example.json): every method of the studies acts with it instead of its
    snapshot sampling and the capacities (variant `profile`; default --out
    runs/sweeps/<preset>-profile)."""
    num_seeds: int | None = None
    """Override the preset's number of seeds (on every env)."""
    seed: int | None = None
    """Override the preset's first seed."""
    total_steps: int | None = None
    """Override the env steps per run (every env)."""
    runs_per_call: int | None = None
    """Split each cell into programs of at most this many runs (memory)."""
    allow_code_change: bool = False
    """Add to a directory whose cells were made by other code (normally refused)."""
    max_cells: int | None = None
    """Stop after this many cells (resume later with the same command)."""
    shard: str = ""
    """i/n: this process takes cells i, i + n, i + 2n, ... of the plan, so n processes (a job
    array, or processes on machines sharing a file system) fill one --out directory together.
    slurm: this SLURM job array task's (SLURM_ARRAY_TASK_ID of SLURM_ARRAY_TASK_COUNT). Unset:
    every cell. Any processes may share a directory: a cell runs in one process at a time."""
    plan: bool = False
    """Print the plan (cells, runs, env steps) and exit; instant, nothing is compiled."""
    dry_run: bool = False
    """Compile every program ahead of time, print the plan with each program's per-device memory,
    and exit without training or writing."""
    device_memory: float = 0.0
    """GB of memory per device to plan for in a dry run (0: what the device reports; the CPU
    reports none). Cells that do not fit are split (--runs-per-call) until they do."""
    compact: tuple[str, ...] = ()
    """Compact the result tables under these directories and exit: the rows of each results.jsonl
    (a sweep's, a benchmark's, an LLM sweep's), and of a results.jsonl.gz earlier versions wrote,
    move to results.parquet: Parquet, every value exactly as written, read by the reports and by
    resuming as before. For a finished directory, or one only sweeps write to (they wait on its
    lock)."""
    progress: bool = True
    """Show a progress bar per cell (on a terminal or in a notebook; a line per cell in logs)."""
    compile_cache: str = "default"
    """JAX's persistent compilation cache: default (off if VACO_JAX_COMPILE_CACHE=off; else
    JAX_COMPILATION_CACHE_DIR, else the per-user cache), off, or a directory."""
    verbose: bool = False
    """Show the libraries' own log messages (absl, orbax, jax)."""
    logging: Annotated[LoggerOptions, tyro.conf.OmitArgPrefixes,
                       tyro.conf.arg(prefix_name=False)] = LoggerOptions()
    """Where each run's metrics also go as its cell runs: one logged run per (capacity, δ, seed)
    of a cell (`vaco_jax.loggers`)."""
    cluster: Annotated[Cluster, tyro.conf.OmitArgPrefixes] = Cluster()


def dry_run(args, preset: presets.Preset, out: Path, lag_profile=()) -> None:
    """Compile every program (nothing runs) and print its placement and per-device memory. When
    one does not fit the device memory, halve the runs per program (a multiple of the device count)
    and plan again, until every program fits or holds one run per device."""
    import jax

    from vaco_jax import program
    from vaco_jax.study import sweep

    limit = args.device_memory * 1e9 if args.device_memory else program.device_memory_bytes()
    print(f"planning for {limit / 1e9:.1f} GB per device" if limit else
          "device memory unknown (the CPU reports none): pass --device-memory GB to plan for an "
          "accelerator")
    devices = jax.device_count()
    while True:
        cells = sweep.plan(preset, args.studies, args.algos, lag_profile)
        reports = [sweep.dry_run_cell(cell, limit) for cell in cells]
        largest = max(len(cell.runs) for cell in cells)
        if all(r["fits"] is not False for r in reports) or largest <= devices:
            break
        per_call = max(devices, -(-largest // 2 // devices) * devices)
        print(f"{largest} runs per program do not fit: trying --runs-per-call {per_call}")
        preset = preset.with_overrides(runs_per_call=per_call)
    fits = {None: "", True: ", fits", False: ", does NOT fit even at one run per device"}
    for cell, report in zip(cells, reports):
        print(f"{cell.cell_id}: {len(cell.runs)} runs × {cell.config.env_steps:,} steps "
              f"({report['devices']}), compile {report['compile_seconds']:.0f} s, per device "
              f"{program.describe_memory(report['memory_per_device'])}{fits[report['fits']]}")
    total = sum(cell.config.env_steps * len(cell.runs) for cell in cells)
    per_call = f", --runs-per-call {preset.runs_per_call}" if preset.runs_per_call else ""
    print(f"{len(cells)} programs{per_call}, {total:,} env steps in all -> {out}")


def compact(directories) -> int:
    """`--compact`: every results.jsonl (or earlier versions' results.jsonl.gz) under
    `directories` into results.parquet."""
    from vaco_jax import io
    from vaco_jax.study import sweep

    missing = [d for d in directories if not Path(d).is_dir()]
    if missing:
        error = invalid_option("--compact", missing[0], "must be a directory (of results.jsonl "
                                                         "files, at any depth)")
        print(f"error: {error}", file=sys.stderr)
        return 2
    names = (sweep.RESULTS, io.legacy_path(Path(sweep.RESULTS)).name)
    tables = sorted({path.parent for d in directories for name in names
                     for path in Path(d).rglob(name)})
    for directory in tables:
        size = sum(p.stat().st_size for p in map(directory.joinpath, names) if p.exists())
        rows = sweep.compact(directory)
        packed = io.compact_path(directory / sweep.RESULTS)
        print(f"{directory}: {rows} rows ({size / 1e6:.1f} MB) -> {packed.name} "
              f"({packed.stat().st_size / 1e6 if packed.exists() else 0:.1f} MB)")
    if not tables:
        print(f"nothing to compact: no {sweep.RESULTS} under {', '.join(directories)}")
    return 0


def interrupted(out: Path, prog: str, argv: list[str]) -> str:
    """The one line a sweep or benchmark stopped by Ctrl-C prints: what it kept, how to resume."""
    import shlex

    return (f"interrupted: the finished cells are kept in {out} (a cell part-way keeps its last "
            f"checkpoint); resume with the same command: {shlex.join([prog, *argv])}")


def main(argv: list[str] | None = None, prog: str = "vaco-sweep") -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.split("\n\n")[0], prog=prog)
    # The library is imported once the flags are parsed: --help imports no JAX.
    from vaco_jax import runtime
    from vaco_jax.study import sweep

    if args.compact:
        return compact(args.compact)

    try:
        validate_logging(args.logging)
        runtime.start(args.cluster, compile_cache=args.compile_cache, verbose=args.verbose)
        preset = presets.preset(args.preset, envs=args.envs, capacities=args.capacities,
                              num_seeds=args.num_seeds, seed=args.seed, total_steps=args.total_steps,
                              runs_per_call=args.runs_per_call)
        lag_profile = read_lag_profile(args.lag_profile) if args.lag_profile else ()
        if lag_profile and args.capacities:
            raise ConfigError("option `capacities` is invalid with --lag-profile: the profile's "
                              "length is the capacity; leave --capacities out")
        cells = sweep.plan(preset, args.studies, args.algos, lag_profile)
        shard = sweep.shard_option(args.shard)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = (Path(args.out) if args.out else
           presets.ROOT / (args.preset + ("-profile" if lag_profile else "")))
    if args.plan:
        total = 0
        for cell in cells:
            steps = cell.config.env_steps * len(cell.runs)
            total += steps
            print(f"{cell.cell_id}: {len(cell.runs)} runs × {cell.config.env_steps:,} steps = {steps:,}")
        print(f"{len(cells)} cells, {total:,} env steps in all -> {out}")
        return 0
    if args.dry_run:
        dry_run(args, preset, out, lag_profile)
        return 0
    try:
        sweep.run_sweep(cells, out, preset=preset, max_cells=args.max_cells, progress=args.progress,
                        allow_code_change=args.allow_code_change, logging=args.logging,
                        shard=shard)
    except KeyboardInterrupt:
        print(interrupted(out, prog, sys.argv[1:] if argv is None else argv), file=sys.stderr)
        return 130
    except (SweepError, CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0

