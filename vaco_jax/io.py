"""Writing results safely: atomic JSON files, append-only JSONL, compact JSONL tables, and run
provenance.

A JSONL table (`results.jsonl`) is appended to line by line while it is written; `compact_jsonl`
moves its rows into gzip'd JSONL beside it (`results.jsonl.gz`, ~8× smaller), and `read_rows`
reads the table in either form or both (the compact rows first, then the lines appended since)."""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import secrets
import subprocess
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np

LIBRARIES = ("vaco_jax", "jax", "jaxlib", "flax", "optax", "chex", "distrax", "rlax", "rliable",
             "brax", "mujoco", "mujoco-mjx", "playground", "gymnax", "orbax-checkpoint", "numpy")


def library_versions() -> dict[str, str]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def provenance() -> dict[str, Any]:
    """Library versions, device, Python and git commit: what a result needs to be reproduced.

    `host` names the CPU too (its model and `host_tag`, a hash of the model and its feature
    flags): XLA compiles differently for different instruction sets, so two CPUs can give
    different numbers from the same seed."""
    import jax

    device = jax.devices()[0]
    return {
        "versions": library_versions(),
        "python": platform.python_version(),
        "device": {"platform": device.platform, "kind": device.device_kind,
                   "count": jax.device_count()},
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "cpu": cpu_model(), "cpu_tag": host_tag()},
        "git_commit": git_commit(),
        "source": source_hash(),
    }


def _cpuinfo_lines(cpuinfo: str, prefixes: tuple[str, ...]) -> list[str]:
    """The lines of Linux `/proc/cpuinfo` (`cpuinfo`) that start with `prefixes`; [] elsewhere."""
    try:
        with open(cpuinfo) as file:
            return [line for line in file if line.startswith(prefixes)]
    except OSError:
        return []


def host_tag(cpuinfo: str = "/proc/cpuinfo") -> str:
    """A short name for this kind of host CPU: the architecture and a hash of the CPU model and its
    feature flags (Linux `/proc/cpuinfo`; elsewhere what `platform` reports)."""
    lines = _cpuinfo_lines(cpuinfo, ("model name", "flags", "Features"))
    description = "".join(sorted(set(lines))) or platform.processor()
    return f"{platform.machine()}-{hashlib.sha256(description.encode()).hexdigest()[:12]}"


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The host CPU's model name (Linux `/proc/cpuinfo`; elsewhere what `platform` reports)."""
    lines = _cpuinfo_lines(cpuinfo, ("model name", "Model", "Hardware"))
    return (lines[0].partition(":")[2].strip() if lines else platform.processor()) or "unknown"


@functools.cache
def source_hash() -> str:
    """SHA-256 (16 hex digits) of the package's source files: the code that made a result, also
    without git and with uncommitted changes. Read once, when this module is imported (with the
    rest of the package): files edited while a long sweep runs are not the code it runs."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@functools.cache
def git_commit() -> str | None:
    """HEAD when this module was imported (see `source_hash`)."""
    try:
        root = Path(__file__).resolve().parent.parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def leaf_names(tree) -> list[str]:
    """The name of every leaf of `tree`, in `jax.tree.leaves` order: its pytree path with `/`
    between dict keys, dataclass fields and sequence indices (`params/actor/Dense_0/kernel`)."""
    import jax

    def name(entry) -> str:
        for attribute in ("key", "name", "idx"):
            if hasattr(entry, attribute):
                return str(getattr(entry, attribute))
        return str(entry)

    paths, _ = jax.tree_util.tree_flatten_with_path(tree)
    return ["/".join(name(entry) for entry in path) for path, _ in paths]


def to_jsonable(value):
    """Arrays → lists, numpy scalars → Python numbers, non-finite floats → None (valid JSON)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "__array__"):
        value = np.asarray(value)
        return to_jsonable(value.tolist()) if value.ndim else to_jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return to_jsonable(value.item())
    return value


def write_bytes_atomic(path, data: bytes) -> None:
    """Write `data` so that `path` holds either the old or the new content, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Created like any new file (0666 less the umask; mkstemp's would be private, 0600), so a
    # result stays readable by whoever can read its directory.
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path, data) -> None:
    """Write JSON so that `path` holds either the old or the new content, never half of one."""
    write_bytes_atomic(path, json.dumps(to_jsonable(data), indent=2).encode())


def _jsonl(rows) -> str:
    return "".join(json.dumps(to_jsonable(row)) + "\n" for row in rows)


def write_jsonl_atomic(path, rows) -> None:
    """Replace `path` with `rows`, one JSON object per line: the old or the new file, never half."""
    write_bytes_atomic(path, _jsonl(rows).encode())


def append_jsonl(path, rows) -> None:
    """Append rows, one JSON object per line, each written whole and flushed to disk. The first
    starts on a fresh line, so a line torn by a writer killed mid-write stays one unreadable line
    and takes no row written after it along."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = _jsonl(rows).encode()
    with open(path, "a+b") as f:   # appends go to the end wherever the file position is
        end = f.seek(0, os.SEEK_END)
        if end:
            f.seek(end - 1)
            if f.read(1) != b"\n":
                text = b"\n" + text
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path) -> list[dict]:
    """Rows of a JSONL file. A line that is not a whole JSON object (a write torn by a crash)
    costs only itself: it is skipped, with a warning that counts such lines."""
    rows, unreadable = [], 0
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:   # not JSON, or not UTF-8 (e.g. the zeros a crash can leave)
                row = None
            if isinstance(row, dict):
                rows.append(row)
            else:
                unreadable += 1
    if unreadable:
        warnings.warn(f"{path}: skipped {unreadable} unreadable line{'s' * (unreadable > 1)} (a "
                      f"write torn by a crash); read the {len(rows)} whole rows", stacklevel=2)
    return rows


# --- compact JSONL tables ------------------------------------------------------------------------
def compact_path(path) -> Path:
    """Where the rows of the JSONL table `path` go when compacted: `path` + `.gz`."""
    path = Path(path)
    return path.with_name(path.name + ".gz")


def has_rows(path) -> bool:
    """Whether the JSONL table `path` exists, in either form."""
    return Path(path).exists() or compact_path(path).exists()


def read_rows(path) -> list[dict]:
    """The rows of the JSONL table `path` (e.g. `results.jsonl`), in the order they were written:
    those of its compact form (`path.gz`), then those appended to `path` since. Every reader of a
    result table reads it through here."""
    path, packed = Path(path), compact_path(path)
    if not has_rows(path):
        raise FileNotFoundError(f"no rows at {path} (nor {packed.name})")
    # Written whole and atomically (`compact_jsonl`): every line is a row.
    rows = ([json.loads(line) for line in gzip.decompress(packed.read_bytes()).splitlines()]
            if packed.exists() else [])
    if path.exists():
        if packed.exists() and _compacted_already(path, packed):
            warnings.warn(f"{path}: skipped, its rows already in {packed.name} (a compaction "
                          f"stopped before removing it; compacting again removes it)", stacklevel=2)
        else:
            rows += read_jsonl(path)
    return rows


def remove_rows(path) -> None:
    """Delete the JSONL table `path` in both forms."""
    for each in (Path(path), compact_path(path)):
        each.unlink(missing_ok=True)


def compact_jsonl(path) -> int:
    """Move the rows of the JSONL file `path` into `path.gz`; returns how many moved.

    The rows go in as one new gzip member after those already there (the bytes of earlier rows
    are kept as they are), written atomically; `path` is removed only after. So a crash at any
    point loses no row: before `path.gz` is replaced, both files are as they were; after it,
    `read_rows` knows `path`'s rows are in `path.gz` (the last member's CRC-32 and length are
    theirs) and skips them, and compacting again removes `path`. Lines that are not whole rows
    (a torn write) are left out. Appending to `path` meanwhile is the caller's to prevent (a
    sweep compacts under its directory's lock)."""
    path, packed = Path(path), compact_path(path)
    finish_compaction(path)
    if not path.exists():
        return 0
    lines = _whole_lines(path.read_bytes())
    if lines:
        old = packed.read_bytes() if packed.exists() else b""
        new = old + gzip.compress(b"".join(lines), compresslevel=9, mtime=0)
        if gzip.decompress(new[len(old):]) != b"".join(lines):   # what was written reads back
            raise OSError(f"compacting {path}: the gzip'd rows do not read back")
        write_bytes_atomic(packed, new)
    path.unlink()
    return len(lines)


def finish_compaction(path) -> None:
    """Remove `path` when a `compact_jsonl` stopped after moving its rows into `path.gz`: called
    before appending to a table that may have been compacted, so those rows never count twice."""
    path, packed = Path(path), compact_path(path)
    if path.exists() and packed.exists() and _compacted_already(path, packed):
        path.unlink()


def _whole_lines(data: bytes) -> list[bytes]:
    """The lines of JSONL bytes that are whole JSON objects, each ending in a newline."""
    lines = []
    for line in data.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            lines.append(line + b"\n")
    return lines


def _compacted_already(path: Path, packed: Path) -> bool:
    """Whether `packed`'s last gzip member holds exactly `path`'s whole lines (`compact_jsonl`
    stopped between writing `packed` and removing `path`): read from the gzip trailer, the
    member's CRC-32 and length."""
    lines = b"".join(_whole_lines(path.read_bytes()))
    with open(packed, "rb") as f:
        if not lines or f.seek(0, os.SEEK_END) < 8:
            return False
        f.seek(-8, os.SEEK_END)
        trailer = f.read(8)
    return trailer == zlib.crc32(lines).to_bytes(4, "little") + (len(lines) % 2**32).to_bytes(4, "little")


# The code this process runs: its source and commit now, not when a result is written hours later.
source_hash()
git_commit()
