"""Writing results safely: atomic JSON files, append-only JSONL, compact JSONL tables, and run
provenance.

A JSONL table (`results.jsonl`) is appended to line by line while it is written; `compact_jsonl`
moves its rows into Parquet beside it (`results.parquet`), every value exactly as written, and
`read_rows` reads the table in either form or both (the compact rows first, then the lines
appended since). Tables compacted by earlier versions (gzip'd JSONL, `results.jsonl.gz`) are read
too, and folded into the Parquet file when compacted."""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import heapq
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


def portable_path(path) -> str:
    """`path` as a result or a log records it: never this machine's absolute location. Inside the
    checkout (or installation) that holds `vaco_jax`, relative to it (`vaco_jax/llm/...`,
    `results/...`); else relative to the working directory when inside it; else under the home
    directory as `~/...`. A path outside all three is kept as given."""
    path = Path(path)
    if not path.is_absolute():
        return path.as_posix()
    resolved = path.resolve()
    for base in (Path(__file__).resolve().parent.parent, Path.cwd().resolve()):
        if resolved.is_relative_to(base):
            return resolved.relative_to(base).as_posix() or "."
    home = Path.home().resolve()
    if resolved.is_relative_to(home):
        return "~/" + resolved.relative_to(home).as_posix()
    return str(path)


def provenance() -> dict[str, Any]:
    """Library versions, device, Python and git commit: what a result needs to be reproduced.

    `host` names the CPU too (its model, its `cpu_id` and `host_tag`, a hash of the model and its
    feature flags): XLA compiles differently for different instruction sets, so two CPUs can give
    different numbers from the same seed. A virtual machine may report a coarse model name ("AMD
    EPYC"); `cpu_id` (vendor, family, model and stepping) still tells its generations apart."""
    import jax

    device = jax.devices()[0]
    return {
        "versions": library_versions(),
        "python": platform.python_version(),
        "device": {"platform": device.platform, "kind": device.device_kind,
                   "count": jax.device_count()},
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "cpu": cpu_model(), "cpu_id": cpu_id(), "cpu_tag": host_tag()},
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


def cpu_seconds(stat: str = "/proc/stat") -> tuple[float, float] | None:
    """(the CPU seconds every process on this machine has been busy since boot, this process's
    own, all its threads): the difference of two readings says what other processes used in
    between (`others_cpu_seconds`). None where `stat` (Linux `/proc/stat`) cannot be read."""
    try:
        with open(stat) as file:
            fields = file.readline().split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
    except (OSError, ValueError):
        return None
    own = os.times()
    busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    return busy, own.user + own.system


def others_cpu_seconds(since: tuple[float, float] | None) -> float | None:
    """The CPU seconds that other processes (this one's children too) used since the reading
    `since` (`cpu_seconds`): near 0 on a quiet machine. None without both readings."""
    now = cpu_seconds()
    if since is None or now is None:
        return None
    return round(max(0.0, (now[0] - since[0]) - (now[1] - since[1])), 2)


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The host CPU's model name (Linux `/proc/cpuinfo`; elsewhere what `platform` reports)."""
    lines = _cpuinfo_lines(cpuinfo, ("model name", "Model", "Hardware"))
    return (lines[0].partition(":")[2].strip() if lines else platform.processor()) or "unknown"


def cpu_id(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The host CPU's identification, as its first processor in Linux `/proc/cpuinfo` gives it:
    x86 `vendor_id`, `cpu family`, `model` and `stepping` ("AuthenticAMD family 25 model 17
    stepping 1"); Arm `CPU implementer`, `part`, `variant` and `revision`. It names the
    generation where `cpu_model` is coarse. "unknown" where there is no such file (macOS,
    Windows: `cpu_model` names the CPU there)."""
    fields = {}
    try:
        with open(cpuinfo) as file:
            for line in file:
                if not line.strip():
                    if fields:
                        break   # the first processor's block is enough
                    continue
                name, _, value = line.partition(":")
                fields.setdefault(name.strip(), value.strip())
    except OSError:
        return "unknown"
    x86 = ("vendor_id", "cpu family", "model", "stepping")
    arm = ("CPU implementer", "CPU part", "CPU variant", "CPU revision")
    if "cpu family" in fields:
        return " ".join([fields.get("vendor_id", "?")] + [
            f"{name.removeprefix('cpu ')} {fields[name]}" for name in x86[1:] if name in fields])
    if "CPU implementer" in fields:
        return " ".join(f"{name.removeprefix('CPU ')} {fields[name]}" for name in arm
                        if name in fields)
    return "unknown"


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


def write_json_atomic(path, data, *, compact: bool = False) -> None:
    """Write JSON so that `path` holds either the old or the new content, never half of one;
    indented for reading, or without whitespace (`compact`) for a file only programs read."""
    text = (json.dumps(to_jsonable(data), separators=(",", ":")) if compact
            else json.dumps(to_jsonable(data), indent=2))
    write_bytes_atomic(path, text.encode())


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


# --- compact result tables -----------------------------------------------------------------------
# A compact table is one Parquet file: a column per key, in the rows' key order. `_ROWS_METADATA`
# (JSON in the file's key-value metadata) says how each column reads back as the values written.
_ROWS_METADATA = b"vaco_jax.rows"
_MISSING = object()   # a key a row does not have


def compact_path(path) -> Path:
    """Where the rows of the JSONL table `path` go when compacted: Parquet beside it
    (`results.jsonl` → `results.parquet`)."""
    path = Path(path)
    return path.with_suffix(".parquet") if path.suffix == ".jsonl" else path.with_name(
        path.name + ".parquet")


def legacy_path(path) -> Path:
    """The compact form earlier versions wrote, gzip'd JSONL (`results.jsonl.gz`): still read, and
    folded into the Parquet file when the table is compacted."""
    path = Path(path)
    return path.with_name(path.name + ".gz")


def has_rows(path) -> bool:
    """Whether the JSONL table `path` exists, in any form."""
    path = Path(path)
    return any(p.exists() for p in (path, compact_path(path), legacy_path(path)))


def read_rows(path) -> list[dict]:
    """The rows of the JSONL table `path` (e.g. `results.jsonl`), in the order they were written:
    those of its compact form (`results.parquet`; gzip'd JSONL `path.gz` from earlier versions),
    then those appended to `path` since. Each row is the dict written: its keys in order, and its
    values with their JSON types (int, float bit for bit, NaN, bool, str, None, lists, dicts).
    Every reader of a result table reads it through here."""
    path, packed, legacy = Path(path), compact_path(path), legacy_path(path)
    if not has_rows(path):
        raise FileNotFoundError(f"no rows at {path} (nor {packed.name})")
    rows, absorbed = _read_packed(packed) if packed.exists() else ([], {})
    if legacy.exists():
        data = legacy.read_bytes()
        if _digest(data) == absorbed.get("gz"):
            _warn_absorbed(legacy, packed)
        else:
            rows += _legacy_rows(data)
    if path.exists():
        holder = _holder(path, absorbed, packed, legacy)
        if holder:
            _warn_absorbed(path, holder)
        else:
            rows += read_jsonl(path)
    return rows


def remove_rows(path) -> None:
    """Delete the JSONL table `path` in every form."""
    path = Path(path)
    for each in (path, compact_path(path), legacy_path(path)):
        each.unlink(missing_ok=True)


def compact_jsonl(path) -> int:
    """Move the rows of the JSONL file `path` (and of a gzip'd `path.gz` an earlier version wrote)
    into the Parquet file `compact_path(path)`; returns how many rows moved.

    The Parquet file is rewritten whole (its earlier rows, then the new ones), atomically, and
    read back before anything is removed; it records a SHA-256 of each file it took rows from.
    Then `path.gz` and `path` are removed. So a crash at any point loses no row: before the
    Parquet file is replaced every file is as it was; after it, `read_rows` skips the files whose
    digest it recorded, and compacting again removes them. Lines that are not whole rows (a torn
    write) are left out. Appending to `path` meanwhile is the caller's to prevent (a sweep
    compacts under its directory's lock)."""
    path, packed, legacy = Path(path), compact_path(path), legacy_path(path)
    finish_compaction(path)
    if not path.exists() and not legacy.exists():
        return 0
    new, absorbing = [], {}
    if legacy.exists():
        data = legacy.read_bytes()
        new += _legacy_rows(data)
        absorbing["gz"] = _digest(data)
    if path.exists():
        data = path.read_bytes()
        new += [json.loads(line) for line in _whole_lines(data)]
        absorbing["jsonl"] = _digest(data)
    if new or legacy.exists():
        rows = (_read_packed(packed)[0] if packed.exists() else []) + new
        data = _encode_rows(rows, absorbing)
        if not _same_rows(_decode_rows(data)[0], rows):   # what was written reads back
            raise OSError(f"compacting {path}: the rows written to {packed.name} do not read "
                          f"back as they were")
        write_bytes_atomic(packed, data)
    for each in (legacy, path):
        if each.exists():
            each.unlink()
    return len(new)


def finish_compaction(path) -> None:
    """Remove `path` (and `path.gz`) when a `compact_jsonl` stopped after moving their rows into
    the compact file: called before appending to a table that may have been compacted, so those
    rows never count twice."""
    path, packed, legacy = Path(path), compact_path(path), legacy_path(path)
    absorbed = _absorbed(packed) if packed.exists() else {}
    if path.exists() and _holder(path, absorbed, packed, legacy):
        path.unlink()   # first: whether legacy holds its rows is read from legacy
    if legacy.exists() and _digest(legacy.read_bytes()) == absorbed.get("gz"):
        legacy.unlink()


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _warn_absorbed(source: Path, holder: Path) -> None:
    warnings.warn(f"{source}: skipped, its rows already in {holder.name} (a compaction stopped "
                  f"before removing it; compacting again removes it)", stacklevel=3)


def _holder(path: Path, absorbed: dict, packed: Path, legacy: Path) -> Path | None:
    """The compact file that already holds the rows of the JSONL file `path`, if one does: the
    Parquet file recorded its digest, or an earlier version's compaction into `legacy` stopped
    before removing it (`legacy`'s last gzip member holds exactly its whole lines)."""
    if absorbed.get("jsonl") == _digest(path.read_bytes()):
        return packed
    if legacy.exists() and _compacted_into_legacy(path, legacy):
        return legacy
    return None


def _legacy_rows(data: bytes) -> list[dict]:
    """The rows of gzip'd JSONL (written whole and atomically: every line is a row)."""
    return [json.loads(line) for line in gzip.decompress(data).splitlines()]


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


def _compacted_into_legacy(path: Path, legacy: Path) -> bool:
    """Whether `legacy`'s last gzip member holds exactly `path`'s whole lines (an earlier version's
    compaction stopped between writing `legacy` and removing `path`): read from the gzip trailer,
    the member's CRC-32 and length."""
    lines = b"".join(_whole_lines(path.read_bytes()))
    with open(legacy, "rb") as f:
        if not lines or f.seek(0, os.SEEK_END) < 8:
            return False
        f.seek(-8, os.SEEK_END)
        trailer = f.read(8)
    return trailer == zlib.crc32(lines).to_bytes(4, "little") + (len(lines) % 2**32).to_bytes(4, "little")


def _same_rows(a: list[dict], b: list[dict]) -> bool:
    """Whether two lists of rows are the same JSON: keys in the same order, values of the same JSON
    types, floats bit for bit (NaN equals NaN, -0.0 differs from 0.0)."""
    return json.dumps(a) == json.dumps(b)


# --- rows <-> Parquet ----------------------------------------------------------------------------
def _encode_rows(rows: list[dict], absorbed: dict[str, str]) -> bytes:
    """Parquet bytes (zstd) holding `rows`, which `_decode_rows` reads back exactly.

    A column per key, in an order every row's keys follow where one exists (a row that does not
    has its own order stored). A column's values keep their type: bool, int64, float64, string,
    lists of one of these, else JSON text; floats go in as float32 where every value of the column
    is a float32 exactly (results are float32 arrays' values), which halves their size. A key
    missing from some rows gets a boolean column saying which rows have it. zstd level 19."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    order, follows = _key_order(rows)
    names = set(order)

    def fresh(name: str) -> str:   # a column name no key and no other column has
        while name in names:
            name += "_"
        names.add(name)
        return name

    columns, specs = {}, []
    for key in order:
        values = [row.get(key, _MISSING) for row in rows]
        present = [value is not _MISSING for value in values]
        values = [None if value is _MISSING else value for value in values]
        kind, columns[key] = _column(values)
        spec = {"key": key, "kind": kind}
        if not all(present):
            spec["present"] = fresh(f"{key}.present")
            columns[spec["present"]] = pa.array(present, pa.bool_())
        specs.append(spec)
    own_order = None
    if not all(follows.values()):
        own_order = fresh("key_order")
        columns[own_order] = pa.array(
            [None if follows[tuple(row)] else json.dumps(list(row)) for row in rows], pa.string())
    metadata = {"version": 1, "rows": len(rows), "columns": specs, "key_order": own_order,
                "absorbed": absorbed}
    table = pa.table(columns).replace_schema_metadata({_ROWS_METADATA: json.dumps(metadata)})
    leaves = {f"{field.name}.list.element" if pa.types.is_list(field.type) else field.name:
              field.type.value_type if pa.types.is_list(field.type) else field.type
              for field in table.schema}
    floats = [name for name, arrow in leaves.items() if pa.types.is_floating(arrow)]
    sink = pa.BufferOutputStream()
    # Floats compress best as byte streams (sign and exponent bytes repeat), not as a dictionary:
    # about a third smaller.
    pq.write_table(table, sink, compression="zstd", compression_level=19,
                   use_dictionary=[name for name in leaves if name not in floats],
                   use_byte_stream_split=floats)
    return sink.getvalue().to_pybytes()


def _column(values: list):
    """("json" or "value", pyarrow array) for one key's values, None where a row has none or
    lacks the key: a bool, int64, float32, float64 or string column, or lists of one of these,
    where every value has that type; else JSON text."""
    import pyarrow as pa

    given = [value for value in values if value is not None]
    listed = {type(value) for value in given} == {list}
    items = [item for value in given for item in value] if listed else given
    types = {type(item) for item in items}
    arrow = None
    if types == {float}:
        arrow = pa.float32() if _float32_exact(items) else pa.float64()
    elif types == {int} and all(-2**63 <= item < 2**63 for item in items):
        arrow = pa.int64()
    elif types in ({bool}, {str}):
        arrow = pa.bool_() if types == {bool} else pa.string()
    if arrow is not None:
        try:
            return "value", pa.array(values, pa.list_(arrow) if listed else arrow)
        except (pa.ArrowException, ValueError, TypeError):   # e.g. a str not encodable as UTF-8
            pass
    return "json", pa.array([None if v is None else json.dumps(v) for v in values], pa.string())


def _float32_exact(floats: list[float]) -> bool:
    """Whether every float is a float32 exactly (NaN and ±inf included)."""
    values = np.asarray(floats, np.float64)
    with np.errstate(over="ignore"):
        back = values.astype(np.float32).astype(np.float64)
    return bool(np.array_equal(back.view(np.uint64), values.view(np.uint64)))


def _key_order(rows: list[dict]) -> tuple[list[str], dict[tuple, bool]]:
    """One order of every key that each row's keys follow where possible (keys first seen first
    among those free to go next), and, for each distinct key sequence, whether it follows it."""
    sequences = dict.fromkeys(tuple(row) for row in rows)
    first = {}
    for sequence in sequences:
        for key in sequence:
            first.setdefault(key, len(first))
    after = {key: set() for key in first}
    for sequence in sequences:
        for a, b in zip(sequence, sequence[1:]):
            after[a].add(b)
    waiting = {key: 0 for key in first}
    for a in after:
        for b in after[a]:
            waiting[b] += 1
    ready = [(first[key], key) for key in first if not waiting[key]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, key = heapq.heappop(ready)
        order.append(key)
        for b in after[key]:
            waiting[b] -= 1
            if not waiting[b]:
                heapq.heappush(ready, (first[b], b))
    order += sorted(set(first) - set(order), key=first.get)   # keys on a cycle: first seen first
    position = {key: i for i, key in enumerate(order)}
    return order, {s: all(position[a] < position[b] for a, b in zip(s, s[1:])) for s in sequences}


def _absorbed(packed: Path) -> dict[str, str]:
    """The digests of the files whose rows the Parquet file `packed` took in when it was written."""
    import pyarrow.parquet as pq

    return json.loads(pq.read_schema(packed).metadata[_ROWS_METADATA])["absorbed"]


def _read_packed(packed: Path) -> tuple[list[dict], dict[str, str]]:
    """`_decode_rows` of the Parquet file `packed`; one that cannot be read (cut short by a full
    disk or an interrupted copy) is refused with its name and what to do (`SweepError`)."""
    from vaco_jax.errors import SweepError

    try:
        return _decode_rows(packed.read_bytes())
    except Exception as error:  # noqa: BLE001 -- pyarrow's errors, or a file not ours
        raise SweepError(
            f"{packed} cannot be read ({type(error).__name__}: {error}): the file is damaged "
            f"(e.g. cut short). Restore it from a copy (a committed one: `git restore "
            f"{packed}`); without one, its rows are lost: move its directory aside and run the "
            f"command again, which runs those cells again") from None


def _decode_rows(data: bytes) -> tuple[list[dict], dict[str, str]]:
    """The rows `_encode_rows` wrote, and the digests of the files they were taken from."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(pa.BufferReader(data))
    metadata = json.loads(table.schema.metadata[_ROWS_METADATA])
    if not metadata["columns"]:
        return [{} for _ in range(metadata["rows"])], metadata["absorbed"]
    keys, columns, incomplete = [], [], np.zeros(metadata["rows"], bool)
    for spec in metadata["columns"]:
        values = _values(table.column(spec["key"]), spec["kind"])
        if "present" in spec:
            present = table.column(spec["present"]).to_numpy()
            values = [value if there else _MISSING for value, there in zip(values, present)]
            incomplete |= ~present
        keys.append(spec["key"])
        columns.append(values)
    rows = [dict(zip(keys, values)) for values in zip(*columns)]
    for i in np.flatnonzero(incomplete):
        rows[i] = {key: value for key, value in rows[i].items() if value is not _MISSING}
    if metadata["key_order"]:
        for i, own in enumerate(table.column(metadata["key_order"]).to_pylist()):
            if own is not None:
                rows[i] = {key: rows[i][key] for key in json.loads(own)}
    return rows, metadata["absorbed"]


def _values(column, kind: str) -> list:
    """A column's values as the Python values written (None where null)."""
    import pyarrow as pa

    if kind == "json":
        return [None if text is None else json.loads(text) for text in column.to_pylist()]
    if not column.null_count and (pa.types.is_boolean(column.type) or pa.types.is_integer(
            column.type) or pa.types.is_floating(column.type)):
        return column.to_numpy().tolist()   # faster than to_pylist; the same Python values
    return column.to_pylist()


# The code this process runs: its source and commit now, not when a result is written hours later.
source_hash()
git_commit()
