"""An estimates table (`estimands.ESTIMATES`) as estimates.csv and as report.md; headline rows
picked by their key (study, estimand, metric, method, setting, and the task), never by reading a
rendered report. The one interval formatter: an undefined point (NaN) reads "undefined", an
undefined interval "[n/a]" (a number that does not exist, not a dash that could mean "not run")."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from vaco_jax.analysis.estimands import ESTIMATES, POOLED

UNDEFINED = "undefined"
KEY = ("study", "estimand", "metric", "method", "setting")
TEXT = ("study", "estimand", "metric", "method", "baseline", "task", "setting", "verdict")


def interval(point, low, high, digits: int = 2, sign: bool = False) -> str:
    """"0.50 [0.41, 0.62]"; "undefined" for a NaN point, "0.50 [n/a]" for a NaN interval."""
    if point is None or not np.isfinite(point):
        return UNDEFINED
    form = f"{{:{'+' if sign else ''}.{digits}f}}"
    if not (np.isfinite(low) and np.isfinite(high)):
        return f"{form.format(point)} [n/a]"
    return f"{form.format(point)} [{form.format(low)}, {form.format(high)}]"


def intervals(frame: pd.DataFrame, point: str, low: str = "low", high: str = "high",
              digits: int = 2, sign: bool = False) -> list[str]:
    """`interval` of every row of `frame`."""
    return [interval(p, lo, hi, digits, sign)
            for p, lo, hi in zip(frame[point], frame[low], frame[high])]


def _cell(value, digits: int) -> str:
    if isinstance(value, (float, np.floating)):
        return UNDEFINED if not np.isfinite(value) else f"{value:.{digits}g}" if (
            abs(value) < 1e-3 and value != 0) else f"{value:.{digits}f}"
    return str(value)


def markdown(frame: pd.DataFrame, columns: Sequence[str] | None = None, digits: int = 3) -> str:
    """A GitHub markdown table of `frame`'s `columns` (default: all); floats at `digits`."""
    columns = list(columns or frame.columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(v, digits) for v in row) + " |"
              for row in frame[columns].itertuples(index=False)]
    return "\n".join(lines)


def write_csv(estimates: pd.DataFrame, path: str | Path) -> Path:
    """estimates.csv: `ESTIMATES`' columns in order, floats at full precision."""
    estimates[list(ESTIMATES)].to_csv(path, index=False)
    return Path(path)


def read_csv(path: str | Path) -> pd.DataFrame:
    """An estimates.csv back: text columns as text ("" where empty), the others as numbers."""
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    for column in set(ESTIMATES) - set(TEXT):
        frame[column] = frame[column].replace("", "nan").astype(np.float64)
    return frame.astype({"seeds": np.int64})


def headline(estimates: pd.DataFrame, task: str = POOLED, **key) -> pd.Series:
    """The one row of `estimates` whose `KEY` columns (and task) equal `key`'s; a KeyError naming
    the key when none or several do."""
    chosen = estimates
    for column, value in {**key, "task": task}.items():
        chosen = chosen[chosen[column] == value]
    if len(chosen) != 1:
        raise KeyError(f"{len(chosen)} estimates rows match {dict(key, task=task)}; a headline "
                       f"names exactly one (key: {', '.join(KEY)}, task)")
    return chosen.iloc[0]


def render(estimates: pd.DataFrame, title: str, digits: int = 2) -> str:
    """report.md: the title, then one section per estimand and metric (in the table's order),
    each a table of its rows: method, baseline, task, setting, estimate [95% CI], seeds, and
    Holm's p and the verdict where the section has them."""
    lines = [f"# {title}", ""]
    for (estimand, metric), part in estimates.groupby(["estimand", "metric"], sort=False):
        shown = part.assign(**{"estimate [95% CI]": intervals(part, "point", digits=digits)})
        columns = [c for c in ("method", "baseline", "task", "setting") if (part[c] != "").any()]
        columns += ["estimate [95% CI]", "seeds"]
        columns += [c for c in ("p", "p_holm") if part[c].notna().any()]
        columns += ["verdict"] if (part["verdict"] != "").any() else []
        lines += [f"## {estimand} of {metric}", "", markdown(shown, columns, digits + 1), ""]
    return "\n".join(lines)
