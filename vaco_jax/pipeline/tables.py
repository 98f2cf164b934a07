"""Generic tables, with the one interval formatter every report uses (`analysis.report`'s).

An undefined point (NaN: e.g. a retention whose synchronous score is not above random) reads
"undefined", and an undefined interval "[n/a]": a reader is told a number does not exist, not
shown a dash that could mean "not run"."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from vaco_jax.analysis.paired import POOLED
from vaco_jax.analysis.report import UNDEFINED, interval, intervals, markdown  # noqa: F401


def host(record) -> str:
    """A run record's host in words: its CPU and CPU count (as recorded when not a mapping)."""
    if record is None:
        return "not recorded"
    if isinstance(record, Mapping):
        return f"{record.get('cpu', '?')} ×{record.get('cpus', '?')}"
    return str(record)


def cost(frame: pd.DataFrame, columns: dict[str, str]) -> str:
    """A markdown table of what each method cost: a column per `columns` item (heading: frame
    column), where a `*_seconds` column reads in minutes to one decimal; a column `frame` lacks
    reads "undefined" in every row."""
    def column(name: str) -> list:
        if name not in frame:
            return [UNDEFINED] * len(frame)
        if name.endswith("_seconds"):
            return [f"{v / 60:.1f}" if np.isfinite(v) else UNDEFINED for v in frame[name]]
        return list(frame[name])
    return markdown(pd.DataFrame({heading: column(name) for heading, name in columns.items()}))


def wide(frame: pd.DataFrame, texts: Sequence[str], index: Sequence[str], columns: str,
         order: Sequence[str]) -> str:
    """A markdown table of `texts` (one per row of `frame`): a row per value of the `index` columns
    (in `frame`'s order; the pooled task named "pooled (mean over tasks)"), a column per value of
    `columns`, in `order`; "—" where a row has no text."""
    if frame.empty:
        return "—"
    index = list(index)
    cells = frame.assign(_text=list(texts)).pivot(index=index, columns=columns, values="_text")
    table = frame[index].drop_duplicates().merge(
        cells.reindex(columns=order).fillna("—").reset_index(), on=index, how="left")
    table["task"] = table["task"].replace({POOLED: "pooled (mean over tasks)"})
    return markdown(table.rename(columns=str))
