"""Chunking overhead: the CLI's loop over compiled chunks vs one `jit` of the whole run.

    python -m benchmarks.chunking --env toy_reach --num-seeds 1 --repeats 5

Seven ways to run the same training (the default config but for `--env`/`--num-seeds`; `num_evals`
chunks of `iterations_per_eval` iterations), all compiled before timing and timed alternately:
  whole       `jax.jit(jax.vmap(Trainer.train))`: one program, no host round trip;
  chunked     the compiled chunk called `num_evals` times, each dispatched before the previous one's
              metrics are fetched (the CLI's loop without its writes);
  cli         `vaco_jax.driver.run` without checkpoints (adds metrics.jsonl rows, divergence checks);
  cli+log     `cli` with `--log-every 1`: a row of the training updates' metrics per iteration
              (updates.jsonl), the most it writes;
  cli+ckpt    `vaco_jax.driver.run` with the default checkpointing (every chunk, within a 5% budget);
  ckpt-every  `vaco_jax.driver.run` saving after every chunk whatever it costs (`checkpoint_budget=1`);
  unguarded   `whole` with the in-program divergence guard removed (what the guard costs).
Each repeat times every way once, back to back; the overhead of a way is the median over repeats of
its time divided by `whole`'s in the same repeat (pairing cancels slow changes in machine load). Wall
time and process CPU time (all threads) are both reported: on a shared machine the CPU time is the
steadier measure of extra work. Results go to stdout and, as JSON, to `--out`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from vaco_jax import Config, Trainer, io, trainer as trainer_module
from vaco_jax.options import Options
from vaco_jax.driver import build_program, init_state, run, seed_keys


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chunking",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="toy_reach")
    parser.add_argument("--num-seeds", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    config = Config(env=args.env, num_seeds=args.num_seeds)
    keys = seed_keys(config)
    program = build_program(config)
    whole = jax.jit(jax.vmap(Trainer(config).train)).lower(keys).compile()
    guard = trainer_module.guard_divergence
    trainer_module.guard_divergence = lambda old, new, metrics, traj: new  # traced without it
    unguarded = jax.jit(jax.vmap(Trainer(config).train)).lower(keys).compile()
    trainer_module.guard_divergence = guard
    chunk, _ = program.compiled_chunk()
    scratch = Path(tempfile.mkdtemp(prefix="chunking_"))

    def time_whole(program=whole):
        start, cpu_start = time.perf_counter(), time.process_time()
        jax.block_until_ready(program(keys))
        return time.perf_counter() - start, time.process_time() - cpu_start

    def time_chunked():
        state = jax.block_until_ready(init_state(program, config))
        start, cpu_start = time.perf_counter(), time.process_time()
        pending = chunk(state)
        for index in range(config.num_evals):
            state, metrics = pending
            if index + 1 < config.num_evals:
                pending = chunk(state)
            jax.device_get(metrics)
        return time.perf_counter() - start, time.process_time() - cpu_start

    def time_cli(checkpoint_every, checkpoint_budget=0.05, log_every=0):
        out = scratch / f"run{checkpoint_every}"
        shutil.rmtree(out, ignore_errors=True)
        summary = run(config, Options(out=str(out), progress=False, overwrite=True,
                                      checkpoint_every=checkpoint_every,
                                      checkpoint_budget=checkpoint_budget, log_every=log_every))
        saves[(checkpoint_every, checkpoint_budget)] = len(summary["checkpoints_saved"])
        return summary["train_seconds"], summary["train_cpu_seconds"]

    saves = {}
    ways = {"whole": time_whole, "chunked": time_chunked, "cli": lambda: time_cli(0),
            "cli+log": lambda: time_cli(0, log_every=1),
            "cli+ckpt": lambda: time_cli(1), "ckpt-every": lambda: time_cli(1, 1.0),
            "unguarded": lambda: time_whole(unguarded)}
    for way in ways.values():  # warm-up: first calls, file system, thread pools
        way()
    wall = {name: [] for name in ways}
    cpu = {name: [] for name in ways}
    load = []
    for _ in range(args.repeats):
        load.append(os.getloadavg()[0])
        for name, way in ways.items():
            wall_seconds, cpu_seconds = way()  # both over the training loop only
            wall[name].append(wall_seconds)
            cpu[name].append(cpu_seconds)
    shutil.rmtree(scratch, ignore_errors=True)

    steps = config.env_steps * config.num_seeds
    result = {"env": args.env, "num_seeds": args.num_seeds, "num_evals": config.num_evals,
              "iterations_per_chunk": config.iterations_per_eval, "env_steps_per_seed": config.env_steps,
              "repeats": args.repeats, "wall_seconds": wall, "cpu_seconds": cpu, "load_average": load,
              "checkpoints_saved_last_repeat": {"default": saves[(1, 0.05)], "every": saves[(1, 1.0)]},
              **io.provenance()}
    print(f"{args.env}, {args.num_seeds} seed(s), {config.num_evals} chunks of "
          f"{config.iterations_per_eval} iterations ({config.env_steps:,} steps/seed), {args.repeats} "
          f"repeats, load average {min(load):.1f}-{max(load):.1f} on {os.cpu_count()} cores:")
    for name in ways:
        wall_ratio = np.asarray(wall[name]) / np.asarray(wall["whole"])
        cpu_ratio = np.asarray(cpu[name]) / np.asarray(cpu["whole"])
        result[name] = {"wall_overhead": float(np.median(wall_ratio) - 1),
                        "wall_overhead_iqr": np.percentile(wall_ratio - 1, [25, 75]).tolist(),
                        "cpu_overhead": float(np.median(cpu_ratio) - 1),
                        "median_wall_s": float(np.median(wall[name]))}
        print(f"  {name:10s} {np.median(wall[name]):6.3f} s ({steps / np.median(wall[name]):9,.0f} steps/s)"
              f"  wall overhead {100 * (np.median(wall_ratio) - 1):+6.1f}% "
              f"(IQR {100 * np.percentile(wall_ratio - 1, 25):+.1f}..{100 * np.percentile(wall_ratio - 1, 75):+.1f})"
              f"  cpu overhead {100 * (np.median(cpu_ratio) - 1):+6.1f}%")
    print(f"  checkpoints written in the last repeat: default {saves[(1, 0.05)]}, "
          f"ckpt-every {saves[(1, 1.0)]} of {config.num_evals}")
    if args.out:
        io.write_json_atomic(args.out, result)


if __name__ == "__main__":
    main()
