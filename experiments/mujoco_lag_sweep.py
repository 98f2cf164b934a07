"""The paper's MuJoCo lag sweep (SPEC §7): algorithms × buffer capacities × envs × seeds.

    python -m experiments.mujoco_lag_sweep --preset cpu                     # ~45 min, 2 CPU cores
    python -m experiments.mujoco_lag_sweep --preset cpu --studies delta ablations
    python -m experiments.mujoco_lag_sweep --preset paper --out results/paper  # an accelerator
    python -m experiments.mujoco_lag_sweep --preset smoke --out /tmp/smoke  # minutes: pipeline check

Each (env, algorithm, variant) is one compiled program that vmaps every capacity × δ × seed.
Results go to `--out` (default `results/<preset>`) as a tidy table, written cell by cell; running
the same command again resumes (finished cells are skipped). `--dry-run` prints the plan.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import tyro

from vaco_jax import sweep
from vaco_jax.config import ConfigError


@dataclasses.dataclass
class Args:
    preset: str = "cpu"
    """Scale: tiny, smoke, cpu or paper (see vaco_jax.sweep.PRESETS)."""
    studies: tuple[str, ...] = ("main",)
    """main (5 algorithms), delta (VACO δ sensitivity), ablations (pairings and filter switches)."""
    out: str = ""
    """Output directory (default results/<preset>)."""
    algos: tuple[str, ...] | None = None
    """Run only these algorithms of the studies."""
    envs: tuple[str, ...] | None = None
    """Override the preset's envs."""
    capacities: tuple[int, ...] | None = None
    """Override the preset's capacities."""
    num_seeds: int | None = None
    """Override the preset's number of seeds."""
    total_steps: int | None = None
    """Override the env steps per run (every env)."""
    runs_per_call: int | None = None
    """Split each cell into programs of at most this many runs (memory)."""
    max_cells: int | None = None
    """Stop after this many cells (resume later with the same command)."""
    dry_run: bool = False
    """Print the plan and exit."""
    progress: bool = True


def preset_from(args) -> sweep.Preset:
    if args.preset not in sweep.PRESETS:
        raise ConfigError(f"unknown preset {args.preset!r}; allowed values are {list(sweep.PRESETS)}")
    overrides = {k: getattr(args, k) for k in
                 ("envs", "capacities", "num_seeds", "total_steps", "runs_per_call")
                 if getattr(args, k, None) is not None}
    return sweep.PRESETS[args.preset].with_overrides(**overrides)


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.split("\n\n")[0])
    try:
        preset = preset_from(args)
        cells = sweep.plan(preset, args.studies, args.algos)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = Path(args.out or f"results/{args.preset}")
    if args.dry_run:
        total = 0
        for cell in cells:
            steps = cell.config.env_steps * len(cell.runs)
            total += steps
            print(f"{cell.cell_id}: {len(cell.runs)} runs × {cell.config.env_steps:,} steps = {steps:,}")
        print(f"{len(cells)} cells, {total:,} env steps in all -> {out}")
        return 0
    sweep.run_sweep(cells, out, preset=preset, max_cells=args.max_cells, progress=args.progress)
    return 0


if __name__ == "__main__":
    sys.exit(main())
