"""Results are never half-written: atomic files, append-only JSONL that survives a torn line."""

import gzip
import json
import math
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from vaco_jax import io


def test_write_json_atomic_round_trips_and_makes_non_finite_values_valid_json(tmp_path):
    path = tmp_path / "deep" / "summary.json"
    io.write_json_atomic(path, {"r": np.float32(1.5), "xs": np.arange(3), "bad": math.nan})
    assert json.loads(path.read_text()) == {"r": 1.5, "xs": [0, 1, 2], "bad": None}


def test_a_crash_before_the_rename_keeps_the_old_content_and_leaves_no_temporary(tmp_path,
                                                                                 monkeypatch):
    path = tmp_path / "summary.json"
    io.write_json_atomic(path, {"version": 1})

    def crash(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        io.write_json_atomic(path, {"version": 2})
    with pytest.raises(KeyboardInterrupt):
        io.write_bytes_atomic(path, b"garbage")
    assert json.loads(path.read_text()) == {"version": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_read_jsonl_ignores_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    io.append_jsonl(path, [{"step": 1}, {"step": 2}])
    with open(path, "a") as f:
        f.write('{"step": 3, "ret')            # a crash mid-write
    with pytest.warns(UserWarning, match="skipped 1 unreadable line"):
        assert io.read_jsonl(path) == [{"step": 1}, {"step": 2}]


def test_a_torn_line_costs_only_itself(tmp_path):
    """A writer killed mid-line, then others appending after it: every whole row is read."""
    path = tmp_path / "results.jsonl"
    io.append_jsonl(path, [{"step": 1}])
    with open(path, "a") as f:
        f.write('{"step": 2, "ret')            # a crash mid-write
    io.append_jsonl(path, [{"step": 3}, {"step": 4}])
    with open(path, "ab") as f:
        f.write(b'\x00\x00\x00\n{"step": 5}\n')   # a tail of zeros some file systems leave
    with pytest.warns(UserWarning, match="skipped 2 unreadable lines"):
        assert io.read_jsonl(path) == [{"step": 1}, {"step": 3}, {"step": 4}, {"step": 5}]


def test_every_append_starts_on_a_fresh_line(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"step": 1}')             # whole, but its newline never written
    io.append_jsonl(path, [{"step": 2}])
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
    io.append_jsonl(path, [{"step": 3}])
    assert path.read_text().splitlines() == ['{"step": 1}', '{"step": 2}', '{"step": 3}']


def test_a_table_reads_its_compact_rows_then_those_appended_since(tmp_path):
    path = tmp_path / "results.jsonl"
    rows = [{"cell": "a", "x": 0.1 + i / 3, "seed": i} for i in range(5)]
    io.append_jsonl(path, rows[:2])
    assert io.read_rows(path) == rows[:2]                        # plain only
    assert io.compact_jsonl(path) == 2
    assert not path.exists() and io.read_rows(path) == rows[:2]  # compact only
    assert io.compact_path(path).name == "results.parquet"
    assert pq.read_table(io.compact_path(path)).num_rows == 2    # Parquet any reader opens
    io.append_jsonl(path, rows[2:4])                             # a resumed writer appends
    assert io.read_rows(path) == rows[:4]                        # both, in order, once each
    io.append_jsonl(path, rows[4:])
    with open(path, "a") as f:
        f.write('{"cell": "a", "x": 0.')                         # a torn line is no row
    assert io.compact_jsonl(path) == 3
    assert io.read_rows(path) == rows and not path.exists()
    assert io.has_rows(path)
    io.remove_rows(path)
    assert not io.has_rows(path) and list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError, match="results.jsonl"):
        io.read_rows(path)


def test_a_compaction_stopped_at_any_point_loses_and_doubles_no_row(tmp_path, monkeypatch):
    path = tmp_path / "results.jsonl"
    old, new = [{"seed": 0}, {"seed": 1}], [{"seed": 2}, {"seed": 3}]
    io.append_jsonl(path, old)
    io.compact_jsonl(path)
    io.append_jsonl(path, new)
    packed = io.compact_path(path).read_bytes()

    def crash(*args):
        raise KeyboardInterrupt

    # Stopped while writing the compact file: both files as they were.
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        io.compact_jsonl(path)
    monkeypatch.undo()
    assert io.compact_path(path).read_bytes() == packed and io.read_jsonl(path) == new
    assert io.read_rows(path) == old + new
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl", "results.parquet"]
    # Stopped after writing it, before removing the plain file: its rows are read once.
    monkeypatch.setattr(Path, "unlink", crash)
    with pytest.raises(KeyboardInterrupt):
        io.compact_jsonl(path)
    monkeypatch.undo()
    assert io.read_jsonl(path) == new
    assert pq.read_table(io.compact_path(path)).num_rows == len(old + new)
    with pytest.warns(UserWarning, match="already in results.parquet"):
        assert io.read_rows(path) == old + new
    io.finish_compaction(path)               # what a writer does before appending again
    assert not path.exists() and io.read_rows(path) == old + new



def identical(a, b) -> bool:
    """The same JSON value: the same types, keys in the same order, floats bit for bit."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)   # NaN is NaN, -0.0 is not 0.0
    if isinstance(a, dict):
        return list(a) == list(b) and all(identical(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(identical, a, b))
    return a == b


def compacted(tmp_path, rows) -> list[dict]:
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))   # NaN as written: NaN
    io.compact_jsonl(path)
    assert not path.exists()
    return io.read_rows(path)


def test_compact_rows_keep_their_keys_key_order_and_value_types(tmp_path):
    rows = [
        {"cell": "a", "seed": 0, "diverged": False, "note": None, "curve": [0.5, 1.25],
         "steps": [1, 2], "tags": ["x"], "config": {"lr": 0.1, "k": [1, "2", None]}},
        {"seed": 1, "cell": "b", "diverged": True, "curve": [], "steps": [3]},   # keys missing
        {"cell": "c", "seed": 2**70, "diverged": 1, "note": "n", "curve": None, "steps": [4.0],
         "config": None, "tags": [True]},   # an int past int64, 1 among bools, 4.0 among ints
        {},
    ]
    read = compacted(tmp_path, rows)
    assert identical(read, rows)
    assert "note" not in read[1] and read[0]["note"] is None
    assert list(read[1])[:2] == ["seed", "cell"]


def test_compact_floats_are_the_floats_written_bit_for_bit(tmp_path):
    draws = (np.random.default_rng(0).normal(size=55) * 1e3).tolist()
    single = [float(np.float32(x)) for x in draws[:50]] + [math.nan, math.inf, -math.inf, -0.0, 0.0]
    rows = [{"single": x, "double": y, "almost": x, "mixed": x, "curve": [x, y]}
            for x, y in zip(single, draws)]
    rows[0]["almost"] = 0.1            # the one value float32 cannot hold keeps the column float64
    rows[1]["mixed"] = 3               # an int among floats stays an int
    read = compacted(tmp_path, rows)
    assert identical(read, rows)
    assert math.isnan(read[50]["single"]) and math.copysign(1, read[53]["single"]) == -1
    assert type(read[1]["mixed"]) is int
    schema = pq.read_schema(io.compact_path(tmp_path / "results.jsonl"))
    assert str(schema.field("single").type) == "float"     # stored as float32: exactly these
    assert str(schema.field("almost").type) == "double"


def test_a_gzip_table_of_an_earlier_version_is_read_and_folded_into_parquet(tmp_path, monkeypatch):
    path, legacy = tmp_path / "results.jsonl", tmp_path / "results.jsonl.gz"
    old, new = [{"seed": 0, "x": 0.1}, {"seed": 1, "x": None}], [{"seed": 2, "y": [1]}]
    legacy.write_bytes(gzip.compress(io._jsonl(old).encode()))   # as earlier versions compacted
    io.append_jsonl(path, new)
    assert io.has_rows(path) and io.read_rows(path) == old + new
    real_unlink = Path.unlink

    def crash_at(name):
        def unlink(self, *args, **kwargs):
            if self.name == name:
                raise KeyboardInterrupt
            return real_unlink(self, *args, **kwargs)
        return unlink

    # Stopped after writing the Parquet file, before removing the gzip'd rows, then the JSONL.
    for name in ("results.jsonl.gz", "results.jsonl"):
        monkeypatch.setattr(Path, "unlink", crash_at(name))
        with pytest.raises(KeyboardInterrupt):
            io.compact_jsonl(path)
        monkeypatch.undo()
        assert path.exists() and io.compact_path(path).exists()
        with pytest.warns(UserWarning, match="already in results.parquet"):
            assert io.read_rows(path) == old + new
    io.finish_compaction(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.parquet"]
    assert io.read_rows(path) == old + new
    legacy.write_bytes(gzip.compress(io._jsonl(new).encode()))   # an earlier version compacts again
    assert io.read_rows(path) == old + new + new
    assert io.compact_jsonl(path) == 1 and io.read_rows(path) == old + new + new
    io.remove_rows(path)
    assert list(tmp_path.iterdir()) == []


def test_a_compaction_an_earlier_version_stopped_still_counts_each_row_once(tmp_path):
    path, legacy = tmp_path / "results.jsonl", tmp_path / "results.jsonl.gz"
    old, new = [{"seed": 0}], [{"seed": 1}, {"seed": 2}]
    # It appended the JSONL's lines to the gzip'd rows as a new member, then stopped.
    members = [gzip.compress(io._jsonl(rows).encode()) for rows in (old, new)]
    legacy.write_bytes(b"".join(members))
    io.append_jsonl(path, new)
    with pytest.warns(UserWarning, match="already in results.jsonl.gz"):
        assert io.read_rows(path) == old + new
    assert io.compact_jsonl(path) == 3
    assert io.read_rows(path) == old + new
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.parquet"]

def test_atomic_writes_get_the_permissions_of_any_new_file(tmp_path):
    import os

    umask = os.umask(0o022)
    try:
        io.write_json_atomic(tmp_path / "summary.json", {"a": 1})
    finally:
        os.umask(umask)
    assert (tmp_path / "summary.json").stat().st_mode & 0o777 == 0o644   # not private (0600)
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_provenance_names_the_code_imported_not_files_edited_since(tmp_path):
    # A copy of the package: editing it while "a sweep runs" leaves the recorded source unchanged.
    shutil.copytree(Path(io.__file__).parent, tmp_path / "vaco_jax",
                    ignore=shutil.ignore_patterns("__pycache__"))
    script = ("import importlib.util, sys\n"
              "spec = importlib.util.spec_from_file_location('copied_io', sys.argv[1])\n"
              "copied = importlib.util.module_from_spec(spec); spec.loader.exec_module(copied)\n"
              "before = copied.source_hash()\n"
              "open(sys.argv[2], 'a').write('# edited\\n')\n"
              "print(before == copied.source_hash(), before == copied.source_hash.__wrapped__())")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "vaco_jax" / "io.py"),
                           str(tmp_path / "vaco_jax" / "envs.py")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "False"]   # recorded: as imported; on disk: changed


def test_provenance_names_the_cpu_model_and_its_instruction_sets(tmp_path):
    # Two CPUs can give different numbers from one seed (XLA compiles per instruction set): the
    # record names the model and a tag that differs when the flags differ.
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("processor\t: 0\nmodel name\t: Example CPU 9000\nflags\t\t: fpu sse avx2\n")
    b.write_text("processor\t: 0\nmodel name\t: Example CPU 9000\nflags\t\t: fpu sse avx512f\n")
    assert io.cpu_model(str(a)) == "Example CPU 9000"
    assert io.host_tag(str(a)) != io.host_tag(str(b))
    host = io.provenance()["host"]
    assert host["cpu"] == io.cpu_model() and host["cpu_tag"] == io.host_tag()
    assert set(host) == {"machine", "cpus", "cpu", "cpu_id", "cpu_tag"}


def test_provenance_tells_apart_cpus_whose_model_name_is_coarse(tmp_path):
    # A virtual machine may name its CPU only "AMD EPYC": the family, model and stepping still
    # say which generation ran a result.
    def cpuinfo(name, model):
        block = (f"processor\t: {{}}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n"
                 f"model\t\t: {model}\nmodel name\t: {name}\nstepping\t: 1\n\n")
        path = tmp_path / f"{model}.txt"
        path.write_text(block.format(0) + block.format(1).replace("stepping\t: 1", "stepping\t: 2"))
        return str(path)
    genoa, milan = cpuinfo("AMD EPYC", 17), cpuinfo("AMD EPYC", 1)
    assert io.cpu_model(genoa) == io.cpu_model(milan) == "AMD EPYC"
    assert io.cpu_id(genoa) == "AuthenticAMD family 25 model 17 stepping 1"   # first processor
    assert io.cpu_id(milan) == "AuthenticAMD family 25 model 1 stepping 1"
    arm = tmp_path / "arm.txt"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n"
                   "CPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: 0xd0c\n"
                   "CPU revision\t: 1\n")
    assert io.cpu_id(str(arm)) == "implementer 0x41 part 0xd0c variant 0x3 revision 1"
    assert io.cpu_id(str(tmp_path / "absent")) == "unknown"
    assert io.provenance()["host"]["cpu_id"] == io.cpu_id()
