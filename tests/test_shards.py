"""Many processes fill one sweep directory together (`--shard i/n`, SLURM job arrays, or any
processes sharing a file system): no row lost or doubled, no cell run twice."""

import collections
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from vaco_jax import io
from vaco_jax.errors import ConfigError, SweepError
from vaco_jax.study import presets, sweep

ROOT = Path(__file__).resolve().parent.parent
SLURM_ARRAY_TASK = {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "4",
                    "SLURM_ARRAY_TASK_COUNT": "3"}   # the second of tasks 4, 5, 6


def test_shards_partition_the_plan_and_are_validated():
    assert sweep.parse_shard("") is None
    assert sweep.parse_shard("1/3") == (1, 3)
    for bad in ("3/3", "-1/2", "1", "a/b", "0/0"):
        with pytest.raises(ConfigError, match="option `shard`"):
            sweep.parse_shard(bad)
    assert sweep.shard_from_env({}) is None
    assert sweep.shard_from_env(SLURM_ARRAY_TASK) == (1, 3)
    assert sweep.parse_shard("slurm", SLURM_ARRAY_TASK) == (1, 3)
    assert sweep.parse_shard("", SLURM_ARRAY_TASK) is None          # SLURM's only when asked
    with pytest.raises(ConfigError, match="option `shard` = 'slurm' is invalid: this process is not"):
        sweep.parse_shard("slurm", {})
    cells = sweep.plan(presets.PRESETS["lag-tiny"])
    taken = [c.cell_id for i in range(3) for c in cells[i::3]]
    assert sorted(taken) == sorted(c.cell_id for c in cells) and len(set(taken)) == len(cells)


def test_a_slurm_array_task_takes_its_shard_only_with_shard_slurm_and_says_which(
        tmp_path, monkeypatch, capsys):
    """An array whose tasks run different sweeps runs each whole unless asked to split them."""
    from vaco_jax.commands import sweep as sweep_command

    for name, value in SLURM_ARRAY_TASK.items():
        monkeypatch.setenv(name, value)
    taken = []
    monkeypatch.setattr(sweep, "run_sweep", lambda cells, out, **options: taken.append(options["shard"]))
    argv = ["--preset", "lag-tiny", "--out", str(tmp_path), "--no-progress"]
    assert sweep_command.main(argv) == 0
    assert sweep_command.main(argv + ["--shard", "slurm"]) == 0
    assert taken == [None, (1, 3)]
    printed = capsys.readouterr().out
    assert "a SLURM job array task without --shard: this process takes every cell" in printed
    assert "shard 1/3: this SLURM job array task's (--shard slurm)" in printed
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID")
    assert sweep_command.main(argv + ["--shard", "slurm"]) == 2
    assert "option `shard` = 'slurm' is invalid" in capsys.readouterr().err


def test_vaco_bench_reads_and_says_its_shard_as_vaco_sweep_does(tmp_path, monkeypatch, capsys):
    from vaco_jax.commands import bench as bench_command

    argv = ["--algo", "vaco", "--protocol", "tiny", "--protocol-version", "1", "--out",
            str(tmp_path), "--plan"]
    for name, value in SLURM_ARRAY_TASK.items():
        monkeypatch.setenv(name, value)
    assert bench_command.main(argv) == 0
    assert "a SLURM job array task without --shard: this process takes every cell" in \
        capsys.readouterr().out
    assert bench_command.main(argv + ["--shard", "slurm"]) == 0
    assert "shard 1/3: this SLURM job array task's (--shard slurm)" in capsys.readouterr().out
    assert bench_command.main(argv + ["--shard", "3/3"]) == 2
    assert "option `shard` = 3/3 is invalid: must be i/n" in capsys.readouterr().err
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID")
    assert bench_command.main(argv + ["--shard", "slurm"]) == 2
    assert "option `shard` = 'slurm' is invalid" in capsys.readouterr().err


def test_two_concurrent_processes_fill_one_directory_without_losing_or_doubling_rows(tmp_path):
    """Two shards and a third process that takes every cell, all at once on one directory."""
    out = tmp_path / "sweep"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "experiments.sweep", "--preset", "lag-tiny",
               "--out", str(out), "--no-progress"]
    procs = [subprocess.Popen(command + extra, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for extra in (["--shard", "0/2"], ["--shard", "1/2"], [])]
    logs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], logs

    cells = sweep.plan(presets.PRESETS["lag-tiny"])
    records = io.read_jsonl(out / sweep.CELLS)
    ran = collections.Counter(r["cell"] for r in records)
    assert ran == collections.Counter(c.cell_id for c in cells)     # every cell once, none twice
    rows = io.read_jsonl(out / sweep.RESULTS)
    keys = collections.Counter((r["cell"], r["capacity"], r["seed"], r["eval_index"]) for r in rows)
    expected = {(c.cell_id, run.capacity, run.seed, i) for c in cells for run in c.runs
                for i in range(c.config.num_evals)}
    assert set(keys) == expected and max(keys.values()) == 1        # no row lost or doubled
    # A process that found a cell finished or held by another says so and moves on.
    assert "finished or running in another process" in "".join(logs) or len(records) == len(cells)
    # Run again: nothing left to do, nothing rewritten.
    again = subprocess.run(command + ["--shard", "1/2"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0 and "running 0" in again.stdout, again.stdout + again.stderr
    assert io.read_jsonl(out / sweep.RESULTS) == rows


def test_the_committed_lag_study_keeps_its_cell_fingerprints():
    """Planning the lag-cpu preset again gives every committed cell its recorded fingerprint, so
    the study resumes (and later Config fields at their defaults change no fingerprint)."""
    planned = {c.cell_id: c.fingerprint() for c in sweep.plan(presets.preset("lag-cpu"))}
    recorded = [r for path in sorted((ROOT / "results" / "lag-cpu").glob("*/cells.jsonl"))
                for r in io.read_jsonl(path)]
    assert len(recorded) == 60
    assert {r["cell"]: r["fingerprint"] for r in recorded} == \
        {r["cell"]: planned[r["cell"]] for r in recorded}


def test_a_variant_sweeps_the_learning_rate_inside_its_program():
    cells = sweep.plan(presets.preset("forward-cpu"))
    k4 = next(c for c in cells if c.variant == "K=4,oldest" and c.algo == "ppo_clip")
    assert k4.config.num_epochs == 4 and k4.config.snapshot_sampling == "oldest"
    assert {dict(r.hparams)["learning_rate"] for r in k4.runs} == {3e-4, 1e-3, 3e-3}
    assert len(k4.runs) == 3 * 3 * 10   # capacities × learning rates × seeds
    run = k4.runs[-1]
    assert run.config(k4.config).learning_rate == dict(run.hparams)["learning_rate"]
    k32 = next(c for c in cells if c.variant == "K=32,oldest" and c.algo == "vaco")
    assert {dict(r.hparams)["learning_rate"] for r in k32.runs} == {3e-4, 3e-3}


# --- torn lines, processes killed between appends, one config per cell id ------------------------
# These run `run_sweep` for real with an instant stand-in for training (`fake_run_cell`), so the
# directory's files go through the same appends, locks and clean-ups as a real sweep's.

def lag_tiny_cells():
    return sweep.plan(presets.PRESETS["lag-tiny"])


def fake_run_cell(cell, progress=None, **_):
    """`sweep.run_cell`'s (rows, completion record) for `cell`, made instantly."""
    rows = [{"cell": cell.cell_id, "capacity": run.capacity, "delta": run.delta, "seed": run.seed,
             "eval_index": i, "eval_return": float(i)}
            for run in cell.runs for i in range(cell.config.num_evals)]
    record = {"cell": cell.cell_id, "fingerprint": cell.fingerprint(), "runs": len(cell.runs),
              "compile_seconds": 0.0, "train_seconds": 0.0, "sps": 0.0, "source": io.source_hash()}
    return rows, record


def row_counts(out) -> collections.Counter:
    return collections.Counter((r["cell"], r["capacity"], r["delta"], r["seed"], r["eval_index"])
                               for r in io.read_jsonl(Path(out) / sweep.RESULTS))


def expected_rows(cells) -> set:
    return {(c.cell_id, run.capacity, run.delta, run.seed, i) for c in cells for run in c.runs
            for i in range(c.config.num_evals)}


def tear(path, text: str) -> None:
    """Append `text` as a writer killed mid-write leaves it: every line but the last whole, the
    last cut in half, no newline after it."""
    *whole, last = text.splitlines(keepends=True)
    with open(path, "a") as f:
        f.write("".join(whole) + last[:len(last) // 2])


def test_a_torn_line_in_a_shared_directory_costs_only_itself(tmp_path, monkeypatch):
    """Another process is killed mid-append of cell a's rows while this one runs cell c: c's rows,
    appended after the torn line, are read, survive the next start's clean-up, and a runs again."""
    a, c = lag_tiny_cells()
    rows_a, _ = fake_run_cell(a)

    def run_cell(cell, progress=None, **kwargs):
        if cell is c:
            tear(tmp_path / sweep.RESULTS, "".join(json.dumps(r) + "\n" for r in rows_a[:3]))
        return fake_run_cell(cell)

    monkeypatch.setattr(sweep, "run_cell", run_cell)
    assert sweep.run_sweep([c], tmp_path, log=lambda _: None) == [c.cell_id]
    with pytest.warns(UserWarning, match="skipped 1 unreadable line"):
        assert set(sweep.load_results(tmp_path)["cell"]) == {c.cell_id}
    with pytest.warns(UserWarning, match="skipped 1 unreadable line"):
        assert sweep.run_sweep([a, c], tmp_path, log=lambda _: None) == [a.cell_id]
    counts = row_counts(tmp_path)
    assert set(counts) == expected_rows([a, c]) and max(counts.values()) == 1


def test_a_claimed_cells_orphan_rows_are_dropped_before_its_rows_are_appended(tmp_path, monkeypatch):
    """While this process runs cell a, another is killed between appending cell c's rows and its
    completion record; this process then claims c: c's rows are in the table once, not twice."""
    a, c = lag_tiny_cells()

    def run_cell(cell, progress=None, **kwargs):
        if cell is a:
            io.append_jsonl(tmp_path / sweep.RESULTS, fake_run_cell(c)[0])
        return fake_run_cell(cell)

    monkeypatch.setattr(sweep, "run_cell", run_cell)
    assert sweep.run_sweep([a, c], tmp_path, log=lambda _: None) == [a.cell_id, c.cell_id]
    counts = row_counts(tmp_path)
    assert set(counts) == expected_rows([a, c]) and max(counts.values()) == 1


def test_one_cell_id_means_one_config(tmp_path):
    cell = lag_tiny_cells()[0]
    other = dataclasses.replace(cell, config=dataclasses.replace(cell.config, learning_rate=7e-4))
    assert other.cell_id == cell.cell_id and other.fingerprint() != cell.fingerprint()
    sweep.run_sweep([cell], tmp_path, max_cells=0, log=lambda _: None)   # plans it, runs nothing
    with pytest.raises(SweepError, match=f"cell {cell.cell_id!r} with another config"):
        sweep.run_sweep([other], tmp_path, max_cells=0, log=lambda _: None)
    # Processes that planned it differently never run it at once: the claim is the cell id's.
    claim = sweep._CellClaim(tmp_path, cell)
    assert claim.acquire()
    try:
        assert not sweep._CellClaim(tmp_path, other).acquire()
    finally:
        claim.release()


def shard_process(out: str, shard: str, torn: str = "") -> None:
    """A sweep process with `fake_run_cell` for training (run by the test below).

    `torn`: the file (results.jsonl or cells.jsonl) whose first append this process tears: it
    writes half of it (`tear`), says so (`<out>/torn`), and waits to be killed. Without `torn` it
    waits after its start (its clean-up done) until `<out>/go` exists."""
    out = Path(out)
    sweep.run_cell = fake_run_cell
    append = io.append_jsonl

    def tearing_append(path, rows):
        if Path(path).name != torn:
            return append(path, rows)
        tear(path, "".join(json.dumps(io.to_jsonable(r)) + "\n" for r in rows))
        (out / "torn").touch()
        time.sleep(600)

    def log(message):
        print(message, flush=True)
        if not torn and message.startswith("sweep "):
            (out / "started").touch()
            while not (out / "go").exists():
                time.sleep(0.05)

    io.append_jsonl = tearing_append
    sweep.run_sweep(lag_tiny_cells(), out, log=log, shard=sweep.parse_shard(shard))


def wait_for(path: Path, process, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@pytest.mark.filterwarnings("ignore:.*unreadable line")
@pytest.mark.parametrize("torn", [sweep.RESULTS, sweep.CELLS])
def test_a_shard_killed_mid_append_loses_or_doubles_no_row(tmp_path, monkeypatch, torn):
    """Shard 0/2 is SIGKILLed half-way through appending its cell's rows (or, its rows written,
    its completion record) while the other process, past its start, waits; that process then runs
    the killed shard's cell and its own: every row once, every cell once."""
    out = tmp_path / "sweep"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def start(shard, torn=""):
        code = (f"import sys; sys.path.insert(0, 'tests'); import test_shards; "
                f"test_shards.shard_process({str(out)!r}, {shard!r}, {torn!r})")
        return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    other = start("")                     # every cell; waits after its start
    wait_for(out / "started", other)
    killed = start("0/2", torn)
    wait_for(out / "torn", killed)
    killed.send_signal(signal.SIGKILL)    # holding the directory's lock, half-way through a line
    assert killed.wait(timeout=60) == -signal.SIGKILL
    (out / "go").touch()
    log = other.communicate(timeout=300)[0]
    assert other.returncode == 0, log

    cells = lag_tiny_cells()
    records, counts = io.read_jsonl(out / sweep.CELLS), row_counts(out)
    assert collections.Counter(r["cell"] for r in records) == collections.Counter(
        c.cell_id for c in cells)
    assert set(counts) == expected_rows(cells) and max(counts.values()) == 1
    # The next start finds nothing to do, keeps every row and leaves no torn line.
    monkeypatch.setattr(sweep, "run_cell", fake_run_cell)
    assert sweep.run_sweep(cells, out, log=lambda _: None) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert row_counts(out) == counts and len(io.read_jsonl(out / sweep.CELLS)) == len(cells)
