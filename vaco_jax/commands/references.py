"""Reference returns for score normalisation: per env, a random policy and synchronous PPO-Clip.

    vaco-references --preset cpu   # -> runs/sweeps/cpu/reference_returns.json

Measured at the preset's budget and shapes (PPO-Clip with C = 1, seeds 10000+, disjoint from the
sweep's); the table keeps one entry per (env, budget) with its provenance. Use the same
`--total-steps`/`--envs` overrides as the sweep they normalise.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Literal

import tyro

from vaco_jax.errors import ConfigError
from vaco_jax.study import presets


PresetName = Literal[tuple(presets.PRESETS)]


@dataclasses.dataclass
class Args:
    preset: PresetName = "cpu"
    """The sweep's scale to measure references for (`vaco_jax.study.presets.PRESETS`)."""
    envs: tuple[str, ...] | None = None
    """Override the preset's envs (as the sweep's --envs)."""
    total_steps: int | None = None
    """Override the env steps per run (as the sweep's --total-steps)."""
    num_seeds: int = 5
    """PPO-Clip seeds."""
    random_episodes: int = 64
    """Episodes of the random policy per env."""
    last_evals: int = 1
    """Average each PPO-Clip seed's last this many evaluations (3 for the lag study)."""
    out: str = ""
    """The table to update (default: next to the preset's sweep,
    runs/sweeps/<preset>/reference_returns.json)."""
    compile_cache: str = "default"
    """JAX's persistent compilation cache: default (off if VACO_JAX_COMPILE_CACHE=off; else
    JAX_COMPILATION_CACHE_DIR, else the per-user cache), off, or a directory."""
    verbose: bool = False
    """Show the libraries' own log messages (absl, orbax, jax)."""


def main(argv: list[str] | None = None, prog: str = "vaco-references") -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.split("\n\n")[0], prog=prog)
    # The library is imported once the flags are parsed: --help imports no JAX.
    from vaco_jax import runtime
    from vaco_jax.study import references

    try:
        # Multi-process when launched so by SLURM or Open MPI.
        runtime.start(compile_cache=args.compile_cache, verbose=args.verbose)
        preset = presets.preset(args.preset, envs=args.envs, total_steps=args.total_steps)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = args.out or str(presets.ROOT / args.preset / references.FILE_NAME)
    for env in preset.envs:
        entry = references.measure(preset, env, num_seeds=args.num_seeds,
                                   random_episodes=args.random_episodes, last_evals=args.last_evals)
        if runtime.is_primary():
            references.update(out, entry)   # one env at a time: a crash keeps what is measured
    print(f"-> {out}")
    return 0

