"""The lag-robustness benchmark: one method on a fixed protocol, scored beside every other.

    vaco-bench --algo vaco --protocol cpu --plan          # the size of its runs
    vaco-bench --algo vaco --protocol cpu --tune          # its learning rate, on the design seeds
    vaco-bench --algo vaco --protocol cpu                 # its scored runs, at that learning rate
    vaco-bench --algo vaco --protocol cpu --protocol-version 1 --out results/lag-bench/cpu/vaco
    vaco-bench --algo ppo_kl --set kl_adaptive=true --label ppo_kl_adaptive
    vaco-bench --algo vaco --lag-profile docs/lag_profiles/example.json  # your system's lag
    vaco-bench --table results/lag-bench/cpu     # the leaderboard's table
    vaco-bench --table DIR --check               # recompute it from the per-run files

`--protocol llm-tiny|llm-cpu|llm-gpu --algo <objective>` scores an objective of GRPO on the LLM
testbed instead (`vaco_jax.llm.bench`), and `--table DIR` of a directory of LLM entries writes the
LLM leaderboard (`vaco_jax.llm.scorecard`).

Runs the method's cells (`vaco_jax.study.bench`: per task, the lag axis in one program and the
high-update-frequency setting in another, every lag × seed vmapped), resumably, into
`--out/runs/`. It compares with the methods in `--leaderboard` that compute what this checkout
computes (the same programs, library versions and protocol version; said before it runs). From
protocol version 2 on, `--tune` first chooses the method's learning rate (`--out/tuning.json`);
once every cell has finished, `--out/leaderboard/` ranks the method among those methods
(`vaco_jax.study.robustness`), and `--table DIR` writes a whole leaderboard from its methods' runs.
On version 1 it writes `--out/scorecard.json`, `scorecard.md` and `scorecard.png`
(`vaco_jax.study.scorecard`). `--shard i/n` (or `--shard slurm`: the SLURM array task's) splits
the cells over processes that share `--out`; `--report-only` rewrites the report from what is
there.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Literal

import tyro

from vaco_jax.config import read_lag_profile
from vaco_jax.errors import CheckpointError, ConfigError, SweepError


@dataclasses.dataclass
class Args:
    algo: str = ""
    """The method's algorithm: a registry name (vaco, ppo_clip, icepop, ...), a pairing
    <estimator>+<objective>, or your own <estimator>+<module>:<function>."""
    set: tuple[str, ...] = ()
    """Config overrides that make the method, as field=value (e.g. kl_adaptive=true)."""
    label: str = ""
    """The method's name in tables (default: algo, with its overrides in brackets)."""
    protocol: Literal["tiny", "cpu", "gpu", "llm-tiny", "llm-cpu", "llm-gpu"] = "cpu"
    """tiny: seconds (tests); cpu: one 2-core CPU machine; gpu: one GPU; llm-tiny, llm-cpu,
    llm-gpu: GRPO on the LLM testbed, --algo an LLM objective (docs/benchmark.md)."""
    protocol_version: int | None = None
    """The protocol's version (default: its newest; 1 is the version 1 leaderboard's)."""
    tune: bool = False
    """Choose the method's learning rate: the protocol's grid × its design seeds at k = 0, one
    program per task, into --out/tuning/ and --out/tuning.json; then exit."""
    held_out: bool = False
    """Run the protocol's held-out tasks instead of its tasks (cpu v3: scored only after every
    method of the board has run; a directory of their own, e.g.
    results/lag-bench/cpu-v3-held-out/<method>), tuning included."""
    learning_rate: float | None = None
    """Run at this learning rate instead of the tuned one (recorded as not tuned)."""
    out: str = ""
    """The method's directory (default runs/lag-bench/<protocol>/<method>)."""
    lag_profile: str = ""
    """Your system's lag profile, a JSON file {"probabilities": [p_0, ..., p_{C-1}]} (e.g.
    docs/lag_profiles/example.json): the method also runs acting with it on every task, and the
    scorecard adds its retention (score under the profile ÷ own score at k = 0)."""
    leaderboard: str = ""
    """Directory of the other methods' benchmarks, one sub-directory each (default: the
    repository's results/lag-bench/<protocol>, when vaco_jax is installed from a checkout)."""
    shard: str = ""
    """i/n: this process takes cells i, i + n, ...; slurm: this SLURM job array task's (unset:
    every cell)."""
    report_only: bool = False
    """Write the report (v1: the scorecard; v2: --out/leaderboard/) from the cells already in
    --out; run nothing."""
    plan: bool = False
    """Print the run's size (cells, programs, runs, env steps, evaluation episodes, and the time
    where a finished cell of the same task and setting measured its throughput) and exit."""
    table: str = ""
    """Write the leaderboard table (leaderboard.md) and figure (leaderboard.png) of every method
    in this directory, and exit (protocol v2: recomputed from the per-run files, with its tables
    as CSV: `study.robustness`)."""
    check: bool = False
    """With --table: recompute the leaderboard (protocol v2) from the per-run files committed in
    the directory and exit non-zero, naming each file, when a number differs."""
    agree_with: str = ""
    """With --table: also compare the leaderboard with a controlled-lag study's report
    (its degradation.csv, e.g. results/lag-cpu/lag_report/degradation.csv) in agreement.md."""
    max_cells: int | None = None
    """Stop after this many cells (resume later with the same command)."""
    allow_code_change: bool = False
    """Add to a directory whose cells were made by other code (normally refused)."""
    progress: bool = True
    """A progress bar per cell on a terminal."""
    compile_cache: str = "default"
    """JAX's persistent compilation cache: default (off if VACO_JAX_COMPILE_CACHE=off), off, or a
    directory."""


def main(argv: list[str] | None = None, prog: str = "vaco-bench") -> int:
    args = tyro.cli(Args, args=argv, description=__doc__.split("\n\n")[0], prog=prog)
    from vaco_jax import runtime
    from vaco_jax.study import bench, scorecard, sweep

    if args.table and _llm_board(args.table):
        return _llm_table(args)
    if args.protocol.startswith("llm-"):
        return _llm(args)
    if args.table and args.check:
        from vaco_jax.study import robustness
        if robustness.protocol_version(args.table) == 1:
            print(f"error: {args.table} is a protocol v1 leaderboard: its methods' per-run files "
                  "are not kept, so --check has nothing to recompute; `vaco-report --all --check` "
                  "regenerates its tables from the committed scorecards", file=sys.stderr)
            return 2
        try:
            problems = robustness.check(args.table)
        except FileNotFoundError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print("\n".join(problems) or f"{args.table}: every table matches its recomputation")
        return 1 if problems else 0
    if args.table:
        from vaco_jax.study import leaderboard, robustness
        try:
            if (robustness.protocol_version(args.table) or 1) >= 2:
                if args.agree_with:
                    raise ValueError("option `agree_with` compares a protocol v1 leaderboard "
                                     f"with a study; {args.table} holds protocol v2 methods")
                written = robustness.write_leaderboard(args.table)
            else:
                written = leaderboard.write(args.table, args.agree_with or None)
        except (FileNotFoundError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print("\n".join(str(p) for p in written))
        return 0
    try:
        if not args.algo:
            raise ConfigError("option `algo` is required (e.g. --algo vaco)")
        proto = bench.protocol(args.protocol, args.protocol_version)
        if args.held_out:
            if not proto.held_out:
                raise ConfigError(f"option `held_out` is invalid for protocol {proto.name} "
                                  f"v{proto.version}: it names no held-out tasks")
            proto = dataclasses.replace(proto, tasks=proto.held_out, held_out=())
        proto.check_requires()
        method = bench.Method(args.algo, bench.parse_overrides(args.set), args.label)
        lag_profile = read_lag_profile(args.lag_profile) if args.lag_profile else ()
        if (args.tune or args.learning_rate is not None) and not proto.tuned:
            raise ConfigError(f"option `{'tune' if args.tune else 'learning_rate'}` is invalid "
                              f"for protocol {proto.name} v{proto.version}: it has no "
                              f"learning-rate grid (its tasks set the learning rate)")
        if args.tune:
            cells = bench.tuning_cells(method, proto)
        else:
            cells = bench.bench_cells(method, proto, lag_profile, learning_rate=args.learning_rate)
        shard = sweep.shard_option(args.shard)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path("runs") / "lag-bench" / proto.name / method.name
    leaderboard_dir = (Path(args.leaderboard) if args.leaderboard else
                       bench.committed_leaderboard(proto.name, proto.version,
                                                   held_out=args.held_out))
    if args.leaderboard and not leaderboard_dir.is_dir():
        print(f"error: option `leaderboard` = {args.leaderboard!r} is invalid: not a directory",
              file=sys.stderr)
        return 2
    if args.plan:
        print(_plan(cells, method, proto, out, leaderboard_dir, tune=args.tune))
        return 0
    if args.tune:
        runtime.start(runtime.Cluster(), compile_cache=args.compile_cache)
        try:
            tuning = bench.run_tuning(method, proto, out, shard=shard, progress=args.progress,
                                      allow_code_change=args.allow_code_change,
                                      max_cells=args.max_cells)
        except KeyboardInterrupt:
            from vaco_jax.commands.sweep import interrupted

            print(interrupted(out, prog, sys.argv[1:] if argv is None else argv), file=sys.stderr)
            return 130
        except (ConfigError, SweepError, CheckpointError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        if tuning is None:
            print(f"the learning-rate choice is not finished yet: run the same command again")
            return 0
        cost = tuning["cost"]
        if tuning.get("per_task"):
            for env, task in tuning["tasks"].items():
                steps = len(task["steps"]) - 1
                print(f"{env}: " + ", ".join(f"{k} {v:g}" for k, v in task["chosen"].items())
                      + f" chosen of {len(task['configurations'])} configurations"
                      + (f" ({steps} extension{'s' * (steps != 1)} of the grid)" if steps else "")
                      + (f"; {'; '.join(task['steps'][-1]['notes'])}" if task["edge"] else ""))
            print(f"tuning: {out / bench.TUNING_FILE}; cost {cost['wall_seconds']:.0f} s "
                  f"({cost['compile_seconds']:.0f} s compiling)")
            return 0
        print(f"learning rate {tuning['chosen']:g} chosen ({out / bench.TUNING_FILE}); mean "
              f"normalised AUC {', '.join(f'{k}: {v:.3f}' for k, v in tuning['score'].items())}; "
              f"cost {cost['wall_seconds']:.0f} s ({cost['compile_seconds']:.0f} s compiling)")
        return 0
    if not args.report_only:
        runtime.start(runtime.Cluster(), compile_cache=args.compile_cache)
        try:
            # Before anything runs: whether the scorecard will be compared with the leaderboard.
            print(bench.leaderboard_comparability(
                leaderboard_dir, proto, log=lambda line: print(line, file=sys.stderr, flush=True)),
                file=sys.stderr)
            bench.run_bench(method, proto, out, shard=shard, progress=args.progress,
                            allow_code_change=args.allow_code_change, max_cells=args.max_cells,
                            lag_profile=lag_profile, learning_rate_given=args.learning_rate)
        except KeyboardInterrupt:
            from vaco_jax.commands.sweep import interrupted

            print(interrupted(out, prog, sys.argv[1:] if argv is None else argv), file=sys.stderr)
            return 130
        except (ConfigError, SweepError, CheckpointError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    if proto.version >= 2:   # the leaderboard's report is written from the runs by `--table`
        print(f"the runs are in {out / bench.RUNS}")
        return _beside(out, leaderboard_dir, [cell.cell_id for cell in cells])
    card = _scorecard(lambda: scorecard.scorecard(out, leaderboard_dir), out, out / bench.RUNS)
    if isinstance(card, int):
        return card
    written = scorecard.write(card, out)
    if not leaderboard_dir.is_dir():
        print(f"note: compared with no other method: there is no leaderboard at {leaderboard_dir} "
              f"(--leaderboard DIR names one)", file=sys.stderr)
    if card.missing:
        print(f"{len(card.missing)} cells not finished yet: {', '.join(card.missing)}")
    print("\n".join(str(p) for p in written))
    return 0



def _beside(out: Path, leaderboard: Path, cells: list[str]) -> int:
    """Protocol v2, once every cell in `cells` has finished: the method ranked among the
    leaderboard's methods that compute what this checkout computes, in `out`/leaderboard/."""
    from vaco_jax.study import bench, robustness

    runs = out / bench.RUNS
    missing = bench.unfinished(cells, runs)
    if missing:
        print(f"{len(missing)} cells not finished yet: {', '.join(missing)}")
        return 0
    report = _scorecard(lambda: robustness.beside(out, leaderboard, bench.computed_here), out,
                        runs)
    if isinstance(report, int):
        return report
    print("\n".join(str(p) for p in robustness.write(report, out / robustness.BESIDE)))
    return 0


def _scorecard(make, out: Path, runs: Path):
    """`make()`'s scorecard, or the exit status after saying why it could not be made: a report
    never ends a long run with a traceback (2: nothing to score; 1: the runs are kept)."""
    try:
        return make()
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # noqa: BLE001 -- a report never ends a long run with a traceback
        print(f"error: the scorecard of {out} could not be computed ({type(error).__name__}: "
              f"{error}); its runs are kept in {runs}: rerun with --report-only", file=sys.stderr)
        return 1


def _plan(cells, method, proto, out: Path, leaderboard: Path, *, tune: bool) -> str:
    """What `--plan` prints: the run's size, and its time where throughputs were measured (this
    directory's finished cells, then the leaderboard's)."""
    from vaco_jax.study import bench

    size = bench.plan_size(cells, bench.measured_cells(leaderboard, out))
    what = "the learning-rate choice" if tune else "the scored runs"
    lines = [f"protocol {proto.name} v{proto.version}, {what}: {size['cells']} cells "
             f"({size['programs']} compiled programs), {size['runs']} runs, "
             f"{size['env_steps']:,} env steps, {size['evaluation_episodes']:,} evaluation episodes"]
    lines += [f"  {cell.cell_id}: {len(cell.runs)} runs × {cell.config.env_steps:,} steps"
              for cell in cells]
    parts = [("the scored runs" if not tune else "the learning-rate choice", size)]
    if proto.tuned and not tune:
        tuning = bench.plan_size(bench.tuning_cells(method, proto),
                                 bench.measured_cells(leaderboard, out))
        lines.append(f"the learning-rate choice before it (--tune): {tuning['cells']} cells, "
                     f"{tuning['runs']} runs, {tuning['env_steps']:,} env steps, "
                     f"{tuning['evaluation_episodes']:,} evaluation episodes")
        if not (out / bench.TUNING_FILE).exists():
            parts.insert(0, ("the learning-rate choice", tuning))
    for what, part in parts:
        lines.append(f"  {what}: " + (
            f"about {part['estimated_seconds'] / 60:.0f} min (the measured steps/s and compile "
            f"time of finished cells of the same tasks)" if part["estimated_seconds"] is not None
            else f"not estimated (no measured throughput for {len(part['unmeasured'])} of its "
                 f"{part['cells']} cells)"))
    lowered = _cells_to_lower(leaderboard, proto)
    lines.append("  before the first run, the leaderboard's comparability check " + (
        f"lowers up to {lowered} cells (seconds to a minute each; its results were made by other "
        f"code; none that the per-user cache holds already)" if lowered else
        "lowers no cell (its results were made by this checkout's code, or keyed otherwise)"))
    from vaco_jax import algorithms

    if any(not algorithms.is_builtin(algorithms.parse(c.config.algo).objective) for c in cells):
        lines.append(f"  a user objective's {len(cells)} cells are lowered at every run to key "
                     f"them (seconds to a minute each)")
    known = [part["estimated_seconds"] for _, part in parts]
    lines.append("estimated time in all: " + (
        f"{sum(known) / 60:.0f} min of runs, plus the lowering above" if None not in known
        else "not estimated (see above)"))
    return "\n".join(lines)


def _cells_to_lower(leaderboard: Path, proto) -> int:
    """How many leaderboard cells the comparability check may lower here: those of results made
    by other code than this checkout's (fewer where the per-user cache holds them already)."""
    import json

    from vaco_jax.study import bench, keys

    count = 0
    for path in sorted(leaderboard.glob(f"*/{bench.BENCH_FILE}")) if leaderboard.is_dir() else []:
        key = json.loads(path.read_text()).get("comparability") or {}
        if key.get("protocol") != proto.name or key.get("protocol_version") != proto.version:
            continue
        if key.get("scheme") == keys.SCHEME and key.get("code") != keys.code_digest():
            count += len(key.get("programs", {}))
    return count


# Options of the control protocols that an LLM protocol does not take, and why.
_NOT_LLM = {"set": "an LLM objective's own hyper-parameters are the protocol's",
            "label": "an LLM entry is named by its objective",
            "learning_rate": "the LLM protocols fix the learning rate",
            "lag_profile": "the LLM protocols' lags are their own",
            "shard": "an LLM entry runs in one process",
            "max_cells": "an LLM entry resumes by its finished runs",
            "agree_with": "it compares a control leaderboard"}


def _llm_board(directory: str) -> bool:
    from vaco_jax.llm import scorecard

    return Path(directory).is_dir() and scorecard.is_llm_board(directory)


def _llm_table(args: Args) -> int:
    """`--table DIR` (and `--check`) of an LLM leaderboard."""
    from vaco_jax.llm import scorecard

    try:
        if args.check:
            problems = scorecard.check(args.table)
            print("\n".join(problems) or f"{args.table}: every table matches its recomputation")
            return 1 if problems else 0
        written = scorecard.write_board(args.table)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("\n".join(str(p) for p in written))
    return 0


def _llm(args: Args) -> int:
    """One objective on an LLM protocol: its plan, or its runs (resumed) and scorecard."""
    from vaco_jax import runtime
    from vaco_jax.llm import bench as llm_bench, scorecard
    from vaco_jax.study import bench

    defaults = Args()
    try:
        for name, why in _NOT_LLM.items():
            if getattr(args, name) != getattr(defaults, name):
                raise ConfigError(f"option `{name}` is invalid for protocol {args.protocol}: {why}")
        proto = llm_bench.protocol(args.protocol, args.protocol_version)
        llm_bench.check(proto, args.algo)
        if args.tune and proto.tuning is None:
            raise ConfigError(f"option `tune` is invalid for protocol {proto.name} "
                              f"v{proto.version}: it fixes its configuration (version 2 tunes)")
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path("runs") / "lag-bench" / proto.name / args.algo
    leaderboard = (Path(args.leaderboard) if args.leaderboard
                   else bench.committed_leaderboard(proto.name, proto.version))
    if args.leaderboard and not leaderboard.is_dir():
        print(f"error: option `leaderboard` = {args.leaderboard!r} is invalid: not a directory",
              file=sys.stderr)
        return 2
    if args.plan:
        print(llm_bench.plan_text(proto, args.algo))
        return 0
    if not args.report_only:
        runtime.start(runtime.Cluster(), compile_cache=args.compile_cache)
        log_path = out / "log.txt"
        if runtime.is_primary():
            log_path.parent.mkdir(parents=True, exist_ok=True)

        def log(line):  # to the terminal and, with a timestamp, to out/log.txt (process 0 only)
            if runtime.is_primary():
                print(line, flush=True)
                with open(log_path, "a") as f:
                    f.write(f"{time.strftime('%H:%M:%S')} {line}\n")
        try:
            if args.tune:
                llm_bench.tune(proto, args.algo, out, log=log)
                return 0
            llm_bench.run(proto, args.algo, out, log=log)
        except (ConfigError, SweepError, CheckpointError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    if proto.tuning is not None:   # version 2 reports through its study file
        print(f"{out / llm_bench.RUNS_TABLE}: the runs; the board's tests: vaco-report "
              f"--study-file studies/{proto.name}-v{proto.version}.toml")
        return 0
    card = _scorecard(lambda: scorecard.scorecard(out, leaderboard), out, out)
    if isinstance(card, int):
        return card
    for note in card.notes:
        print(f"note: {note}", file=sys.stderr)
    print("\n".join(str(p) for p in scorecard.write(card, out)))
    return 0
