"""Throughput benchmark: our fused trainer vs the simulator's limit and Brax's PPO trainer.

    python -m benchmarks.throughput --preset cpu                    # inverted_pendulum and hopper
    python -m benchmarks.throughput --preset cpu --env hopper --rounds 3   # fewer rounds
    python -m benchmarks.throughput --preset cpu --env dmc:CheetahRun    # DM Control (dmc extra)
    python -m benchmarks.throughput --preset gpu                    # one large accelerator
    python -m benchmarks.throughput --preset smoke                  # seconds; used by the tests

For each env, on the same shapes (num_envs, unroll length, epochs, minibatches, network sizes), it
measures side by side, each configuration in its own subprocess (so each peak RSS is its own):
  limit      raw `vmap(env.step)` with random actions in a `lax.scan`;
  wrapper    the same through our `VecEnv` (time limit, truncation, fresh auto-resets);
  brax_wrapper  the same through the wrappers Brax's PPO trainer uses (time limit, auto-reset to
             each env's first state): `wrapper/brax_wrapper` is our env wrapper's cost against
             Brax's on the same actions;
  brax_ppo   `brax.training.agents.ppo.train` (its own `training/sps`, compilation excluded; a
             DM Control task behind MuJoCo Playground's own Brax training wrapper);
  ppo_clip, vaco (C = 1), vaco_c8 (C = 8), impala: our training iterations, no evaluation;
  chunk      the CLI's chunk (`vaco_jax.program`: the iterations, then an evaluation): its compile
             time is "the compile time of the training program";
  seeds_S    S seeds in one vmapped call; sequential_S: S single-seed runs one after another.
With `--solver both` the limit, Brax and ppo_clip rows are repeated with `mjx_solver=fast`.
It prints a table, the ratios with PASS/MISS against the targets, and writes JSON (with library
versions and device). Every configuration is measured R times (`--rounds`, 5 by default on the
cpu and gpu presets), interleaved: each ratio is the median of its R within-round ratios, printed
with their [min, max] and beside this machine's raw simulator figure (`limit`), since machines of
one kind differ in speed and the ratios shift with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.measure import Case

PRESETS = {
    # Two CPU cores: the project's default shapes (32 envs × 32 steps, K = 4, M = 8, 64×64 nets).
    "cpu": dict(envs=("inverted_pendulum", "hopper"), seeds=(4, 16), rounds=5,
                case=dict(num_envs=32, unroll_length=32, num_epochs=4, num_minibatches=8,
                          hidden=(64, 64), iterations=8, repeats=3)),
    # One large accelerator: thousands of envs per seed, bigger minibatches.
    "gpu": dict(envs=("inverted_pendulum", "hopper", "walker2d", "halfcheetah"), seeds=(4, 16),
                rounds=5,
                case=dict(num_envs=2048, unroll_length=32, num_epochs=4, num_minibatches=32,
                          hidden=(64, 64), iterations=4, repeats=3, eval_envs=128)),
    # Seconds on a laptop: a toy env, tiny shapes, run in-process (for the smoke test).
    "smoke": dict(envs=("toy_reach",), seeds=(2,), rounds=1,
                  case=dict(num_envs=8, unroll_length=8, num_epochs=2, num_minibatches=2,
                            hidden=(16, 16), iterations=2, repeats=2, episode_length=20,
                            eval_envs=4)),
}

# (name, threshold, kind): "min" passes when ratio >= threshold, "max" when value <= threshold,
# "report" is reported only (a claim to check, not a target).
TARGETS = {
    "ppo_clip/brax_ppo": (1.1, "min"),
    "vaco/ppo_clip": (0.95, "min"),
    "vaco_c8/ppo_clip": (0.85, "min"),
    "impala/vaco": (1.0, "report"),
    "ppo_clip/limit": (None, "report"),
    "vmapped/sequential": (2.0, "min"),
    "compile_s(chunk)": (60.0, "max"),
}


def rows_for(env: str, preset: str, solver: str, seeds: tuple[int, ...]) -> list[dict]:
    """Every measurement of one env: a name and the worker call that makes it."""
    def row(name, kind, **kwargs):
        return {"env": env, "name": name, "kind": kind, "kwargs": kwargs, "solver": "default"}

    rows = [row("limit", "limit"), row("wrapper", "limit", wrapper="ours"),
            row("brax_wrapper", "limit", wrapper="brax"),
            row("brax_ppo", "brax_ppo"), row("ppo_clip", "ours", algo="ppo_clip"),
            row("vaco", "ours", algo="vaco"), row("vaco_c8", "ours", algo="vaco", capacity=8),
            row("impala", "ours", algo="impala"), row("chunk", "ours_chunk", algo="ppo_clip")]
    rows += [row(f"seeds_{s}", "ours", algo="ppo_clip", seeds=s) for s in seeds]
    rows.append(row(f"sequential_{max(seeds)}", "ours", algo="ppo_clip", seeds=max(seeds),
                    sequential=True))
    if solver in ("fast", "both"):
        fast = [dict(r, name=r["name"] + "@fast", solver="fast") for r in rows
                if r["name"] in ("limit", "brax_ppo", "ppo_clip", "chunk")]
        rows = fast if solver == "fast" else rows + fast
    return rows


def run_row(row: dict, case: Case, inline: bool) -> dict:
    """Measure one row, in a fresh subprocess unless `inline`."""
    case = dataclasses.replace(case, env=row["env"], mjx_solver=row["solver"])
    spec = {"kind": row["kind"], "kwargs": row["kwargs"], "case": dataclasses.asdict(case)}
    start = time.perf_counter()
    if inline:
        result = _work(spec)
    else:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.throughput", "--worker",
                               json.dumps(spec)], capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not lines:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            result = {"error": " | ".join(tail)}
        else:
            result = json.loads(lines[-1][len("RESULT "):])
    result["wall_s"] = time.perf_counter() - start
    return result


def _work(spec: dict) -> dict:
    from benchmarks import measure

    case = Case(**{**spec["case"], "hidden": tuple(spec["case"]["hidden"])})
    return getattr(measure, spec["kind"])(case, **spec["kwargs"])


def ratios(results: dict[str, dict], seeds: tuple[int, ...], key: str = "sps") -> dict[str, float]:
    """The reported ratios of one env and round (`results` maps row name → measurement).

    `key="sps"` uses wall-clock throughput; `"cpu_sps"` the process CPU time (steadier on a
    shared machine, blind to multi-core speed-ups).
    """
    sps = {name: r[key] for name, r in results.items() if key in r}

    def ratio(a, b):
        return sps[a] / sps[b] if a in sps and b in sps else None

    out = {
        "ppo_clip/brax_ppo": ratio("ppo_clip", "brax_ppo"),
        "vaco/ppo_clip": ratio("vaco", "ppo_clip"),
        "vaco_c8/ppo_clip": ratio("vaco_c8", "ppo_clip"),
        "impala/vaco": ratio("impala", "vaco"),
        "ppo_clip/limit": ratio("ppo_clip", "limit"),
        "wrapper/limit": ratio("wrapper", "limit"),
        "wrapper/brax_wrapper": ratio("wrapper", "brax_wrapper"),
        "compile_s(chunk)": results.get("chunk", {}).get(
            "compile_s" if key == "sps" else "compile_cpu_s"),
    }
    sequential = results.get(f"sequential_{max(seeds)}", {})
    if key == "sps":  # S sequential runs: the wall time of the first S single-seed runs
        for s in seeds:
            if f"seeds_{s}" in sps and "per_seed_s" in sequential:
                seq_sps = sequential["steps_per_seed"] * s / sum(sequential["per_seed_s"][:s])
                out[f"vmapped/sequential@{s}"] = sps[f"seeds_{s}"] / seq_sps
        out["vmapped/sequential"] = out.get(f"vmapped/sequential@{max(seeds)}")
    if "ppo_clip@fast" in sps:
        out["ppo_clip@fast/brax_ppo@fast"] = ratio("ppo_clip@fast", "brax_ppo@fast")
        out["limit@fast/limit"] = ratio("limit@fast", "limit")
        out["ppo_clip@fast/ppo_clip"] = ratio("ppo_clip@fast", "ppo_clip")
    return {k: v for k, v in out.items() if v is not None}


def verdict(name: str, value: float) -> str:
    threshold, kind = TARGETS.get(name, (None, "report"))
    if kind == "min":
        return f"{'PASS' if value >= threshold else 'MISS'} (target >= {threshold})"
    if kind == "max":
        return f"{'PASS' if value <= threshold else 'MISS'} (target <= {threshold:g} s)"
    return "report"


def format_table(env: str, rows: dict[str, dict]) -> str:
    lines = [f"### {env}", "",
             "| measurement | env steps/s | (CPU-time steps/s) | compile s | (compile CPU s) | peak RSS MB |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error'][:80]} | | | | |")
            continue
        lines.append(f"| {name} | {r['sps']:,.0f} | {r['cpu_sps']:,.0f} | {r['compile_s']:.1f} | "
                     f"{r['compile_cpu_s']:.1f} | {r['peak_rss_mb']:,.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.throughput",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--env", nargs="+", help="envs to run (default: the preset's)")
    parser.add_argument("--only", nargs="+", help="row names to run (default: all)")
    parser.add_argument("--solver", choices=("default", "fast", "both"), default="default")
    parser.add_argument("--rounds", type=int,
                        help="interleaved rounds; ratios are their medians (default: the preset's, "
                             "5 for cpu and gpu)")
    parser.add_argument("--iterations", type=int, help="learner iterations per timed call")
    parser.add_argument("--repeats", type=int, help="timed calls per measurement")
    parser.add_argument("--learning-rate", type=float,
                        help="1e-20 freezes every policy (same env cost for all; see Case.learning_rate)")
    parser.add_argument("--inline", action="store_true",
                        help="measure in this process (peak RSS is then cumulative)")
    parser.add_argument("--out", help="JSON output path")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:  # one measurement, in its own process
        print("RESULT " + json.dumps(_work(json.loads(args.worker))), flush=True)
        return {}

    preset = PRESETS[args.preset]
    case = Case(**preset["case"])
    overrides = {k: v for k, v in (("iterations", args.iterations), ("repeats", args.repeats),
                                   ("learning_rate", args.learning_rate)) if v is not None}
    case = dataclasses.replace(case, **overrides)
    inline = args.inline or args.preset == "smoke"
    envs = tuple(args.env or preset["envs"])
    seeds = tuple(preset["seeds"])
    plan = [r for env in envs for r in rows_for(env, args.preset, args.solver, seeds)
            if not args.only or r["name"] in args.only]

    args.rounds = args.rounds or preset["rounds"]
    rounds = []  # rounds[k][env][row name] = measurement
    for k in range(args.rounds):
        measured: dict[str, dict] = {env: {} for env in envs}
        for row in plan:
            result = run_row(row, case, inline)
            measured[row["env"]][row["name"]] = result
            shown = result.get("error") or (f"{result['sps']:,.0f} steps/s, compile "
                                            f"{result['compile_s']:.1f} s, {result['wall_s']:.0f} s in all")
            print(f"[round {k + 1}/{args.rounds}] {row['env']} {row['name']}: {shown}", flush=True)
        rounds.append(measured)

    report = {"preset": args.preset, "case": dataclasses.asdict(case), "rounds": rounds,
              "command": "python -m benchmarks.throughput " + " ".join(argv if argv is not None
                                                                       else sys.argv[1:]),
              "envs": {}}
    for env in envs:
        median_rows = _median_rows([r[env] for r in rounds])
        per_round = _collect([ratios(r[env], seeds) for r in rounds])
        env_ratios = {n: statistics.median(v) for n, v in per_round.items()}
        cpu_ratios = {n: statistics.median(v) for n, v in _collect(
            [ratios(r[env], seeds, "cpu_sps") for r in rounds]).items()}
        limit_sps = median_rows.get("limit", {}).get("sps")
        report["envs"][env] = {"rows": median_rows, "ratios": env_ratios, "cpu_ratios": cpu_ratios,
                               "ratio_spread": {n: [min(v), max(v)] for n, v in per_round.items()},
                               "limit_sps": limit_sps,
                               "verdicts": {n: verdict(n, v) for n, v in env_ratios.items()
                                            if n in TARGETS}}
        print("\n" + format_table(env, median_rows) + "\n")
        limit_shown = f"{limit_sps:,.0f} env steps/s" if limit_sps else "not measured"
        print(f"{env}: median of {len(rounds)} round(s) [min, max]; this machine's raw simulator "
              f"limit: {limit_shown}")
        print(f"{'':>18} {'ratio (wall clock)':<28} {'value':>9}  {'[min, max]':<16} verdict"
              f"      (CPU-time ratio)")
        for name, value in env_ratios.items():
            unit = " s" if name.startswith("compile") else ""
            cpu = cpu_ratios.get(name)
            cpu_shown = f"({cpu:.2f}{unit})" if cpu is not None else ""
            spread = f"[{min(per_round[name]):.2f}, {max(per_round[name]):.2f}]"
            print(f"{env:>18} {name:<28} {value:>7.2f}{unit:2}  {spread:<16} "
                  f"{verdict(name, value):<28} {cpu_shown}")

    from vaco_jax import io

    report.update(io.provenance())
    out = Path(args.out or f"benchmarks/results/throughput-{args.preset}.json")
    io.write_json_atomic(out, report)
    print(f"\nwrote {out}")
    return report


def _collect(dicts: list[dict]) -> dict[str, list]:
    out: dict[str, list] = {}
    for d in dicts:
        for k, v in d.items():
            out.setdefault(k, []).append(v)
    return out


def _median_rows(rounds: list[dict]) -> dict:
    """Per row: the median over rounds of sps, compile time and peak RSS."""
    out = {}
    for name in rounds[0]:
        ok = [r[name] for r in rounds if name in r and "error" not in r[name]]
        if not ok:
            out[name] = rounds[0][name]
            continue
        out[name] = {key: statistics.median([r[key] for r in ok])
                     for key in ("sps", "cpu_sps", "compile_s", "compile_cpu_s", "peak_rss_mb")}
    return out


if __name__ == "__main__":
    main()
