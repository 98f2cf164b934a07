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
            "llm-forward-lag", "leaderboard-llm", "leaderboard-v2"} <= set(studies)
    # the MinAtar tests are study files now (studies/minatar-*.toml), their legacy reports frozen
    # under results/archive/minatar-cnn/
    assert not {"minatar-long", "minatar-space-invaders"} & set(studies)
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
def board(tmp_path):
    """A copy of the v1 leaderboard's committed files (its scorecards and report, and the
    controlled-lag table it is compared with), its RESULTS.md and results index, as a repository
    root."""
    spec = specs.STUDIES["leaderboard-v1"]
    shutil.copytree(ROOT / spec.report, tmp_path / spec.report)
    (tmp_path / spec.references).parent.mkdir(parents=True)
    shutil.copy2(ROOT / spec.references, tmp_path / spec.references)
    studies = {spec.name: spec}
    made = specs.regenerate(studies, tmp_path / "made", tmp_path)
    (tmp_path / "results" / "RESULTS.md").write_text(
        specs.results_markdown(studies, made, tmp_path))
    (tmp_path / specs.INDEX).write_text(specs.index_markdown(studies, made, tmp_path))
    return tmp_path, studies


VACO_ROW = "| vaco | inverted_double_pendulum | 0.97 [0.91, 1.00] |"


def test_check_passes_on_current_files_and_names_the_file_of_an_edited_number(board):
    root, studies = board
    assert specs.check(studies, root) == []
    report = root / "results/lag-bench/cpu/leaderboard.md"
    report.write_text(report.read_text().replace(VACO_ROW, VACO_ROW.replace("0.91", "0.90")))
    assert specs.check(studies, root) == [
        "results/lag-bench/cpu/leaderboard.md: line 10: 0.90 committed, 0.91 made"]


def test_check_names_a_results_table_that_is_not_what_all_writes(board):
    root, studies = board
    table = root / "results" / "RESULTS.md"
    table.write_text(table.read_text().replace("| 10 |", "| 11 |"))
    (problem,) = specs.check(studies, root)
    assert problem.startswith("results/RESULTS.md: line 5: ")


def test_one_studys_check_passes_on_its_files_and_names_an_edited_one(board, capsys):
    root, studies = board
    (spec,) = studies.values()
    assert specs.check_study(spec, root) == []
    report = root / "results/lag-bench/cpu/leaderboard.md"
    report.write_text(report.read_text().replace(VACO_ROW, VACO_ROW.replace("0.91", "0.90")))
    assert specs.check_study(spec, root) == [
        "results/lag-bench/cpu/leaderboard.md: line 10: 0.90 committed, 0.91 made"]
    assert report_command.main(["--study", "leaderboard-v1", "--check"]) == 0
    assert re.search(r"every committed report file of leaderboard-v1 in \S+ is current",
                     capsys.readouterr().out)
    assert report_command.main(["--study", "lag", "--check"]) == 2


def test_results_table_reads_each_headline_as_its_report_prints_it(board):
    root, _ = board
    row = (root / "results" / "RESULTS.md").read_text().splitlines()[4]
    assert row.startswith("| leaderboard-v1 | ")
    assert "VACO's retention at k = 15: 0.97 [0.91, 1.00]; PPO-Clip's: 1.00 [1.00, 1.00]" in row
    assert "agreement with controlled-lag: Spearman's ρ = 0.93 (p = 0.001)" in row
    assert "| break rule: 9 break, 6 hold, 2 undetermined | 10 | 8e2bba5 |" in row


def test_the_readme_results_table_is_generated_and_an_edited_number_in_it_is_named(board):
    root, studies = board
    made = specs.regenerate(studies, root / "made-again", root)
    readme = root / "README.md"
    readme.write_text(specs.with_readme_block(
        f"# x\n\n{specs.README_BEGIN}\nold table\n{specs.README_END}\n\nmore\n",
        specs.readme_block(studies, made, root)))
    assert specs.check(studies, root) == []
    row = readme.read_text().splitlines()[5]
    assert row.startswith("| [Which methods keep their score under lag on the v1 protocol?]")
    assert "(results/lag-bench/cpu/leaderboard.md)" in row and "0.97 [0.91, 1.00]" in row
    readme.write_text(readme.read_text().replace("0.97 [0.91, 1.00]", "0.97 [0.91, 0.99]"))
    assert specs.check(studies, root) == ["README.md: line 6: 0.99 committed, 1.00 made"]
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
    assert "leaderboard-v1" in capsys.readouterr().err


def test_every_committed_report_and_results_table_is_current():
    # The one test that regenerates every study (about 30 s on a 2-core CPU).
    assert report_command.main(["--all", "--check"]) == 0
