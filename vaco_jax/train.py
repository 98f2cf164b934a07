"""Command line: train one algorithm on one env, many seeds in one vmapped call, in checkpointed chunks.

    python -m vaco_jax.train --env inverted_pendulum --algo vaco --capacity 4 --num-seeds 4 \\
        --total-steps 300000 --out runs/ip_vaco_c4
    python -m vaco_jax.train --resume runs/ip_vaco_c4      # continue after a crash or pre-emption

The run is a Python loop over `num_evals` chunks. Each chunk is one compiled program — `Trainer.run_chunk`
vmapped over seeds and sharded over every device (`vaco_jax.sharding`): a scan over iterations, then
a deterministic evaluation. While one chunk computes, the previous one is checked and written: the
whole train state and the metrics so far are saved (`vaco_jax.checkpoint`) after every chunk, or
less often when writing would take more than `--checkpoint-budget` (5%) of the run's time; a killed
run resumes, bit for bit, from its newest checkpoint. A seed whose loss, gradient or parameters
become non-finite is caught inside the program and frozen at its last good state; `--on-nan stop`
(default) then stops the run, `--on-nan skip-seed` reports it and continues the others.

Writes `config.json` (with library versions and device), `metrics.jsonl` (one row per evaluation,
per-seed lists), `checkpoints/` and, when finished, `summary.json` to `--out`. `--help` lists every
config field with its default.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import tyro

from vaco_jax import checkpoint, io, sharding
from vaco_jax.checkpoint import CheckpointError
from vaco_jax.config import CLI_ONLY_FIELDS, Config, ConfigError, HParams, validate
from vaco_jax.trainer import (NONFINITE_GRADIENT, NONFINITE_LOSS, NONFINITE_PARAMS, Trainer,
                              stack_hparams)


class DivergenceError(RuntimeError):
    """A seed's loss, gradient or parameters became non-finite (and the run was told to stop)."""


def seed_keys(config: Config):
    """One key per seed; seed i uses `PRNGKey(config.seed + i)`, as a single run with that seed."""
    return jnp.stack([jax.random.PRNGKey(config.seed + i) for i in range(config.num_seeds)])


def default_out(config: Config) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{config.env}_{config.algo.replace('+', '-')}_C{config.capacity}_{stamp}"


@dataclasses.dataclass
class Program:
    """The jitted pieces of a run, placed on the devices: `init(keys, hparams)` and one chunk
    `state -> (state, metrics)`, both vmapped over seeds."""

    trainer: Trainer                # built from the shared config: use `init_state`, not its init
    placement: sharding.Placement
    abstract_state: object          # ShapeDtypeStructs with shardings (also the restore target)
    init: object
    chunk: object
    compiled: object = None
    compile_seconds: float = 0.0

    @classmethod
    def build(cls, config: Config) -> "Program":
        # The program depends on neither the seed nor the hyper-parameters (arguments of `init`,
        # then state leaves) nor CLI-only fields: normalise them so such configs share one program.
        shared = dict(_SHARED_DEFAULTS, capacity=1, max_capacity=config.slots)
        return _build_program(dataclasses.replace(config, **shared))

    def init_state(self, config: Config):
        """The initial vmapped state of `config`'s seeds."""
        hparams = stack_hparams([config.hparams()] * config.num_seeds)
        return self.init(seed_keys(config), hparams)

    def compiled_chunk(self):
        """The chunk compiled ahead of time, and the seconds that took (0 when compiled before)."""
        if self.compiled is not None:
            return self.compiled, 0.0
        start = time.perf_counter()
        self.compiled = self.chunk.lower(self.abstract_state).compile()
        self.compile_seconds = time.perf_counter() - start
        return self.compiled, self.compile_seconds


_HPARAM_FIELDS = {f.name for f in dataclasses.fields(HParams)}  # capacity: max_capacity = slots
_SHARED_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Config)
                    if f.name in CLI_ONLY_FIELDS or f.name in _HPARAM_FIELDS or f.name == "seed"}


@functools.lru_cache(maxsize=4)
def _build_program(config: Config) -> Program:
    """Built once per config (up to CLI-only fields), so a resumed or repeated run in the same
    process reuses the traced and compiled program."""
    trainer = Trainer(config)
    placement = sharding.placement(config)
    batched_init = jax.vmap(trainer.init)
    abstract = jax.eval_shape(batched_init, seed_keys(config),
                              stack_hparams([config.hparams()] * config.num_seeds))
    state_sharding = placement.state(abstract)
    init = jax.jit(batched_init, out_shardings=state_sharding)
    chunk = jax.jit(jax.vmap(trainer.run_chunk), in_shardings=(state_sharding,),
                    out_shardings=(state_sharding, placement.metrics_sharding()))
    return Program(trainer, placement, placement.with_shardings(abstract), init, chunk)


def run(config: Config, *, stop_after: int | None = None) -> dict:
    """Train `config.num_seeds` seeds in checkpointed chunks; continue a run if `config.resume`.

    `stop_after` ends this call after that many chunks, leaving a run that `--resume` continues
    (for jobs with a time limit). Returns the summary (also written to `summary.json` when the run
    is complete).
    """
    validate(config)
    out = _output_dir(config)
    checkpoints = checkpoint.RunCheckpoints(out, keep=config.keep_checkpoints,
                                            create=not config.resume)
    try:
        return _train(config, out, checkpoints, stop_after)
    finally:
        checkpoints.wait()
        checkpoints.close()


def _train(config: Config, out: Path, checkpoints: checkpoint.RunCheckpoints,
           stop_after: int | None) -> dict:
    if config.resume:  # refuse a mismatched checkpoint before building anything
        if checkpoints.check_latest(config) == config.num_evals and (out / "summary.json").exists():
            print(f"{out} holds a finished run: nothing to resume", file=sys.stderr)
            return json.loads((out / "summary.json").read_text())
    program = Program.build(config)
    num_evals = config.num_evals
    if config.resume:
        restored = checkpoints.restore_latest(program.abstract_state, config)
        state, history, done = restored.state, restored.history, restored.chunk
        # Rows written after that checkpoint belong to lost chunks: rewrite the file from it.
        if _primary():
            _rewrite_metrics(out, config, history, done)
            print(f"resuming {out} from checkpoint {done} of {num_evals} "
                  f"({done * config.iterations_per_eval * config.batch_size:,} steps/seed)",
                  file=sys.stderr)
    else:
        if _primary():
            io.write_json_atomic(out / "config.json", {"config": config, **io.provenance()})
            (out / "metrics.jsonl").unlink(missing_ok=True)
        state, history, done = program.init_state(config), None, 0

    compiled_chunk, compile_seconds = program.compiled_chunk()
    health = _health(state)

    end = num_evals if stop_after is None else min(num_evals, done + stop_after)
    progress = _progress_bar(config, done)
    loop_start = last_save_end = time.perf_counter()
    loop_cpu_start = time.process_time()
    last_save_seconds, saved = 0.0, []
    try:
        pending = compiled_chunk(state) if done < end else None
        for chunk_index in range(done, end):
            state, metrics = pending
            if chunk_index + 1 < end:
                # Dispatch the next chunk now: it computes while this one is checked and written.
                pending = compiled_chunk(state)
            metrics, new_health = _to_host(metrics), _health(state)
            if history is None:
                history = _empty_history(metrics, num_evals)
            _handle_divergence(config, health, new_health, out, checkpoints)
            health = new_health
            for name, values in metrics.items():
                if np.issubdtype(values.dtype, np.floating):  # a frozen seed reports nothing
                    values = np.where(health["nonfinite"] != 0, np.nan, values)
                history[name][chunk_index] = values
            completed = chunk_index + 1
            if checkpoint_due(config, completed, last_save_seconds,
                              time.perf_counter() - last_save_end, last=completed == end):
                save_start = time.perf_counter()
                checkpoints.save(completed, state, history, config)  # complete on disk on return
                last_save_end = time.perf_counter()
                last_save_seconds = last_save_end - save_start
                saved.append(completed)
            # A row follows its chunk's checkpoint (when one was due): resuming never goes behind it.
            if _primary():
                io.append_jsonl(out / "metrics.jsonl", [_row(config, history, chunk_index)])
            if progress is not None:
                sps = _steps_per_second(config, completed - done, time.perf_counter() - loop_start)
                progress.update(1)
                progress.set_postfix(step=completed * config.iterations_per_eval * config.batch_size,
                                     sps=f"{sps:,.0f}",
                                     eval_return=f"{np.nanmean(metrics['eval_return']):.1f}")
    finally:
        if progress is not None:
            progress.close()
    train_seconds = time.perf_counter() - loop_start  # everything but compilation, writes included
    train_cpu_seconds = time.process_time() - loop_cpu_start  # this process's threads, likewise
    finished = end == num_evals
    last = _last_row(history, end)
    summary = {
        "finished": finished,
        "chunks_done": end,
        "resumed_from_chunk": done if config.resume else None,
        "final_eval_return": last.get("eval_return"),
        "final_eval_return_mean": (float(np.nanmean(last["eval_return"]))
                                   if np.any(np.isfinite(last.get("eval_return", [np.nan]))) else None),
        "env_steps": end * config.iterations_per_eval * config.batch_size,
        "sps": _steps_per_second(config, end - done, train_seconds),
        "compile_seconds": compile_seconds,
        "train_seconds": train_seconds,
        "train_cpu_seconds": train_cpu_seconds,
        "num_seeds": config.num_seeds,
        "devices": sharding.describe(program.placement),
        "diverged_seeds": _diverged_seeds(config, health),
        "checkpoints_saved": saved,
        "out": str(out),
    }
    summary["env_steps_total"] = summary["env_steps"] * config.num_seeds
    if finished and _primary():
        io.write_json_atomic(out / "summary.json", summary)
    return summary


def checkpoint_due(config: Config, completed: int, last_save_seconds: float,
                   seconds_since_save: float, *, last: bool = False) -> bool:
    """Save after chunk `completed`? Always after the `last` chunk of this call (the run's last, or
    where `stop_after` ends it); otherwise every `checkpoint_every` chunks unless that would let
    writing take more than `checkpoint_budget` of the run's time (the last write's duration is the
    estimate of the next one's)."""
    if not config.checkpoint_every:
        return False
    if last:
        return True
    if completed % config.checkpoint_every:
        return False
    budget = config.checkpoint_budget
    return last_save_seconds * (1.0 - budget) <= budget * seconds_since_save


# --- the output directory ----------------------------------------------------------------------------

def _output_dir(config: Config) -> Path:
    """Where this run writes; refuses to clobber a finished or unfinished run it was not told to."""
    if config.resume:
        out = Path(config.resume)
        if config.out and Path(config.out).resolve() != out.resolve():
            raise ConfigError(f"config field `out` = {config.out!r} is invalid: a resumed run writes "
                              f"into the directory it resumes ({config.resume!r}); leave --out out")
        if not out.is_dir():
            raise ConfigError(f"config field `resume` = {config.resume!r} is invalid: no such directory")
        return out
    out = Path(config.out) if config.out else default_out(config)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"config field `out` = {str(out)!r} is invalid: it is a file, not a directory")
    if (out / "summary.json").exists() and not config.overwrite:
        raise ConfigError(f"config field `out` = {str(out)!r} is invalid: it already holds a "
                          f"finished run (summary.json); choose another directory or pass --overwrite")
    ckpt_dir = checkpoint.checkpoint_dir(out)
    if ckpt_dir.is_dir() and any(ckpt_dir.iterdir()):
        if not config.overwrite:
            raise ConfigError(f"config field `out` = {str(out)!r} is invalid: it holds checkpoints of "
                              f"an unfinished run; continue it with --resume {out}, or pass "
                              f"--overwrite to start over (deleting them)")
        shutil.rmtree(ckpt_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out


# --- divergence ---------------------------------------------------------------------------------------

QUANTITIES = ((NONFINITE_LOSS, "loss"), (NONFINITE_GRADIENT, "gradient"),
              (NONFINITE_PARAMS, "parameters"))


def _describe_divergence(config: Config, health, index: int) -> str:
    flags = int(health["nonfinite"][index])
    what = [name for bit, name in QUANTITIES if flags & bit]
    iteration = int(health["iteration"][index])
    what = ", ".join(what[:-1]) + " and " + what[-1] if len(what) > 1 else what[0]
    return (f"seed {config.seed + index} (index {index} of {config.num_seeds}) produced a non-finite "
            f"{what} in learner iteration {iteration + 1} of {config.num_iterations} "
            f"(after {iteration * config.batch_size:,} env steps)")


def _handle_divergence(config: Config, before, after, out: Path, checkpoints) -> None:
    new = [i for i in range(config.num_seeds)
           if after["nonfinite"][i] != 0 and before["nonfinite"][i] == 0]
    if not new:
        return
    diverged = "; ".join(_describe_divergence(config, after, i) for i in new)
    all_diverged = bool(np.all(after["nonfinite"] != 0))
    if config.on_nan == "skip-seed" and not all_diverged:
        if _primary():
            print(f"warning: {diverged}. That seed is frozen at its last good state and reported "
                  f"as NaN from now on (--on-nan skip-seed); the others continue.", file=sys.stderr)
        return
    checkpoints.wait()
    last = checkpoints.latest_chunk()
    kept = (f"the last good checkpoint is {checkpoints.path(last)} (chunk {last} of {config.num_evals})"
            if last is not None else "no checkpoint was written before it")
    advice = ("every seed has diverged" if all_diverged else
              f"to continue the other seeds from there, run --resume {out} --on-nan skip-seed")
    raise DivergenceError(f"training diverged: {diverged}. The run stopped; {kept}; {advice}. "
                          f"Lower --learning-rate or check the config.")


def _diverged_seeds(config: Config, health) -> list[dict]:
    return [{"seed": config.seed + i, "index": i, "iteration": int(health["iteration"][i]) + 1,
             "nonfinite": [name for bit, name in QUANTITIES if int(health["nonfinite"][i]) & bit]}
            for i in range(config.num_seeds) if health["nonfinite"][i] != 0]


# --- metrics -----------------------------------------------------------------------------------------

def _primary() -> bool:
    """Whether this process writes the run's JSON files (process 0 of a multi-host run)."""
    return jax.process_index() == 0


def _to_host(tree):
    """Device arrays → numpy (gathered from every process on a multi-host run)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        tree = multihost_utils.process_allgather(tree, tiled=True)
    return jax.tree.map(np.asarray, jax.device_get(tree))


def _health(state) -> dict:
    """Per-seed divergence records `{nonfinite, iteration}`, each `[num_seeds]`, on the host."""
    return _to_host({"nonfinite": state.health.nonfinite, "iteration": state.health.iteration})


def _empty_history(metrics: dict, num_evals: int) -> dict:
    history = {}
    for name, values in metrics.items():
        values = np.asarray(values)
        fill = np.nan if np.issubdtype(values.dtype, np.floating) else 0
        history[name] = np.full((num_evals,) + values.shape, fill, values.dtype)
    return history


def _row(config: Config, history: dict, chunk_index: int) -> dict:
    """One metrics.jsonl row: per-seed lists, plus the step and iteration (the same for every seed)."""
    row = {"step": (chunk_index + 1) * config.iterations_per_eval * config.batch_size,
           "iteration": (chunk_index + 1) * config.iterations_per_eval}
    row.update({k: v[chunk_index] for k, v in history.items() if k not in ("env_steps", "iteration")})
    return row


def _last_row(history, chunks_done: int) -> dict:
    if history is None or chunks_done == 0:
        return {}
    return {k: v[chunks_done - 1] for k, v in history.items()}


def _rewrite_metrics(out: Path, config: Config, history: dict, done: int) -> None:
    rows = [_row(config, history, i) for i in range(done)]
    tmp = out / ".metrics.jsonl.resume"
    tmp.unlink(missing_ok=True)
    io.append_jsonl(tmp, rows)
    tmp.replace(out / "metrics.jsonl")


def _steps_per_second(config: Config, chunks: int, seconds: float) -> float:
    steps = chunks * config.iterations_per_eval * config.batch_size * config.num_seeds
    return steps / seconds if seconds > 0 else 0.0


def _progress_bar(config: Config, done: int):
    if not config.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=config.num_evals, initial=done, unit="eval",
                desc=f"{config.algo} {config.env} C={config.capacity}", dynamic_ncols=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    description = __doc__.split("\n\n")[0]
    config = tyro.cli(Config, args=argv, description=description)
    try:
        if config.resume:
            # The run's own config is the default; flags given on this command line must agree.
            stored = dataclasses.replace(checkpoint.stored_config(config.resume), out="", resume="")
            config = tyro.cli(Config, args=argv, default=stored, description=description)
        summary = run(config)
    except (ConfigError, CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except DivergenceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 3
    returns = [None if r is None or not np.isfinite(r) else round(float(r), 1)
               for r in np.asarray(summary["final_eval_return"], dtype=float)]
    print(f"final eval return per seed: {returns}  ({summary['env_steps']:,} steps/seed, "
          f"{summary['sps']:,.0f} steps/s, compile {summary['compile_seconds']:.1f} s, "
          f"{summary['devices']}) -> {summary['out']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
