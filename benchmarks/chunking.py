"""Chunking overhead: the CLI's loop over compiled chunks vs one `jit` of the whole run.

    python -m benchmarks.chunking --env toy_reach --num-seeds 1 --repeats 5

Four ways to run the same training (the default config but for `--env`/`--num-seeds`; `num_evals`
chunks of `iterations_per_eval` iterations), all compiled before timing and timed alternately:
  whole      `jax.jit(jax.vmap(Trainer.train))`: one program, no host round trip;
  chunked    the compiled chunk called `num_evals` times, metrics fetched after each (the CLI's loop);
  cli        `vaco_jax.train.run` without checkpoints (adds metrics.jsonl rows and divergence checks);
  cli+ckpt   `vaco_jax.train.run` checkpointing after every chunk (the default).
Prints median seconds and the overhead of each over `whole`, and writes them as JSON to `--out`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from vaco_jax import Config, Trainer, io
from vaco_jax.train import Program, run, seed_keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="toy_reach")
    parser.add_argument("--num-seeds", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    config = Config(env=args.env, num_seeds=args.num_seeds, progress=False, overwrite=True)
    keys = seed_keys(config)
    program = Program.build(config)
    whole = jax.jit(jax.vmap(Trainer(config).train)).lower(keys).compile()
    chunk, _ = program.compiled_chunk()
    scratch = Path(tempfile.mkdtemp(prefix="chunking_"))

    def time_whole():
        start = time.perf_counter()
        jax.block_until_ready(whole(keys))
        return time.perf_counter() - start

    def time_chunked():
        state = jax.block_until_ready(program.init_state(config))
        start = time.perf_counter()
        for _ in range(config.num_evals):
            state, metrics = chunk(state)
            jax.device_get(metrics)
        return time.perf_counter() - start

    def time_cli(checkpoint_every):
        out = scratch / f"run{checkpoint_every}"
        shutil.rmtree(out, ignore_errors=True)
        return run(dataclasses.replace(config, out=str(out), checkpoint_every=checkpoint_every))[
            "train_seconds"]

    ways = {"whole": time_whole, "chunked": time_chunked, "cli": lambda: time_cli(0),
            "cli+ckpt": lambda: time_cli(1)}
    for way in ways.values():  # warm-up: first calls, file system, thread pools
        way()
    times = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, way in ways.items():
            times[name].append(way())
    shutil.rmtree(scratch, ignore_errors=True)

    base = float(np.median(times["whole"]))
    steps = config.env_steps * config.num_seeds
    result = {"env": args.env, "num_seeds": args.num_seeds, "num_evals": config.num_evals,
              "iterations_per_chunk": config.iterations_per_eval, "env_steps_per_seed": config.env_steps,
              "repeats": args.repeats, "times": times, **io.provenance()}
    print(f"{args.env}, {args.num_seeds} seed(s), {config.num_evals} chunks of "
          f"{config.iterations_per_eval} iterations ({config.env_steps:,} steps/seed), "
          f"median of {args.repeats}:")
    for name, values in times.items():
        median = float(np.median(values))
        result[f"{name}_median_s"] = median
        result[f"{name}_overhead"] = median / base - 1.0
        print(f"  {name:9s} {median:7.3f} s  {steps / median:10,.0f} steps/s  "
              f"overhead {100 * (median / base - 1):+6.1f}%  (all: {np.round(values, 3).tolist()})")
    if args.out:
        io.write_json_atomic(args.out, result)


if __name__ == "__main__":
    main()
