"""The accelerator check: what one GPU (or TPU) gives, in one call of about ten minutes.

    python -m benchmarks.accelerator_check --out benchmarks/results/accelerator-<device>.json
    python -m benchmarks.accelerator_check --full --out ...    # every throughput row: hours
    python -m benchmarks.accelerator_check --smoke             # toy shapes: a minute on a CPU

Three measurements, each in its own process (so each compiles and allocates from scratch):
  1. the README's quick start (VACO, inverted_pendulum, 4 seeds, 200k steps per seed): env steps/s,
     compile seconds, final returns;
  2. throughput at the GPU shapes (`benchmarks.throughput --preset gpu`, 2,048 envs per seed): the
     raw simulator (`limit`) and VACO's training (`vaco`) on hopper, one round (`--full`: every
     env, row and round of the preset);
  3. one cell of the controlled-lag study sized for one GPU (`vaco-sweep --preset lag-gpu`: hopper,
     VACO, constant lag k = 0 and 7 × 10 seeds = 20 runs of 256 envs) cut to `--cell-steps` env
     steps per run: its dry-run memory per device, then the run (env steps/s, compile). `--full`
     adds a `paper`-shaped cell (ant, VACO, 5 capacities × 10 seeds = 50 runs of 256 envs).
Each measurement gets what is left of `--budget` seconds (a measurement that runs out of it is
recorded as timed out, and those after it are skipped), and the JSON is rewritten after each one,
so a call cut short keeps what it measured. Prints the backend line, a line per measurement, and
writes every figure with the devices and versions to `--out`.
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

REPOSITORY = Path(__file__).resolve().parent.parent   # the modules run from here

QUICK_START = ["--env", "inverted_pendulum", "--algo", "vaco", "--num-seeds", "4",
               "--total-steps", "200000", "--no-progress"]
# What each measurement runs: the one-GPU check, `--full`, and `--smoke` (toy shapes).
MODES = {
    "check": {"quickstart": QUICK_START,
              "throughput": ["--preset", "gpu", "--env", "hopper", "--rounds", "1",
                             "--only", "limit", "vaco"],
              "lag_cell": ["--preset", "lag-gpu", "--envs", "hopper", "--algos", "vaco"],
              "cell_steps": 1_048_576},
    "full": {"quickstart": QUICK_START, "throughput": ["--preset", "gpu"],
             "lag_cell": ["--preset", "lag-gpu", "--envs", "hopper", "--algos", "vaco"],
             "cell_steps": 5_242_880,
             "paper_cell": ["--preset", "paper", "--envs", "ant", "--algos", "vaco"],
             "paper_steps": 4_194_304},
    "smoke": {"quickstart": ["--env", "toy_reach", "--num-seeds", "2", "--total-steps", "2048",
                             "--num-envs", "8", "--unroll-length", "8", "--num-evals", "2",
                             "--num-minibatches", "2", "--num-actors", "2", "--eval-envs", "4",
                             "--episode-length", "20", "--no-progress"],
              "throughput": ["--preset", "smoke", "--only", "limit", "vaco"],
              "lag_cell": ["--preset", "lag-tiny", "--algos", "vaco"],
              "cell_steps": 2048},
}


class OutOfTime(Exception):
    """The budget ran out before or during a measurement."""


def run(args: list[str], deadline: float | None) -> tuple[str, float]:
    """A module run in a fresh process until `deadline` (time.monotonic()): its output (stdout +
    stderr) and wall seconds."""
    timeout = None if deadline is None else deadline - time.monotonic()
    if timeout is not None and timeout <= 0:
        raise OutOfTime("no time left")
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=REPOSITORY)
    except subprocess.TimeoutExpired:
        raise OutOfTime(f"timed out after {time.perf_counter() - start:.0f} s") from None
    seconds = time.perf_counter() - start
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"`python -m {' '.join(args)}` failed:\n{output[-3000:]}")
    return output, seconds


def quick_start(scratch: Path, args: list[str], deadline) -> dict:
    out = scratch / "quickstart"
    _, wall = run(["vaco_jax.commands.train", *args, "--out", str(out)], deadline)
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_seconds": wall, "sps": summary["sps"],
            "compile_seconds": summary["compile_seconds"],
            "final_eval_return": summary["final_eval_return"], "devices": summary["devices"]}


def throughput(scratch: Path, args: list[str], deadline) -> dict:
    out = scratch / "throughput.json"
    _, wall = run(["benchmarks.throughput", *args, "--out", str(out)], deadline)
    report = json.loads(out.read_text())
    return {"wall_seconds": wall, "case": report["case"],
            "rows": {env: {name: {k: row.get(k) for k in ("sps", "compile_s", "error")
                                  if row.get(k) is not None}
                           for name, row in measured["rows"].items()}
                     for env, measured in report["envs"].items()},
            "report": report}


def sweep_cell(scratch: Path, name: str, args: list[str], steps: int, deadline) -> dict:
    """The first cell of a sweep cut to `steps` env steps per run: its dry run (placement,
    per-device memory), then the run."""
    sweep_args = ["experiments.sweep", *args, "--total-steps", str(steps),
                  "--max-cells", "1", "--no-progress", "--out", str(scratch / name)]
    planned, plan_wall = run([*sweep_args, "--dry-run"], deadline)
    _, wall = run(sweep_args, deadline)
    (record,) = io.read_rows(scratch / name / "cells.jsonl")
    memory = re.search(r"per device (peak [0-9.]+ [kMG]?B)", planned)
    return {"cell": record["cell"], "dry_run": planned.strip().splitlines()[-2:],
            "dry_run_seconds": plan_wall, "peak_memory": memory.group(1) if memory else None,
            "runs": record["runs"], "env_steps_per_run": record["env_steps_per_run"],
            "sps": record["sps"], "compile_seconds": record["compile_seconds"],
            "train_seconds": record["train_seconds"], "devices": record["devices"],
            "wall_seconds": wall}


def describe(name: str, result: dict) -> str:
    """The line printed for one measurement."""
    if "error" in result:
        # The command that failed and, where it printed one, its last line (the exception).
        lines = [line for line in result["error"].splitlines() if line.strip()]
        return f"{name}: {lines[0]}" + (f" {lines[-1].strip()}" if len(lines) > 1 else "")
    if name == "quick start":
        returns = [r if r is None else round(r, 1) for r in result["final_eval_return"]]
        return (f"quick start: {result['sps']:,.0f} env steps/s, compile "
                f"{result['compile_seconds']:.1f} s, {result['wall_seconds']:.0f} s in all, final "
                f"returns {returns}")
    if name == "throughput":
        envs = result["case"]["num_envs"]
        return "; ".join(
            f"throughput, {env} at {envs:,} envs per seed: " + ", ".join(
                f"{row_name} {row['sps']:,.0f} env steps/s (compile {row['compile_s']:.1f} s)"
                if "error" not in row else f"{row_name} failed" for row_name, row in rows.items())
            for env, rows in result["rows"].items())
    return (f"{name} {result['cell']} ({result['runs']} runs × {result['env_steps_per_run']:,} "
            f"steps, {result['devices']}): {result['sps']:,.0f} env steps/s, compile "
            f"{result['compile_seconds']:.0f} s, {result['peak_memory']} memory per device, "
            f"{result['wall_seconds']:.0f} s in all")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.accelerator_check",
                                     description=__doc__.split("\n\n")[0])
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--full", action="store_true",
                      help="every row and round of the gpu throughput preset, the lag cell at "
                           "its full budget and a paper-shaped cell (hours; no budget)")
    kind.add_argument("--smoke", action="store_true", help="toy shapes: a minute on a CPU (tests)")
    parser.add_argument("--cell-steps", type=int, default=0,
                        help="env steps per run of the lag-gpu cell (default 1,048,576)")
    parser.add_argument("--budget", type=float, default=570.0,
                        help="seconds for all the measurements (default 570: one 10-minute call; "
                             "0 = none)")
    parser.add_argument("--only", nargs="+", choices=("quickstart", "throughput", "lag_cell"),
                        help="run only these measurements")
    parser.add_argument("--out", default="", help="JSON output path (rewritten after each one)")
    args = parser.parse_args(argv)
    mode = MODES["full" if args.full else "smoke" if args.smoke else "check"]
    deadline = time.monotonic() + args.budget if args.budget and not args.full else None
    runtime.announce(file=sys.stdout)
    result = {"devices": runtime.describe(), "versions": io.library_versions(),
              "budget_seconds": None if deadline is None else args.budget}
    wanted = args.only or ("quickstart", "throughput", "lag_cell")
    with tempfile.TemporaryDirectory(prefix="accelerator_check_") as scratch:
        scratch = Path(scratch)
        steps = args.cell_steps or mode["cell_steps"]
        plan = {
            "quickstart": ("quick start", lambda: quick_start(scratch, mode["quickstart"],
                                                              deadline)),
            "throughput": ("throughput", lambda: throughput(scratch, mode["throughput"],
                                                            deadline)),
            "lag_cell": ("lag cell", lambda: sweep_cell(scratch, "lag_cell", mode["lag_cell"],
                                                            steps, deadline)),
            "paper_cell": ("paper-shaped cell", lambda: sweep_cell(
                scratch, "paper_cell", mode.get("paper_cell", []), mode.get("paper_steps", 0),
                deadline)),
        }
        if "paper_cell" in mode:
            wanted = (*wanted, "paper_cell")
        for key in wanted:
            name, measure = plan[key]
            try:
                result[key] = measure()
            except (OutOfTime, RuntimeError) as error:
                result[key] = {"error": str(error) if isinstance(error, RuntimeError) else
                               f"{error} (the budget is {args.budget:g} s)"}
            print(describe(name, result[key]), flush=True)
            if args.out:
                io.write_json_atomic(args.out, result)
    if args.out:
        print(f"-> {args.out}")
    return result


if __name__ == "__main__":
    main()
