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
    from vaco_jax.study import references, sweep

    out = Path(args.out or Path(args.sweep) / "figures")
    out.mkdir(parents=True, exist_ok=True)
    table = references.load(args.references or Path(args.sweep) / references.FILE_NAME)
    results = references.add_scores(sweep.load_results(args.sweep), table)
    written = report(results, out, reps=args.reps, seed=args.seed, note=args.note)
    print("\n".join(str(p) for p in written))
    return 0


def report(results, out: Path, *, reps: int = 2000, seed: int = 0, note: str = "") -> list[Path]:
    """Every figure and table of the studies present in `results` (which has a `score` column)."""
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np

    from vaco_jax.study import capacity as capacity_sweeps, plotting

    written = []

    def save(fig, name):
        fig.savefig(out / name, dpi=120)
        written.append(out / name)

    def table(frame, name):
        frame.to_csv(out / name, index=False)
        written.append(out / name)

    main_rows = capacity_sweeps.main_study(results)
    label = capacity_sweeps.describe(main_rows) + (f" — {note}" if note else "")
    final = capacity_sweeps.aggregate_table(main_rows, reps=reps, seed=seed)
    auc = capacity_sweeps.aggregate_table(main_rows, auc=True, reps=reps, seed=seed)
    table(final, "aggregate_final.csv")
    table(auc, "aggregate_auc.csv")
    save(plotting.aggregate_intervals(final, title=f"Final normalised score\n({label})"),
         "fig_a_aggregates.png")
    save(plotting.metric_vs_capacity(final, title=f"Normalised IQM vs capacity\n({label})"),
         "fig_b_iqm_vs_capacity.png")
    save(plotting.training_curves(main_rows, title=f"Training curves, IQM over seeds with 95% CIs\n({label})"),
         "fig_c_training_curves.png")
    save(plotting.lag_diagnostics(main_rows, title=f"Lag diagnostics\n({label})"),
         "fig_d_lag_diagnostics.png")
    lines = [f"# Lag sweep: {label}", "", "Scores normalised per env: (R − R_random) / "
             "(R_ppo_sync − R_random); stratified bootstrap 95% CIs "
             f"({reps} replications).", "", "## Final score", "", capacity_sweeps.markdown(final), "",
             "## Sample efficiency (normalised area under the curve)", "", capacity_sweeps.markdown(auc)]
    if "vaco" in set(main_rows["method"]):
        improvement = capacity_sweeps.improvement_table(main_rows, "vaco", reps=reps, seed=seed)
        table(improvement, "improvement.csv")
        save(plotting.improvement(improvement, title=f"P(VACO > baseline), 95% CIs\n({label})"),
             "fig_improvement.png")
        lines += ["", "## Probability of improvement, P(VACO > baseline)", "",
                  "| C | baseline | P | 95% CI |", "|---|---|---|---|"]
        lines += [f"| {r.capacity} | {r.baseline} | {r.point:.2f} | [{r.low:.2f}, {r.high:.2f}] |"
                  for r in improvement.itertuples()]
    taus = np.linspace(-0.5, 2.0, 51)
    capacity = int(main_rows["capacity"].max())
    save(plotting.performance_profiles(capacity_sweeps.profiles(main_rows, capacity, taus, reps=reps // 2,
                                                         seed=seed), taus,
                                       title=f"Performance profiles, C = {capacity}\n({label})"),
         "fig_profiles.png")

    delta_rows, ablation_rows = capacity_sweeps.delta_study(results), capacity_sweeps.ablation_study(results)
    has_delta = delta_rows["delta"].nunique() > 1
    has_ablations = (ablation_rows["study"] == "ablations").any()
    if has_delta or has_ablations:
        delta_table = capacity_sweeps.aggregate_table(delta_rows, reps=reps, seed=seed) if has_delta else None
        ablation_table = (capacity_sweeps.aggregate_table(ablation_rows, reps=reps, seed=seed)
                          if has_ablations else None)
        for name, frame in (("aggregate_delta.csv", delta_table),
                            ("aggregate_ablations.csv", ablation_table)):
            if frame is not None:
                table(frame, name)
                lines += ["", f"## {name[10:-4].capitalize()}", "", capacity_sweeps.markdown(frame)]
        save(plotting.sensitivity(delta_table, ablation_table, title=f"δ sensitivity and ablations (normalised IQM)\n({label})"),
             "fig_e_sensitivity.png")
    diverged = capacity_sweeps.diverged_runs(results)
    if len(diverged):
        lines += ["", "## Diverged runs (scored 0, as failures, in every statistic; left out of "
                  "the return curves)", "", capacity_sweeps.markdown_rows(diverged)]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    written.append(out / "summary.md")
    return written

