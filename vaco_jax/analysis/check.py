"""Whether a committed report file still says what its regeneration says, number by number.

A CSV file is compared cell by cell: equal text, or two numbers within a relative tolerance of
`REL_TOL` or an absolute one of `ABS_TOL` (its floats are printed at full precision, and the last
digits move between machines and library versions). Any other text file (markdown) is split into its words and its numbers: the
words must be identical (a verdict is words), and each number equal at the precision it is printed
(`+0.05` and `0.05`, `-0.00` and `0.00` are the same number; `0.05` and `0.06` are not). Figures
are not compared."""

from __future__ import annotations

import csv
import io
import math
import re
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
            if x != y and _number(x) != _number(y):
                return f"line {line}: {x} committed, {y} made"
    if old_words != new_words or len(old_numbers) != len(new_numbers):
        return (f"{len(committed.splitlines())} lines committed, "
                f"{len(made.splitlines())} made")
    return None


def difference(committed: Path, made: Path) -> str | None:
    """How the committed file differs from the one made (None: the same); figures: None."""
    if committed.suffix in FIGURES:
        return None
    if not committed.exists():
        return "missing (the regeneration makes it)"
    if not made.exists():
        return "not made by the regeneration"
    old, new = committed.read_text(), made.read_text()
    return (csv_difference if committed.suffix == ".csv" else text_difference)(old, new)
