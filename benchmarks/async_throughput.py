"""Throughput of real asynchrony (`vaco-train --async`) against the fused program, one machine.

    nice -n 10 python -m benchmarks.async_throughput --env inverted_pendulum --total-steps 65536
    python -m benchmarks.async_throughput --preset smoke         # seconds; a toy env

Each round runs, on the same env, shapes and algorithm, with compilation excluded and one
evaluation at the end of each run (so every row pays the same evaluation):
  fused       `vaco_jax.run`, C = 1 (the CLI's chunked program, no checkpoints written);
  async_sync  `--async --async-handover sync`: the actor and learner threads, no concurrency;
  async_queued  `--async --async-queue Q`: actors act while the learner learns.
It prints env steps/s (the learner's steps over the run's seconds, compilation excluded, as
`summary.json`'s `sps`), each async row's ratio to the fused one of the same round (the median
over rounds with [min, max]), the async rows' measured ages and the learner's share of time spent
waiting for batches, and writes it all as JSON with the library versions and host.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path

PRESETS = {
    # Two CPU cores: the project's default shapes (32 envs × 32 steps, K = 4, M = 8, 64×64 nets).
    "cpu": dict(env="inverted_pendulum", num_envs=32, unroll_length=32, num_epochs=4,
                num_minibatches=8, hidden=(64, 64), num_actors=2, total_steps=32 * 32 * 64,
                eval_envs=8, rounds=2),
    # Seconds: a toy env, tiny shapes (the smoke test).
    "smoke": dict(env="toy_reach", num_envs=8, unroll_length=8, num_epochs=2, num_minibatches=2,
                  hidden=(16, 16), num_actors=2, total_steps=8 * 8 * 8, eval_envs=4, rounds=1,
                  episode_length=20),
}


def config_of(preset: dict, algo: str):
    from vaco_jax import Config

    extra = {"episode_length": preset["episode_length"]} if "episode_length" in preset else {}
    return Config.for_env(preset["env"], algo=algo, num_envs=preset["num_envs"],
                          unroll_length=preset["unroll_length"], num_epochs=preset["num_epochs"],
                          num_minibatches=preset["num_minibatches"],
                          actor_hidden=preset["hidden"], critic_hidden=preset["hidden"],
                          num_actors=preset["num_actors"], total_steps=preset["total_steps"],
                          num_evals=1, eval_envs=preset["eval_envs"], capacity=1,
                          max_capacity=0, **extra)


def measure(name: str, config, queue: int, out: Path) -> dict:
    from vaco_jax import Options, run
    from vaco_jax.actor_learner import run_async
    from vaco_jax.options import AsyncOptions

    options = Options(out=str(out / name), progress=False, overwrite=True, checkpoint_every=0)
    if name == "fused":
        summary = run(config, options)
        return {"sps": summary["sps"], "train_seconds": summary["train_seconds"],
                "compile_seconds": summary["compile_seconds"]}
    handover = "sync" if name == "async_sync" else "queued"
    summary = run_async(config, options, AsyncOptions(
        asynchronous=True, async_handover=handover, async_queue=1 if handover == "sync" else queue),
        log=lambda line: None)
    waiting = summary["learner_seconds"]["waiting"]
    return {"sps": summary["sps"], "train_seconds": summary["train_seconds"],
            "compile_seconds": summary["compile_seconds"], "age_mean": summary["ages"]["mean"],
            "age_max": summary["ages"]["max"], "age_counts": summary["ages"]["counts"],
            "learner_waiting_share": waiting / summary["train_seconds"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.async_throughput",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--env", help="env (default: the preset's)")
    parser.add_argument("--algo", default="vaco")
    parser.add_argument("--total-steps", type=int, help="env steps per run (default: the preset's)")
    parser.add_argument("--num-actors", type=int, help="actor groups (default: the preset's)")
    parser.add_argument("--queue", type=int, help="--async-queue of async_queued (default: 2 × "
                                                  "the actor groups)")
    parser.add_argument("--rounds", type=int, help="rounds, interleaved (default: the preset's)")
    parser.add_argument("--out", help="JSON output path")
    args = parser.parse_args(argv)
    preset = dict(PRESETS[args.preset])
    for name, value in (("env", args.env), ("total_steps", args.total_steps),
                        ("num_actors", args.num_actors), ("rounds", args.rounds)):
        if value is not None:
            preset[name] = value
    queue = args.queue or 2 * preset["num_actors"]

    from vaco_jax import io

    config = config_of(preset, args.algo)
    rows: dict[str, list[dict]] = {"fused": [], "async_sync": [], "async_queued": []}
    with tempfile.TemporaryDirectory(prefix="async_throughput_") as tmp:
        for round_index in range(preset["rounds"]):
            for name in rows:
                rows[name].append(measure(name, config, queue, Path(tmp) / str(round_index)))
                print(f"round {round_index + 1}: {name}: {rows[name][-1]['sps']:,.0f} steps/s",
                      file=sys.stderr, flush=True)
    ratios = {}
    for name in ("async_sync", "async_queued"):
        within = [a["sps"] / f["sps"] for a, f in zip(rows[name], rows["fused"])]
        ratios[f"{name}/fused"] = {"median": statistics.median(within), "min": min(within),
                                   "max": max(within)}
    result = {"preset": args.preset, "shapes": preset, "algo": args.algo, "queue": queue,
              "config": dataclasses.asdict(config), "rows": rows, "ratios": ratios,
              **io.provenance()}
    print(f"{config.env}, {config.algo}, {config.num_envs} envs × {config.unroll_length} steps, "
          f"K = {config.num_epochs}, M = {config.num_minibatches}, {config.num_actors} actor "
          f"groups, {config.num_iterations} iterations, {preset['rounds']} round(s)")
    for name, measured in rows.items():
        sps = statistics.median(m["sps"] for m in measured)
        extra = ""
        if name != "fused":
            last = measured[-1]
            extra = (f"  ages mean {last['age_mean']:.2f}, max {last['age_max']}; learner waits "
                     f"{last['learner_waiting_share']:.0%} of the time")
        print(f"  {name:13s} {sps:10,.0f} env steps/s{extra}")
    for name, ratio in ratios.items():
        print(f"  {name:20s} {ratio['median']:.2f} [{ratio['min']:.2f}, {ratio['max']:.2f}]")
    if args.out:
        Path(args.out).write_text(json.dumps(io.to_jsonable(result), indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
