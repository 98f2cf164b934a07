"""The lag-robustness benchmark: any method, a fixed versioned protocol, one scorecard.

A **protocol** fixes everything but the method: tasks (env, budget, shapes, seeds), a constant
backward-lag axis k (every actor acts with the snapshot k learner iterations old: capacity k + 1,
`snapshot_sampling="oldest"`, as in the controlled-lag study), and a high-update-frequency setting
(forward lag: more epochs per batch) at the lags it names. A **method** is an algorithm
(`--algo`: a registry name, `<estimator>+<objective>`, a user's `<estimator>+<module>:<function>`)
with optional config overrides (`ppo_kl` with `kl_adaptive=True`). Seed s of every method uses
`PRNGKey(protocol.seed + s)`, so methods are paired by seed (common random numbers).

`bench_cells` plans a method's cells (one compiled program per task and setting, every lag ×
seed vmapped in it); `run_bench` runs them with the sweep machinery (`vaco_jax.study.sweep`:
resumable cell by cell, shardable over processes) into `<out>/runs/`, and records in
`<out>/bench.json` the method, the protocol and its **comparability key**: the protocol's
version, the libraries' versions and what each cell computes (`cell_key`: the StableHLO of its
programs, without source locations, and its runs' hyper-parameters and seeds). Two results may be
compared when both are what one checkout computes (`computed_here`): a docstring or a refactor
keeps a leaderboard comparable, a change of behaviour does not. The scorecard itself is
`vaco_jax.study.scorecard`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from pathlib import Path
from typing import Any

from vaco_jax import algorithms, cache, io, program
from vaco_jax.config import Config, validate, with_lag_profile
from vaco_jax.errors import ConfigError
from vaco_jax.study import sweep
from vaco_jax.study.sweep import Cell, Run

BENCH_FILE = "bench.json"
RUNS = "runs"
REFERENCES = "random_returns.json"
STUDY = "bench"
PROFILE = "profile"   # the setting of a method acting with the user's lag profile

def committed_leaderboard(protocol: str) -> Path:
    """The leaderboard committed with the repository, `results/lag-bench/<protocol>` of the
    checkout this package runs from (absent when it is installed without one): found from any
    directory."""
    return Path(io.__file__).resolve().parent.parent / "results" / "lag-bench" / protocol


# Modules that read results but never make them: editing them leaves every benchmark result valid.
ANALYSIS_ONLY = ("pipeline/", "study/robustness.py", "study/analysis.py", "study/lag.py",
                 "study/plotting.py", "study/scorecard.py", "study/stats.py", "study/settings.py", "study/leaderboard.py", "loggers.py", "llm/",
                 "commands/lag_report.py", "commands/plots.py", "commands/plot_diagnostics.py",
                 "commands/plot_forward_lag.py", "commands/plot_runs.py")


@dataclasses.dataclass(frozen=True)
class Task:
    env: str
    config: tuple[tuple[str, Any], ...]
    """Config fields of every run on this task (budget, shapes)."""
    seeds: int


@dataclasses.dataclass(frozen=True)
class Protocol:
    """What a method is scored on. Changing anything here changes `version`."""

    name: str
    version: int
    tasks: tuple[Task, ...]
    lags: tuple[int, ...]
    """Constant backward lags k (learner iterations), 0 first: synchronous."""
    forward: tuple[tuple[str, Any], ...]
    """Static overrides of the high-update-frequency setting (e.g. num_epochs=16)."""
    forward_lags: tuple[int, ...] = (0,)
    """The lags the high-update-frequency setting runs at."""
    seed: int = 200
    """Seed s of a task runs with `PRNGKey(seed + s)`."""
    references: tuple[str, ...] = ("ppo_clip", "appo", "vaco")
    """The methods every scorecard is tested against (the pre-registered family)."""
    last_evals: int = 3
    """A run's final score: the mean of its last this many evaluations."""
    description: str = ""

    @property
    def largest_lag(self) -> int:
        return max(self.lags)

    def describe(self) -> dict:
        return io.to_jsonable(dataclasses.asdict(self))


_TINY = (("num_envs", 8), ("unroll_length", 8), ("num_epochs", 2), ("num_minibatches", 2),
         ("num_actors", 2), ("episode_length", 50), ("num_evals", 4), ("eval_envs", 4),
         ("total_steps", 8_192), ("learning_rate", 1e-3))
# The controlled-lag study's CPU shapes (presets._LAG_CPU_SHAPES): 32 envs × 32 steps per
# iteration, K = 4 epochs × M = 8 minibatches, 20 evaluations of 16 episodes.
_CPU = (("num_envs", 32), ("unroll_length", 32), ("num_epochs", 4), ("num_minibatches", 8),
        ("num_actors", 4), ("episode_length", 1000), ("num_evals", 20), ("eval_envs", 16))

PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (
    Protocol("tiny", 1, (Task("toy_reach", _TINY, 3),), lags=(0, 1, 3),
             forward=(("num_epochs", 4),), forward_lags=(0, 3), seed=200,
             description="seconds on a CPU: the pipeline end to end (tests, CI)"),
    # inverted_double_pendulum at the controlled-lag study's budget: there (results/lag-cpu)
    # PPO-KL, SPO, decoupled PPO and adaptive PPO-KL break by k = 15 and PPO-Clip, APPO and VACO
    # do not; at half the budget every method, PPO-Clip and VACO included, is still below 0.8 of
    # its synchronous score at k = 15 (lag slows learning before it ends at the cap), so the
    # budget cannot be cut. Forward lag: 16 epochs per batch instead of 4 (4x the SGD steps).
    Protocol("cpu", 1, (Task("inverted_double_pendulum", _CPU + (("total_steps", 614_400),), 10),),
             lags=(0, 3, 15), forward=(("num_epochs", 16),), forward_lags=(0,), seed=200,
             description="one 2-core CPU machine, about half an hour per method"),
    Protocol("gpu", 1, (
        Task("inverted_double_pendulum", _CPU + (("total_steps", 614_400),), 10),
        Task("dmc:CartpoleSwingup", _CPU + (("total_steps", 1_024_000),), 10),
        Task("dmc:CheetahRun", _CPU + (("total_steps", 1_024_000),), 10),
        Task("hopper", _CPU + (("total_steps", 1_024_000), ("mjx_solver", "fast")), 10)),
        lags=(0, 3, 15), forward=(("num_epochs", 16),), forward_lags=(0, 15), seed=200,
        description="the four tasks of the controlled-lag study: one GPU (needs the dmc extra)"),
)}


def protocol(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise ConfigError(f"option `protocol` = {name!r} is invalid: allowed values are "
                          f"{list(PROTOCOLS)}")
    return PROTOCOLS[name]


# --- methods -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Method:
    algo: str
    overrides: tuple[tuple[str, Any], ...] = ()
    label: str = ""

    @property
    def name(self) -> str:
        """The method's name in tables: its label, else `algo` or `algo[field=value,...]`."""
        if self.label:
            return self.label
        if not self.overrides:
            return self.algo
        return f"{self.algo}[{','.join(f'{k}={v}' for k, v in self.overrides)}]"


def parse_overrides(items) -> tuple[tuple[str, Any], ...]:
    """`field=value` strings as typed Config overrides (JSON values: 1e-3, true, "learner"), each
    field checked to exist; `ConfigError` names the option otherwise. A field that holds a tuple
    takes a JSON list (`actor_hidden=[64,64]`) or items one at a time, each `--set` adding one
    (`objective_hparams=tau=0.1 objective_hparams=scale=2`)."""
    hints = typing.get_type_hints(Config)
    out: dict[str, Any] = {}
    for item in items:
        name, eq, text = str(item).partition("=")
        if not eq or name not in hints:
            raise ConfigError(f"option `set` item {item!r} is invalid: write field=value with a "
                              f"Config field (e.g. kl_adaptive=true)")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text   # a bare string, e.g. learner
        if typing.get_origin(hints[name]) is tuple:
            value = tuple(value) if isinstance(value, list) else out.get(name, ()) + (value,)
        elif isinstance(value, list):
            value = tuple(value)
        out[name] = value
    return tuple(out.items())


# --- planning ------------------------------------------------------------------------------------
def bench_cells(method: Method, proto: Protocol, lag_profile=()) -> list[Cell]:
    """The method's cells: per task, the lag axis (one program: every lag × seed) and the
    high-update-frequency setting (another program), each config validated before compiling.
    With a `lag_profile` (`config.read_lag_profile`), also the method acting with it at the
    protocol's shapes (setting `profile`, capacity the profile's length: a program per task)."""
    cells = []
    for task in proto.tasks:
        seeds = range(proto.seed, proto.seed + task.seeds)
        settings = [("lag", proto.lags, ())]
        if proto.forward:
            settings.append(("forward", proto.forward_lags, proto.forward))
        for variant, lags, extra in settings:
            capacities = tuple(k + 1 for k in lags)
            fields = {**dict(task.config), **dict(extra), **dict(method.overrides)}
            fields.update(algo=method.algo, snapshot_sampling="oldest",
                          capacity=max(capacities), max_capacity=max(capacities))
            try:
                config = Config(env=task.env, **fields)
            except TypeError as error:
                raise ConfigError(f"method {method.name!r}: {error}") from None
            validate(config)
            runs = tuple(Run(c, float(config.delta), s) for c in capacities for s in seeds)
            for run in runs:
                validate(dataclasses.replace(config, capacity=run.capacity))
            cells.append(Cell(STUDY, task.env, method.name, variant, config, runs))
        if lag_profile:
            lag = cells[-len(settings)].config   # the lag axis's config, at the profile
            config = with_lag_profile(dataclasses.replace(lag, max_capacity=0), lag_profile)
            validate(config)
            runs = tuple(Run(config.capacity, float(config.delta), s) for s in seeds)
            cells.append(Cell(STUDY, task.env, method.name, PROFILE, config, runs))
    return cells


# --- the code that makes a result ----------------------------------------------------------------
def result_sources() -> dict[str, str]:
    """A hash (12 hex digits) per source file of the package that can change a result (every
    module but `ANALYSIS_ONLY`), by path relative to the package."""
    package = Path(io.__file__).resolve().parent
    out = {}
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if any(relative == a or (a.endswith("/") and relative.startswith(a)) for a in ANALYSIS_ONLY):
            continue
        out[relative] = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    return out


def result_code(sources: dict[str, str]) -> str:
    """One hash of `result_sources()`."""
    return hashlib.sha256(json.dumps(sources, sort_keys=True).encode()).hexdigest()[:16]


def code_difference(ours: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """The files whose code differs between two `result_sources()` (added, removed or edited)."""
    return sorted(name for name in set(ours) | set(theirs) if ours.get(name) != theirs.get(name))


# --- what a result computes: whether two results may be compared --------------------------------
# The libraries whose versions key a result: this package's own code is in its programs, and
# rliable only reads results.
KEY_LIBRARIES = tuple(name for name in io.LIBRARIES if name not in ("vaco_jax", "rliable"))


def key_versions() -> dict[str, str]:
    """The versions of `KEY_LIBRARIES` installed here."""
    versions = io.library_versions()
    return {name: versions[name] for name in KEY_LIBRARIES}


def program_digest(cell: Cell) -> str:
    """What `cell` computes, as a hash (16 hex digits): its config and runs (`Cell.fingerprint`,
    which holds the hyper-parameters and seeds its programs take as arguments) and the StableHLO
    of its programs without source locations (`program.lowered_text`). A comment, a docstring or
    a refactor that computes the same keeps it; a change of behaviour does not. Lowered every
    call: `cell_key` keeps it per checkout."""
    text = program.lowered_text(cell.config, len(cell.runs))
    return hashlib.sha256(f"{cell.fingerprint()}\0{text}".encode()).hexdigest()[:16]


def cell_key(cell: Cell) -> str:
    """`program_digest(cell)`, kept in the per-user cache under everything its lowering depends
    on (this package's source, the library versions, JAX's settings: `cache.program_key`), so a
    checkout lowers each cell once. A cell of a user objective is lowered every time (its code is
    not in the package's source)."""
    if not algorithms.is_builtin(algorithms.parse(cell.config.algo).objective):
        return program_digest(cell)
    path = cache.user_dir("program-keys") / f"{cache.program_key('bench cell', cell.fingerprint())}"
    try:
        return path.read_text().strip()
    except OSError:
        pass
    key = program_digest(cell)
    try:
        io.write_bytes_atomic(path, key.encode())
    except OSError:   # a read-only cache costs only time
        pass
    return key


def comparability_key(method: Method, proto: Protocol, lag_profile=()) -> dict:
    """What decides whether a result of `method` on `proto` (and `lag_profile`) may be compared
    with another: the protocol and its version, the `KEY_LIBRARIES`' versions, and each cell's
    `cell_key`."""
    cells = bench_cells(method, proto, lag_profile)
    return {"protocol": proto.name, "protocol_version": proto.version, "versions": key_versions(),
            "programs": {cell.cell_id: cell_key(cell) for cell in cells}}


def _method_of(info: dict) -> Method:
    overrides = tuple((name, tuple(value) if isinstance(value, list) else value)
                      for name, value in info["overrides"])   # JSON keeps tuples as lists
    return Method(info["algo"], overrides, info["method"] if info["method"] != info["algo"] else "")


def computed_here(info: dict) -> tuple[bool, str]:
    """Whether the result `info` (a `bench.json`) describes is what this checkout computes, and
    why: its protocol version, library versions and every cell's program (lowered here,
    `cell_key`) are this checkout's. A result recorded before programs were keyed is this
    checkout's only if its result code is (`result_sources`)."""
    proto = PROTOCOLS.get(info["protocol"])
    if proto is None or proto.version != info["protocol_version"]:
        here = f"v{proto.version}" if proto is not None else "no such protocol"
        return False, (f"made on protocol {info['protocol']} v{info['protocol_version']} "
                       f"(here: {here})")
    key = info.get("comparability")
    versions = (key or {}).get("versions") or {name: value for name, value in
                                               info.get("versions", {}).items()
                                               if name in KEY_LIBRARIES}
    ours = key_versions()
    changed = [name for name in KEY_LIBRARIES   # a library it did not record counts for nothing
               if name in versions and versions[name] != ours[name]]
    if changed:
        return False, "made with " + ", ".join(
            f"{name} {versions[name]} (here {ours[name]})" for name in changed)
    if key is None:
        sources = result_sources()
        if info.get("result_code") == result_code(sources):
            return True, f"same result code, versions and protocol {proto.name} v{proto.version}"
        files = code_difference(sources, info.get("result_sources", {}))
        shown = ", ".join(files[:6]) + (f" and {len(files) - 6} more" if len(files) > 6 else "")
        return False, (f"made before results recorded their programs, by other code (result code "
                       f"{info.get('result_code')} at commit "
                       f"{str(info.get('git_commit') or 'unrecorded')[:7]}, its files differing "
                       f"from this checkout's in {shown})")
    try:
        cells = bench_cells(_method_of(info), proto, tuple(info.get("lag_profile", ())))
    except ConfigError as error:
        return False, f"its method cannot be planned here ({error})"
    recorded = key.get("programs", {})
    if sorted(recorded) != sorted(cell.cell_id for cell in cells):
        return False, (f"its cells ({', '.join(sorted(recorded))}) are not the ones planned here "
                       f"({', '.join(cell.cell_id for cell in cells)})")
    for cell in cells:
        if cell_key(cell) != recorded[cell.cell_id]:
            return False, f"program of cell {cell.cell_id} differs"
    return True, f"same programs, versions and protocol {proto.name} v{proto.version}"


def leaderboard_comparability(directory: Path, proto: Protocol) -> str:
    """Said before a run: whether the methods of the leaderboard in `directory` on `proto` are
    what this checkout computes (`computed_here`), so that the scorecard compares with them, and
    why; for those that are not, the two ways to a comparison."""
    directory = Path(directory)
    entries = []
    for path in sorted(directory.glob(f"*/{BENCH_FILE}")) if directory.is_dir() else []:
        info = json.loads(path.read_text())
        if info.get("protocol") == proto.name:
            entries.append((info, *computed_here(info)))
    where = f"leaderboard {directory}"
    if not entries:
        return f"{where}: no method on protocol {proto.name} to compare with"
    reasons = sorted({why for _, _, why in entries})
    if len(reasons) == 1:
        verdict = "comparable" if entries[0][1] else "not comparable"
        line = f"{where} ({len(entries)} methods): {verdict}: {reasons[0]}"
    else:
        ok = [info["method"] for info, same, _ in entries if same]
        head = (f"comparable with {len(ok)} of {len(entries)} methods ({', '.join(ok)}); not with "
                if ok else f"not comparable with any of its {len(entries)} methods: ")
        line = f"{where}: {head}" + "; ".join(
            f"{info['method']}: {why}" for info, same, why in entries if not same)
    commits = sorted({str(info.get("git_commit") or "unrecorded")[:7]
                      for info, same, _ in entries if not same})
    if commits:
        line += (f". To compare, run this benchmark with their code (a git worktree at commit "
                 f"{commits[0]}: docs/benchmark.md, \"Which results are compared\"), or "
                 f"recompute the methods you want beside it with this code")
    return line


# --- running -------------------------------------------------------------------------------------
def record(out: Path, method: Method, proto: Protocol, lag_profile=(), key: dict | None = None,
           *, allow_code_change: bool = False) -> dict:
    """`<out>/bench.json`: what `out` holds, the code that made it and what it computes (`key`:
    `comparability_key`, computed here if not given). A directory holds one method on one
    protocol, and at most one lag profile: another is refused, and so is another version of the
    method's user objective (unless `allow_code_change`)."""
    sources = result_sources()
    data = {"method": method.name, "algo": method.algo,
            "overrides": [list(item) for item in method.overrides],
            "protocol": proto.name, "protocol_version": proto.version,
            "protocol_definition": proto.describe(),
            "comparability": (comparability_key(method, proto, lag_profile) if key is None
                              else key),
            "result_code": result_code(sources), "result_sources": sources,
            "objective": algorithms.objective_record(algorithms.parse(method.algo).objective,
                                                     dict(method.overrides).get("objective_hparams", ())),
            **io.provenance()}
    if lag_profile:
        data["lag_profile"] = list(lag_profile)
    path = out / BENCH_FILE
    if path.exists():
        old = json.loads(path.read_text())
        if (old["method"], old["protocol"], old["protocol_version"]) != \
                (data["method"], data["protocol"], data["protocol_version"]):
            raise ConfigError(
                f"{out} holds method {old['method']!r} on protocol {old['protocol']} "
                f"v{old['protocol_version']}, not {data['method']!r} on {proto.name} "
                f"v{proto.version}: use another --out directory")
        theirs = (old.get("objective") or {}).get("code")
        ours = data["objective"].get("code")
        if (theirs or ours) and not allow_code_change and (
                (ours or {}).get("fingerprint") is None
                or (theirs or {}).get("fingerprint") != ours["fingerprint"]):
            raise ConfigError(
                f"{out} holds method {old['method']!r} made by another version of its objective "
                f"{data['objective']['name']!r} (fingerprint "
                f"{(theirs or {}).get('fingerprint') or 'not recorded'}; this code's: "
                f"{(ours or {}).get('fingerprint') or 'unknown'}): results of two versions would "
                f"mix under one name. Use another --out directory, or --allow-code-change to add "
                f"to it anyway")
        if lag_profile and old.get("lag_profile", list(lag_profile)) != list(lag_profile):
            raise ConfigError(
                f"{out} holds the method under lag profile {old['lag_profile']}, not "
                f"{list(lag_profile)}: use another --out directory for another profile")
        if lag_profile and "lag_profile" not in old:   # the profile's cells join the others
            old["lag_profile"] = list(lag_profile)
            if "comparability" in old:   # and so do their programs
                old["comparability"]["programs"] = {**data["comparability"]["programs"],
                                                    **old["comparability"]["programs"]}
            io.write_json_atomic(path, old)
        return old   # runs of other code are refused by the sweep (unless allow_code_change)
    out.mkdir(parents=True, exist_ok=True)
    io.write_json_atomic(path, data)
    return data


def random_returns(out: Path, proto: Protocol) -> dict[str, float]:
    """The random policy's mean return per task (the scores' zero), measured once per directory."""
    from vaco_jax.study import references

    path = out / REFERENCES
    table = json.loads(path.read_text()) if path.exists() else {}
    missing = [t for t in proto.tasks if t.env not in table]
    for task in missing:
        episode_length = dict(task.config).get("episode_length", Config().episode_length)
        table[task.env], _ = references.random_policy_return(
            task.env, episode_length=episode_length, num_episodes=64, seed=0)
    if missing:
        io.write_json_atomic(path, table)
    return table


def run_bench(method: Method, proto: Protocol, out: str | Path, *, shard=None, log=print,
              progress: bool = False, allow_code_change: bool = False,
              max_cells: int | None = None, lag_profile=()) -> list[str]:
    """Run the method's unfinished cells into `<out>/runs/` (resumable, shardable); returns the
    ids of the cells run now. With a `lag_profile`, its cells too (`bench_cells`)."""
    out = Path(out)
    cells = bench_cells(method, proto, lag_profile)
    key = comparability_key(method, proto, lag_profile)
    record(out, method, proto, lag_profile, key, allow_code_change=allow_code_change)
    random_returns(out, proto)
    return sweep.run_sweep(cells, out / RUNS, log=log, progress=progress, shard=shard,
                           allow_code_change=allow_code_change, max_cells=max_cells,
                           programs=key["programs"])
