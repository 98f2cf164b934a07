"""What every leaderboard method's cells compute, as one digest each: whether two checkouts run
the same programs (a refactor) or not (a change of behaviour).

    python -m experiments.program_digests digests.json                  # this checkout's
    python -m experiments.program_digests digests.json --compare other.json

A digest is the cell's key (`keys.cell_key`): its config and runs, the values its programs
receive and what they compute. It covers the protocol's cells on `--env` (default: its first task) of
every method in `bench.LEADERBOARD_METHODS`, and each built-in objective's fingerprint. With
`--compare`, prints every key whose digest differs and exits 1 when one does."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def digests(protocol: str, env: str) -> dict[str, str]:
    from vaco_jax import algorithms
    from vaco_jax.study import bench, keys

    out = {f"objective/{name}": algorithms.objective_fingerprint(objective)
           for name, objective in algorithms.OBJECTIVES.items()}
    proto = bench.protocol(protocol)
    env = env or proto.tasks[0].env
    for method in bench.LEADERBOARD_METHODS:
        for cell in bench.bench_cells(method, proto):
            if cell.env == env:
                out[f"{method.name}/{cell.cell_id}"] = keys.cell_key(cell)
                print(f"{method.name}/{cell.cell_id}: {out[f'{method.name}/{cell.cell_id}']}",
                      flush=True)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.program_digests",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="where to write the digests (JSON)")
    parser.add_argument("--compare", default="", help="another checkout's digests (JSON)")
    parser.add_argument("--protocol", default="cpu")
    parser.add_argument("--env", default="", help="the task whose cells are lowered")
    args = parser.parse_args(argv)
    ours = digests(args.protocol, args.env)
    Path(args.out).write_text(json.dumps(ours, indent=1, sort_keys=True) + "\n")
    if not args.compare:
        return 0
    theirs = json.loads(Path(args.compare).read_text())
    differ = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
    for key in differ:
        print(f"differs: {key}: {theirs.get(key)} there, {ours.get(key)} here")
    print(f"{len(ours)} digests; {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
