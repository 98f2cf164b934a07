"""`vaco_jax.run`, the loop behind `vaco-train`: one algorithm on one env, many seeds in one vmapped
call, in checkpointed chunks (the command's parsing is `vaco_jax.commands.train`).

    vaco-train --env inverted_pendulum --algo vaco --capacity 4 --num-seeds 4 \\
        --total-steps 300000 --out runs/ip_vaco_c4
    vaco-train --resume runs/ip_vaco_c4      # continue after a crash or pre-emption

The run is a Python loop over `num_evals` chunks. Each chunk is `Trainer.run_chunk` vmapped over
seeds and placed on every device of every process (`vaco_jax.program`): a scan over iterations,
then a deterministic evaluation, compiled as two programs at once and timed apart (`summary.json`:
`learn_seconds`, `eval_seconds`, `eval_fraction`). While one chunk computes, the previous one is checked
and written: the whole train state and the metrics so far are saved (`vaco_jax.checkpoint`) after
every chunk, or less often when writing would take more than `--checkpoint-budget` (5%) of the run's
time, but never less often than `--checkpoint-max-age` (10 min); a killed run resumes, bit for bit,
from its newest checkpoint. A seed whose loss, gradient or parameters become non-finite is caught
inside the program and frozen at its last good state; `--on-nan stop` (default) then stops the
run, `--on-nan skip-seed` reports it and continues the others.

Writes `config.json` (with library versions, device and the code's source hash; `sources` lists
the code of every stretch of a run resumed on other code, `--allow-code-change`), `metrics.jsonl`
(one row per evaluation, per-seed lists, and the source hash of the code that made it),
`checkpoints/`, `policy.npz` (every seed's policy, `vaco_jax.policy`), with `--log-every N`
`updates.jsonl` (the training updates' metrics every N learner iterations, `vaco_jax.update_log`)
and, when finished, `summary.json` to `--out` (process 0 of a multi-process run writes them;
`vaco_jax.runtime`).
`--dry-run` compiles the program and prints its per-device memory without training. `--help`
lists every config field and option with its default.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np

from vaco_jax import algorithms, cache, checkpoint, envs, io, loggers, policy, runtime, update_log
from vaco_jax import program as program_lib
from vaco_jax.config import Config, to_json_dict, validate
from vaco_jax.errors import ConfigError, DivergenceError
from vaco_jax.options import Options, duration_seconds, validate_log_every, validate_options
from vaco_jax.trainer import ENV_NONFINITE, nonfinite_names, stack_hparams

__all__ = ["DivergenceError", "Options", "run", "dry_run"]


def seed_keys(config: Config) -> np.ndarray:
    """One key per seed; seed i uses `PRNGKey(config.seed + i)`, as a single run with that seed."""
    return program_lib.seed_keys(range(config.seed, config.seed + config.num_seeds))


def clock() -> float:
    """Seconds on this process's monotonic clock, which times the checkpoint cadence (a module
    attribute, so that it can be replaced, e.g. to skew one process's clock)."""
    return time.perf_counter()


def default_out(config: Config) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{config.env}_{config.algo.replace('+', '-')}_C{config.capacity}_{stamp}"


def build_program(config: Config, log=program_lib.log_to_stderr, *,
                  per_iteration: bool = False) -> program_lib.TrainProgram:
    """The CLI's program: `config.num_seeds` runs, not donating (the state is saved while the
    next chunk computes); with `per_iteration`, keeping every iteration's metrics (`--log-every`)."""
    return program_lib.TrainProgram.build(config, config.num_seeds, log=log,
                                          per_iteration=per_iteration)


def compile_status(config: Config, *, live: bool) -> runtime.StatusLine:
    """The line process 0 prints while the run's programs are built and compiled (silent for 30 s
    to minutes otherwise): with a seconds count on a terminal or in a notebook when `live`, else
    (batch logs) a line when it starts and one when it ends."""
    primary = runtime.is_primary()
    return runtime.compiling(config.env, config.algo, config.num_seeds,
                             live=live and primary and runtime.interactive(),
                             log=program_lib.log_to_stderr if primary else lambda line: None)


def as_run(config: Config) -> Config:
    """`config` as it runs (and is recorded): an env of the user's (registered or
    `module:factory`) brings its own episode limit unless the config sets one
    (`envs.with_time_limit`, as `Trainer` does)."""
    if not envs.is_users(config.env):
        return config
    return envs.with_time_limit(config, envs.make_env(config.env))


def init_state(program: program_lib.TrainProgram, config: Config):
    """The initial state of `config`'s seeds in `program`."""
    return program.init_state(seed_keys(config),
                              stack_hparams([config.hparams()] * config.num_seeds))


def run(config: Config, options: Options = Options(), *, stop_after: int | None = None) -> dict:
    """Train `config.num_seeds` seeds in checkpointed chunks; continue a run if `options.resume`.

    `stop_after` ends this call after that many chunks, leaving a run that `--resume` continues
    (for jobs with a time limit). Returns the summary (also written to `summary.json` when the run
    is complete). On a multi-process run every process calls this with the same arguments. JAX's
    compilation cache is `options.compile_cache` unless the process chose before
    (`vaco_jax.cache.default_compile_cache`).
    """
    validate(config)
    config = as_run(config)
    validate_options(options)
    validate_log_every(options.log_every, config.iterations_per_eval)
    cache.default_compile_cache(options.compile_cache)   # unless the process chose already
    if options.dry_run:
        return dry_run(config, per_iteration=options.log_every > 0)
    out = _output_dir(options, config)
    checkpoints = checkpoint.RunCheckpoints(out, keep=options.keep_checkpoints,
                                            create=not options.resume)
    try:
        return _train(config, options, out, checkpoints, stop_after)
    finally:
        checkpoints.wait()
        checkpoints.close()


def dry_run(config: Config, *, per_iteration: bool = False) -> dict:
    """Compile the run's program ahead of time (with `per_iteration`, as `--log-every` builds it)
    and report its placement and per-device memory."""
    validate(config)
    config = as_run(config)
    with compile_status(config, live=True) as status:
        program = build_program(config, per_iteration=per_iteration)
        reused, xla_cache_hits = program.compiled is not None, cache.xla_cache_hits()
        report = {"programs": 1, "runs_per_program": config.num_seeds, **program.dry_run(),
                  "device_memory": program_lib.device_memory_bytes()}
        status.outcome = runtime.compile_outcome(program, reused=reused,
                                                 xla_cache_hits=xla_cache_hits)
    if runtime.is_primary():
        print(f"dry run: 1 program of {config.num_seeds} runs ({report['devices']}), compiled in "
              f"{report['compile_seconds']:.1f} s; per device: "
              f"{program_lib.describe_memory(report['memory_per_device'])}", file=sys.stderr)
    return report


def _train(config: Config, options: Options, out: Path, checkpoints: checkpoint.RunCheckpoints,
           stop_after: int | None) -> dict:
    allowed = dict(allow_version_change=options.allow_version_change,
                   allow_code_change=options.allow_code_change)
    if options.resume:  # refuse a mismatched checkpoint before building anything
        latest = checkpoints.usable_latest(config, **allowed)   # a corrupt newest one: set aside
        finished = runtime.primary_decision(
            lambda: _finished_summary(out) if latest == config.num_evals else None)
        if finished is not None:
            if runtime.is_primary():
                print(f"{out} holds a finished run: nothing to resume", file=sys.stderr)
            return finished
    with compile_status(config, live=options.progress) as status:
        program = build_program(config, per_iteration=options.log_every > 0)
        reused, xla_cache_hits = program.compiled is not None, cache.xla_cache_hits()
        compiled_chunk, compile_seconds = program.compiled_chunk()
        status.outcome = runtime.compile_outcome(program, reused=reused,
                                                 xla_cache_hits=xla_cache_hits)
        # A new run's initial state (its own, smaller program); a resumed run restores its state.
        state = None if options.resume else init_state(program, config)
    layout = program.layout
    num_evals = config.num_evals
    record = io.provenance() if runtime.is_primary() else {}  # once: it hashes the source
    if options.resume:
        restored = checkpoints.restore_latest(program.abstract_state, config, **allowed)
        state, history, done = restored.state, restored.history, restored.chunk
        sources = checkpoint.continued_sources(checkpoint.sources_of(restored.meta), done, config)
        # Rows written after that checkpoint belong to lost chunks: rewrite the files from it.
        if runtime.is_primary():
            _rewrite_metrics(out, config, history, done, sources)
            update_log.keep_until(out, done * config.iterations_per_eval)
            _record_sources(out, sources)
            print(f"resuming {out} from checkpoint {done} of {num_evals} "
                  f"({done * config.iterations_per_eval * config.batch_size:,} steps/seed)",
                  file=sys.stderr)
    else:
        sources = [checkpoint.source_record(0, config)]
        if runtime.is_primary():
            # The objective as run: its own hyper-parameters resolved, a user's code by file and hash.
            objective = algorithms.objective_record(algorithms.parse(config.algo).objective,
                                                    config.objective_hparams)
            io.write_json_atomic(out / "config.json", {"config": to_json_dict(config),
                                                       "options": dataclasses.replace(
                                                           options, out=io.portable_path(out)),
                                                       "devices": layout.describe(), **record,
                                                       "objective": objective,
                                                       **checkpoint.registration_entry(config),
                                                       "sources": sources})
            (out / "metrics.jsonl").unlink(missing_ok=True)
            (out / update_log.FILE).unlink(missing_ok=True)
        history, done = None, 0

    runtime.barrier("programs compiled")   # then the chunks' collectives start together
    health = _health(layout, state)

    end = num_evals if stop_after is None else min(num_evals, done + stop_after)
    progress = _progress_bar(config, options, done)
    steps_per_chunk = config.iterations_per_eval * config.batch_size
    logger = (loggers.make(options.logging, out, to_json_dict(config),
                           coordinates={"env": config.env, "algo": config.algo,
                                        "capacity": config.capacity},
                           first_step=done * steps_per_chunk + 1 if done else None)
              if runtime.is_primary() else None)
    seeds = list(range(config.seed, config.seed + config.num_seeds))
    loop_start = time.perf_counter()
    last_save_end = clock()
    loop_cpu_start = time.process_time()
    last_save_seconds, saved = 0.0, []
    timer = program_lib.ChunkTimer()
    try:
        pending = compiled_chunk.run(state) if done < end else None
        for chunk_index in range(done, end):
            state, metrics, per_iteration = pending
            chunk_seconds = timer.track(metrics)
            if chunk_index + 1 < end:
                # Dispatch the next chunk now: it computes while this one is checked and written.
                pending = compiled_chunk.run(state)
            metrics, new_health = layout.unpad(metrics), _health(layout, state)
            if history is None:
                history = _empty_history(metrics, num_evals)
            # A run resumed on newer code may log metrics its checkpoint lacks: NaN before.
            history.update(_empty_history({k: v for k, v in metrics.items() if k not in history},
                                          num_evals))
            _handle_divergence(config, options, health, new_health, out, checkpoints)
            health = new_health
            for name, values in metrics.items():
                if np.issubdtype(values.dtype, np.floating):  # a frozen seed reports nothing
                    values = np.where(health["nonfinite"] != 0, np.nan, values)
                history[name][chunk_index] = values
            completed = chunk_index + 1
            # Every process saves, or none: process 0's clock decides for all.
            due = runtime.primary_decision(lambda: checkpoint_due(
                options, completed, last_save_seconds, clock() - last_save_end,
                last=completed == end))
            if due:
                save_start = clock()
                # Complete on disk when this returns.
                checkpoints.save(completed, state, history, config, sources=sources)
                last_save_end = clock()
                last_save_seconds = last_save_end - save_start
                saved.append(completed)
            if due or completed == end:   # the policy goes with every checkpoint and the end
                _save_policy(out, config, layout, state, completed, health, record,
                             program.trainer.observation_shape)
            # A row follows its chunk's checkpoint (when one was due): resuming never goes behind it.
            source = checkpoint.source_at(sources, chunk_index)
            row = _row(config, history, chunk_index, source)
            updates = ([] if per_iteration is None else
                       _update_rows(config, options, layout.unpad(per_iteration), health,
                                    chunk_index, source, chunk_seconds.result()[0]))
            if runtime.is_primary():
                if updates:
                    io.append_jsonl(out / update_log.FILE, updates)
                io.append_jsonl(out / "metrics.jsonl", [row])
            sps = _steps_per_second(config, completed - done, time.perf_counter() - loop_start)
            step = completed * steps_per_chunk
            if logger is not None:
                # One call per step (W&B drops a second one): the chunk's last update row, at
                # the evaluation's step, goes with the evaluation.
                logged = {update["step"]: update_log.scalars(update, seeds) for update in updates}
                logged[step] = {**logged.get(step, {}), **loggers.scalars(row, seeds),
                                "perf/steps_per_second": sps}
                for at, scalars in logged.items():
                    logger.log(at, scalars)
            finite = metrics["eval_return"][np.isfinite(metrics["eval_return"])]
            eval_return = finite.mean() if finite.size else np.nan
            if progress is not None:
                progress.update(1)
                progress.set_postfix(step=step, sps=f"{sps:,.0f}", eval_return=f"{eval_return:.1f}")
            elif runtime.is_primary():   # batch jobs: one line per evaluation
                print(f"evaluation {completed}/{num_evals}: step {step:,}, eval return "
                      f"{eval_return:.1f} ({'mean of ' + str(config.num_seeds) + ' seeds' if config.num_seeds > 1 else 'one seed'}), {sps:,.0f} steps/s"
                      f"{', checkpoint saved' if due else ''}", file=sys.stderr, flush=True)
    finally:
        if progress is not None:
            progress.close()
        if logger is not None:
            logger.close()
    train_seconds = time.perf_counter() - loop_start  # everything but compilation, writes included
    train_cpu_seconds = time.process_time() - loop_cpu_start  # this process's threads, likewise
    finished = end == num_evals
    last = _last_row(history, end)
    summary = {
        "finished": finished,
        "chunks_done": end,
        "resumed_from_chunk": done if options.resume else None,
        "final_eval_return": last.get("eval_return"),
        "final_eval_return_mean": (float(np.nanmean(last["eval_return"]))
                                   if np.any(np.isfinite(last.get("eval_return", [np.nan]))) else None),
        "env_steps": end * config.iterations_per_eval * config.batch_size,
        "sps": _steps_per_second(config, end - done, train_seconds),
        "compile_seconds": compile_seconds,
        "train_seconds": train_seconds,
        **timer.seconds(),
        "train_cpu_seconds": train_cpu_seconds,
        "num_seeds": config.num_seeds,
        "devices": layout.describe(),
        "processes": jax.process_count(),
        "diverged_seeds": _diverged_seeds(config, health),
        "checkpoints_saved": saved,
        "out": io.portable_path(out),
    }
    summary["env_steps_total"] = summary["env_steps"] * config.num_seeds
    if config.snapshot_sampling == "profile":
        summary["snapshot_ages"] = snapshot_ages(config, history, end)
    if finished and runtime.is_primary():
        io.write_json_atomic(out / "summary.json", summary)
    return summary


def checkpoint_due(options: Options, completed: int, last_save_seconds: float,
                   seconds_since_save: float, *, last: bool = False) -> bool:
    """Save after chunk `completed`? Always after the `last` chunk of this call (the run's last, or
    where `stop_after` ends it) and whenever the newest checkpoint is `checkpoint_max_age` old;
    otherwise every `checkpoint_every` chunks unless that would let writing take more than
    `checkpoint_budget` of the run's time (the last write's duration is the estimate of the next
    one's)."""
    if not options.checkpoint_every:
        return False
    max_age = duration_seconds(options.checkpoint_max_age)
    if last or 0 < max_age <= seconds_since_save:
        return True
    if completed % options.checkpoint_every:
        return False
    budget = options.checkpoint_budget
    return last_save_seconds * (1.0 - budget) <= budget * seconds_since_save


# --- the output directory ----------------------------------------------------------------------------

def _output_dir(options: Options, config: Config) -> Path:
    """Where this run writes; refuses to clobber a finished or unfinished run it was not told to.
    With `--overwrite` the earlier directory is moved aside whole and the new run starts in an
    empty one: nothing of the earlier run (its W&B id, TensorBoard events, summary, policy,
    evaluations) mixes with the new one, and nothing of it is deleted. Process 0 checks and moves
    for every process."""
    out, earlier = runtime.primary_decision(lambda: _check_output_dir(options, config))
    out = Path(out)
    if options.resume:
        return out
    if runtime.is_primary():
        if earlier:
            print(f"--overwrite: the earlier contents of {out} were moved to {_move_aside(out)}",
                  file=sys.stderr)
        out.mkdir(parents=True, exist_ok=True)
    runtime.barrier("output directory ready")
    return out


def _move_aside(out: Path) -> Path:
    """Rename `out` to a new sibling `<name>.old-<time>` (one rename: atomic) and return it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside, n = out.with_name(f"{out.name}.old-{stamp}"), 1
    while aside.exists():
        n += 1
        aside = out.with_name(f"{out.name}.old-{stamp}-{n}")
    out.rename(aside)
    return aside


def _check_output_dir(options: Options, config: Config) -> tuple[str, bool]:
    """(the run's directory, whether it holds anything to move aside first), or a refusal."""
    if options.resume:
        out = Path(options.resume)
        if options.out and Path(options.out).resolve() != out.resolve():
            raise ConfigError(f"option `out` = {options.out!r} is invalid: a resumed run writes "
                              f"into the directory it resumes ({options.resume!r}); leave --out out")
        if not out.is_dir():
            raise ConfigError(f"option `resume` = {options.resume!r} is invalid: no such directory")
        return str(out), False
    out = Path(options.out) if options.out else default_out(config)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"option `out` = {str(out)!r} is invalid: it is a file, not a directory")
    if (out / "summary.json").exists() and not options.overwrite:
        raise ConfigError(f"option `out` = {str(out)!r} is invalid: it already holds a "
                          f"finished run (summary.json); choose another directory or pass --overwrite")
    ckpt_dir = checkpoint.checkpoint_dir(out)
    if ckpt_dir.is_dir() and any(ckpt_dir.iterdir()) and not options.overwrite:
        raise ConfigError(f"option `out` = {str(out)!r} is invalid: it holds checkpoints of "
                          f"an unfinished run; continue it with --resume {out}, or pass "
                          f"--overwrite to start over (moving the earlier run aside)")
    earlier = options.overwrite and out.is_dir() and any(out.iterdir())
    if earlier and Path.cwd().is_relative_to(out.resolve()):
        raise ConfigError(f"option `overwrite` is invalid with `out` = {str(out)!r}: the working "
                          f"directory is in it, so it cannot be moved aside; choose another "
                          f"directory or run from elsewhere")
    return str(out), earlier


def _finished_summary(out: Path) -> dict | None:
    """The summary of the finished run in `out`, or None when it has none."""
    path = out / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def _save_policy(out: Path, config: Config, layout: program_lib.Layout, state, completed: int,
                 health: dict, record: dict, observation_shape: tuple[int, ...] | None):
    """`out/policy.npz`: every seed's actor and normaliser after `completed` chunks, and which
    seeds diverged."""
    actor, normalizer = layout.unpad((state.params["actor"], state.normalizer))  # every process
    if runtime.is_primary():
        policy.save_policy(out, config, actor, normalizer, evaluations=completed,
                           env_steps=completed * config.iterations_per_eval * config.batch_size,
                           diverged_seeds=_diverged_seeds(config, health), provenance=record,
                           observation_shape=observation_shape)


# --- divergence ---------------------------------------------------------------------------------------

def _describe_divergence(config: Config, health, index: int) -> str:
    what = nonfinite_names(health["nonfinite"][index])
    iteration = int(health["iteration"][index])
    seed = f"seed {config.seed + index} (index {index} of {config.num_seeds})"
    from_env = [name for name in what if name in ENV_NONFINITE]
    if from_env:   # the env's, not the learner's: it reaches the loss too
        return (f"{seed}: the env produced a non-finite {' and '.join(from_env)} in the middle "
                f"of an episode, at one of env steps {iteration * config.batch_size + 1:,} to "
                f"{(iteration + 1) * config.batch_size:,} (the rollout of learner iteration "
                f"{iteration + 1} of {config.num_iterations})")
    what = ", ".join(what[:-1]) + " and " + what[-1] if len(what) > 1 else what[0]
    return (f"{seed} produced a non-finite {what} in learner iteration {iteration + 1} of "
            f"{config.num_iterations} (after {iteration * config.batch_size:,} env steps)")


def _env_made(health, seeds) -> bool:
    """Did the env produce the non-finite values of any of `seeds`?"""
    return any(set(nonfinite_names(health["nonfinite"][i])) & set(ENV_NONFINITE) for i in seeds)


def _handle_divergence(config: Config, options: Options, before, after, out: Path,
                       checkpoints) -> None:
    new = [i for i in range(config.num_seeds)
           if after["nonfinite"][i] != 0 and before["nonfinite"][i] == 0]
    if not new:
        return
    diverged = "; ".join(_describe_divergence(config, after, i) for i in new)
    all_diverged = bool(np.all(after["nonfinite"] != 0))
    if options.on_nan == "skip-seed" and not all_diverged:
        if runtime.is_primary():
            print(f"warning: {diverged}. That seed is frozen at its last good state and reported "
                  f"as NaN from now on (--on-nan skip-seed); the others continue.", file=sys.stderr)
        return
    checkpoints.wait()
    last = checkpoints.latest_chunk()
    kept = (f"the last good checkpoint is {checkpoints.path(last)} (chunk {last} of {config.num_evals})"
            if last is not None else "no checkpoint was written before it")
    advice = ("every seed has diverged" if all_diverged else
              f"to continue the other seeds from there, run --resume {out} --on-nan skip-seed")
    remedy = ("Check the env's reset and step: a NaN or infinite reward or observation comes "
              "from the env, not from learning" if _env_made(after, new) else
              "Lower --learning-rate or check the config")
    raise DivergenceError(f"training diverged: {diverged}. The run stopped; {kept}; {advice}. "
                          f"{remedy}.")


def _diverged_seeds(config: Config, health) -> list[dict]:
    return [{"seed": config.seed + i, "index": i, "iteration": int(health["iteration"][i]) + 1,
             "nonfinite": nonfinite_names(health["nonfinite"][i])}
            for i in range(config.num_seeds) if health["nonfinite"][i] != 0]


# --- metrics -----------------------------------------------------------------------------------------

def _health(layout: program_lib.Layout, state) -> dict:
    """Per-seed divergence records `{nonfinite, iteration}`, each `[num_seeds]`, on the host."""
    return layout.unpad({"nonfinite": state.health.nonfinite, "iteration": state.health.iteration})


def _empty_history(metrics: dict, num_evals: int) -> dict:
    history = {}
    for name, values in metrics.items():
        values = np.asarray(values)
        fill = np.nan if np.issubdtype(values.dtype, np.floating) else 0
        history[name] = np.full((num_evals,) + values.shape, fill, values.dtype)
    return history


def _row(config: Config, history: dict, chunk_index: int, source: str) -> dict:
    """One metrics.jsonl row: per-seed lists, plus the step and iteration (the same for every seed)
    and the source hash of the code that made it."""
    row = {"step": (chunk_index + 1) * config.iterations_per_eval * config.batch_size,
           "iteration": (chunk_index + 1) * config.iterations_per_eval, "source": source}
    row.update({k: v[chunk_index] for k, v in history.items() if k not in ("env_steps", "iteration")})
    return row


def snapshot_ages(config: Config, history, chunks_done: int) -> dict:
    """A lag-profile run's snapshot ages: the profile (`lag_profile`, padded to the buffer's
    slots) beside the realised share of each age over the evaluations done, per seed and pooled
    (every evaluation covers the same number of iterations and actor groups)."""
    if history is None or chunks_done == 0:
        return {}
    realised = np.stack([np.asarray(history[f"snapshot_age_hist_{k}"][:chunks_done], np.float64)
                         for k in range(config.slots)], axis=-1)      # [evals, seeds, slots]
    per_seed = realised.mean(axis=0)
    profile = np.pad(config.lag_profile, (0, config.slots - len(config.lag_profile)))
    return {"profile": [float(p) for p in profile / profile.sum()],
            "realised": [round(float(x), 6) for x in per_seed.mean(axis=0)],
            "realised_per_seed": [[round(float(x), 6) for x in seed] for seed in per_seed],
            "draws": chunks_done * config.iterations_per_eval * config.num_actors}


def _last_row(history, chunks_done: int) -> dict:
    if history is None or chunks_done == 0:
        return {}
    return {k: v[chunks_done - 1] for k, v in history.items()}


def _update_rows(config: Config, options: Options, per_iteration: dict, health: dict,
                 chunk_index: int, source: str, learn_seconds: float) -> list[dict]:
    """The `updates.jsonl` rows of chunk `chunk_index`, its steps/s those of its learner program
    (every seed's env steps over the seconds it took, measured on the host)."""
    steps = config.iterations_per_eval * config.batch_size * config.num_seeds
    return update_log.rows(
        per_iteration, log_every=options.log_every,
        first_iteration=chunk_index * config.iterations_per_eval, batch_size=config.batch_size,
        diverged_at=np.where(health["nonfinite"] != 0, health["iteration"], -1), source=source,
        steps_per_second=steps / learn_seconds if learn_seconds > 0 else 0.0)


def _rewrite_metrics(out: Path, config: Config, history: dict, done: int,
                     sources: list[dict]) -> None:
    io.write_jsonl_atomic(out / "metrics.jsonl", [_row(config, history, i, checkpoint.source_at(
        sources, i)) for i in range(done)])


def _record_sources(out: Path, sources: list[dict]) -> None:
    """config.json's `sources`: the code each stretch of the run's chunks was made with (the rest
    of config.json describes the run's first start)."""
    path = out / "config.json"
    if path.exists():
        io.write_json_atomic(path, {**json.loads(path.read_text()), "sources": sources})


def _steps_per_second(config: Config, chunks: int, seconds: float) -> float:
    steps = chunks * config.iterations_per_eval * config.batch_size * config.num_seeds
    return steps / seconds if seconds > 0 else 0.0


def _progress_bar(config: Config, options: Options, done: int):
    """A tqdm bar on a terminal or in a notebook; None (a line per evaluation) in batch logs."""
    if not options.progress or not runtime.interactive() or not runtime.is_primary():
        return None
    from tqdm.auto import tqdm

    return tqdm(total=config.num_evals, initial=done, unit="eval",
                desc=f"{config.algo} {config.env} C={config.capacity}", dynamic_ncols=True)
