"""The installed commands (pyproject.toml's `[project.scripts]`): each is a `main` of the package
whose usage line names the command, whose `--help` imports no JAX, and once installed (`pip
install -e .`) each runs from any directory. (How long `--help` takes: benchmarks/help_time.py.)"""

import importlib
import json
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
    "vaco-plot-llm": (["--help"], "--out"),
}


def test_every_command_module_is_installed_as_a_command():
    modules = {path.stem for path in (ROOT / "vaco_jax" / "commands").glob("*.py")} - {"__init__"}
    targets = {target.partition(":")[0] for target in SCRIPTS.values()}
    assert {f"vaco_jax.commands.{m}" for m in modules} == targets
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


# What made `--help` take seconds: imported at the top of the commands' modules before.
HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax", "brax", "mujoco", "matplotlib", "pandas",
         "scipy", "rliable")
IMPORTED_BY_HELP = """
import contextlib, importlib, io, json, sys
scripts, helps, heavy = (json.loads(a) for a in sys.argv[1:])
for name, target in scripts.items():
    module, _, function = target.partition(":")
    sys.argv = [name, *helps[name]]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        getattr(importlib.import_module(module), function)()
    print(name, sorted({m.split(".")[0] for m in sys.modules} & set(heavy)))
"""


def test_help_imports_no_jax():
    """Each command builds its parser from light modules and imports the library only once its
    arguments are parsed (one fresh process, the commands in turn: what one brings stays)."""
    helps = {name: argv for name, (argv, _) in HELP.items()}
    done = subprocess.run([sys.executable, "-c", IMPORTED_BY_HELP, json.dumps(SCRIPTS),
                           json.dumps(helps), json.dumps(HEAVY)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [f"{name} []" for name in SCRIPTS], lines


def test_import_vaco_jax_loads_no_jax_and_every_public_name_resolves():
    code = """
import sys, vaco_jax
assert "jax" not in sys.modules, "import vaco_jax imported jax"
for name in vaco_jax.__all__:
    getattr(vaco_jax, name)
print(sorted(set(vaco_jax.__all__) - set(dir(vaco_jax))), vaco_jax.run.__module__,
      vaco_jax.Trainer.__module__, vaco_jax.HParams.__module__, vaco_jax.envs.__name__)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "vaco_jax.driver", "vaco_jax.trainer", "vaco_jax.hparams",
                                   "vaco_jax.envs"]


def test_installed_commands_run_from_any_directory(tmp_path):
    """Each installed command's `--help`, run in a fresh process from an empty directory with no
    PYTHONPATH: the package, not the checkout, provides it."""
    bin_dir = Path(sys.executable).parent
    missing = [name for name in SCRIPTS if not (bin_dir / name).exists()]
    assert not missing, (f"{missing} are not installed beside {sys.executable}: the package was "
                         f"installed before these commands were added; reinstall it "
                         f"(pip install -c requirements-lock.txt -e \".[dev]\")")
    stale = [name for name in SCRIPTS if "from {} import {}".format(*SCRIPTS[name].split(":"))
             not in (bin_dir / name).read_text()]
    assert not stale, (f"{stale} beside {sys.executable} run modules other than pyproject.toml "
                       f"names (installed before their modules were renamed); reinstall the "
                       f"package (pip install -c requirements-lock.txt -e \".[dev]\")")
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
