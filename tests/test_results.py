"""The committed studies as specs (vaco_jax.study.specs) and `vaco-report --all [--check]`: a
committed report file is compared with its regeneration number by number (pipeline.compare), and
results/RESULTS.md is generated from the reports."""

import re
import shutil

import pytest

from vaco_jax.commands import report as report_command
from vaco_jax.pipeline import compare
from vaco_jax.study import specs

ROOT = specs.ROOT


# --- comparing a committed file with its regeneration -------------------------------------------
def test_csv_numbers_compare_at_full_precision_with_a_relative_tolerance():
    committed = "task,low\na,0.7146594667835201\nb,0.0300585677\n"
    assert compare.csv_difference(committed, "task,low\na,0.71465946678352\nb,"
                                             "0.030058567650420986\n") is None
    assert compare.csv_difference(committed, "task,low\na,0.7146491507608569\nb,0.0300585677\n") \
        == "row 1, column 'low': '0.7146594667835201' committed, '0.7146491507608569' made"
    assert "rows" in compare.csv_difference(committed, "task,low\na,0.71\n")


def test_text_numbers_compare_at_the_precision_they_are_printed():
    line = "| vaco | pooled | -0.15 [-0.31, 0.01] | 1,024,000 | holds | b62c8ce |"
    same = "| vaco | pooled | -0.15 [-0.31, +0.01] | 1,024,000 | holds | b62c8ce |"
    assert compare.text_difference(line, same) is None
    assert compare.text_difference(line, line.replace("-0.31", "-0.32")) == \
        "line 1: -0.31 committed, -0.32 made"
    assert compare.text_difference(line, line.replace("holds", "breaks")).startswith("line 1: ")
    assert compare.text_difference(line, line.replace("b62c8ce", "b62c8cf")) is not None


# --- the specs ----------------------------------------------------------------------------------
def test_every_committed_study_is_a_spec_with_its_report_files_committed():
    studies = report_command._studies()
    assert {"controlled-lag", "forward", "stepsize", "delta-lag", "leaderboard-v1",
            "llm-forward-lag", "minatar-long", "minatar-space-invaders", "leaderboard-llm",
            "leaderboard-v2"} \
        <= set(studies)
    for spec in studies.values():
        assert len(spec.question.split()) <= 12, spec.question
        assert all((ROOT / d).is_dir() for d in spec.directories), spec.name
        assert all((ROOT / spec.report / f).is_file() for f in spec.files), spec.name


def test_the_archived_capacity_sweeps_are_specs_named_in_the_help_and_left_out_of_all(capsys):
    assert set(specs.ARCHIVED) == {"capacity-cpu", "capacity-ablations", "capacity-dmc",
                                   "capacity-hopper-1m"}
    assert not set(specs.ARCHIVED) & set(report_command._studies())
    for spec in specs.ARCHIVED.values():
        assert all((ROOT / spec.report / f).is_file() for f in spec.files), spec.name
    with pytest.raises(SystemExit):
        report_command.main(["--help"])
    text = "".join(c for c in capsys.readouterr().out if not c.isspace() and c != "│")
    assert all(name in text for name in specs.ARCHIVED)   # however tyro wraps the lines


@pytest.fixture
def minatar(tmp_path):
    """A copy of the MinAtar study's committed files, its RESULTS.md and results index, as a
    repository root."""
    spec = specs.STUDIES["minatar-long"]
    shutil.copytree(ROOT / spec.report, tmp_path / spec.report)
    studies = {spec.name: spec}
    made = specs.regenerate(studies, tmp_path / "made", tmp_path)
    (tmp_path / "results" / "RESULTS.md").write_text(
        specs.results_markdown(studies, made, tmp_path))
    (tmp_path / specs.INDEX).write_text(specs.index_markdown(studies, made, tmp_path))
    return tmp_path, studies


def test_check_passes_on_current_files_and_names_the_file_of_an_edited_number(minatar):
    root, studies = minatar
    assert specs.check(studies, root) == []
    report = root / "results/minatar-cnn/long/report.md"
    report.write_text(report.read_text().replace("[-13.02, -0.22]", "[-13.02, -0.23]"))
    assert specs.check(studies, root) == [
        "results/minatar-cnn/long/report.md: line 2: -0.23 committed, -0.22 made"]


def test_check_names_a_results_table_that_is_not_what_all_writes(minatar):
    root, studies = minatar
    table = root / "results" / "RESULTS.md"
    table.write_text(table.read_text().replace("| 5 |", "| 6 |"))
    (problem,) = specs.check(studies, root)
    assert problem.startswith("results/RESULTS.md: line 5: ")


def test_one_studys_check_passes_on_its_files_and_names_an_edited_one(minatar, capsys):
    root, studies = minatar
    (spec,) = studies.values()
    assert specs.check_study(spec, root) == []
    report = root / "results/minatar-cnn/long/report.md"
    report.write_text(report.read_text().replace("[-13.02, -0.22]", "[-13.02, -0.23]"))
    assert specs.check_study(spec, root) == [
        "results/minatar-cnn/long/report.md: line 2: -0.23 committed, -0.22 made"]
    assert report_command.main(["--study", "minatar-long", "--check"]) == 0
    assert re.search(r"every committed report file of minatar-long in \S+ is current",
                     capsys.readouterr().out)
    assert report_command.main(["--study", "lag", "--check"]) == 2


def test_results_table_reads_each_headline_as_its_report_prints_it(minatar):
    root, _ = minatar
    row = (root / "results" / "RESULTS.md").read_text().splitlines()[4]
    assert row.startswith("| minatar-long | ") and "-6.62, 95% Welch interval [-13.02, -0.22]" in row
    assert "| the MLP learns more at this budget | 5 | 195bf2b |" in row


def test_the_readme_results_table_is_generated_and_an_edited_number_in_it_is_named(minatar):
    root, studies = minatar
    made = specs.regenerate(studies, root / "made-again", root)
    readme = root / "README.md"
    readme.write_text(specs.with_readme_block(
        f"# x\n\n{specs.README_BEGIN}\nold table\n{specs.README_END}\n\nmore\n",
        specs.readme_block(studies, made, root)))
    assert specs.check(studies, root) == []
    row = readme.read_text().splitlines()[5]
    assert row.startswith("| [Does a CNN beat the MLP on Breakout-MinAtar")
    assert "(results/minatar-cnn/long/report.md)" in row and "[-13.02, -0.22]" in row
    readme.write_text(readme.read_text().replace("[-13.02, -0.22]", "[-13.02, -0.21]"))
    assert specs.check(studies, root) == ["README.md: line 6: -0.21 committed, -0.22 made"]
    readme.write_text("# x\n")
    (problem,) = specs.check(studies, root)
    assert problem.startswith("README.md: README.md lacks the results markers")


def test_the_v1_leaderboard_row_counts_its_pre_registered_break_rule():
    verdict = specs.STUDIES["leaderboard-v1"].verdict(ROOT / "results/lag-bench/cpu")
    assert verdict == "break rule: 9 break, 6 hold, 2 undetermined"


def test_the_llm_leaderboard_row_counts_its_primary_familys_verdicts():
    verdict = report_command._studies()["leaderboard-llm"].verdict(ROOT / "results/lag-bench/llm-cpu")
    assert verdict == "F1, family of 48: 19 no difference shown, 16 higher, 13 lower"


def test_the_llm_leaderboard_row_is_exploratory_without_the_whole_family(tmp_path):
    from vaco_jax.llm import families
    (tmp_path / families.PRIMARY).write_text(
        "family,objective,N,metric,verdict\nF1,vaco,1,final_accuracy,"
        "exploratory (24 of the 48 tests present)\n")
    verdict = report_command._studies()["leaderboard-llm"].verdict(tmp_path)
    assert verdict == "none: exploratory (24 of the 48 tests present)"


def test_the_v2_leaderboard_row_counts_its_pre_registered_family():
    verdict = specs.STUDIES["leaderboard-v2"].verdict(ROOT / "results/lag-bench/cpu-v2")
    assert verdict == "family of 16: 11 lower, 5 no difference shown"


def test_the_v2_leaderboard_row_is_exploratory_without_verdict_words(tmp_path):
    (tmp_path / "comparisons.csv").write_text(
        "method,baseline,p_holm,verdict\nvaco,ppo_clip,0.01,\"Holm p < 0.05, estimate < 0\"\n"
        "spo,ppo_clip,0.4,Holm p ≥ 0.05\n")
    verdict = specs.STUDIES["leaderboard-v2"].verdict(tmp_path)
    assert verdict == "none: exploratory (leaderboard.md says why)"
    (tmp_path / "comparisons.csv").write_text(
        "method,baseline,p_holm,verdict\nvaco,ppo_clip,0.01,lower\nspo,ppo_clip,0.4,"
        "no difference shown\npg,ppo_clip,0.02,lower\n")
    verdict = specs.STUDIES["leaderboard-v2"].verdict(tmp_path)
    assert verdict == "family of 3: 2 lower, 1 no difference shown"


def test_an_unknown_study_is_refused_naming_the_committed_ones(capsys):
    assert report_command.main(["--study", "nope"]) == 2
    assert "minatar-long" in capsys.readouterr().err


def test_every_committed_report_and_results_table_is_current():
    # The one test that regenerates every study (about 30 s on a 2-core CPU).
    assert report_command.main(["--all", "--check"]) == 0
