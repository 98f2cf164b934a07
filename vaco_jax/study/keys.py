"""Whether two results were made by the same computation: a key per cell, and how to check it fast.

A cell's **key** is a hash of three parts:

* its config and runs (`sweep.Cell.fingerprint`);
* its **inputs**: the bytes of what its programs receive as arguments, made by the same function
  that feeds them when the cell runs (`sweep.cell_inputs`): every run's PRNG key and every
  hyper-parameter leaf (learning rate, δ, ε, an objective's constants, ...). A changed default, a
  halved learning rate in `Config.hparams()` or another seed map changes it;
* its **program**: the StableHLO of its init, learner and evaluation programs without source
  locations, hashed over the call graph (`fingerprint.module_digest`), so neither a comment, a
  renamed helper nor what the process lowered before changes it, and any change of computation
  does.

Lowering a cell takes seconds to a minute; a leaderboard has about two hundred cells. So each
result also records the **code digest** of the checkout that made it (`code_digest`: the syntax
trees, without comments or docstrings, of every module its programs can be traced from, with the
library versions and JAX's trace settings). A checkout with the same code digest lowers nothing: it
computes each cell's inputs (milliseconds) and takes the recorded program part. Any other checkout
lowers each cell once and keeps its program part in the per-user cache under its own code digest.
So a comment or a docstring costs nothing, a refactor costs one lowering per cell and keeps every
key, and a change of behaviour, whether in a program or in the values it receives, breaks the keys
of the cells it touches.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import jax
import numpy as np

from vaco_jax import algorithms, cache, fingerprint, io, program
from vaco_jax.study.sweep import Cell, cell_inputs, key_versions

SCHEME = 2
"""The key's definition. Keys of another scheme are never equal to this one's."""
PREFIX = f"k{SCHEME}:"
# Modules that read results but never make them: editing them changes no result, so they are left
# out of the code digest (and of `bench.result_sources`).
ANALYSIS_ONLY = ("analysis/", "pipeline/", "study/robustness.py", "study/capacity.py",
                 "study/lag.py", "study/plotting.py", "study/scorecard.py", "study/stats.py",
                 "study/lag_by_setting.py", "study/leaderboard.py", "study/specs.py",
                 "study/keys.py", "loggers.py", "llm/", "commands/report.py",
                 "commands/plot_sweep.py", "commands/plot_diagnostics.py", "commands/plot_llm.py",
                 "commands/plot_runs.py")


def result_files() -> list[Path]:
    """The package's modules that can change a result (every one but `ANALYSIS_ONLY`)."""
    package = Path(io.__file__).resolve().parent
    return [path for path in sorted(package.rglob("*.py"))
            if not any(_under(path.relative_to(package).as_posix(), a) for a in ANALYSIS_ONLY)]


def _under(relative: str, entry: str) -> bool:
    return relative == entry or (entry.endswith("/") and relative.startswith(entry))


def program_files() -> list[Path]:
    """The package's modules a cell's programs can be traced from: `vaco_jax.program` and every
    module of the package it imports, directly or not (an import inside a function counts), with
    the packages above each (whose `__init__` Python runs first). What lies outside (the commands,
    the sweeps, the protocols) makes a cell's config and inputs, which its key hashes by value,
    never its programs."""
    package = Path(io.__file__).resolve().parent
    todo, seen = ["vaco_jax.program"], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for imported in imported_names(name, _module_path(package, name)):
            parts = imported.split(".")   # `from a import b`: the module `a.b`, else `a`
            while parts and _module_path(package, ".".join(parts)) is None:
                parts.pop()
            todo.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return sorted(_module_path(package, name) for name in seen)


def _module_path(package: Path, name: str) -> Path | None:
    parts = name.split(".")
    if parts[0] != package.name:
        return None
    base = package.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imported_names(name: str, path: Path) -> set[str]:
    """The dotted names module `name` (file `path`) imports anywhere in its file (function bodies
    included), relative imports resolved against its package; `importlib.import_module("...")`
    with a literal too. `from a import b` gives `a.b` (a module, or a name in module `a`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            names.add(node.args[0].value)
    return names


def syntax_digest(source: str) -> str:
    """A hash of Python source as a syntax tree without docstrings or other bare strings (which
    compute nothing), comments, blank lines or line numbers."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                            and isinstance(s.value.value, str))]
            node.body = kept or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree, include_attributes=False).encode()).hexdigest()


@functools.cache
def code_digest() -> str:
    """What this checkout's program-making code is (16 hex digits): the syntax of
    `program_files`, by path, the `KEY_LIBRARIES`' versions, Python's minor version and JAX's
    trace settings. Equal digests lower to equal programs. Computed once per process (like
    `io.source_hash`)."""
    package = Path(io.__file__).resolve().parent
    parts = {path.relative_to(package).as_posix(): syntax_digest(path.read_text())
             for path in program_files()}
    context = (SCHEME, key_versions(), sys.version_info[:2],
               [(name, getattr(jax.config, name, None)) for name in cache.TRACE_SETTINGS])
    return hashlib.sha256(json.dumps([parts, repr(context)], sort_keys=True).encode()).hexdigest()[:16]


def inputs_digest(cell: Cell) -> str:
    """A hash (16 hex digits) of every value `cell`'s programs receive as arguments when it runs
    (`sweep.cell_inputs`): the runs' PRNG keys and hyper-parameter leaves, by name, dtype, shape
    and bytes."""
    return arrays_digest(*cell_inputs(cell))


def arrays_digest(keys, hparams) -> str:
    """A hash (16 hex digits) of PRNG `keys` and the pytree `hparams`: every leaf by its name,
    dtype, shape and bytes."""
    digest = hashlib.sha256()
    for name, leaf in zip(["keys", *io.leaf_names(hparams)], [keys, *jax.tree.leaves(hparams)]):
        leaf = np.ascontiguousarray(np.asarray(leaf))
        digest.update(repr((name, leaf.dtype.str, leaf.shape)).encode())
        digest.update(leaf.tobytes())
    return digest.hexdigest()[:16]


def program_digest(cell: Cell) -> str:
    """A hash (16 hex digits) of what `cell`'s programs compute (`fingerprint.module_digest` of
    each), lowered here: seconds to a minute."""
    texts = program.lowered_texts(cell.config, len(cell.runs))
    return hashlib.sha256(" ".join(fingerprint.module_digest(t) for t in texts).encode()).hexdigest()[:16]


def combine(cell: Cell, program_part: str, inputs_part: str) -> str:
    """The cell's key from its parts."""
    text = f"{cell.fingerprint()}\0{program_part}\0{inputs_part}"
    return PREFIX + hashlib.sha256(text.encode()).hexdigest()[:16]


def is_current(key) -> bool:
    """Is `key` of this scheme (else it cannot be compared with one)?"""
    return isinstance(key, str) and key.startswith(PREFIX)


def _builtin(cell: Cell) -> bool:
    return algorithms.is_builtin(algorithms.parse(cell.config.algo).objective)


def _cache_path(cell: Cell) -> Path:
    return cache.user_dir(f"program-keys-v{SCHEME}") / f"{code_digest()}-{cell.fingerprint()}"


def _cached(cell: Cell) -> str | None:
    try:
        return _cache_path(cell).read_text().strip() or None
    except OSError:
        return None


def program_parts(cells: Iterable[Cell], recorded: dict | None = None, *,
                  log: Callable[[str], None] | None = None) -> dict[str, str]:
    """Each cell's program part, by cell id. Taken from `recorded` (a result's `cells` record)
    when it was made with this checkout's code digest, else from the per-user cache, else lowered
    here (saying so, with progress, through `log`). A user objective's cells (whose code is not in
    the code digest) are always lowered."""
    recorded = recorded or {}
    same_code = recorded.get("code") == code_digest()
    out, todo = {}, []
    for cell in cells:
        builtin = _builtin(cell)
        part = (recorded.get("cells", {}).get(cell.cell_id) or {}).get("program")
        part = (part if same_code and part else _cached(cell)) if builtin else None
        if part:
            out[cell.cell_id] = part
        else:
            todo.append((cell, builtin))
    start = time.perf_counter()
    for n, (cell, builtin) in enumerate(todo, 1):
        if log is not None:
            log(f"  lowering cell {n}/{len(todo)} {cell.cell_id} to key what it computes "
                f"({time.perf_counter() - start:.0f} s so far; kept for this code in "
                f"{_cache_path(cell).parent})")
        out[cell.cell_id] = program_digest(cell)
        if builtin:
            try:
                io.write_bytes_atomic(_cache_path(cell), out[cell.cell_id].encode())
            except OSError:   # a read-only cache costs only time
                pass
    return out


def cell_records(cells: list[Cell], recorded: dict | None = None, *,
                 log: Callable[[str], None] | None = None) -> dict[str, dict]:
    """Each cell's key and its parts: `{cell_id: {"key", "program", "inputs"}}`."""
    programs = program_parts(cells, recorded, log=log)
    out = {}
    for cell in cells:
        inputs = inputs_digest(cell)
        out[cell.cell_id] = {"key": combine(cell, programs[cell.cell_id], inputs),
                             "program": programs[cell.cell_id], "inputs": inputs}
    return out


def cell_key(cell: Cell, *, log: Callable[[str], None] | None = None) -> str:
    """One cell's key (lowered here unless cached)."""
    return cell_records([cell], log=log)[cell.cell_id]["key"]
