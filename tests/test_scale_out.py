"""Scale-out: runs spread over every device (padded when uneven) and over several processes give the
single-device results; only process 0 writes; a killed multi-process run resumes.

Multi-device runs use forced host (CPU) devices in subprocesses; multi-process runs are two OS
processes on localhost joined by `jax.distributed` with the CPU's gloo collectives, 2 devices each.
Results are compared up to float32 rounding: XLA vectorises a different per-device batch
differently, so the last bits of a loss may differ.
"""

import dataclasses
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

from vaco_jax import io, program
from vaco_jax.study import presets, sweep
from vaco_jax.config import from_json_dict, to_json_dict
from vaco_jax.driver import run

from conftest import CACHE_DIR
from test_checkpoint import BASE, cli_args, final_state, options

ROOT = Path(__file__).resolve().parent.parent
FIVE = dataclasses.replace(BASE, num_seeds=5)   # 5 seeds on 4 devices: padded to 8
ONE = dataclasses.replace(BASE, num_seeds=1)    # one seed: its 8 envs are split instead
CHUNKS = 2  # chunks compared (of 6): enough to cover learning, short enough to stay fast
# A sweep cell of 5 runs (capacity 4 × seeds 0..4): 8 with padding on 4 devices.
CELL_ARGS = ["--preset", "tiny", "--algos", "vaco", "--capacities", "4", "--num-seeds", "5"]
CELL = sweep.plan(presets.PRESETS["tiny"].with_overrides(capacities=(4,), num_seeds=5), ["main"],
                  algos=["vaco"])[0]
TOLERANCE = dict(rtol=1e-4, atol=1e-6)


def environment(devices: int) -> dict:
    return dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
                JAX_COMPILATION_CACHE_DIR=CACHE_DIR, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5",
                JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_rows_close(rows, expected, what):
    assert len(rows) == len(expected), what
    for row, expected_row in zip(rows, expected):
        for key, values in expected_row.items():
            if isinstance(values, (list, float)):
                np.testing.assert_allclose(np.asarray(row[key], float), np.asarray(values, float),
                                           err_msg=f"{what}: {key}", **TOLERANCE)
            else:
                assert row[key] == values, (what, key)


@functools.lru_cache(maxsize=1)
def cell_rows():
    """The 5-run sweep cell on this process's one device (computed once, while a subprocess
    compiles)."""
    assert jax.device_count() == 1
    rows, record = sweep.run_cell(CELL)
    assert record["devices"] == "5 runs on 1 device"
    return rows


def test_padding_is_dropped_from_every_result():
    layout = program.Layout(Mesh(np.asarray(jax.devices()), (program.AXIS,)), "runs", 5, 8)
    runs = {"x": np.arange(5.0), "y": np.arange(10).reshape(5, 2)}
    padded = layout.pad(runs)
    assert padded["x"].tolist() == [0, 1, 2, 3, 4, 4, 4, 4] and padded["y"].shape == (8, 2)
    unpadded = layout.unpad(layout.put(runs))
    assert all(np.array_equal(unpadded[k], runs[k]) for k in runs)


SCRIPT = """
import json, sys
import jax
from vaco_jax import program
from vaco_jax.study import presets, sweep
from vaco_jax.checkpoint import RunCheckpoints
from vaco_jax.config import from_json_dict
from vaco_jax.options import Options
from vaco_jax.driver import build_program, run

assert jax.device_count() == 4, jax.devices()
configs, out, chunks = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
report, params = {}, {}
for name, config in configs.items():
    config = from_json_dict(config)
    report[name] = run(config, Options(out=f"{out}/{name}", progress=False), stop_after=chunks)["devices"]
    built = build_program(config)
    restored = RunCheckpoints(f"{out}/{name}", create=False).restore_latest(built.abstract_state, config)
    params[name] = jax.tree.map(lambda x: x.tolist(), built.layout.unpad(restored.state.params))
cell = sweep.plan(presets.PRESETS["tiny"].with_overrides(capacities=(4,), num_seeds=5), ["main"],
                  algos=["vaco"])[0]
rows, record = sweep.run_cell(cell)
report["cell"] = record["devices"]
# One run whose envs do not divide over 4 devices uses the most that do, and says so.
warnings = []
report["10 envs"] = program.layout(1, num_envs=10, log=warnings.append).describe()
report["warning"] = warnings
print("REPORT " + json.dumps({"report": report, "rows": rows, "params": params}))
"""


def test_four_devices_give_the_single_device_results(tmp_path):
    configs = {"seeds": to_json_dict(FIVE), "envs": to_json_dict(ONE)}
    process = subprocess.Popen([sys.executable, "-c", SCRIPT, json.dumps(configs), str(tmp_path),
                                str(CHUNKS)], cwd=ROOT, env=environment(4), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        # The single-device references compute while the subprocess runs: the sweep cell, and BASE
        # (2 seeds, compiled for the checkpoint tests already) for seeds (0, 1), (2, 3), (4, 5).
        cell_rows()
        for seed in (0, 2, 4):
            summary = run(dataclasses.replace(BASE, seed=seed),
                          options(out=str(tmp_path / f"1dev_{seed}")), stop_after=CHUNKS)
            assert summary["devices"] == "2 runs on 1 device"
        stdout, stderr = process.communicate(timeout=500)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr[-3000:]
    result = json.loads(stdout.split("REPORT ", 1)[1])
    report = result.pop("report")
    assert report == {"seeds": "5 runs (+3 padding) split over 4 devices",
                      "envs": "1 run, its 8 envs split over 4 devices",
                      "cell": "5 runs (+3 padding) split over 4 devices",
                      "10 envs": "1 run, its 10 envs split over 2 devices",
                      "warning": ["warning: the one run's 10 envs split evenly over 2 of the 4 "
                                  "devices only; use a num_envs divisible by 4 to use them all"]}
    assert_rows_close(result["rows"], cell_rows(), "sweep cell")

    def seeds_of(run_dir, config, seeds):
        """Rows (per-seed lists cut to `seeds`) and final params (cut likewise) of a 1-device run."""
        rows = [{k: np.asarray(v, float)[seeds] if isinstance(v, list) else v for k, v in row.items()}
                for row in io.read_jsonl(run_dir / "metrics.jsonl")]
        params = jax.tree.map(lambda x: np.asarray(x)[seeds], final_state(run_dir, config).state.params)
        return rows, params

    one_device = [seeds_of(tmp_path / f"1dev_{seed}", dataclasses.replace(BASE, seed=seed), slice(0, 2))
                  for seed in (0, 2, 4)]
    first_five = lambda *xs: np.concatenate(xs)[:5]  # noqa: E731 — seeds 0..4 of the three runs
    expected = {
        "seeds": ([{k: first_five(*[rows[i][k] for rows, _ in one_device])
                    if isinstance(v, np.ndarray) else v for k, v in one_device[0][0][i].items()}
                   for i in range(CHUNKS)],
                  jax.tree.map(first_five, *[params for _, params in one_device])),
        "envs": seeds_of(tmp_path / "1dev_0", BASE, slice(0, 1))}
    for name in ("seeds", "envs"):
        rows = io.read_jsonl(tmp_path / name / "metrics.jsonl")
        expected_rows, expected_params = expected[name]
        assert [r["step"] for r in rows] == [r["step"] for r in expected_rows] == [1280, 2560]
        for row, expected_row in zip(rows, expected_rows):
            for key, values in expected_row.items():
                if isinstance(values, str):   # e.g. the source hash of the code that made the row
                    assert row[key] == values, (name, key)
                else:
                    np.testing.assert_allclose(row[key], values, err_msg=f"{name}: {key}",
                                               **TOLERANCE)
        params = jax.tree.map(np.asarray, result["params"][name],
                              is_leaf=lambda x: isinstance(x, list))
        for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(expected_params)):
            np.testing.assert_allclose(x, y, err_msg=name, **TOLERANCE)


def launch(module_args: list[str], port: int):
    """The same command in two processes of 2 host devices each, joined on localhost."""
    return [subprocess.Popen([sys.executable, "-m", *module_args, "--distributed",
                              "--coordinator-address", f"127.0.0.1:{port}", "--num-processes", "2",
                              "--process-id", str(i)], cwd=ROOT, env=environment(2),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(2)]


def finish(processes, timeout=400) -> list[tuple[str, str]]:
    try:
        outputs = [p.communicate(timeout=timeout) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
    for p, (_, stderr) in zip(processes, outputs):
        assert p.returncode == 0, stderr[-3000:]
    return outputs


def test_two_processes_train_resume_and_sweep_like_one(tmp_path):
    # A 2-process CLI run (2 seeds on 4 devices: padded), killed after its second row.
    out = tmp_path / "two_processes"
    processes = launch(["vaco_jax.commands.train", *cli_args(BASE), "--out", str(out)], free_port())
    try:
        reference = tmp_path / "one_process"   # computed while the two processes compile
        run(BASE, options(out=str(reference)))
        expected_rows = io.read_jsonl(reference / "metrics.jsonl")
        deadline = time.time() + 300
        while not ((out / "metrics.jsonl").exists() and len(io.read_jsonl(out / "metrics.jsonl")) >= 2):
            assert all(p.poll() is None for p in processes), processes[0].communicate()[1][-3000:]
            assert time.time() < deadline, "the run wrote no second row in time"
            time.sleep(0.02)
        for p in processes:
            p.send_signal(signal.SIGKILL)
    finally:
        for p in processes:
            p.kill()
            p.communicate()
    rows_at_kill = len(io.read_jsonl(out / "metrics.jsonl"))
    assert rows_at_kill < BASE.num_evals and not (out / "summary.json").exists()

    # Resumed by two processes again: the whole run equals the single-process one, written once.
    outputs = finish(launch(["vaco_jax.commands.train", "--resume", str(out), "--no-progress"], free_port()))
    (stdout0, stderr0), (stdout1, stderr1) = outputs
    assert "JAX 0.9.2 on cpu: 4 devices (cpu) in 2 processes, 2 here; this is process 0" in stderr0
    assert "resuming" in stderr0 and "resuming" not in stderr1
    assert "final eval return per seed" in stdout0 and "final eval return" not in stdout1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["devices"] == "2 runs (+2 padding) split over 4 devices"
    assert summary["processes"] == 2 and rows_at_kill <= summary["resumed_from_chunk"] < BASE.num_evals
    assert_rows_close(io.read_jsonl(out / "metrics.jsonl"), expected_rows, "2-process CLI")
    config_json = json.loads((out / "config.json").read_text())
    assert from_json_dict(config_json["config"]) == BASE

    # A sweep cell of 5 runs over the 2 processes: the single-process rows, each written once.
    sweep_out = tmp_path / "sweep"
    finish(launch(["experiments.sweep", *CELL_ARGS, "--no-progress", "--out",
                   str(sweep_out)], free_port()))
    assert_rows_close(sweep.load_results(sweep_out).to_dict("records"), cell_rows(), "2-process sweep")
    (record,) = sweep.load_cells(sweep_out).to_dict("records")
    assert record["devices"] == "5 runs (+3 padding) split over 4 devices" and record["processes"] == 2
