"""Lag sweeps (SPEC §7): algorithms × buffer capacities × envs × seeds, as a tidy table.

A sweep is planned as **cells**. A cell is one compiled program: one (env, algorithm, static
variant) whose runs — every capacity × δ × seed — are `jax.vmap`ped together (capacity and δ are
`HParams` leaves; the ring buffer allocates `max(capacities)` slots and masks the rest). A cell is
the unit of resumption: when it finishes, its rows are appended to `results.jsonl` and then its
completion record to `cells.jsonl`. Re-running the same command skips every finished cell (checked by
fingerprint, so a changed config is never silently mixed in) and drops rows of a cell that was
interrupted. Nothing already written is rewritten except to discard such partial rows, atomically.

Output directory:
    sweep.json      the plan (preset, cells with their configs and runs) and provenance
    results.jsonl   one row per run × evaluation: cell, study, env, algo, variant, capacity, delta,
                    seed, eval_index, step, budget, eval_return, filtered/clip fraction, TV estimate,
                    snapshot age, ... (`load_results` returns it as a pandas DataFrame)
    results.parquet the rows of results.jsonl once compacted (`compact`, `vaco-sweep --compact`):
                    Parquet, the values exactly as written, read before the rows appended since
    cells.jsonl     one record per finished cell: fingerprint, timings, steps/s, git commit
    partial/        the saved state of a cell in progress (one directory per cell fingerprint,
                    removed when it finishes): a long cell resumes where it was stopped
    locks/          one lock file per cell (held while a process runs it) and the directory's

Many processes can fill one directory together — a SLURM job array, or processes on several
machines sharing a file system: `shard=(i, n)` makes a process take every n-th cell of the plan
(`parse_shard("slurm")` reads it from SLURM's array variables), and any number of processes may
also share the same cells. A process runs a cell only while it holds the cell's lock (an OS file
lock: released when the process ends, however it ends), so a cell never runs twice at once; the
rows and the completion record of a cell are appended together under the directory's lock, each
append on a fresh line, so no row is lost or written twice. Rows without a completion record (a
process killed between the two appends) are discarded under the same lock, when a process starts
or claims their cell; a line torn by a process killed mid-append costs only itself. One cell id is
one cell: a directory refuses a cell id planned there with another config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import numpy as np
import pandas as pd
from filelock import FileLock, Timeout

from vaco_jax import cache, io, loggers, program as program_lib, runtime
from vaco_jax.config import Config, to_json_dict, validate, with_lag_profile
from vaco_jax.options import LoggerOptions
from vaco_jax.errors import ConfigError, SweepError
from vaco_jax.study.presets import PROFILE_VARIANT, STUDIES, Preset, method_variant
from vaco_jax.trainer import nonfinite_names, stack_hparams

RESULTS, CELLS, PLAN = "results.jsonl", "cells.jsonl", "sweep.json"
PROGRAM_KEY = "program.json"   # in a partial save's directory: the program key it was saved with
PARTIAL = "partial"   # in-progress cells' saved states, removed when a cell finishes
LOCKS = "locks"       # a lock per cell (held while it runs) and the directory's (`directory.lock`)
# Set per run by the cell (each run's seed), so left out of the cell's config fingerprint.
PER_RUN_FIELDS = ("seed", "num_seeds")
# The libraries whose versions key a result with its programs: this package's own code is in its
# programs, and rliable only reads results.
KEY_LIBRARIES = tuple(name for name in io.LIBRARIES if name not in ("vaco_jax", "rliable"))


def key_versions() -> dict[str, str]:
    """The versions of `KEY_LIBRARIES` installed here."""
    versions = io.library_versions()
    return {name: versions[name] for name in KEY_LIBRARIES}


@dataclasses.dataclass(frozen=True)
class Run:
    capacity: int
    delta: float
    seed: int
    hparams: tuple[tuple[str, float], ...] = ()
    """Other `HParams` leaves this run sets (e.g. `(("learning_rate", 1e-3),)`, or a
    `("lag_profile", (p_0, ...))`), vmapped like capacity and δ; each is a column of the run's rows."""
    tags: tuple[tuple[str, object], ...] = ()
    """Columns written into each of the run's rows that change nothing it computes (e.g. the
    benchmark's `("setting", "k=8")`)."""

    def config(self, config: Config) -> Config:
        """`config` with this run's capacity, δ and hyper-parameters."""
        return dataclasses.replace(config, capacity=self.capacity, delta=self.delta,
                                   **dict(self.hparams))

    def spec(self) -> dict:
        """What identifies the run in a cell's fingerprint (`hparams` and `tags` only when set, so
        cells planned before runs had them keep their fingerprints)."""
        spec = dataclasses.asdict(self)
        for name in ("hparams", "tags"):
            if not spec[name]:
                del spec[name]
        return spec


@dataclasses.dataclass(frozen=True)
class Cell:
    """One compiled program: a static config and the runs vmapped through it."""

    study: str
    env: str
    algo: str
    variant: str
    config: Config
    runs: tuple[Run, ...]
    part: int = -1          # index of this slice of the runs when a cell is split (-1: not split)

    @property
    def cell_id(self) -> str:
        suffix = f"#{self.part}" if self.part >= 0 else ""
        return f"{self.study}/{self.env}/{self.algo}/{self.variant}{suffix}"

    def fingerprint(self) -> str:
        """Hash of everything that determines the cell's results (config and runs)."""
        spec = {"config": _config_dict(self.config), "runs": [r.spec() for r in self.runs]}
        return hashlib.sha256(json.dumps(io.to_jsonable(spec), sort_keys=True).encode()).hexdigest()[:16]


def plan(preset: Preset, studies: Sequence[str] | None = None,
         algos: Sequence[str] | None = None, lag_profile: Sequence[float] = ()) -> list[Cell]:
    """The cells of `studies` (default: the preset's) at `preset`'s scale (only `algos`, if given,
    else the preset's), validated before anything compiles.

    With a `lag_profile` (`config.read_lag_profile`), every method of the studies acts with it
    instead of its snapshot sampling and the preset's capacities: one capacity, the profile's
    length; variant `profile` (`<method variant>,profile`). Methods that differ only in their
    sampling column (the lag study's `oldest` and `uniform`) become one cell."""
    studies = preset.studies if studies is None else studies
    algos = preset.algos if algos is None else algos
    unknown = [s for s in studies if s not in STUDIES]
    if unknown:
        raise ConfigError(f"unknown study {unknown}; allowed values are {list(STUDIES)}")
    cells = []
    for study_name in studies:
        study = STUDIES[study_name]
        for env in preset.envs:
            base = preset.env_base(env)
            deltas = study.deltas or (base.delta,)
            for algo, variant in study.entries:
                if algos is not None and algo not in algos:
                    continue
                capacities = [c for c in preset.capacities
                              if not variant.capacities or c in variant.capacities]
                config = dataclasses.replace(base, algo=algo, **dict(variant.overrides))
                name = variant.name
                if lag_profile:
                    config = with_lag_profile(dataclasses.replace(config, max_capacity=0),
                                              lag_profile)
                    capacities = [config.capacity]
                    method = method_variant(variant.name)
                    name = (PROFILE_VARIANT if method == "default"
                            else f"{method},{PROFILE_VARIANT}")
                if not capacities:   # e.g. a column of capacity 16 in a preset without it
                    continue
                settings = _settings(variant.hparams)
                runs = tuple(Run(c, float(d), preset.seed + s, h) for c in capacities
                             for d in deltas for h in settings for s in range(preset.seeds(env)))
                validate(config)
                for run in runs:
                    validate(run.config(config))
                if lag_profile and any((c.study, c.env, c.algo, c.variant) ==
                                       (study_name, env, algo, name) for c in cells):
                    continue   # another sampling column of the same method
                for part, part_runs in _split(runs, preset.runs_per_call):
                    cells.append(Cell(study_name, env, algo, name, config, part_runs, part))
    ids = [c.cell_id for c in cells]
    if not cells:
        raise ConfigError(f"the plan is empty: no algorithm of {list(algos or [])} is in studies "
                          f"{list(studies)}")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"studies {list(studies)} plan the same cell twice: {ids}")
    return cells


def _settings(grid) -> list[tuple[tuple[str, float], ...]]:
    """Every combination of a variant's hyper-parameter grid `((name, values), ...)`: one
    `Run.hparams` each (`[()]` for no grid)."""
    import itertools

    names = [name for name, _ in grid]
    return [tuple(zip(names, map(float, values)))
            for values in itertools.product(*(values for _, values in grid))]


def _split(runs, per_call: int):
    if per_call <= 0 or per_call >= len(runs):
        return [(-1, runs)]
    return [(i, runs[k:k + per_call]) for i, k in enumerate(range(0, len(runs), per_call))]


# Config fields added after results were committed: left out of a cell's fingerprint while they
# hold their default, so the cells of those results keep their fingerprints (and resume).
LATER_FIELDS = ("objective_hparams", "kl_reference", "kl_coef_min", "kl_coef_max", "network",
                "lag_profile")


def _config_dict(config: Config) -> dict:
    defaults = Config()
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in PER_RUN_FIELDS
            and not (k in LATER_FIELDS and v == getattr(defaults, k))}


# --- running one cell ---------------------------------------------------------------------------
def cell_inputs(cell: Cell):
    """What the cell's programs receive besides their code, as `run_cell` feeds them: one PRNG
    key per run (`program.seed_keys` of the runs' seeds) and the runs' stacked `HParams`. The
    comparability key hashes them (`keys.inputs_digest`)."""
    hparams = stack_hparams([r.config(cell.config).hparams() for r in cell.runs])
    return program_lib.seed_keys([r.seed for r in cell.runs]), hparams


def build_cell_program(cell: Cell, log=None) -> program_lib.TrainProgram:
    """The cell's program: every run vmapped, placed on every device, donating its state."""
    return program_lib.TrainProgram.build(cell.config, len(cell.runs), donate=True, log=log)


def run_cell(cell: Cell, progress: Callable[[int, int], None] | None = None, *,
             checkpoints: Path | None = None, checkpoint_seconds: float = 600.0,
             stop_after: int | None = None, allow_code_change: bool = False,
             on_evaluation: Callable[[list[dict], tuple[str, ...]], None] | None = None,
             compile_status: runtime.StatusLine | None = None, program_key: str | None = None,
             ) -> tuple[list[dict], dict] | None:
    """Train every run of `cell` in one vmapped program; returns (tidy rows, timing record).

    Run i uses `PRNGKey(run.seed)`, so a seed sees the same key at every capacity, δ and algorithm
    (common random numbers) and is the same computation as a single `vaco-train --seed
    <seed>` run: equal to float rounding, which XLA may order differently in a batch than
    alone on some CPUs and which training amplifies over iterations.
    The runs are spread over every device (`vaco_jax.program`); padding runs are never reported.

    `checkpoints`: a directory where the cell's whole state is saved (`vaco_jax.checkpoint`) at
    most every `checkpoint_seconds` and after `stop_after` chunks (which then ends this call,
    returning None); a later call continues from the newest save, bit for bit, unless it was made
    by other code (refused unless `allow_code_change`) or another cell (refused). Other source
    text that computes the same program is not other code: a save records `program_key` (the
    cell's key, `bench.cell_key`, where the caller has one) and a call with the same key resumes it.

    `on_evaluation(rows, metrics)` is called after each evaluation with its tidy rows (one per
    run, in the order of `cell.runs`, as results.jsonl will hold them) and the names of their
    metrics: the loggers' hook (`run_sweep`), which sees the cell's progress as it runs.
    `compile_status` is shown while the cell's programs are built and compiled (`run_sweep`).
    """
    start, cpu_start = time.perf_counter(), io.cpu_seconds()
    config = cell.config
    with compile_status or contextlib.nullcontext():
        program = build_cell_program(cell)
        reused, xla_cache_hits = program.compiled is not None, cache.xla_cache_hits()
        chunk, compile_seconds = program.compiled_chunk()
        if compile_status is not None:
            compile_status.outcome = runtime.compile_outcome(program, reused=reused,
                                                             xla_cache_hits=xla_cache_hits)
    saved = None if checkpoints is None else _CellCheckpoints(cell, checkpoints, program_key)
    restored = (None if saved is None else
                saved.restore(program.abstract_state, allow_code_change=allow_code_change))
    if restored is None:
        state = program.init_state(*cell_inputs(cell))
        history, done = None, 0
    else:
        state, history, done = restored.state, restored.history, restored.chunk

    end = config.num_evals if stop_after is None else min(config.num_evals, done + stop_after)
    train_seconds, timer = 0.0, program_lib.ChunkTimer()
    last_save = time.perf_counter()
    for eval_index in range(done, end):
        chunk_start = time.perf_counter()
        state, metrics = chunk(state)
        timer.track(metrics)
        metrics, health = program.layout.unpad((metrics, state.health))
        train_seconds += time.perf_counter() - chunk_start
        metrics = {k: np.asarray(v) for k, v in metrics.items() if k not in ("env_steps", "iteration")}
        metrics["diverged"] = (health.nonfinite != 0).astype(np.float32)
        history = {} if history is None else history
        for name, values in metrics.items():
            if name not in history:   # a new cell, or one resumed on code that logs more metrics
                history[name] = np.full((config.num_evals,) + values.shape, np.nan, np.float32)
            history[name][eval_index] = values
        if progress is not None:
            progress(eval_index + 1, config.num_evals)
        if on_evaluation is not None:
            on_evaluation(_rows(cell, eval_index, history), tuple(history))
        completed = eval_index + 1
        # Whether to save depends on each process's clock, but saving is collective: process 0's.
        due = runtime.primary_decision(
            lambda: completed == end or time.perf_counter() - last_save >= checkpoint_seconds)
        if saved is not None and completed < config.num_evals and due:
            saved.save(completed, state, history)
            last_save = time.perf_counter()
    if end < config.num_evals:
        return None
    rows = [row for i in range(config.num_evals) for row in _rows(cell, i, history)]
    # Timings are this call's: a resumed cell's steps/s counts only the chunks it ran.
    steps = (end - done) * config.iterations_per_eval * config.batch_size * len(cell.runs)
    record = {
        "cell": cell.cell_id, "fingerprint": cell.fingerprint(), "runs": len(cell.runs),
        "env_steps_per_run": config.env_steps, "compile_seconds": compile_seconds,
        "train_seconds": train_seconds, **timer.seconds(),
        "wall_seconds": time.perf_counter() - start,
        "others_cpu_seconds": io.others_cpu_seconds(cpu_start),
        "sps": steps / train_seconds, "diverged_runs": _diverged(cell, health),
        "resumed_from_chunk": done if restored is not None else None,
        "devices": program.layout.describe(), "processes": jax.process_count(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"), **io.provenance(),
    }
    return rows, record


class _CellCheckpoints:
    """The in-progress saves of one cell, in `<root>/<fingerprint>/` (a cell's fingerprint covers
    its config and runs, so a save is never restored into another cell)."""

    def __init__(self, cell: Cell, root: Path, program_key: str | None = None):
        self.cell, self.program_key = cell, program_key
        self.directory = Path(root) / cell.fingerprint()
        # The checkpoint's config: the cell's, with its number of runs as the number of seeds.
        self.config = dataclasses.replace(cell.config, num_seeds=len(cell.runs))

    def _manager(self, create: bool):
        from vaco_jax import checkpoint

        return checkpoint.RunCheckpoints(self.directory, keep=1, create=create)

    def restore(self, abstract_state, *, allow_code_change: bool):
        from vaco_jax import checkpoint

        saves = checkpoint.checkpoint_dir(self.directory)
        # Restoring is collective; whether there is anything to restore is process 0's view. A
        # finished save is a directory named by its chunk (orbax writes under a temporary name and
        # renames it when complete).
        if not runtime.primary_decision(
                lambda: saves.is_dir() and any(p.name.isdigit() for p in saves.iterdir())):
            return None
        recorded = self.directory / PROGRAM_KEY
        same_program = (self.program_key is not None and recorded.exists()
                        and json.loads(recorded.read_text()).get("program") == self.program_key)
        manager = self._manager(create=False)
        try:
            with warnings.catch_warnings():
                if same_program:   # the same program from other source text: nothing to warn of
                    warnings.filterwarnings("ignore", "resuming checkpoint .* other vaco_jax code")
                return manager.restore_latest(abstract_state, self.config,
                                              allow_code_change=allow_code_change or same_program)
        finally:
            manager.close()

    def save(self, chunk: int, state, history: dict) -> None:
        manager = self._manager(create=True)
        try:
            manager.save(chunk, state, history, self.config)
        finally:
            manager.wait()
            manager.close()
        if self.program_key is not None and runtime.is_primary():
            io.write_json_atomic(self.directory / PROGRAM_KEY, {"program": self.program_key})

    def remove(self) -> None:
        import shutil

        shutil.rmtree(self.directory, ignore_errors=True)


class _CellLoggers:
    """The logged runs of one cell (`vaco_jax.loggers`): one per run, i.e. per (capacity, δ,
    seed), named and tagged with its coordinates, opened at the first evaluation this call runs
    (a resumed cell's replace what an interrupted attempt had logged from there on)."""

    def __init__(self, cell: Cell, out: Path, options: LoggerOptions):
        self.cell, self.out, self.options = cell, Path(out), options
        self.runs = None

    def log(self, rows: list[dict], metrics: tuple[str, ...]) -> None:
        if self.runs is None:
            first_step = rows[0]["step"] if rows[0]["eval_index"] else 0
            self.runs = [self._open(run, first_step) for run in self.cell.runs]
        for logger, row in zip(self.runs, rows):
            logger.log(row["step"], loggers.finite({name: row[name] for name in metrics}))

    def _open(self, run: Run, first_step: int):
        cell = self.cell
        coordinates = {"study": cell.study, "env": cell.env, "algo": cell.algo,
                       "variant": cell.variant, "capacity": run.capacity, "delta": run.delta,
                       "seed": run.seed}
        name = (f"{cell.study}/{cell.env}/{cell.algo}/{cell.variant}/"
                + loggers.run_name({"C": run.capacity, "delta": run.delta, "seed": run.seed}))
        config = to_json_dict(dataclasses.replace(run.config(cell.config), seed=run.seed,
                                                  num_seeds=1))
        return loggers.make(self.options, self.out, {**config, **coordinates, "cell": cell.cell_id},
                            name=name, coordinates=coordinates, group=self.out.name,
                            first_step=first_step)

    def close(self) -> None:
        for logger in self.runs or ():
            logger.close()


def dry_run_cell(cell: Cell, device_memory: float | None = None) -> dict:
    """Compile `cell`'s program ahead of time (nothing runs): its placement, compile seconds and
    per-device memory, and whether it fits in `device_memory` bytes (None: unknown)."""
    report = build_cell_program(cell).dry_run()
    memory = report["memory_per_device"]
    fits = None if device_memory is None or not memory else memory["peak"] <= device_memory
    return {"cell": cell.cell_id, "runs": len(cell.runs), **report, "fits": fits}


def _rows(cell: Cell, eval_index: int, history: dict) -> list[dict]:
    """One tidy row per run for this evaluation. A diverged run (frozen at its last good state in
    the program) is marked `diverged` and reports NaN from its divergence on, so no statistic
    mistakes its frozen values for results; its step is the planned one, like every other run's."""
    scalars = {k: v[eval_index] for k, v in history.items() if k != "diverged"}
    diverged = history["diverged"][eval_index] > 0
    config = cell.config
    iteration = (eval_index + 1) * config.iterations_per_eval
    rows = []
    for i, run in enumerate(cell.runs):
        row = {"cell": cell.cell_id, "study": cell.study, "env": cell.env, "algo": cell.algo,
               "variant": cell.variant, "capacity": run.capacity, "delta": run.delta, "seed": run.seed,
               "eval_index": eval_index, "step": iteration * config.batch_size,
               "iteration": iteration, "budget": config.env_steps,
               "snapshot_sampling": config.snapshot_sampling,
               "sgd_steps_per_iteration": config.num_epochs * config.num_minibatches,
               "diverged": bool(diverged[i]), **dict(run.hparams), **dict(run.tags)}
        row.update({k: math.nan if diverged[i] else float(v[i]) for k, v in scalars.items()})
        rows.append(row)
    return rows


def _diverged(cell: Cell, health) -> list[dict]:
    """The diverged runs of a cell: capacity, δ, seed, and the learner iteration (1-based) and
    quantities that went non-finite."""
    return [{"capacity": run.capacity, "delta": run.delta, "seed": run.seed,
             "iteration": int(health.iteration[i]) + 1,
             "nonfinite": nonfinite_names(health.nonfinite[i])}
            for i, run in enumerate(cell.runs) if health.nonfinite[i] != 0]


# --- the sweep ----------------------------------------------------------------------------------
def run_sweep(cells: Sequence[Cell], out: str | Path, *, preset: Preset | None = None,
              max_cells: int | None = None, log: Callable[[str], None] = print,
              progress: bool = False, allow_code_change: bool = False,
              checkpoint_seconds: float = 600.0, stop_after: int | None = None,
              logging: LoggerOptions = LoggerOptions(),
              shard: tuple[int, int] | None = None,
              programs: dict[str, str] | None = None) -> list[str]:
    """Run every unfinished cell of `cells` into `out`, resuming; returns the ids of cells run now.

    `max_cells` stops after that many cells have run (a reduced run; resume later with the same
    command). A finished cell whose fingerprint differs from the requested one raises `SweepError`,
    and so does a directory whose cells were made by other code (another `io.source_hash()`),
    unless `allow_code_change`. A cell in progress saves its whole state to `out/partial/` every
    `checkpoint_seconds` (and, with `stop_after`, after that many evaluations of the first cell
    run, where this call then stops); the next call continues it from there. `logging`: where
    each run's metrics also go as the cell runs (`vaco_jax.loggers`: one logged run per run).
    `shard=(i, n)`: run only the cells at positions i, i + n, i + 2n, ... of `cells` (other
    processes take the rest; see the module's docstring). A cell that another process is running
    is skipped (it is that process's). A cell of a user objective records the objective's
    fingerprint (`algorithms.objective_fingerprint`), and cells made by another version of it are
    refused unless `allow_code_change`. `programs`: what each cell computes (`bench.cell_key`, by
    cell id), recorded with the cell; a finished cell recorded with another is refused unless
    `allow_code_change`, and one recorded with the same, under the same `KEY_LIBRARIES` versions,
    is accepted whatever the source text that made it (a comment or a docstring edited).
    """
    out = Path(out)
    primary = runtime.is_primary()   # process 0 writes; every process computes every cell
    if primary:
        out.mkdir(parents=True, exist_ok=True)
        (out / LOCKS).mkdir(exist_ok=True)
    runtime.barrier("sweep directory ready")
    all_cells = list(cells)
    if shard is not None:
        index, count = check_shard(shard)
        cells = all_cells[index::count]
    # Which cells are left decides which programs every process runs: process 0's reading.
    finished = runtime.primary_decision(lambda: _finished_cells(out))
    for cell in cells:
        if cell.cell_id in finished and finished[cell.cell_id]["fingerprint"] != cell.fingerprint():
            raise SweepError(
                f"{out} already holds cell {cell.cell_id!r} run with a different config or runs "
                f"(fingerprint {finished[cell.cell_id]['fingerprint']} != {cell.fingerprint()}); "
                f"use another --out directory")
    _check_programs(cells, finished, out, programs or {}, allow_code_change)
    source = io.source_hash()
    # A cell of other source text that computes what this code computes (a docstring edited) is
    # this code's: the same program, under the same library versions.
    other = [r for r in finished.values()
             if r.get("source") != source and not _same_program(r, programs or {})]
    other_code = sorted({r.get("source") or "unrecorded" for r in other})
    if other_code and not allow_code_change:
        commits = sorted({str(r.get("git_commit")) for r in other})
        raise SweepError(
            f"{out} holds cells made by other code (vaco_jax source {', '.join(other_code)} at "
            f"commit {', '.join(commits)}; this code is {source}): results of different code would "
            f"mix. Use another --out directory, or --allow-code-change to add to it anyway")
    runtime.primary_decision(lambda: _prepare_directory(out, all_cells, preset))

    todo_all = [c for c in cells if c.cell_id not in finished]
    todo = todo_all if max_cells is None else todo_all[:max_cells]
    log = log if primary else (lambda message: None)
    part = f" (shard {shard[0]}/{shard[1]} of {len(all_cells)})" if shard is not None else ""
    log(f"sweep {out}: {len(cells)} cells{part}, {len(cells) - len(todo_all)} already finished, "
        f"running {len(todo)}")
    ran = []
    for n, cell in enumerate(todo, 1):
        claim = _CellClaim(out, cell) if primary else None
        # Whether to run the cell is process 0's decision (every process runs the same programs).
        if not runtime.primary_decision(lambda: claim.acquire()):
            log(f"[{n}/{len(todo)}] {cell.cell_id}: finished or running in another process, skipped")
            continue
        try:
            result = _run_claimed(cell, n, len(todo), out, progress=progress, primary=primary,
                                  log=log, checkpoint_seconds=checkpoint_seconds,
                                  stop_after=stop_after, allow_code_change=allow_code_change,
                                  logging=logging, program=(programs or {}).get(cell.cell_id))
        finally:
            if claim is not None:
                claim.release()
        if result is None:   # stopped part-way (`stop_after`): its state is saved
            return ran
        ran.append(cell.cell_id)
    return ran


def user_objective(cell: Cell) -> dict | None:
    """`{"name", "fingerprint"}` of `cell`'s objective when it is a user's, else None."""
    from vaco_jax import algorithms

    objective = algorithms.parse(cell.config.algo).objective
    if algorithms.is_builtin(objective):
        return None
    return {"name": objective.name, "fingerprint": algorithms.objective_fingerprint(objective)}


def _same_program(record: dict, programs: dict) -> bool:
    """Whether the finished cell `record` was made by the program `programs` names for its cell,
    under this installation's `KEY_LIBRARIES` versions."""
    versions = record.get("versions") or {}
    return (bool(record.get("program")) and record["program"] == programs.get(record["cell"])
            and all(versions.get(name) == value for name, value in key_versions().items()))


def _same_scheme(theirs: str, ours: str) -> bool:
    """Are two cell keys of one scheme (`keys.SCHEME`: the prefix before `:`), so that unequal
    means another computation? A key of another scheme says nothing either way."""
    return ":" in theirs and ":" in ours and theirs.split(":")[0] == ours.split(":")[0]


def _check_programs(cells: Sequence[Cell], finished: dict, out: Path, programs: dict,
                    allow_code_change: bool) -> None:
    """Refuse (unless `allow_code_change`) to add cells to `out` where its finished cells were made
    by another version of the same user objective, or (`programs`) where a finished cell was
    made by another program than the same cell now (naming every such cell)."""
    if allow_code_change:
        return
    differ = [(cell.cell_id, finished[cell.cell_id]["program"]) for cell in cells
              if finished.get(cell.cell_id, {}).get("program") and cell.cell_id in programs
              and _same_scheme(finished[cell.cell_id]["program"], programs[cell.cell_id])
              and finished[cell.cell_id]["program"] != programs[cell.cell_id]]
    if differ:
        raise SweepError(
            f"{out} holds {len(differ)} {'cell' if len(differ) == 1 else 'cells'} made by another "
            f"program than this code's: " + "; ".join(
                f"{cell_id!r} (program {theirs}; this code's: {programs[cell_id]})"
                for cell_id, theirs in differ) +
            ". Results of different programs would mix. Use another --out directory, or "
            "--allow-code-change to add to it anyway")
    mine = {}
    for cell in cells:
        objective = user_objective(cell)
        if objective is not None:
            mine.setdefault(objective["name"], (objective["fingerprint"], cell.cell_id))
    for record in finished.values():
        theirs = record.get("objective") or {}
        name = theirs.get("name")
        if name not in mine:   # a record made before cells kept it: matched by cell id
            name = next((n for n, (_, cell_id) in mine.items() if cell_id == record["cell"]), None)
        if name is None:
            continue
        fingerprint = mine[name][0]
        if fingerprint is None or theirs.get("fingerprint") != fingerprint:
            raise SweepError(
                f"{out} holds cell {record['cell']!r} made by another version of objective "
                f"{name!r} (fingerprint {theirs.get('fingerprint') or 'not recorded'}; this code's: "
                f"{fingerprint or 'unknown'}): results of two versions would mix under one name. "
                f"Use another --out directory, or --allow-code-change to add to it anyway")


def check_shard(shard: tuple[int, int]) -> tuple[int, int]:
    """`shard` as (index, count), or `ConfigError` naming the option and what is allowed."""
    index, count = shard
    if not (isinstance(index, int) and isinstance(count, int) and count >= 1 and 0 <= index < count):
        raise ConfigError(f"option `shard` = {index}/{count} is invalid: must be i/n with n >= 1 "
                          f"and 0 <= i < n (process i of n takes cells i, i + n, ...)")
    return index, count


def parse_shard(text: str, environ=None) -> tuple[int, int] | None:
    """`"i/n"` as (i, n); `"slurm"` as the shard of this SLURM job array task (`shard_from_env`);
    `""` as None (every cell, in a job array too). Raises `ConfigError` naming the option."""
    if not text:
        return None
    if text == "slurm":
        shard = shard_from_env(environ)
        if shard is None:
            raise ConfigError("option `shard` = 'slurm' is invalid: this process is not a SLURM job "
                              "array task (SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT are "
                              "unset); give the shard as i/n")
        return shard
    head, slash, tail = text.partition("/")
    try:
        shard = (int(head), int(tail))
    except ValueError:
        shard = None
    if not slash or shard is None:
        raise ConfigError(f"option `shard` = {text!r} is invalid: write it as i/n (e.g. 0/4: the "
                          f"first of 4 processes), or slurm (the SLURM job array task's)")
    return check_shard(shard)


def shard_option(text: str, environ=None, log: Callable[[str], None] = print
                 ) -> tuple[int, int] | None:
    """Option `shard` of a command (`vaco-sweep`, `vaco-bench`) = `text`, parsed and checked
    (`parse_shard`: `ConfigError` naming the option), with what the command says about it
    (`_shard_note`) logged when there is something to say."""
    shard = parse_shard(text, environ)
    note = _shard_note(text, shard, environ)
    if note:
        log(note)
    return shard


def _shard_note(text: str, shard: tuple[int, int] | None, environ=None) -> str:
    """What a command says about the shard it took from option `shard` = `text`: the one SLURM
    gave, or, in a job array without the option, that this task takes every cell."""
    if text == "slurm":
        return f"shard {shard[0]}/{shard[1]}: this SLURM job array task's (--shard slurm)"
    if not text and shard_from_env(environ) is not None:
        return ("a SLURM job array task without --shard: this process takes every cell (--shard "
                "slurm splits them over the array's tasks)")
    return ""


def shard_from_env(environ=None) -> tuple[int, int] | None:
    """The shard of a SLURM job array's task (`SLURM_ARRAY_TASK_ID` − `SLURM_ARRAY_TASK_MIN` of
    `SLURM_ARRAY_TASK_COUNT`), or None outside a job array."""
    import os

    environ = os.environ if environ is None else environ
    if "SLURM_ARRAY_TASK_ID" not in environ or "SLURM_ARRAY_TASK_COUNT" not in environ:
        return None
    try:
        index = int(environ["SLURM_ARRAY_TASK_ID"]) - int(environ.get("SLURM_ARRAY_TASK_MIN", 0))
        count = int(environ["SLURM_ARRAY_TASK_COUNT"])
    except ValueError:
        raise ConfigError("SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT / SLURM_ARRAY_TASK_MIN "
                          "must be integers to shard the cells by them") from None
    return check_shard((index, count))


def _directory_lock(out: Path) -> FileLock:
    """The lock under which a directory's shared files (results, cells, plan) are changed."""
    return FileLock(str(out / LOCKS / "directory.lock"))


def _prepare_directory(out: Path, cells: Sequence[Cell], preset: Preset | None) -> None:
    """Under the directory's lock: refuse a cell id planned here with another config, drop rows
    of cells that never finished and torn lines, and add `cells` to the plan."""
    with _directory_lock(out):
        _check_one_config_per_cell(out, cells)
        io.finish_compaction(out / RESULTS)
        _rewrite_jsonl(out / CELLS)
        _discard_unfinished_rows(out, _finished_cells(out))
        _write_plan(out, cells, preset)


def _check_one_config_per_cell(out: Path, cells: Sequence[Cell]) -> None:
    """A cell id means one config and runs in a directory: another process (or an earlier
    invocation) that planned it otherwise would mix two configs' rows under one cell."""
    path = out / PLAN
    planned = json.loads(path.read_text())["cells"] if path.exists() else {}
    for cell in cells:
        recorded = planned.get(cell.cell_id, {}).get("fingerprint", cell.fingerprint())
        if recorded != cell.fingerprint():
            raise SweepError(
                f"{out} has planned cell {cell.cell_id!r} with another config or runs (fingerprint "
                f"{recorded} != {cell.fingerprint()}): one cell id holds one config's rows. Use "
                f"another --out directory")


class _CellClaim:
    """The right to run one cell: its lock file, held while it runs (never blocking: a cell held
    by another process is that process's), and the cell not yet recorded as finished."""

    def __init__(self, out: Path, cell: Cell):
        self.out, self.cell = out, cell
        # Keyed by the cell id, not the config: one id is one cell (`_check_one_config_per_cell`).
        key = hashlib.sha256(cell.cell_id.encode()).hexdigest()[:16]
        self.lock = FileLock(str(out / LOCKS / f"cell-{key}.lock"))

    def acquire(self) -> bool:
        try:
            self.lock.acquire(timeout=0)
        except Timeout:
            return False
        # Another process may have finished it since this process read the finished cells.
        if self.cell.cell_id in _finished_cells(self.out):
            self.lock.release()
            return False
        return True

    def release(self) -> None:
        if self.lock.is_locked:
            self.lock.release()


def _run_claimed(cell: Cell, n: int, total: int, out: Path, *, progress, primary, log,
             checkpoint_seconds, stop_after, allow_code_change, logging, program=None):
    """Run one claimed cell and record it; None when it stopped part-way (`stop_after`)."""
    live = progress and primary and runtime.interactive()
    bars = []

    def advance(evaluations: int, _evaluations_in_all: int) -> None:
        if not bars:   # made after compiling, below its status line
            bars.append(_progress_bar(cell, n, total))
        bars[0].update(evaluations - bars[0].n)

    status = runtime.compiling(cell.env, cell.algo, len(cell.runs), live=live, log=log,
                               label=f"[{n}/{total}] {cell.cell_id}: ")
    logged = _CellLoggers(cell, out, logging) if primary and logging.logger else None
    try:
        result = run_cell(cell, advance if live else None,
                          checkpoints=out / PARTIAL, checkpoint_seconds=checkpoint_seconds,
                          stop_after=stop_after, allow_code_change=allow_code_change,
                          on_evaluation=logged.log if logged is not None else None,
                          compile_status=status, program_key=program)
    finally:
        if logged is not None:
            logged.close()
    for bar in bars:
        bar.close()
    if result is None:   # stopped part-way (`stop_after`): its state is saved
        log(f"[{n}/{total}] {cell.cell_id}: stopped part-way, saved in {out / PARTIAL}")
        return None
    rows, record = result
    objective = user_objective(cell)
    record.update({"objective": objective} if objective else {},
                  **({"program": program} if program else {}))
    if primary:
        with _directory_lock(out):   # rows and record together: no other writer in between
            io.finish_compaction(out / RESULTS)
            # Rows of this (claimed, unfinished) cell already there were left by a process killed
            # between these two appends: dropped, or they would count twice.
            _rewrite_jsonl(out / RESULTS, lambda row: row.get("cell") != cell.cell_id,
                           mentioning=cell.cell_id)
            io.append_jsonl(out / RESULTS, rows)   # rows first: a cell counts once recorded
            io.append_jsonl(out / CELLS, [record])
        _CellCheckpoints(cell, out / PARTIAL).remove()
    final = np.mean([r["eval_return"] for r in rows if r["eval_index"] == cell.config.num_evals - 1])
    log(f"[{n}/{total}] {cell.cell_id}: {len(cell.runs)} runs, compile "
        f"{record['compile_seconds']:.1f} s, train {record['train_seconds']:.1f} s "
        f"({record['sps']:,.0f} steps/s), mean final eval return {final:.1f}")
    return cell.cell_id


def _finished_cells(out: Path) -> dict[str, dict]:
    path = out / CELLS
    return {r["cell"]: r for r in io.read_rows(path)} if io.has_rows(path) else {}


def _discard_unfinished_rows(out: Path, finished: dict) -> None:
    """Rewrite results.jsonl without rows of cells that never finished and without torn lines
    (rows in results.parquet are finished cells': `compact` discards the others first)."""
    _rewrite_jsonl(out / RESULTS, lambda row: row.get("cell") in finished)


def _rewrite_jsonl(path: Path, keep: Callable[[dict], bool] = lambda row: True, *,
                   mentioning: str | None = None) -> None:
    """Rewrite a JSONL file of the directory, atomically, with the rows `keep` accepts and without
    torn lines; left as it is when that is every line. `mentioning`: a cell id whose rows alone
    `keep` may refuse (the file is parsed only when its text holds it). Under the directory lock."""
    if not path.exists():
        return
    text = path.read_bytes()
    if mentioning is not None and json.dumps({"cell": mentioning})[1:-1].encode() not in text:
        return
    rows = io.read_jsonl(path)
    kept = [row for row in rows if keep(row)]
    if len(kept) != sum(1 for line in text.split(b"\n") if line.strip()):
        io.write_jsonl_atomic(path, kept)


def _write_plan(out: Path, cells: Sequence[Cell], preset: Preset | None) -> None:
    """sweep.json: the union of every plan run into this directory, with provenance."""
    path = out / PLAN
    old = json.loads(path.read_text()) if path.exists() else {"cells": {}}
    plan_cells = dict(old["cells"])
    for cell in cells:
        plan_cells[cell.cell_id] = {
            "fingerprint": cell.fingerprint(), "study": cell.study, "env": cell.env,
            "algo": cell.algo, "variant": cell.variant, "config": _config_dict(cell.config),
            "runs": [r.spec() for r in cell.runs]}
    data = {"preset": dataclasses.asdict(preset) if preset else old.get("preset"),
            "cells": plan_cells, **io.provenance()}
    io.write_json_atomic(path, data, compact=True)   # ~3× smaller: every run's spec, read by code


def _progress_bar(cell: Cell, n: int, total: int):
    from tqdm.auto import tqdm

    return tqdm(total=cell.config.num_evals, unit="eval", desc=f"[{n}/{total}] {cell.cell_id}",
                dynamic_ncols=True, leave=False)


# --- reading results ----------------------------------------------------------------------------
def load_results(out: str | Path) -> pd.DataFrame:
    """The tidy table of every finished cell in `out` (rows of unfinished cells are left out)."""
    out = Path(out)
    if not io.has_rows(out / RESULTS):
        raise FileNotFoundError(f"no sweep results in {out} (expected {out / RESULTS}); run "
                                f"`vaco-sweep --out {out}` first")
    finished = _finished_cells(out)
    table = pd.DataFrame(io.read_rows(out / RESULTS))
    return table[table["cell"].isin(finished)].reset_index(drop=True)


def compact(out: str | Path) -> int:
    """Move the rows of `out/results.jsonl` into `out/results.parquet` (`io.compact_jsonl`); in a
    sweep's directory under its lock, so no process appends meanwhile, and rows of cells that
    never finished are dropped first, as a sweep starting there would. Returns how many rows
    moved. A compacted directory resumes as any other: new cells' rows go to results.jsonl. The
    plan (sweep.json) is rewritten without whitespace, as sweeps now write it."""
    out = Path(out)
    if (out / PLAN).exists():
        io.write_json_atomic(out / PLAN, json.loads((out / PLAN).read_text()), compact=True)
    if not io.has_rows(out / CELLS):   # not a sweep's (an LLM sweep's, written by one process)
        return io.compact_jsonl(out / RESULTS)
    with _directory_lock(out):
        _discard_unfinished_rows(out, _finished_cells(out))
        return io.compact_jsonl(out / RESULTS)


def load_cells(out: str | Path) -> pd.DataFrame:
    """One row per finished cell: timings, steps/s, fingerprint, git commit."""
    return pd.DataFrame(list(_finished_cells(Path(out)).values()))
