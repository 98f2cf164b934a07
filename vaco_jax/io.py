"""Writing results safely: atomic JSON files, append-only JSONL, and run provenance."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import secrets
import subprocess
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
    """Append rows, one JSON object per line, each written whole and flushed to disk."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = _jsonl(rows)
    with open(path, "a") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path) -> list[dict]:
    """Rows of a JSONL file; a torn last line (a crash mid-write) is ignored."""
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return rows


# The code this process runs: its source and commit now, not when a result is written hours later.
source_hash()
git_commit()
