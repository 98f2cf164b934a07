"""Generic figures of estimates: points with their intervals, one row per label; and the one way
a figure is written."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from PIL import Image


def save(fig, path, *, dpi: int = 120, **savefig_kwargs) -> Path:
    """Writes `fig` to `path` and closes it, written or not: a saved figure is finished, and a
    report that draws many never holds them open. A PNG is stored in at most 256 colours: a plot
    looks the same at about a third of the bytes (a transparent one keeps its transparency).
    Other formats (`.pdf`, `.svg`) are written as matplotlib writes them. To show a figure as
    well (a notebook), show it before saving it."""
    path = Path(path)
    try:
        if path.suffix.lower() != ".png":
            fig.savefig(path, dpi=dpi, **savefig_kwargs)
            return path
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=dpi, **savefig_kwargs)
        with Image.open(buffer) as drawn:
            drawn = drawn.convert("RGBA")
            if drawn.getextrema()[3][0] < 255:   # transparent somewhere: a palette with alpha
                stored = drawn.quantize(colors=256, method=Image.Quantize.FASTOCTREE)
            else:
                stored = drawn.convert("RGB").quantize(colors=256)
            stored.save(path, format="PNG", optimize=True)
        return path
    finally:
        plt.close(fig)


def intervals_figure(frame: pd.DataFrame, label: str, point: str = "point", *,
                     panel: str | None = None, xlabel: str = "", order=None,
                     sharex: bool = False):
    """Each row of `frame` as a point with its interval (columns `low`, `high`), labelled by
    `label` (top to bottom in `order`, else as they first appear), one panel per value of
    `panel`, on one x axis when `sharex`; a dotted line at 1. Rows with undefined values are
    drawn as absent."""
    panels = list(dict.fromkeys(frame[panel])) if panel else [None]
    labels = list(dict.fromkeys([*(order or ()), *frame[label]]))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels) + 1.2,
                                                     0.35 * len(labels) + 1.2),
                             sharey=True, sharex=sharex, squeeze=False)
    for ax, name in zip(axes[0], panels):
        part = frame if name is None else frame[frame[panel] == name]
        y = part[label].map({m: i for i, m in enumerate(labels)}).to_numpy()
        p, lo, hi = (part[c].to_numpy(np.float64) for c in (point, "low", "high"))
        ax.errorbar(p, y, xerr=np.abs(np.stack([p - lo, hi - p])), fmt="o", capsize=3)
        ax.axvline(1.0, color="grey", linestyle=":")
        ax.set_title("" if name is None else str(name), fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_yticks(range(len(labels)), labels)
    axes[0][0].invert_yaxis()
    fig.tight_layout()
    return fig
