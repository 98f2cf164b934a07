"""Where a run's scalars go besides its own files: TensorBoard event files, Weights & Biases, or both.

Every command takes the same flags (`options.LoggerOptions`): `--logger tensorboard wandb`, and
`--wandb-entity`, `--wandb-project`, `--wandb-group`, `--wandb-tags`, `--wandb-mode`. A *logged
run* is one curve per metric, at env steps (generated batches for the LLM):

* `vaco-train`: the run (all its seeds) in `<out>/tensorboard/`, each metric's mean
  over the seeds as `<metric>/mean` and each seed's value as `<metric>/seed_<seed>`, plus
  `perf/steps_per_second`, at every evaluation; one W&B run named after the directory.
* the lag sweep: one logged run per run of a cell, i.e. per (capacity, δ, seed), in
  `<out>/tensorboard/<study>/<env>/<algo>/<variant>/C=<capacity>,delta=<δ>,seed=<seed>/`, each
  metric under its own name (`eval_return`, `tv_estimate`, ...), at every evaluation as the cell
  runs. TensorBoard overlays the runs that share a metric in one chart and filters them by a
  regular expression on their path (`C=16`, `vaco/`), which is how a sweep is read: capacities,
  δ, seeds and algorithms side by side in one chart each.
* the LLM experiment: one logged run per (N, objective, seed), in
  `<out>/tensorboard/N=<N>/<objective>/seed=<seed>/`, every per-iteration metric at each generated
  batch and the evaluations at theirs, when the N finishes.

W&B gets one run per logged run, tagged with its coordinates (`env:hopper`, `capacity:16`, ...)
besides `--wandb-tags`, grouped by `--wandb-group` (a sweep's and an LLM experiment's default:
their output directory's name). A logged run picks up where it stopped when its run resumes:
TensorBoard hides the events it had written past the resumed step, and W&B continues the same run
(its id is kept in the output directory: `wandb_run_id` for a training run, `wandb_run_ids.json`
for the runs of a sweep or an LLM experiment). Non-finite values (a diverged seed) are left out.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from vaco_jax import io
from vaco_jax.options import LOGGER_PACKAGES, LoggerOptions

TENSORBOARD = "tensorboard"           # the event files' directory in an output directory
WANDB_RUN_ID = "wandb_run_id"         # a training run's W&B id
WANDB_RUN_IDS = "wandb_run_ids.json"  # {logged run name: W&B id} of a sweep or an LLM experiment


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


def finite(values: Mapping[str, float]) -> dict[str, float]:
    """The finite ones of one run's named scalars, as floats (a diverged run's NaN is left out)."""
    out = {}
    for name, value in values.items():
        value = float(value)
        if np.isfinite(value):
            out[name] = value
    return out


def coordinate_tags(coordinates: Mapping[str, object]) -> list[str]:
    """W&B tags naming a run's place in an experiment: `name:value` (W&B allows 64 characters)."""
    return [f"{name}:{_format(value)}"[:64] for name, value in coordinates.items()]


def run_name(coordinates: Mapping[str, object]) -> str:
    """`name=value,...`: a logged run's directory name from its coordinates."""
    return ",".join(f"{name}={_format(value)}" for name, value in coordinates.items())


def _format(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _require(kind: str):
    return __import__(LOGGER_PACKAGES[kind][0])   # present: `validate_logging` checked


class TensorBoard:
    """Event files in `directory`, written with tensorboardX."""

    def __init__(self, directory: Path, config: Mapping, *, first_step: int | None = None):
        # TensorBoard hides the events written before this one at `first_step` or later.
        self.writer = _require("tensorboard").SummaryWriter(logdir=str(directory),
                                                            purge_step=first_step)
        if not first_step:
            self.writer.add_text("config", f"```\n{json.dumps(config, indent=1)}\n```", 0)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandB:
    """One W&B run; `run_id` makes a resumed run continue the same one."""

    def __init__(self, options: LoggerOptions, *, directory: Path, run_id: str, name: str,
                 group: str, tags: Sequence[str], config: Mapping):
        wandb = _require("wandb")
        optional = {"entity": options.wandb_entity, "group": options.wandb_group or group,
                    "mode": options.wandb_mode}
        self.run = wandb.init(project=options.wandb_project, name=name, id=run_id,
                              resume="allow", dir=str(directory), config=dict(config),
                              tags=[*options.wandb_tags, *tags], reinit="create_new",
                              **{k: v for k, v in optional.items() if v})

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step, commit=True)

    def close(self) -> None:
        self.run.finish()


class Loggers:
    """Every backend of one logged run: each scalar goes to all of them."""

    def __init__(self, backends: Sequence[Logger]):
        self.backends = list(backends)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for backend in self.backends:
            backend.log(step, scalars)

    def close(self) -> None:
        for backend in self.backends:
            backend.close()


def make(options: LoggerOptions, out: Path, config: Mapping, *, name: str = "",
         coordinates: Mapping[str, object] | None = None, group: str = "",
         first_step: int | None = None) -> Loggers | None:
    """The backends of `options` for one logged run of the output directory `out`; None when
    there are none (nothing is imported or opened).

    `name`: the logged run's path under `<out>/tensorboard/` and its W&B name ("" for a training
    run: the directory itself, named after `out`). `config`: recorded with it (JSON-safe).
    `coordinates`: its place in an experiment, as W&B tags. `group`: the W&B group unless
    `--wandb-group` is given. `first_step`: None for a new logged run; else what this call logs
    replaces every event logged before at this step or later (a resumed run's, or those of an
    earlier attempt that stopped: 0 replaces them all)."""
    if not options.logger:
        return None
    out = Path(out)
    backends = []
    for backend in dict.fromkeys(options.logger):   # each once, in the order given
        if backend == "tensorboard":
            backends.append(TensorBoard(out / TENSORBOARD / name, config, first_step=first_step))
        elif backend == "wandb":
            backends.append(WandB(options, directory=out, run_id=wandb_run_id(out, name),
                                  name=name or out.name, group=group,
                                  tags=coordinate_tags(coordinates or {}), config=config))
    return Loggers(backends)


def wandb_run_id(out: Path, name: str = "") -> str:
    """The W&B id of the logged run `name` of `out`, made and kept on first use: a training run's
    in `<out>/wandb_run_id`, the runs of a sweep or an LLM experiment in `<out>/wandb_run_ids.json`."""
    out = Path(out)
    if not name:
        path = out / WANDB_RUN_ID
        run_id = path.read_text().strip() if path.exists() else secrets.token_hex(6)
        path.write_text(run_id)
        return run_id
    path = out / WANDB_RUN_IDS
    ids = json.loads(path.read_text()) if path.exists() else {}
    if name not in ids:
        ids[name] = secrets.token_hex(6)
        io.write_json_atomic(path, ids)
    return ids[name]
