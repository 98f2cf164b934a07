"""The accelerator check: what a GPU/TPU machine gives, in one command (about 10 minutes).

    python -m benchmarks.accelerator_check --out benchmarks/results/accelerator-<device>.json
    python -m benchmarks.accelerator_check --quick      # smaller: a first look, a few minutes

Three measurements, each in its own process (so each compiles and allocates from scratch):
  1. the README's quick start (VACO, inverted_pendulum, 4 seeds, 200k steps per seed): env steps/s,
     compile seconds, final returns;
  2. `benchmarks.throughput --preset gpu` (ours vs the raw env and Brax's PPO; with `--quick`, one
     env and one seed count);
  3. one `paper`-shaped sweep cell — ant, VACO, 5 capacities × 10 seeds = 50 runs of 256 envs — cut to
     a few million steps per run: its dry-run memory per device, then the run (env steps/s, compile).
Prints one summary table and writes every figure (with the devices and versions) to `--out`.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vaco_jax import io, runtime

QUICK_START = ["--env", "inverted_pendulum", "--algo", "vaco", "--num-seeds", "4",
               "--total-steps", "200000", "--no-progress"]


def run(args: list[str], timeout: float) -> tuple[str, float]:
    """A module run in a fresh process: its output (stdout + stderr) and wall seconds."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=timeout)
    seconds = time.perf_counter() - start
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"`python -m {' '.join(args)}` failed:\n{output[-3000:]}")
    return output, seconds


def quick_start(scratch: Path) -> dict:
    out = scratch / "quickstart"
    _, wall = run(["vaco_jax.train", *QUICK_START, "--out", str(out)], timeout=1800)
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_seconds": wall, "sps": summary["sps"], "compile_seconds": summary["compile_seconds"],
            "final_eval_return": summary["final_eval_return"], "devices": summary["devices"]}


def throughput(scratch: Path, quick: bool) -> dict:
    out = scratch / "throughput.json"
    args = ["benchmarks.throughput", "--preset", "gpu", "--out", str(out)]
    if quick:
        args += ["--env", "hopper"]
    _, wall = run(args, timeout=3600)
    return {"wall_seconds": wall, **json.loads(out.read_text())}


def paper_cell(scratch: Path, total_steps: int) -> dict:
    sweep_args = ["experiments.mujoco_lag_sweep", "--preset", "paper", "--envs", "ant", "--algos",
                  "vaco", "--total-steps", str(total_steps), "--no-progress",
                  "--out", str(scratch / "paper_cell")]
    planned, plan_wall = run([*sweep_args, "--dry-run"], timeout=1800)
    _, wall = run(sweep_args, timeout=3600)
    (record,) = io.read_jsonl(scratch / "paper_cell" / "cells.jsonl")
    memory = re.search(r"per device (peak [0-9.]+ [kMG]?B)", planned)
    return {"dry_run": planned.strip().splitlines()[-3:], "dry_run_seconds": plan_wall,
            "peak_memory": memory.group(1) if memory else None,
            "runs": record["runs"], "env_steps_per_run": record["env_steps_per_run"],
            "sps": record["sps"], "compile_seconds": record["compile_seconds"],
            "train_seconds": record["train_seconds"], "devices": record["devices"],
            "wall_seconds": wall}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.accelerator_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one throughput env; a 1M-step cell")
    parser.add_argument("--cell-steps", type=int, default=0,
                        help="env steps per run of the paper-shaped cell (default 4M; 1M --quick)")
    parser.add_argument("--only", nargs="+", choices=("quickstart", "throughput", "paper_cell"),
                        help="run only these measurements")
    parser.add_argument("--out", default="", help="JSON output path")
    args = parser.parse_args(argv)
    runtime.announce(file=sys.stdout)
    steps = args.cell_steps or (1_048_576 if args.quick else 4_194_304)
    wanted = args.only or ("quickstart", "throughput", "paper_cell")
    result = {"devices": runtime.describe(), "versions": io.library_versions()}
    with tempfile.TemporaryDirectory(prefix="accelerator_check_") as scratch:
        scratch = Path(scratch)
        if "quickstart" in wanted:
            result["quickstart"] = quick_start(scratch)
            q = result["quickstart"]
            print(f"quick start: {q['sps']:,.0f} env steps/s, compile {q['compile_seconds']:.1f} s, "
                  f"{q['wall_seconds']:.0f} s in all, final returns {q['final_eval_return']}", flush=True)
        if "throughput" in wanted:
            result["throughput"] = throughput(scratch, args.quick)
            print(f"throughput: see {args.out or 'the JSON'} ({result['throughput']['wall_seconds']:.0f} s)",
                  flush=True)
        if "paper_cell" in wanted:
            result["paper_cell"] = paper_cell(scratch, steps)
            c = result["paper_cell"]
            print(f"paper-shaped cell (ant, vaco, {c['runs']} runs × {c['env_steps_per_run']:,} steps, "
                  f"{c['devices']}): {c['sps']:,.0f} env steps/s, compile {c['compile_seconds']:.0f} s, "
                  f"{c['peak_memory']} memory per device", flush=True)
    if args.out:
        io.write_json_atomic(args.out, result)
    return result


if __name__ == "__main__":
    main()
