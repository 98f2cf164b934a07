"""Training curves of `vaco-train` runs, side by side.

    vaco-plot-runs runs/hopper_vaco runs/hopper_ppo_clip --out docs/hopper.png

Each run directory holds `config.json` and `metrics.jsonl` (one row per evaluation, one value per
seed). The figure shows the IQM over seeds with a 95% bootstrap CI per algorithm (one panel per
env × capacity, as the sweep's training-curve plot); the printed table gives each run's final
evaluation return per seed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import tyro

if TYPE_CHECKING:
    import pandas as pd


def load_run(run_dir) -> pd.DataFrame:
    """A run's evaluations as a tidy table: env, algo, method, capacity, seed, step, eval_return."""
    import pandas as pd

    from vaco_jax import io

    run_dir = Path(run_dir)
    config = json.loads((run_dir / "config.json").read_text())["config"]
    rows = []
    network = config.get("network", "mlp")   # named when not the default
    method = config["algo"] if network == "mlp" else f"{config['algo']} ({network})"
    for row in io.read_rows(run_dir / "metrics.jsonl"):
        for i, value in enumerate(row["eval_return"]):
            rows.append({"env": config["env"], "algo": config["algo"], "method": method,
                         "capacity": config["capacity"], "seed": config["seed"] + i,
                         "step": row["step"], "eval_return": value})
    if not rows:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} has no evaluations")
    return pd.DataFrame(rows)


def final_table(results: pd.DataFrame) -> pd.DataFrame:
    """Per (env, algo, method, capacity): the last evaluation's step, per-seed returns, mean and
    range (the method is the algorithm, and the network when not the default MLP)."""
    keys = ["env", "algo", "method", "capacity"]
    last = results[results["step"] == results.groupby(keys)["step"].transform("max")]
    return (last.groupby(keys)
            .agg(step=("step", "max"), seeds=("seed", "count"), mean=("eval_return", "mean"),
                 min=("eval_return", "min"), max=("eval_return", "max"),
                 per_seed=("eval_return", lambda v: [round(float(x), 1) for x in v]))
            .reset_index())


@dataclasses.dataclass
class Args:
    runs: Annotated[list[str], tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]
    """Run directories (written by `vaco-train`)."""
    out: str
    """The figure's path (PNG)."""
    title: str = ""
    """The figure's title (default: the envs, the statistic and the number of seeds)."""


def plot(runs, out, title: str = "") -> pd.DataFrame:
    """Draw the runs' curves into `out` (PNG); returns the final-return table (`final_table`)."""
    import pandas as pd

    from vaco_jax.pipeline import figures
    from vaco_jax.study import plotting

    results = pd.concat([load_run(run) for run in runs], ignore_index=True)
    table = final_table(results)
    seeds = results.groupby("method")["seed"].nunique().min()
    title = title or (f"{', '.join(sorted(results['env'].unique()))}: eval return, IQM over "
                      f"{seeds} seeds, 95% CIs")
    fig = plotting.training_curves(results, title=title)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figures.save(fig, out, dpi=110)
    return table


def main(argv: list[str] | None = None, prog: str = "vaco-plot-runs") -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.split("\n\n")[0], prog=prog)
    if not args.runs:
        raise SystemExit("error: give at least one run directory (written by vaco-train)")
    table = plot(args.runs, args.out, args.title)
    print(table.to_string(index=False))
    print(f"wrote {args.out}")
    return 0
