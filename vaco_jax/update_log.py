"""The training updates' log (`--log-every N`): a row of `updates.jsonl` every N learner iterations.

A chunk's learner program keeps every iteration's metrics when the option is on
(`Trainer.learn_chunk(per_iteration=True)`: what its scan computes anyway, returned as well as
averaged). After the chunk the host averages them over each N iterations, one row per N, with
per-seed lists as in `metrics.jsonl`. Off, the program is unchanged and nothing is written.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vaco_jax import io, loggers

FILE = "updates.jsonl"
PREFIX = "updates/"   # the rows' metrics in TensorBoard and W&B, apart from the evaluations'


def rows(per_iteration: dict, *, log_every: int, first_iteration: int, batch_size: int,
         diverged_at, source: str, steps_per_second: float) -> list[dict]:
    """The rows of one chunk. `per_iteration`: `{metric: [seeds, iterations]}` (host arrays) of the
    iterations that follow `first_iteration` (0-based, the run's); `diverged_at` `[seeds]`: the
    iteration each seed diverged at, or -1 (a diverged seed is frozen: NaN from there on).

    Each row: `step` (env steps per seed) and `iteration` at its last iteration, the code's
    `source`, the chunk's `steps_per_second`, and per-seed lists: every metric's mean over the
    row's iterations, except `nonfinite_episodes` (their sum) and `train_return` (the mean return
    of the training episodes that ended in them, NaN when none did)."""
    values = {name: np.asarray(v) for name, v in per_iteration.items()}
    seeds, count = values["episodes"].shape
    iteration = first_iteration + np.arange(count)
    diverged_at = np.asarray(diverged_at)[:, None]
    frozen = (diverged_at >= 0) & (iteration >= diverged_at)            # [seeds, iterations]

    def windows(name):   # [seeds, rows, log_every]
        return np.where(frozen, np.nan, values[name]).reshape(seeds, count // log_every, log_every)

    means = {name: windows(name).mean(axis=-1) for name in values
             if name not in ("episodes", "episode_return_sum", "nonfinite_episodes")}
    means["nonfinite_episodes"] = windows("nonfinite_episodes").sum(axis=-1)
    episodes = windows("episodes").sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        means["train_return"] = np.where(episodes > 0,
                                         windows("episode_return_sum").sum(axis=-1) / episodes,
                                         np.nan)
    out = []
    for index in range(count // log_every):
        last = first_iteration + (index + 1) * log_every
        out.append({"step": last * batch_size, "iteration": last, "source": source,
                    "steps_per_second": steps_per_second,
                    **{name: v[:, index] for name, v in means.items()}})
    return out


def scalars(row: dict, seeds: list[int]) -> dict[str, float]:
    """A row as the loggers' named scalars: `updates/<metric>/mean` and `.../seed_<seed>`
    (`loggers.scalars`) and `updates/steps_per_second`."""
    named = loggers.scalars({k: v for k, v in row.items() if k != "steps_per_second"}, seeds)
    named = {PREFIX + name: value for name, value in named.items()}
    return {**named, PREFIX + "steps_per_second": float(row["steps_per_second"])}


def keep_until(out: Path, iteration: int) -> None:
    """Drop the rows of `out/updates.jsonl` past `iteration` (a resumed run's checkpoint: rows
    that a stopped run wrote after it are written again as the run continues)."""
    path = Path(out) / FILE
    if path.exists():
        io.write_jsonl_atomic(path, [row for row in io.read_jsonl(path)
                                     if row["iteration"] <= iteration])
