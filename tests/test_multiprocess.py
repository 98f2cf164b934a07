"""Choices that lead into a collective step are made once, by process 0, for every process: two
processes whose clocks disagree still checkpoint together (each waiting for the other at a
different step would hang the run), and `--overwrite` moves the earlier run aside once.

Two OS processes on localhost joined by `jax.distributed` with the CPU's gloo collectives, 2 host
devices each (the harness of `test_scale_out`); the run is `test_checkpoint`'s BASE, whose program
that module's two-process test has compiled already.
"""

import json
import subprocess
import sys

from vaco_jax.config import to_json_dict

from test_checkpoint import BASE
from test_scale_out import ROOT, environment, finish, free_port

SCRIPT = """
import json, sys, time
from pathlib import Path
import jax
from vaco_jax import driver, runtime
from vaco_jax.config import from_json_dict
from vaco_jax.errors import ConfigError
from vaco_jax.options import Options
from vaco_jax.runtime import Cluster

config, out, port, index = from_json_dict(json.loads(sys.argv[1])), sys.argv[2], sys.argv[3], int(sys.argv[4])
runtime.start(Cluster(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=index))
report = {"decided": runtime.primary_decision(lambda: {"by": jax.process_index()})}

def refuse():
    raise ConfigError(f"refused by process {jax.process_index()}")
try:
    runtime.primary_decision(refuse)
except ConfigError as error:
    report["refusal"] = str(error)

if index == 1:   # a clock 1000 times fast: every chunk ends minutes after the last checkpoint
    driver.clock = lambda: 1000.0 * time.perf_counter()
# Saved after the first chunk and the last, unless a checkpoint is older than a minute.
summary = driver.run(config, Options(out=out, progress=False, checkpoint_budget=0.01,
                                    checkpoint_max_age="60s"))
report["saved"], report["finished"] = summary["checkpoints_saved"], summary["finished"]
# Started over: process 0 moves the finished run aside while process 1 waits.
driver.run(config, Options(out=out, overwrite=True, progress=False), stop_after=1)
report["aside"] = sorted(p.name for p in Path(out).parent.iterdir() if p.name != "run")
print("REPORT " + json.dumps(report))
"""


def launch_script(*args: str) -> list[subprocess.Popen]:
    port = free_port()
    return [subprocess.Popen([sys.executable, "-c", SCRIPT, *args, str(port), str(i)], cwd=ROOT,
                             env=environment(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
            for i in range(2)]


def test_processes_whose_clocks_disagree_checkpoint_together(tmp_path):
    out = tmp_path / "run"
    outputs = finish(launch_script(json.dumps(to_json_dict(BASE)), str(out)), timeout=400)
    reports = [json.loads(stdout.split("REPORT ", 1)[1]) for stdout, _ in outputs]
    for report in reports:
        assert report["decided"] == {"by": 0}
        assert report["refusal"] == "refused by process 0"
        # Process 0's clock decides for both: its first and last chunk (process 1's alone would
        # have saved after every chunk).
        assert report["saved"] == [1, BASE.num_evals] and report["finished"]
    assert reports[0]["aside"] == reports[1]["aside"] and len(reports[0]["aside"]) == 1
    (aside,) = reports[0]["aside"]
    assert (tmp_path / aside / "summary.json").exists() and not (out / "summary.json").exists()
