"""Command line: train one algorithm on one env, many seeds in one vmapped call.

    python -m vaco_jax.train --env inverted_pendulum --algo vaco --capacity 4 --num-seeds 4 \\
        --total-steps 300000 --out runs/ip_vaco_c4

Writes `config.json` (with library versions and device), `metrics.jsonl` (one row per evaluation,
per-seed lists) and `summary.json` to `--out`. `--help` lists every config field with its default.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import tyro

from vaco_jax import io
from vaco_jax.config import Config, ConfigError, validate
from vaco_jax.trainer import Trainer

LOSS_KEYS = ("loss", "policy_loss", "value_loss")


class DivergenceError(RuntimeError):
    """A loss became non-finite during training."""


def seed_keys(config: Config):
    """One key per seed; seed i uses `PRNGKey(config.seed + i)`, as a single run with that seed."""
    return jnp.stack([jax.random.PRNGKey(config.seed + i) for i in range(config.num_seeds)])


def default_out(config: Config) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{config.env}_{config.algo.replace('+', '-')}_C{config.capacity}_{stamp}"


def run(config: Config) -> dict:
    """Train `config.num_seeds` seeds in one vmapped program, writing results as it goes."""
    validate(config)
    out = Path(config.out) if config.out else default_out(config)
    if (out / "summary.json").exists() and not config.overwrite:
        raise ConfigError(f"config field `out` = {str(out)!r} is invalid: it already holds a "
                          f"finished run (summary.json); choose another directory or pass --overwrite")
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    io.write_json_atomic(out / "config.json", {"config": config, **io.provenance()})

    trainer = Trainer(config)
    init = jax.jit(jax.vmap(trainer.init))
    chunk = jax.jit(jax.vmap(trainer.run_chunk), donate_argnums=0)
    state = init(seed_keys(config))
    compile_start = time.perf_counter()
    compiled_chunk = chunk.lower(state).compile()
    compile_seconds = time.perf_counter() - compile_start

    progress = _progress_bar(config)
    train_seconds = 0.0
    metrics = {}
    for _ in range(config.num_evals):
        start = time.perf_counter()
        state, metrics = compiled_chunk(state)
        metrics = jax.device_get(metrics)
        train_seconds += time.perf_counter() - start
        _check_finite(metrics)
        env_steps = int(metrics["env_steps"][0])
        io.append_jsonl(out / "metrics.jsonl", [_row(metrics)])
        sps = env_steps * config.num_seeds / train_seconds
        if progress is not None:
            progress.update(1)
            progress.set_postfix(step=env_steps, eval_return=f"{np.mean(metrics['eval_return']):.1f}",
                                 sps=f"{sps:,.0f}")
    if progress is not None:
        progress.close()

    summary = {
        "final_eval_return": metrics["eval_return"],
        "final_eval_return_mean": float(np.mean(metrics["eval_return"])),
        "env_steps": int(metrics["env_steps"][0]),
        "env_steps_total": int(metrics["env_steps"][0]) * config.num_seeds,
        "sps": int(metrics["env_steps"][0]) * config.num_seeds / train_seconds,
        "compile_seconds": compile_seconds,
        "train_seconds": train_seconds,
        "num_seeds": config.num_seeds,
        "out": str(out),
    }
    io.write_json_atomic(out / "summary.json", summary)
    return summary


def _row(metrics) -> dict:
    """One metrics.jsonl row: per-seed lists, plus the step and iteration."""
    row = {"step": int(metrics["env_steps"][0]), "iteration": int(metrics["iteration"][0])}
    row.update({k: np.asarray(v) for k, v in metrics.items() if k not in ("env_steps", "iteration")})
    return row


def _check_finite(metrics) -> None:
    for key in LOSS_KEYS:
        values = np.asarray(metrics[key])
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise DivergenceError(
                f"non-finite `{key}` at iteration {int(metrics['iteration'][0])} "
                f"(env step {int(metrics['env_steps'][0])}) for seed index(es) {bad.tolist()}: "
                f"values {values[bad].tolist()}; lower the learning rate or check the config")


def _progress_bar(config: Config):
    if not config.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=config.num_evals, unit="eval", desc=f"{config.algo} {config.env} C={config.capacity}",
                dynamic_ncols=True)


def main(argv: list[str] | None = None) -> int:
    config = tyro.cli(Config, args=argv, description=__doc__.split("\n\n")[0])
    try:
        summary = run(config)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"final eval return per seed: {np.round(summary['final_eval_return'], 1).tolist()}  "
          f"({summary['env_steps']:,} steps/seed, {summary['sps']:,.0f} steps/s, "
          f"compile {summary['compile_seconds']:.1f} s) -> {summary['out']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
