"""Multi-device: the same run with its seeds (or, for one seed, its envs) split over 4 devices
equals the single-device run. The 4 devices are forced host (CPU) devices in a subprocess."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

from vaco_jax import Config, io
from vaco_jax.config import to_json_dict
from vaco_jax.train import run

from conftest import CACHE_DIR
from test_checkpoint import BASE, final_state

ROOT = Path(__file__).resolve().parent.parent
# BASE (2 seeds) is compiled for the checkpoint tests already: the single-device references are
# BASE runs of seeds (0, 1) and (2, 3); only the 4-device programs compile anew, in the subprocess.
SEEDS = dataclasses.replace(BASE, num_seeds=4)
ENVS = dataclasses.replace(BASE, num_seeds=1)  # one seed: its 8 envs are split instead
CHUNKS = 2  # chunks compared (of 6): enough to cover learning, short enough to stay fast

SCRIPT = """
import json, sys
import jax
from vaco_jax import Config
from vaco_jax.config import from_json_dict
from vaco_jax.sharding import describe, placement
from vaco_jax.train import run

assert jax.device_count() == 4, jax.devices()
report = {name: run(from_json_dict(config), stop_after=int(sys.argv[2]))["devices"]
          for name, config in json.loads(sys.argv[1]).items()}
# Uneven splits use the largest even share: 6 seeds on 2 devices, 5 seeds on 1.
report["6 seeds"] = describe(placement(Config(num_seeds=6)))
report["5 seeds"] = describe(placement(Config(num_seeds=5)))
print("REPORT " + json.dumps(report))
"""


def test_four_devices_give_the_single_device_results(tmp_path):
    configs = {name: dataclasses.replace(config, out=str(tmp_path / f"{name}_4dev"))
               for name, config in [("seeds", SEEDS), ("envs", ENVS)]}
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_COMPILATION_CACHE_DIR=CACHE_DIR, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    # One subprocess per split, side by side: each mostly compiles, on one core.
    processes = [subprocess.Popen([sys.executable, "-c", SCRIPT, json.dumps({name: to_json_dict(c)}),
                                   str(CHUNKS)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for name, c in configs.items()]
    try:
        # The single-device references compute while the subprocess runs.
        assert jax.device_count() == 1
        for seed in (0, 2):
            summary = run(dataclasses.replace(BASE, seed=seed, out=str(tmp_path / f"1dev_{seed}")),
                          stop_after=CHUNKS)
            assert summary["devices"] == "1 device"
        outputs = [process.communicate(timeout=400) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    report = {}
    for process, (stdout, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-3000:]
        report.update(json.loads(stdout.split("REPORT ", 1)[1]))
    assert report == {"seeds": "seeds split over 4 devices", "envs": "envs split over 4 devices",
                      "6 seeds": "seeds split over 2 devices", "5 seeds": "1 device"}

    def seeds_of(run_dir, config, seeds):
        """Rows (per-seed lists cut to `seeds`) and final params (cut likewise) of a run."""
        rows = [{k: np.asarray(v, float)[seeds] if isinstance(v, list) else v for k, v in row.items()}
                for row in io.read_jsonl(run_dir / "metrics.jsonl")]
        params = jax.tree.map(lambda x: np.asarray(x)[seeds], final_state(run_dir, config).state.params)
        return rows, params

    one_device = [seeds_of(tmp_path / "1dev_0", BASE, slice(0, 2)),
                  seeds_of(tmp_path / "1dev_2", dataclasses.replace(BASE, seed=2), slice(0, 2))]
    expected = {"seeds": ([{k: np.concatenate([a[k], b[k]]) if isinstance(a[k], np.ndarray) else a[k]
                            for k in a} for a, b in zip(one_device[0][0], one_device[1][0])],
                          jax.tree.map(lambda a, b: np.concatenate([a, b]), one_device[0][1],
                                       one_device[1][1])),
                "envs": seeds_of(tmp_path / "1dev_0", BASE, slice(0, 1))}
    for name, config in [("seeds", SEEDS), ("envs", ENVS)]:
        rows, params = seeds_of(tmp_path / f"{name}_4dev", config, slice(None))
        expected_rows, expected_params = expected[name]
        assert [r["step"] for r in rows] == [r["step"] for r in expected_rows] == [1280, 2560]
        # Equal up to float32 rounding: XLA vectorises a different per-device batch differently.
        for row, expected_row in zip(rows, expected_rows):
            for key, values in expected_row.items():
                np.testing.assert_allclose(row[key], values, rtol=1e-4, atol=1e-6, err_msg=f"{name}: {key}")
        for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(expected_params)):
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6, err_msg=name)
