"""Key a committed leaderboard's results under the current key scheme (`vaco_jax.study.keys`).

    python -m experiments.rekey results/lag-bench/cpu-v2 --inputs-at 0a5f72c
    python -m experiments.rekey results/lag-bench/cpu-v2 --methods vaco,appo --reverse

A result keyed by an older scheme recorded its programs' lowered text but not the values they
receive. This rewrites each method's `bench.json` `comparability` record under the current scheme,
and only after three checks, per cell:

* its older key, recomputed here in a fresh process lowering the method's cells in the order
  its run lowered them, equals the recorded one: this checkout's programs are the ones that ran;
* with `--inputs-at COMMIT` (the commit that made the runs), the values its programs receive
  (PRNG keys and hyper-parameter leaves) are the same at that commit (read in a git worktree) as
  here: the older key could not see them;
* with `--reverse`, its program part is the same lowered again in the reverse order after
  `jax.clear_caches()`: the key does not depend on what the process lowered before.

A result keyed by the current scheme by other code (another code digest) is checked again: each
cell lowered here must give its recorded program part; then its code digest becomes this
checkout's, so that checking it costs no lowering here.

A method that fails a check is left as it was, and named. Each method runs in its own process.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def input_digests(directory: Path) -> dict[str, str]:
    """Each cell's inputs digest by the formula of `keys.inputs_digest`, written only with what
    every version of the package since the v2 protocol has (run at another commit too)."""
    import jax
    import numpy as np

    from vaco_jax import io, program
    from vaco_jax.study import bench
    from vaco_jax.trainer import stack_hparams

    out = {}
    for path in sorted(directory.glob(f"*/{bench.BENCH_FILE}")):
        for cell in _cells(json.loads(path.read_text())):
            hparams = stack_hparams([r.config(cell.config).hparams() for r in cell.runs])
            seeds = program.seed_keys([r.seed for r in cell.runs])
            digest = hashlib.sha256()
            for name, leaf in zip(["keys", *io.leaf_names(hparams)], [seeds, *jax.tree.leaves(hparams)]):
                leaf = np.ascontiguousarray(np.asarray(leaf))
                digest.update(repr((name, leaf.dtype.str, leaf.shape)).encode())
                digest.update(leaf.tobytes())
            out[f"{path.parent.name}/{cell.cell_id}"] = digest.hexdigest()[:16]
    return out


def _cells(info: dict):
    from vaco_jax.study import bench

    overrides = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in info["overrides"])
    method = bench.Method(info["algo"], overrides,
                          info["method"] if info["method"] != info["algo"] else "")
    proto = bench.protocol(info["protocol"], info["protocol_version"])
    return bench.bench_cells(method, proto, tuple(info.get("lag_profile", ())),
                             learning_rate=info.get("learning_rate"))


def rekey_method(path: Path, reverse: bool) -> dict:
    """Check one method's cells and return its new `comparability` record (or why not)."""
    import jax

    from vaco_jax import fingerprint, program
    from vaco_jax.study import bench

    info = json.loads(path.read_text())
    old = info["comparability"]
    refresh = old.get("scheme") == keys.SCHEME   # keyed already: check the program parts again
    cells = _cells(info)
    parts, problems = {}, []
    for cell in cells:   # in the order the run lowered them, in a fresh process
        texts = program.lowered_texts(cell.config, len(cell.runs))
        parts[cell.cell_id] = hashlib.sha256(" ".join(
            fingerprint.module_digest(t) for t in texts).encode()).hexdigest()[:16]
        if refresh:
            recorded = old["cells"].get(cell.cell_id, {}).get("program")
            same = parts[cell.cell_id] == recorded
            what = f"program {'equals' if same else 'DIFFERS from'} the recorded {recorded}"
        else:
            text = "\n".join(fingerprint.rename_symbols(t) for t in texts)
            recorded = old["programs"].get(cell.cell_id)
            same = hashlib.sha256(f"{cell.fingerprint()}\0{text}".encode()).hexdigest()[:16] == recorded
            what = f"older key {'matches' if same else 'DIFFERS from'} the recorded {recorded}"
        if not same:
            problems.append(f"{cell.cell_id}: {what}")
        print(f"  {cell.cell_id}: {what}; program {parts[cell.cell_id]}", file=sys.stderr, flush=True)
    if reverse:
        jax.clear_caches()
        for cell in reversed(cells):
            again = keys.program_digest(cell)
            if again != parts[cell.cell_id]:
                problems.append(f"{cell.cell_id}: program {again} lowered in reverse order != "
                                f"{parts[cell.cell_id]}")
    cell_ids = [cell.cell_id for cell in cells]
    inputs = {cell.cell_id: keys.inputs_digest(cell) for cell in cells}
    record = {"scheme": keys.SCHEME, "protocol": old["protocol"],
              "protocol_version": old["protocol_version"], "versions": old["versions"],
              "code": keys.code_digest(),
              "programs": {c.cell_id: keys.combine(c, parts[c.cell_id], inputs[c.cell_id])
                           for c in cells},
              "cells": {i: {"program": parts[i], "inputs": inputs[i]} for i in cell_ids}}
    return {"record": record, "problems": problems,
            "versions_here": bench.key_versions() == old["versions"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.rekey", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--methods", default="", help="comma-separated (default: every one)")
    parser.add_argument("--inputs-at", default="", help="the commit that made the runs")
    parser.add_argument("--reverse", action="store_true")
    parser.add_argument("--jobs", type=int, default=1, help="methods checked at once")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--inputs-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inputs_only:
        print(json.dumps(input_digests(args.directory)))
        return 0
    if args.one:
        print(json.dumps(rekey_method(args.directory, args.reverse)))
        return 0

    from vaco_jax import io
    from vaco_jax.study import bench

    wanted = [m for m in args.methods.split(",") if m]
    paths = [p for p in sorted(args.directory.glob(f"*/{bench.BENCH_FILE}"))
             if not wanted or p.parent.name in wanted]
    if args.inputs_at:
        theirs = _inputs_at(args.inputs_at, args.directory.resolve())
        ours = input_digests(args.directory)
        differ = sorted(k for k in ours if theirs.get(k) != ours[k])
        print(f"inputs at {args.inputs_at} and here: {len(ours) - len(differ)} of {len(ours)} "
              f"cells equal" + (f"; differ: {', '.join(differ)}" if differ else ""), flush=True)
    else:
        differ = []
    failed = 0
    results = {}
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for path in paths:
            results[path] = pool.submit(_one, path, args.reverse)
    for path in paths:
        print(f"{path.parent.name}:", flush=True)
        result = results[path].result()
        if result is None:
            print("  already keyed by this scheme and this code", flush=True)
            continue
        mine = [k for k in differ if k.startswith(f"{path.parent.name}/")]
        problems = result["problems"] + [f"{k}: inputs differ at {args.inputs_at}" for k in mine]
        if not result["versions_here"]:
            problems.append("library versions differ from the recorded ones")
        if problems:
            failed += 1
            print(f"  left as it was: {'; '.join(problems)}", flush=True)
            continue
        info = json.loads(path.read_text())
        info["comparability"] = result["record"]
        io.write_json_atomic(path, info)
        print(f"  rekeyed ({len(result['record']['programs'])} cells)", flush=True)
    return 1 if failed else 0


def _one(path: Path, reverse: bool) -> dict | None:
    """`rekey_method` in a fresh process (None: keyed by this code already)."""
    from vaco_jax.study import keys

    key = json.loads(path.read_text())["comparability"]
    if key.get("scheme") == keys.SCHEME and key.get("code") == keys.code_digest():
        return None
    out = subprocess.run([sys.executable, "-m", "experiments.rekey", str(path), "--one",
                          *(["--reverse"] if reverse else [])], cwd=ROOT,
                         stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _inputs_at(commit: str, directory: Path) -> dict[str, str]:
    """`input_digests` computed by the package as it was at `commit` (a git worktree)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=ROOT,
                       check=True, capture_output=True)
        try:
            code = ("import json, sys; from pathlib import Path; sys.path.insert(0, %r); "
                    "import vaco_jax; assert vaco_jax.__file__.startswith(%r), vaco_jax.__file__; "
                    "import experiments_rekey as r; print(json.dumps(r.input_digests(Path(%r))))"
                    % (str(Path(tmp)), str(tree), str(directory)))
            (Path(tmp) / "experiments_rekey.py").write_text(Path(__file__).read_text())
            out = subprocess.run([sys.executable, "-c", code], cwd=tree, text=True, check=True,
                                 stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(tree)})
            return json.loads(out.stdout.strip().splitlines()[-1])
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                           check=False, capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
