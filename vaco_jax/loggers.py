"""Where a run's scalars go besides `metrics.jsonl`: TensorBoard event files or Weights & Biases.

`--logger tensorboard` writes `<run>/tensorboard/` (view it with `tensorboard --logdir runs`);
`--logger wandb` logs to the W&B project `--wandb-project` (set `WANDB_MODE=offline` to keep it on
disk, under `<run>/wandb/`, and `wandb sync` it later). Both get every metrics.jsonl row at its
env step: each metric's mean over the run's seeds as `<metric>/mean` and each seed's value as
`<metric>/seed_<seed>`, plus `perf/steps_per_second`. A resumed run logs again from its checkpoint:
TensorBoard hides the events it had written past that step, and the rows W&B receives again carry
the same values (resuming is bit-identical).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Protocol

import numpy as np

from vaco_jax.config import Config, to_json_dict
from vaco_jax.options import LOGGER_PACKAGES


class Logger(Protocol):
    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def scalars(row: dict, seeds: list[int]) -> dict[str, float]:
    """A metrics.jsonl row as named scalars: `<metric>/mean` over the seeds with a finite value
    (absent when none has one) and `<metric>/seed_<seed>` for each finite one."""
    out = {}
    for name, values in row.items():
        if name in ("step", "iteration") or isinstance(values, str):   # e.g. the code's `source`
            continue
        values = np.asarray(values, dtype=float).reshape(-1)
        finite = np.isfinite(values)
        if finite.any():
            out[f"{name}/mean"] = float(values[finite].mean())
        out.update({f"{name}/seed_{seed}": float(v) for seed, v, ok in zip(seeds, values, finite)
                    if ok})
    return out


def _require(kind: str):
    return __import__(LOGGER_PACKAGES[kind][0])   # present: `validate_options` checked


class TensorBoard:
    """Event files in `<run>/tensorboard/`, written with tensorboardX."""

    def __init__(self, out: Path, config: Config, *, first_step: int = 0):
        self.writer = _require("tensorboard").SummaryWriter(
            logdir=str(Path(out) / "tensorboard"), purge_step=first_step or None)
        if not first_step:
            self.writer.add_text("config", f"```\n{to_json_dict(config)}\n```", 0)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandB:
    """A W&B run named after the run directory; a resumed run continues the same W&B run."""

    def __init__(self, out: Path, config: Config, *, project: str):
        wandb = _require("wandb")
        out = Path(out)
        id_file = out / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(6)
        id_file.write_text(run_id)
        self.run = wandb.init(project=project, name=out.name, id=run_id, resume="allow",
                              dir=str(out), config=to_json_dict(config))

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step, commit=True)

    def close(self) -> None:
        self.run.finish()


def make(kind: str, out: Path, config: Config, *, wandb_project: str = "vaco_jax",
         first_step: int = 0) -> Logger | None:
    """The logger `kind` (`Options.logger`) for the run in `out`; None for `none`. `first_step`:
    the first env step a resumed run logs again (0 for a new run)."""
    if kind == "tensorboard":
        return TensorBoard(out, config, first_step=first_step)
    if kind == "wandb":
        return WandB(out, config, project=wandb_project)
    return None
