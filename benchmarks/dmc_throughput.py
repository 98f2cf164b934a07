"""Raw simulator throughput of every DeepMind Control Suite task (MuJoCo Playground, MJX's JAX
implementation): `vmap(env.step)` with uniform random actions in a `lax.scan`, no policy.

    python -m benchmarks.dmc_throughput                       # all 25 tasks, 32 envs
    python -m benchmarks.dmc_throughput --tasks CheetahRun WalkerWalk --num-envs 128

Also the check that every task resets and steps under `jit(vmap)`. Prints a Markdown table (env
steps/s, compile seconds, observation and action sizes, physics and control time steps) and writes
JSON with the library versions and device (`--out`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.measure import Case, limit
from vaco_jax import envs, io


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dmc_throughput",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(envs.DMC_TASKS),
                        choices=envs.DMC_TASKS, metavar="TASK")
    parser.add_argument("--num-envs", type=int, default=32)
    parser.add_argument("--steps", type=int, default=256, help="env steps per timed call, per env")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls (median reported)")
    parser.add_argument("--out", default="", help="write the results as JSON here")
    args = parser.parse_args(argv)

    rows = {}
    print("| task | env steps/s | compile s | obs | act | sim dt | ctrl dt |")
    print("|---|---|---|---|---|---|---|")
    for task in args.tasks:
        case = Case(env=f"dmc:{task}", num_envs=args.num_envs, unroll_length=args.steps,
                    iterations=1, repeats=args.repeats)
        start = time.perf_counter()
        result = limit(case)
        env = envs.make_env(case.env)
        rows[task] = {**result, "observation_size": env.observation_size,
                      "action_size": env.action_size, "sim_dt": float(env.env.sim_dt),
                      "ctrl_dt": float(env.env.dt), "seconds": time.perf_counter() - start}
        row = rows[task]
        print(f"| {task} | {row['sps']:,.0f} | {row['compile_s']:.1f} | {row['observation_size']} "
              f"| {row['action_size']} | {row['sim_dt']:g} | {row['ctrl_dt']:g} |", flush=True)
    if args.out:
        io.write_json_atomic(Path(args.out), {"num_envs": args.num_envs, "steps": args.steps,
                                              "results": rows, **io.provenance()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
