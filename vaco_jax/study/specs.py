"""Studies as data: each study a short declarative spec, run by one generic report.

A `TwoArms` study compares two arms' final returns (the last evaluation, per seed) with Welch's t
(its pre-registered test), and reports each arm's mean return over the curve (the area under it
÷ the steps it spans) and its throughput as exploratory."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from vaco_jax import io
from vaco_jax.pipeline import estimates

ROOT = Path(io.__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class TwoArms:
    directory: str
    """Relative to the repository: one sub-directory per arm (metrics.jsonl, summary.json)."""
    arms: tuple[str, str]
    """(baseline, treatment): the primary estimate is treatment − baseline."""
    verdicts: tuple[str, str, str]
    """In words: the treatment higher, the baseline higher, neither shown."""
    confidence: float = 0.95


MINATAR = ("mlp", "cnn"), ("the CNN learns more than the MLP at this budget",
                           "the MLP learns more at this budget",
                           "no difference shown at this budget")
STUDIES = {
    "minatar-long": TwoArms("results/minatar-cnn/long", *MINATAR),
    "minatar-space-invaders": TwoArms("results/minatar-cnn/space-invaders", *MINATAR),
}


def _curves(directory: Path, arm: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps [evals], returns [seeds, evals]) of one arm."""
    rows = io.read_rows(directory / arm / "metrics.jsonl")
    return np.array([r["step"] for r in rows]), np.array([r["eval_return"] for r in rows]).T


def two_arms(spec: TwoArms, root: Path = ROOT) -> str:
    """The study's report, in lines."""
    directory = root / spec.directory
    (base, treated), curves = spec.arms, {arm: _curves(directory, arm) for arm in spec.arms}
    steps = curves[base][0]
    final = {arm: c[:, -1] for arm, (_, c) in curves.items()}
    difference, low, high, p = estimates.welch_difference(final[treated], final[base],
                                                          spec.confidence)
    verdict = spec.verdicts[0 if low > 0 else 1 if high < 0 else 2]
    lines = [f"final return at {steps[-1]:,} steps, per seed: " + ", ".join(
                 f"{arm} {final[arm].round(2).tolist()} (mean {final[arm].mean():.2f})"
                 for arm in spec.arms),
             f"primary: {treated} - {base} = {difference:+.2f}, "
             f"{spec.confidence:.0%} Welch interval [{low:+.2f}, {high:+.2f}] (p = {p:.3f}): "
             f"{verdict}"]
    auc = {arm: np.trapezoid(c, s, axis=1) / (s[-1] - s[0]) for arm, (s, c) in curves.items()}
    lines.append("exploratory: mean return over the curve (area / steps): " + ", ".join(
        f"{arm} {auc[arm].mean():.2f}" for arm in spec.arms))
    for arm in spec.arms:
        summary = json.loads((directory / arm / "summary.json").read_text())
        lines.append(f"exploratory: {arm} {summary['sps']:,.0f} env steps/s (all seeds together)")
    return "\n".join(lines)
