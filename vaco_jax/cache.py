"""Per-user caches, in one place: `$VACO_JAX_CACHE_DIR`, else `$XDG_CACHE_HOME/vaco_jax`, else
`~/.cache/vaco_jax`. Nothing in them is a result: deleting the directory only costs time.

    xla/<host>/  JAX's persistent compilation cache: a second identical run (CLI, sweep cell,
           notebook) loads its compiled programs instead of compiling them (bounded by
           `COMPILE_CACHE_BYTES`). One subdirectory per kind of host CPU (`host_tag`): XLA's CPU
           programs are compiled for the CPU's instruction-set extensions, and a home directory
           shared by different cluster nodes must not hand one node's programs to another.
    llm/   LLM warm-start parameters, keyed by a hash of the model, task and SFT config
"""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path

import jax

COMPILE_CACHE_BYTES = 4 << 30   # least recently used entries are evicted beyond this


def user_dir(kind: str = "") -> Path:
    """The per-user cache directory (or its `kind` subdirectory); not created here."""
    root = os.environ.get("VACO_JAX_CACHE_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        root = Path(base) / "vaco_jax"
    return Path(root) / kind if kind else Path(root)


def host_tag(cpuinfo: str = "/proc/cpuinfo") -> str:
    """A short name for this kind of host CPU: the architecture and a hash of the CPU model and its
    feature flags (Linux `/proc/cpuinfo`; elsewhere what `platform` reports)."""
    description = platform.processor()
    try:
        with open(cpuinfo) as file:
            lines = [line for line in file if line.startswith(("model name", "flags", "Features"))]
        description = "".join(sorted(set(lines))) or description
    except OSError:
        pass
    return f"{platform.machine()}-{hashlib.sha256(description.encode()).hexdigest()[:12]}"


def enable_compile_cache(setting: str = "default") -> Path | None:
    """Turn on JAX's persistent compilation cache; returns its directory (None when off).

    `default`: the directory JAX is already configured with (`JAX_COMPILATION_CACHE_DIR`), else
    `user_dir("xla") / host_tag()`; `off`: leave it off; anything else: that directory.
    """
    if setting == "off":
        return None
    if setting == "default" and jax.config.jax_compilation_cache_dir:
        return Path(jax.config.jax_compilation_cache_dir)   # configured through JAX: as it is
    path = user_dir("xla") / host_tag() if setting == "default" else Path(setting).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    if jax.config.jax_compilation_cache_max_size < 0:
        jax.config.update("jax_compilation_cache_max_size", COMPILE_CACHE_BYTES)
    return path
