"""`vaco-report --all --check` compares every generated file of the checkout it runs in — each
study's report files, results/RESULTS.md, the results index results/README.md and the README's
results table — and names the file and the value that differs.

Regenerating every study takes minutes, so here the regeneration is the committed reports
themselves (a pristine copy: what `--all --check` confirms the real regeneration gives); the study
files (`studies/*.toml`), seconds, are regenerated for real, once. The comparison, RESULTS.md and
the README's table are the real check's, run on a copy of the checkout in which one number at a
time is edited."""

import csv
import io
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from vaco_jax.analysis import study
from vaco_jax.commands import report
from vaco_jax.pipeline import compare
from vaco_jax.study import lag, specs

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
    shutil.copytree(ROOT / specs.STUDY_FILES, copy / specs.STUDY_FILES)
    for spec in studies.values():
        if not (made / spec.report).exists():
            shutil.copytree(ROOT / spec.report, made / spec.report,
                            ignore=shutil.ignore_patterns("*.parquet", "*.png"))
    return copy, made


@pytest.fixture(scope="module")
def made_files():
    """Every committed study file regenerated (in memory, from this checkout's runs)."""
    return specs.regenerate_study_files(ROOT)


@pytest.fixture
def regenerated(monkeypatch, studies, checkout, made_files):
    _, made = checkout

    def regenerate(chosen, out, root=ROOT):
        return {name: made / studies[name].report for name in chosen}
    monkeypatch.setattr(specs, "regenerate", regenerate)
    monkeypatch.setattr(specs, "regenerate_study_files",
                        lambda root=ROOT, descends=None: made_files)


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
    files = {(specs.RESULTS,), (specs.INDEX,), (specs.README, specs.README_BEGIN, specs.README_END)}
    for spec in studies.values():
        files |= {(f"{spec.report}/{name}",) for name in spec.files
                  if Path(name).suffix not in compare.FIGURES}
    for loaded in specs.study_files(ROOT):   # each study file's estimates.csv and report.md
        files |= {(f"{loaded.output}/{name}",) for name in study.FILES}
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
    assert edited >= 54   # RESULTS.md, the README, (nearly) every report file, every study file's


def test_a_changed_byte_of_a_frozen_archive_file_fails_the_check_naming_it(studies, checkout,
                                                                          regenerated):
    """A legacy report frozen under results/archive/ is not regenerated: the check holds each file
    results/archive/SHA256SUMS lists to its bytes, so one byte changed (a space or a digit a
    number comparison would let pass) is named."""
    from vaco_jax.analysis import check

    copy, _ = checkout
    listed = check.checksums(copy / check.CHECKSUMS)
    assert "minatar-cnn/long/report.md" in listed
    for name in listed:
        path = copy / "results" / "archive" / name
        original = path.read_bytes()
        for edited in (original + b" ", original[:-2] + bytes([original[-2] ^ 1]) + original[-1:]):
            try:
                path.write_bytes(edited)
                problems = specs.check(studies, copy)
            finally:
                path.write_bytes(original)
            assert problems == [f"results/archive/{name}: its bytes changed (its SHA-256 is not "
                                f"the one {check.CHECKSUMS} lists)"], problems


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


def test_a_changed_study_files_estimates_fail_the_command_naming_the_file(checkout, regenerated,
                                                                         monkeypatch, capsys):
    """A committed results/studies/<name>/estimates.csv whose number is not its regeneration's
    fails `vaco-report --all --check`, named with the column and both values."""
    copy, _ = checkout
    estimates = copy / "results/studies/minatar-long/estimates.csv"
    original = estimates.read_bytes()
    old, new = edit_one_number(estimates)
    monkeypatch.chdir(copy)
    try:
        code = report.main(["--all", "--check"])
    finally:
        estimates.write_bytes(original)
    out = capsys.readouterr().out
    assert code == 1, out
    [line] = [line for line in out.splitlines() if line.startswith("stale: ")]
    assert line.startswith(f"stale: results/studies/minatar-long/estimates.csv: row 1, column "
                           f"'point': '{new}' committed, '"), line
    assert float(line.split(" committed, '")[1].split("'")[0]) == pytest.approx(float(old))
    assert report.main(["--all", "--check"]) == 0, capsys.readouterr().out


# --- the results index ----------------------------------------------------------------------------
def index_rows(path: Path) -> dict[str, dict[str, str]]:
    """The results index's rows by study name (its link text, for a study file)."""
    [table] = specs.markdown_tables(path)
    return {re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", row["study"]): row for row in table}


def test_the_results_index_lists_every_study_and_names_its_report(studies):
    from vaco_jax.analysis import study

    rows = index_rows(ROOT / specs.INDEX)
    reports = {spec.name: f"{spec.report}/{spec.files[0]}"
               for spec in {**studies, **specs.ARCHIVED}.values()}
    for path in sorted((ROOT / specs.STUDY_FILES).glob("*.toml")):
        loaded = study.load(path, root=ROOT)
        reports[loaded.name] = f"{loaded.output}/report.md"
    assert len(reports) >= 16 and sorted(rows) == sorted(reports)
    for name, report in reports.items():
        [target] = re.findall(r"\]\(([^)]+)\)", rows[name]["question (its report)"])
        assert (ROOT / "results" / target).resolve() == (ROOT / report).resolve(), name
        assert (ROOT / report).is_file(), name
        assert re.fullmatch(r"[0-9a-f]{7}(, [0-9a-f]{7})*", rows[name]["runs made at"]), name
    assert rows["controlled-lag"]["runs made at"] == "b62c8ce"
    assert rows["capacity-dmc"]["runs made at"] == "6e4cbdf, cd9c061, ddef61f"   # per cell
    assert rows["capacity-dmc"]["status"].startswith("archived")
    assert rows["forward"]["status"] == "current"


def test_the_index_says_which_studies_were_pre_registered_and_by_which_commit():
    if specs.preregistration.descends_from(lag.PRE_REGISTRATION, lag.PRE_REGISTRATION) is None:
        pytest.skip("this checkout's git history cannot check the runs' ancestry")
    rows = index_rows(ROOT / specs.INDEX)
    assert rows["forward"]["tests"] == "pre-registered (eaf6cd5)"
    assert rows["controlled-lag"]["tests"] == ("exploratory: runs made before its "
                                               "pre-registration (eaf6cd5)")
    assert rows["leaderboard-v2-level"]["tests"] == "pre-registered (a5f50b2)"
    assert rows["stepsize"]["tests"] == rows["leaderboard-v2-robustness"]["tests"] == "exploratory"


def test_tests_in_words_follows_the_ancestry_of_the_runs():
    after = lambda commit, ancestor: True   # noqa: E731
    assert specs.tests_in_words(["a" * 40], "", descends=after) == "exploratory"
    assert specs.tests_in_words(["a" * 40], "b" * 40, descends=after) == "pre-registered (bbbbbbb)"
    assert specs.tests_in_words(["a" * 40], "b" * 40, False, descends=after).startswith(
        "exploratory: its report gives no")
    assert specs.tests_in_words(["a" * 40], "b" * 40, descends=lambda c, a: False) == (
        "exploratory: runs made before its pre-registration (bbbbbbb)")
    assert "cannot be checked" in specs.tests_in_words([], "b" * 40, descends=after)


def test_a_study_files_registration_is_the_commit_that_added_its_test():
    """A study file whose registered tests are a file of their own (the MinAtar tests'
    PREREGISTRATION.md) names as its registration the commit that added that file."""
    from vaco_jax.analysis import study

    own = [loaded for loaded in (study.load(path, root=ROOT) for path in
                                 sorted((ROOT / specs.STUDY_FILES).glob("*.toml")))
           if loaded.family and (ROOT / loaded.family.get("section", "")).is_file()]
    assert {loaded.name for loaded in own} >= {"minatar-long", "minatar-space-invaders"}
    for loaded in own:
        added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--",
                                loaded.family["section"]], cwd=ROOT,
                               capture_output=True, text=True).stdout.split()
        if not added:
            pytest.skip("this checkout's git history does not hold the pre-registration")
        assert added[-1] == loaded.family["registration"]


@pytest.mark.parametrize("edit", ["commit", "tests", "dropped", "new study file", "run record"])
def test_an_edited_row_of_the_results_index_fails_the_check_naming_it(studies, checkout,
                                                                      regenerated, edit):
    copy, _ = checkout
    index = copy / specs.INDEX
    text = index.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| forward |"))
    changed = {"commit": lambda: index.write_text(text.replace(
                   row, row.replace("| 8e2bba5 |", "| 8e2bba6 |"))),
               "tests": lambda: index.write_text(text.replace(
                   row, row.replace("pre-registered (eaf6cd5)", "exploratory"))),
               "dropped": lambda: index.write_text(text.replace(row + "\n", ""))}
    added = copy / specs.STUDY_FILES / "zz-copy.toml"
    config = copy / "results/minatar-cnn/long/cnn/config.json"
    original = config.read_bytes()
    try:
        if edit == "new study file":   # a study file added: its row is missing from the index
            added.write_text((copy / specs.STUDY_FILES / "leaderboard-v2-level.toml").read_text()
                             .replace('study = "leaderboard-v2-level"', 'study = "zz-copy"'))
        elif edit == "run record":     # a run's recorded commit, not the index, changed
            info = json.loads(original)
            config.write_text(json.dumps({**info, "git_commit": "1" * 40}))
        else:
            assert row in text
            changed[edit]()
        problems = specs.check(studies, copy)
    finally:
        index.write_text(text)
        added.unlink(missing_ok=True)
        config.write_bytes(original)
    if edit == "run record":   # a study file's runs: its row of RESULTS.md and the README's too
        assert [p.split(":")[0] for p in problems] == [specs.RESULTS, specs.INDEX, specs.README], \
            problems
        return
    assert len(problems) == 1 and problems[0].startswith(f"{specs.INDEX}: "), problems
