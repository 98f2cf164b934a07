"""Whether a committed generated file still says what its regeneration says: one rule for every
file. Numbers match within a relative `REL_TOL` or an absolute `ABS_TOL` (full-precision floats'
last digits move between machines and library versions; a number printed at two decimals matches
only itself: `+0.05` and `0.05` are the same, `0.05` and `0.06` are not); all other text matches
exactly (a verdict is words). A CSV file is compared cell by cell, any other text file line by
line, split into words and numbers. Figures are not compared. `check_files` compares
regenerations held in memory and names each file and its first differing value.

A file that is no longer regenerated (a legacy report frozen under `results/archive/`) is held to
its bytes instead: `CHECKSUMS` lists its SHA-256 digest, and `checksum_problems` names each listed
file whose bytes no longer give it."""

from __future__ import annotations

import csv
import hashlib
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
CHECKSUMS = "results/archive/SHA256SUMS"
"""The frozen files' digests, in `sha256sum`'s format (`sha256sum -c SHA256SUMS` run in its folder
verifies them too): one line per file, its hex digest, two spaces (or a space and `*`) and its
path relative to the folder of the list."""


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


def checksums(path: str | Path) -> dict[str, str]:
    """The digests a `sha256sum`-format list at `path` holds: file (relative to the list's
    folder) → hex digest. A line that is not a digest and a path raises ValueError."""
    listed = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        found = re.fullmatch(r"([0-9a-f]{64}) [ *](.+)", line)
        if not found or Path(found.group(2)).is_absolute() or ".." in Path(found.group(2)).parts:
            raise ValueError(f"{path}: line {number} is not a SHA-256 digest and a relative path")
        listed[found.group(2)] = found.group(1)
    return listed


def checksum_problems(root: str | Path, sums: str = CHECKSUMS) -> list[str]:
    """One line per file listed in `sums` (a path under `root`; see `CHECKSUMS`) that is missing
    or whose bytes no longer give its listed SHA-256 digest; [] when every one matches (or no list
    is committed)."""
    path = Path(root) / sums
    if not path.exists():
        return []
    try:
        listed = checksums(path)
    except ValueError as error:
        return [str(error)]
    problems = []
    for name, digest in listed.items():
        file = path.parent / name
        shown = (Path(sums).parent / name).as_posix()
        if not file.is_file():
            problems.append(f"{shown}: missing (listed in {sums})")
        elif hashlib.sha256(file.read_bytes()).hexdigest() != digest:
            problems.append(f"{shown}: its bytes changed (its SHA-256 is not the one {sums} lists)")
    return problems
