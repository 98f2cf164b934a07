"""The lag diagnostics of `vaco-train` runs, side by side (docs/diagnostics.md).

    vaco-plot-diagnostics runs/ip_vaco_c8 runs/ip_ppo_clip_c8 --out docs/diagnostics.png

Each run directory holds `config.json` and `metrics.jsonl`; each run is labelled by its algorithm.
Panels: the update-age histogram, `tv_backward` and `tv_forward` over training, the objective's
`intervened_fraction` (and `ratio_clip_fraction`), and the evaluation return, means over seeds.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import tyro


@dataclasses.dataclass
class Args:
    runs: Annotated[list[str], tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]
    """Run directories (written by `vaco-train`)."""
    out: str
    """The figure's path (PNG)."""
    title: str = ""
    """The figure's title (default: env, capacity, snapshot sampling and seeds)."""


def plot(runs, out, title: str = "") -> Path:
    """Draw the runs' lag diagnostics into `out` (PNG), each run labelled by its algorithm."""
    from vaco_jax import io
    from vaco_jax.pipeline import figures
    from vaco_jax.study import plotting

    curves, configs = {}, []
    for run_dir in map(Path, runs):
        config = json.loads((run_dir / "config.json").read_text())["config"]
        curves[config["algo"]] = io.read_rows(run_dir / "metrics.jsonl")
        configs.append(config)
    c = configs[0]
    title = title or (f"{c['env']}, C = {c['capacity']} ({c['snapshot_sampling']} snapshots), "
                      f"K = {c['num_epochs']} epochs × M = {c['num_minibatches']} minibatches, "
                      f"{c['num_seeds']} seeds")
    fig = plotting.run_diagnostics(curves, title=title)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figures.save(fig, out, dpi=110)
    return out


def main(argv: list[str] | None = None, prog: str = "vaco-plot-diagnostics") -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.split("\n\n")[0], prog=prog)
    if not args.runs:
        raise SystemExit("error: give at least one run directory (written by vaco-train)")
    print(f"wrote {plot(args.runs, args.out, args.title)}")
    return 0
