"""Per-user caches, in one place: `$VACO_JAX_CACHE_DIR`, else `$XDG_CACHE_HOME/vaco_jax`, else
`~/.cache/vaco_jax`. Nothing in them is a result: deleting the directory only costs time.

    xla/<host>/  JAX's persistent compilation cache: a second identical run (CLI, sweep cell,
           notebook) loads its compiled programs instead of compiling them (bounded by
           `COMPILE_CACHE_BYTES`). One subdirectory per kind of host CPU (`host_tag`): XLA's CPU
           programs are compiled for the CPU's instruction-set extensions, and a home directory
           shared by different cluster nodes must not hand one node's programs to another.
           On by default: the commands turn it on first thing (`--compile-cache`), and building
           a `Trainer` (`make_train`, `vaco_jax.run`) or an LLM `GRPO` does when nothing chose
           before (`default_compile_cache`); `VACO_JAX_COMPILE_CACHE=off` or a call
           `enable_compile_cache("off")` keeps it off.
    llm/   LLM warm-start parameters trained on this machine, keyed by a hash of the model, task
           and SFT config, the contents of the data files they name and the source of the code
           that makes the data and trains on it (`vaco_jax.llm.sft.cache_key`); the presets'
           shipped warm starts are in the package (`vaco_jax/llm/warm_starts/`), not here

Beside JAX's compilation cache, in its `programs/` subdirectory, `ProgramStore` keeps the MuJoCo
trainer's compiled programs whole, keyed by everything they are built from (`program_key`): JAX's
cache still traces and lowers a program before it can look it up (most of a warm start's time);
a stored program is loaded without either.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
from pathlib import Path

import jax
from jax.experimental import serialize_executable

from vaco_jax import io
from vaco_jax.errors import ConfigError
from vaco_jax.io import host_tag

COMPILE_CACHE_BYTES = 4 << 30   # least recently used entries are evicted beyond this
PROGRAM_STORE_BYTES = 1 << 30   # the same for `ProgramStore`


def user_dir(kind: str = "") -> Path:
    """The per-user cache directory (or its `kind` subdirectory); not created here."""
    root = os.environ.get("VACO_JAX_CACHE_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        root = Path(base) / "vaco_jax"
    return Path(root) / kind if kind else Path(root)


# `off` keeps vaco_jax from turning the compilation cache on, in the commands and from Python.
COMPILE_CACHE_VARIABLE = "VACO_JAX_COMPILE_CACHE"
# Whether this process chose its compilation cache (a call of `enable_compile_cache`). Set once,
# never unset: a trainer's programs are fingerprinted with it (`Trainer.__init__` calls
# `default_compile_cache`), and it is True whenever a program is kept (`ProgramStore`).
_chosen = False


def enable_compile_cache(setting: str = "default") -> Path | None:
    """Turn on JAX's persistent compilation cache; returns its directory (None when off).

    `default`: off when `$VACO_JAX_COMPILE_CACHE` is `off`; else the directory JAX is already
    configured with (`JAX_COMPILATION_CACHE_DIR`, `jax.config`), kept as it is; else
    `user_dir("xla") / host_tag()`. `off`: leave it off (JAX's own settings stand); anything
    else: that directory. The first call decides for the process: a `Trainer` built after it
    leaves the cache as it is (`default_compile_cache`).
    """
    global _chosen
    _chosen = True
    if setting == "default":
        setting = _default_setting()
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


def default_compile_cache(setting: str = "default") -> None:
    """What building a `Trainer` (`make_train`) or an LLM `GRPO` does first, and `vaco_jax.run`
    with its `Options.compile_cache`: `enable_compile_cache(setting)`, unless this process chose
    already (a call of `enable_compile_cache`: a command's `--compile-cache`, or yours, `"off"`
    included: JAX reads the directory once, at its first compilation with one) or JAX's persistent
    cache is switched off (`jax_enable_compilation_cache`)."""
    if not _chosen and jax.config.jax_enable_compilation_cache:
        enable_compile_cache(setting)


def _default_setting() -> str:
    value = os.environ.get(COMPILE_CACHE_VARIABLE, "") or "default"
    if value not in ("default", "off"):
        raise ConfigError(f"environment variable {COMPILE_CACHE_VARIABLE}={value!r} is invalid: "
                          f"'off' keeps vaco_jax from turning the compilation cache on, 'default' "
                          f"(or unset) lets it; JAX_COMPILATION_CACHE_DIR chooses the directory")
    return value


# JAX settings that change what a traced program computes (the key of a stored program holds them).
TRACE_SETTINGS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_default_prng_impl",
                  "jax_threefry_partitionable", "jax_debug_nans", "jax_debug_infs")


def program_key(*parts) -> str:
    """A hash of `parts` (reprs of what a program is built from: its static config, placement, and
    the fingerprint of the code, env and algorithm it is traced from, `program.traced_from`) and
    of everything else it depends on: this package's source, the library versions, the JAX
    settings above, `XLA_FLAGS` and the kind of host CPU."""
    context = (io.source_hash(), io.library_versions(), host_tag(), os.environ.get("XLA_FLAGS", ""),
               [(name, getattr(jax.config, name, None)) for name in TRACE_SETTINGS])
    return hashlib.sha256(repr((parts, context)).encode()).hexdigest()[:24]


_XLA_CACHE_HIT = "/jax/compilation_cache/cache_hits"
_xla_cache_hits: list[int] = []   # [count] once counting


def _count_xla_cache_hit(event: str, **_) -> None:
    if event == _XLA_CACHE_HIT:
        _xla_cache_hits[0] += 1


def xla_cache_hits() -> int:
    """Programs loaded from JAX's compilation cache in this process since the first call."""
    if not _xla_cache_hits:
        _xla_cache_hits.append(0)
        jax.monitoring.register_event_listener(_count_xla_cache_hit)
    return _xla_cache_hits[0]


def _prepare_lapack() -> None:
    """Set up jaxlib's CPU LAPACK kernels (Cholesky, LU, ...), as lowering a linear-algebra op does.

    jaxlib fills in its LAPACK function pointers only when such an op is lowered in the process; a
    program loaded whole lowers nothing, and its first LAPACK call (MJX's Newton solver factorises
    with Cholesky) jumps to a null pointer: a segmentation fault. This happened when a process's
    first program came from the store without an init program being traced (resuming a saved run
    of a DM Control task). Lowering one tiny Cholesky here costs milliseconds, once per process."""
    if not _lapack_ready:
        import jax.numpy as jnp

        cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
        jax.jit(jnp.linalg.cholesky).lower(jax.ShapeDtypeStruct((1, 1), jnp.float32, sharding=cpu))
        _lapack_ready.append(True)


_lapack_ready: list[bool] = []


@dataclasses.dataclass(frozen=True)
class ProgramStore:
    """Compiled programs on disk (`jax.experimental.serialize_executable`), one file per
    `(key, name)`: what `load` returns runs exactly as the program that was saved. A file that
    cannot be read is removed and reported as missing (the caller compiles again); beyond
    `max_bytes` the least recently used files are removed."""

    directory: Path
    max_bytes: int = PROGRAM_STORE_BYTES

    def __post_init__(self):
        object.__setattr__(self, "directory", Path(self.directory))

    @classmethod
    def default(cls) -> "ProgramStore | None":
        """The store beside JAX's compilation cache: none when that cache is off, and none in a
        multi-process run (each process would load its own copy of a program compiled for all)."""
        directory = jax.config.jax_compilation_cache_dir
        if (not directory or not jax.config.jax_enable_compilation_cache
                or jax.process_count() > 1 or jax.config.jax_disable_jit):
            return None
        return cls(Path(directory) / "programs")

    def _path(self, key: str, name: str) -> Path:
        return self.directory / f"{key}-{name}.program"

    def load(self, key: str, name: str):
        """The `jax.stages.Compiled` saved as `(key, name)`, or None."""
        path = self._path(key, name)
        try:
            payload = path.read_bytes()
        except OSError:
            return None
        _prepare_lapack()
        try:
            compiled = serialize_executable.deserialize_and_load(*pickle.loads(payload))
        except Exception:  # noqa: BLE001 -- unreadable (truncated, other jaxlib): compile again
            path.unlink(missing_ok=True)
            return None
        os.utime(path)   # recently used
        return compiled

    def save(self, key: str, name: str, compiled) -> bool:
        """Keep `compiled` as `(key, name)`; False when this program cannot be serialised. Only
        for programs compiled in this process: with this jaxlib, serialising one that was loaded
        from JAX's compilation cache writes a program that cannot run, and breaks the one loaded."""
        try:
            payload = pickle.dumps(serialize_executable.serialize(compiled))
        except (ValueError, NotImplementedError, TypeError, pickle.PicklingError):
            return False
        io.write_bytes_atomic(self._path(key, name), payload)
        self._evict()
        return True

    def _evict(self) -> None:
        files = sorted(self.directory.glob("*.program"), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
        for path in files[:-1]:   # never the newest
            if total <= self.max_bytes:
                break
            total -= path.stat().st_size
            path.unlink(missing_ok=True)
