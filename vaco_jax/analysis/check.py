"""Whether a committed generated file still says what its regeneration says: one rule for every
file. Numbers match within a relative `REL_TOL` or an absolute `ABS_TOL` (full-precision floats'
last digits move between machines and library versions; a number printed at two decimals matches
only itself: `+0.05` and `0.05` are the same, `0.05` and `0.06` are not); all other text matches
exactly (a verdict is words). A CSV file is compared cell by cell, any other text file line by
line, split into words and numbers. Figures are not compared. `check_files` compares
regenerations held in memory and names each file and its first differing value."""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Mapping
from pathlib import Path

REL_TOL = 1e-9
"""Relative tolerance of full-precision CSV floats."""
ABS_TOL = 1e-10
"""Absolute tolerance of CSV floats: near 0, and where a table is made from a JSON summary that
keeps 10 decimals (a scorecard's)."""
NUMBER = re.compile(r"(?<![\w.])[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?!\w|\.\d)")
"""A number as reports print it: signed (ASCII or Unicode minus), thousands separated, decimal or
exponent; not a run of digits inside a word (a commit hash, `fig_a`, `k=15`'s name)."""
FIGURES = (".png", ".pdf", ".svg")


def _number(text: str) -> float | None:
    try:
        return float(text.replace("−", "-").replace(",", ""))
    except ValueError:
        return None


def _same_cell(a: str, b: str) -> bool:
    if a == b:
        return True
    x, y = _number(a), _number(b)
    if x is None or y is None:
        return False
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return math.isclose(x, y, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def csv_difference(committed: str, made: str) -> str | None:
    """The first difference between two CSV texts (None: the same numbers and words)."""
    old, new = (list(csv.reader(io.StringIO(t))) for t in (committed, made))
    if len(old) != len(new):
        return f"{len(old) - 1} rows committed, {len(new) - 1} made"
    for i, (a, b) in enumerate(zip(old, new)):
        if len(a) != len(b):
            return f"row {i}: {len(a)} cells committed, {len(b)} made"
        header = old[0] if i else None
        for j, (x, y) in enumerate(zip(a, b)):
            if not _same_cell(x, y):
                where = f"row {i}, column {header[j]!r}" if header and j < len(header) else \
                    f"row {i}, cell {j}"
                return f"{where}: {x!r} committed, {y!r} made"
    return None


def _tokens(text: str) -> tuple[list[str], list[str]]:
    """(the words between numbers, the numbers) of `text`."""
    return NUMBER.split(text), NUMBER.findall(text)


def text_difference(committed: str, made: str) -> str | None:
    """The first difference between two texts, numbers compared at their printed precision."""
    (old_words, old_numbers), (new_words, new_numbers) = _tokens(committed), _tokens(made)
    for line, (a, b) in enumerate(zip(committed.splitlines(), made.splitlines()), 1):
        (words_a, numbers_a), (words_b, numbers_b) = _tokens(a), _tokens(b)
        if words_a != words_b or len(numbers_a) != len(numbers_b):
            return f"line {line}: {a.strip()[:160]!r} committed, {b.strip()[:160]!r} made"
        for x, y in zip(numbers_a, numbers_b):
            if not _same_cell(x, y):
                return f"line {line}: {x} committed, {y} made"
    if old_words != new_words or len(old_numbers) != len(new_numbers):
        return (f"{len(committed.splitlines())} lines committed, "
                f"{len(made.splitlines())} made")
    return None


def difference(committed: Path, made: Path) -> str | None:
    """How the committed file differs from the one made (None: the same); figures: None."""
    if made.exists() or committed.suffix in FIGURES or not committed.exists():
        return _file_difference(committed, made.read_text() if made.exists() else "")
    return "not made by the regeneration"


def _file_difference(committed: Path, made: str) -> str | None:
    if committed.suffix in FIGURES:
        return None
    if not committed.exists():
        return "missing (the regeneration makes it)"
    return (csv_difference if committed.suffix == ".csv" else text_difference)(
        committed.read_text(), made)


def check_files(root: str | Path, made: Mapping[str, str]) -> list[str]:
    """One line per file of `made` (a path under `root` → its regenerated text) whose committed
    version differs: "path: its first difference"; [] when every one matches."""
    found = ((name, _file_difference(Path(root) / name, text)) for name, text in made.items())
    return [f"{name}: {differs}" for name, differs in found if differs]
