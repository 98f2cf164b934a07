"""Figures and tables of a lag sweep: aggregates with CIs, IQM vs capacity, curves, diagnostics.

    vaco-plot-sweep --sweep runs/sweeps/cpu        # -> runs/sweeps/cpu/figures
    vaco-plot-sweep --sweep results/archive/cpu --references results/archive/reference_returns.json

Needs the reference returns of the sweep's budget (`vaco-references`,
which writes them into the sweep's directory).
Writes (a) fig_a_aggregates.png, (b) fig_b_iqm_vs_capacity.png, (c) fig_c_training_curves.png,
(d) fig_d_lag_diagnostics.png, (e) fig_e_sensitivity.png (when the delta/ablations studies were
run), fig_improvement.png, fig_profiles.png, and the tables (CSV and summary.md).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import tyro

from vaco_jax.study import presets


@dataclasses.dataclass
class Args:
    sweep: str = str(presets.ROOT / "cpu")
    """Sweep directory (results.jsonl, cells.jsonl)."""
    references: str = ""
    """Reference-returns table (default <sweep>/reference_returns.json)."""
    out: str = ""
    """Where figures and tables go (default <sweep>/figures)."""
    reps: int = 2000
    """Bootstrap replications."""
    seed: int = 0
    note: str = ""
    """Extra label for every title (e.g. 'reduced validation run')."""


def main(argv: list[str] | None = None, prog: str = "vaco-plot-sweep") -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.split("\n\n")[0], prog=prog)
    # The library is imported once the flags are parsed: --help imports no JAX.
    import matplotlib

    matplotlib.use("Agg")
    from vaco_jax.study import references, specs, sweep

    out = Path(args.out or Path(args.sweep) / "figures")
    out.mkdir(parents=True, exist_ok=True)
    table = references.load(args.references or Path(args.sweep) / references.FILE_NAME)
    results = references.add_scores(sweep.load_results(args.sweep), table)
    written = specs.capacity_report(results, out, reps=args.reps, seed=args.seed, note=args.note)
    print("\n".join(str(p) for p in written))
    return 0
