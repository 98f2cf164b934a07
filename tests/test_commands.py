"""The installed commands (pyproject.toml's `[project.scripts]`): each is a `main` of the package
whose usage line names the command, and once installed (`pip install -e .`) each runs from any
directory."""

import importlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
# What each command's help is asked with, and a flag of its own that the help must show.
HELP = {
    "vaco-train": (["--help"], "--num-seeds"),
    "vaco-evaluate": (["--help"], "--episodes"),
    "vaco-sweep": (["--help"], "--preset"),
    "vaco-references": (["--help"], "--last-evals"),
    "vaco-plot-sweep": (["--help"], "--references"),
    "vaco-report": (["--help"], "--sweeps"),
    "vaco-bench": (["--help"], "--leaderboard"),
    "vaco-llm": (["tiny", "--help"], "--objectives"),
    "vaco-plot-runs": (["--help"], "RUN_DIR"),
    "vaco-plot-diagnostics": (["--help"], "RUN_DIR"),
}


def test_every_command_module_is_installed_as_a_command():
    modules = {path.stem for path in (ROOT / "vaco_jax" / "commands").glob("*.py")} - {"__init__"}
    targets = {target.partition(":")[0] for target in SCRIPTS.values()}
    assert {f"vaco_jax.commands.{m}" for m in modules} | {"vaco_jax.train", "vaco_jax.evaluate"} \
        == targets
    assert set(SCRIPTS) == set(HELP)   # a new command gets a line above


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_each_command_s_help_names_it(name, monkeypatch, capsys):
    module, _, function = SCRIPTS[name].partition(":")
    main = getattr(importlib.import_module(module), function)
    argv, flag = HELP[name]
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(sys, "argv", [name, *argv])   # as the installed script calls it
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: {' '.join([name, *argv[:-1]])} "), text.splitlines()[0]
    assert flag in text


def test_installed_commands_run_from_any_directory(tmp_path):
    """Each installed command's `--help`, run in a fresh process from an empty directory with no
    PYTHONPATH: the package, not the checkout, provides it."""
    bin_dir = Path(sys.executable).parent
    missing = [name for name in SCRIPTS if not (bin_dir / name).exists()]
    assert not missing, (f"{missing} are not installed beside {sys.executable}: the package was "
                         f"installed before these commands were added; reinstall it "
                         f"(pip install -c requirements-lock.txt -e \".[dev]\")")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["COLUMNS"] = "200"
    for name in SCRIPTS:
        argv, flag = HELP[name]
        done = subprocess.run([str(bin_dir / name), *argv], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"usage: {' '.join([name, *argv[:-1]])} "), done.stdout[:200]
        assert flag in done.stdout, name
    assert not list(tmp_path.iterdir())   # --help writes nothing
