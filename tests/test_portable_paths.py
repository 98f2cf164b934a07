"""Committed results and docs hold no absolute path of the machine that wrote them, and the
committed LLM leaderboard checks from any checkout, not only the one that made it."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vaco_jax import io

ROOT = Path(__file__).resolve().parent.parent
# An absolute path of a machine: a directory of this one, or a typical home or scratch prefix.
PREFIXES = {"/work/", "/root/", "/home/", "/tmp/", "/Users/", f"{ROOT.as_posix()}/",
            f"{Path.home().as_posix().rstrip('/')}/"} - {"//", "/"}
ABSOLUTE = re.compile("(?<![\\w.~/-])(" + "|".join(map(re.escape, sorted(PREFIXES))) + ")")


def _tracked(*folders: str) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z", "--", *folders], cwd=ROOT, check=True,
                            capture_output=True).stdout
    return [ROOT / name for name in listed.decode().split("\0") if name]


needs_git = pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                               reason="needs git and a git checkout")


@needs_git
def test_no_tracked_result_or_doc_holds_an_absolute_path():
    found = []
    for path in _tracked("results", "docs"):
        data = path.read_bytes()
        if b"\0" in data:   # a binary file (Parquet, PNG): its rows are checked as text elsewhere
            continue
        for number, line in enumerate(data.decode(errors="replace").splitlines(), 1):
            match = ABSOLUTE.search(line)
            if match:
                found.append(f"{path.relative_to(ROOT)}:{number}: "
                             f"...{line[max(0, match.start() - 40):match.end() + 40]}...")
    assert not found, "absolute paths in committed files:\n" + "\n".join(found[:40])


def test_portable_path_is_never_absolute_for_the_checkout_the_cwd_or_home(tmp_path, monkeypatch):
    assert io.portable_path(ROOT / "vaco_jax" / "llm" / "warm_starts" / "cpu.npz") == \
        "vaco_jax/llm/warm_starts/cpu.npz"
    assert io.portable_path("runs/x") == "runs/x"
    monkeypatch.chdir(tmp_path)
    assert io.portable_path(tmp_path / "runs" / "x") == "runs/x"
    assert io.portable_path(Path.home() / ".cache" / "vaco_jax" / "f") == "~/.cache/vaco_jax/f"


@needs_git
def test_the_committed_llm_board_checks_from_a_fresh_clone(tmp_path):
    """`vaco-bench --table results/lag-bench/llm-cpu --check`, run in a clone in another folder:
    every recomputed file (the scorecards' reference to PPO-Clip's runs included) matches."""
    clone = tmp_path / "elsewhere" / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True,
                   capture_output=True)
    command = shutil.which("vaco-bench", path=str(Path(sys.executable).parent))
    assert command, "vaco-bench is not installed beside this Python"
    done = subprocess.run([command, "--table", "results/lag-bench/llm-cpu", "--check"],
                          cwd=clone, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stdout + done.stderr
    # and from outside the clone, naming the board by its absolute path
    done = subprocess.run([command, "--table", str(clone / "results/lag-bench/llm-cpu"),
                           "--check"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stdout + done.stderr
