"""`vaco-report --all --check` compares every generated file of the checkout it runs in — each
study's report files, results/RESULTS.md and the README's results table — and names the file and
the value that differs.

Regenerating every study takes minutes, so here the regeneration is the committed reports
themselves (a pristine copy: what `--all --check` confirms the real regeneration gives). The
comparison, RESULTS.md and the README's table are the real check's, run on a copy of the checkout
in which one number at a time is edited."""

import csv
import io
import math
import shutil
from pathlib import Path

import pytest

from vaco_jax.commands import report
from vaco_jax.pipeline import compare
from vaco_jax.study import specs

ROOT = specs.ROOT


@pytest.fixture(scope="module")
def studies():
    return report._studies()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory, studies):
    """A copy of the checkout's results and README (`copy`), and of each study's committed report
    directory as its regeneration (`made`)."""
    base = tmp_path_factory.mktemp("results_check")
    copy, made = base / "elsewhere" / "checkout", base / "made"
    shutil.copytree(ROOT / "results", copy / "results",
                    ignore=shutil.ignore_patterns("*.parquet", "*.png", "*.npz"))
    shutil.copy2(ROOT / specs.README, copy / specs.README)
    for spec in studies.values():
        if not (made / spec.report).exists():
            shutil.copytree(ROOT / spec.report, made / spec.report,
                            ignore=shutil.ignore_patterns("*.parquet", "*.png"))
    return copy, made


@pytest.fixture
def regenerated(monkeypatch, studies, checkout):
    _, made = checkout

    def regenerate(chosen, out, root=ROOT):
        return {name: made / studies[name].report for name in chosen}
    monkeypatch.setattr(specs, "regenerate", regenerate)


def _bump(token: str) -> str:
    """A printed number with its last digit changed: another number at the same precision."""
    i = max(i for i, c in enumerate(token) if c.isdigit())
    return token[:i] + str((int(token[i]) + 1) % 10) + token[i + 1:]


def edit_one_number(path: Path, *, between: tuple[str, str] | None = None
                    ) -> tuple[str, str] | None:
    """Change one number of `path` (a CSV's first finite non-zero number: doubled and moved by
    one; a text file's first number on a table line, between the two markers if given): the
    number as it was and as it is now; None, the file untouched, when it holds none."""
    text = path.read_text()
    if path.suffix == ".csv":
        rows = list(csv.reader(io.StringIO(text)))
        for row in rows[1:]:
            for j, cell in enumerate(row):
                try:
                    number = float(cell.replace("−", "-").replace(",", ""))
                except ValueError:
                    continue
                if math.isfinite(number) and number != 0:
                    row[j] = repr(number * 2 + 1)
                    out = io.StringIO()
                    csv.writer(out, lineterminator="\n").writerows(rows)
                    path.write_text(out.getvalue())
                    return cell, row[j]
        return None   # a table without numbers (e.g. no missing cells)
    lines, inside = text.split("\n"), between is None
    for n, line in enumerate(lines):
        if between and between[0] in line:
            inside = True
        elif between and between[1] in line:
            inside = False
        match = compare.NUMBER.search(line) if inside and line.startswith("|") else None
        if match:
            old = match.group()
            lines[n] = line[:match.start()] + _bump(old) + line[match.end():]
            path.write_text("\n".join(lines))
            return old, _bump(old)
    return None


def generated_files(studies) -> list[tuple[str, ...]]:
    files = {(specs.RESULTS,), (specs.README, specs.README_BEGIN, specs.README_END)}
    for spec in studies.values():
        files |= {(f"{spec.report}/{name}",) for name in spec.files
                  if Path(name).suffix not in compare.FIGURES}
    return sorted(files)


def test_the_committed_reports_are_their_own_regeneration(studies, checkout, regenerated):
    copy, _ = checkout
    assert specs.check(studies, copy) == []


def test_an_edited_number_in_any_generated_file_fails_the_check_naming_it(studies, checkout,
                                                                         regenerated):
    copy, _ = checkout
    missed, edited = [], 0
    for relative, *markers in generated_files(studies):
        path = copy / relative
        original = path.read_bytes()
        try:
            change = edit_one_number(path, between=tuple(markers) or None)
            if change is None:
                continue
            old, new = change
            edited += 1
            problems = specs.check(studies, copy)
        finally:
            path.write_bytes(original)
        named = [p for p in problems if p.startswith(f"{relative}:")]
        if len(problems) != 1 or not named or (old not in named[0] and new not in named[0]):
            missed.append(f"{relative} ({old} -> {new}): {problems}")
    assert not missed, "\n".join(missed)
    assert edited >= 40   # RESULTS.md, the README and (nearly) every report file


def test_the_command_checks_the_checkout_it_runs_in(studies, checkout, regenerated,
                                                    monkeypatch, capsys):
    """Run in another checkout than the one the code is installed from, `vaco-report --all
    --check` reads that checkout's RESULTS.md: an edited headline fails, naming file and value."""
    copy, _ = checkout
    results = copy / specs.RESULTS
    original = results.read_bytes()
    text = original.decode()
    assert "-0.15 [-0.31, +0.01]" in text   # the controlled-lag row
    results.write_text(text.replace("-0.15 [-0.31, +0.01]", "-0.22 [-0.31, +0.01]", 1))
    monkeypatch.chdir(copy / "results")
    try:
        code = report.main(["--all", "--check"])
    finally:
        results.write_bytes(original)
    out = capsys.readouterr().out
    assert code == 1, out
    assert f"stale: {specs.RESULTS}: line" in out and "-0.22 committed, -0.15 made" in out
