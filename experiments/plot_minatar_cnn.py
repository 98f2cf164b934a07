"""The MinAtar CNN-vs-MLP figure (docs/minatar_cnn_vs_mlp.png) from results/minatar-cnn.

    python -m experiments.plot_minatar_cnn

One panel per setting of Breakout-MinAtar (normalised observations, the default; raw; normalised for
three times the steps, the pre-registered comparison of `results/minatar-cnn/long`) and one for
SpaceInvaders-MinAtar (pre-registered, `results/minatar-cnn/space-invaders`); in each, the mean
evaluation return over seeds of the MLP and the CNN run, with every seed as a thin line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from vaco_jax.commands.plot_runs import load_run  # noqa: E402
from vaco_jax.pipeline import figures  # noqa: E402

# The committed results and figure of this checkout, wherever the command runs from.
REPOSITORY = Path(__file__).resolve().parent.parent
RESULTS = REPOSITORY / "results" / "minatar-cnn"
FIGURE = REPOSITORY / "docs" / "minatar_cnn_vs_mlp.png"
PANELS = {"normalized": "Breakout: normalised observations\n(default), 3 seeds",
          "raw": "Breakout: raw observations, 3 seeds",
          "long": "Breakout: normalised, 3x the steps,\n5 seeds (pre-registered)",
          "space-invaders": "SpaceInvaders: normalised, 5 seeds\n(pre-registered)"}
COLORS = {"mlp": "tab:blue", "cnn": "tab:orange"}


def draw(out: str | Path = FIGURE) -> None:
    fig, axes = plt.subplots(1, len(PANELS), figsize=(18, 4.2))
    for ax, (setting, title) in zip(axes, PANELS.items()):
        for network, color in COLORS.items():
            runs = load_run(RESULTS / setting / network)
            wide = runs.pivot(index="step", columns="seed", values="eval_return")
            for seed in wide:
                ax.plot(wide.index, wide[seed], color=color, alpha=0.3, linewidth=0.8)
            ax.plot(wide.index, wide.mean(axis=1), color=color, linewidth=2,
                    label=f"{network}: mean (thick), each seed (thin)")
        ax.set_title(title)
        ax.set_xlabel("env steps per seed")
        ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1000:.0f}k")
        ax.grid(alpha=0.3)
        ax.set_ylabel("eval return")
    axes[0].legend(loc="lower right")
    fig.suptitle("gymnax MinAtar (Breakout, SpaceInvaders), VACO (synchronous): CNN vs flattened MLP")
    fig.tight_layout()
    figures.save(fig, out, dpi=110)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m experiments.plot_minatar_cnn",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(FIGURE), help="the figure's path (default: the "
                        "checkout's docs/minatar_cnn_vs_mlp.png)")
    draw(parser.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
