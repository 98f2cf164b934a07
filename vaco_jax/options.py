"""Options of the training command: how the process runs, never what it computes.

`Config` describes a run; `Options` say where it writes, whether it resumes, how often it saves and
what it does when a seed diverges. A run may be resumed with other options, never another config.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from vaco_jax.errors import check_types, invalid


@dataclasses.dataclass(frozen=True)
class Options:
    """The command's process options (flags of `python -m vaco_jax.train`)."""

    out: str = ""
    """Output directory for config.json, metrics.jsonl, checkpoints/ and summary.json (default
    runs/<env>_<algo>_C<capacity>_<time>)."""
    progress: bool = True
    """Show a progress bar on a terminal or in a notebook (without one, or when stderr is a file:
    a line per evaluation on stderr, for batch-job logs)."""
    overwrite: bool = False
    """Start a new run in an output directory that already holds one (finished or not): its
    contents are first moved aside whole, to `<out>.old-<time>` (printed), never deleted."""
    resume: str = ""
    """Continue the run in this directory from its newest checkpoint. Other flags may be left out
    (the run's own config is used); any config flag given must agree with it."""
    allow_version_change: bool = False
    """With --resume: continue a checkpoint written with other versions of jax, brax, numpy, ...
    (a warning names them; the continuation may then differ from an uninterrupted run). Without
    it such a resume is refused."""
    allow_code_change: bool = False
    """With --resume: continue a checkpoint written by other vaco_jax code (another source hash,
    `io.source_hash`: any edit to the package). A warning says so, and config.json (`sources`) and
    every metrics.jsonl row (`source`) name the code each part of the run was made with. Without
    it such a resume is refused."""
    checkpoint_every: int = 1
    """Save the whole train state after every this many evaluation chunks (0 = never)."""
    checkpoint_budget: float = 0.05
    """Most of the run's time that writing checkpoints may take: a due checkpoint is skipped while
    the last write took more than this share of the time since it (1 = save every due chunk; the
    last chunk is always saved)."""
    checkpoint_max_age: str = "10min"
    """Most time a run may go without a checkpoint, whatever the budget: a checkpoint is written at
    the end of the first chunk that finds the newest one this old (e.g. 90s, 10min, 2h; 0 = no
    maximum). A kill then loses at most this plus one chunk."""
    keep_checkpoints: int = 2
    """Keep the newest this many checkpoints."""
    on_nan: Literal["stop", "skip-seed"] = "stop"
    """When a seed's loss, gradient or parameters become non-finite: `stop` the run (the last good
    checkpoint is kept) or `skip-seed` (freeze that seed, report it, continue the others)."""
    logger: Literal["none", "tensorboard", "wandb"] = "none"
    """Also send every evaluation's metrics to TensorBoard (`<out>/tensorboard/`, needs the
    `tensorboard` extra) or Weights & Biases (the `wandb` extra; WANDB_MODE=offline keeps it local)."""
    wandb_project: str = "vaco_jax"
    """The W&B project of --logger wandb."""
    compile_cache: str = "default"
    """JAX's persistent compilation cache: `default` (JAX_COMPILATION_CACHE_DIR if set, else the
    per-user cache, `vaco_jax.cache`), `off`, or a directory. A repeated run skips compiling."""
    verbose: bool = False
    """Show the libraries' own log messages (absl, orbax, jax); normally only errors."""
    dry_run: bool = False
    """Compile the run's program ahead of time, print its per-device memory and placement, and
    exit without training or writing anything."""


# Options that a resumed run may set anew (the others name the run or are implied by resuming).
RESUME_MAY_CHANGE = ("progress", "allow_version_change", "allow_code_change", "checkpoint_every",
                     "checkpoint_budget", "checkpoint_max_age", "keep_checkpoints", "on_nan",
                     "compile_cache", "verbose", "logger", "wandb_project")

_UNITS = {"": 1.0, "s": 1.0, "min": 60.0, "h": 3600.0}


def duration_seconds(text: str) -> float:
    """`"90"`, `"90s"`, `"10min"`, `"1.5h"` → seconds; raises `ValueError` on anything else."""
    text = str(text).strip().lower()
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(number):]
    if unit not in _UNITS or not number:
        raise ValueError(text)
    seconds = float(number) * _UNITS[unit]
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(text)
    return seconds


# --logger: the package each backend imports, and the extra that installs it.
LOGGER_PACKAGES = {"tensorboard": ("tensorboardX", "tensorboard"), "wandb": ("wandb", "wandb")}


def _missing_logger_package(logger: str):
    import importlib.util

    package = LOGGER_PACKAGES.get(logger)
    return package if package and importlib.util.find_spec(package[0]) is None else None


def validate_options(options: Options) -> None:
    """Raise `ConfigError` naming the first bad option (before anything compiles)."""
    check_types(options)
    if options.keep_checkpoints < 1:
        raise invalid("keep_checkpoints", options.keep_checkpoints, "must be an integer >= 1")
    if not 0 < options.checkpoint_budget <= 1:
        raise invalid("checkpoint_budget", options.checkpoint_budget,
                      "must be in (0, 1]: the share of run time checkpoint writing may take (1 = no limit)")
    try:
        duration_seconds(options.checkpoint_max_age)
    except ValueError:
        raise invalid("checkpoint_max_age", options.checkpoint_max_age,
                      "must be a duration such as 90s, 10min or 2h (0 = no maximum)") from None
    missing = _missing_logger_package(options.logger)
    if missing:
        raise invalid("logger", options.logger,
                      f"needs the {missing[0]} package: pip install -e \".[{missing[1]}]\"")
    if options.checkpoint_every < 0:
        raise invalid("checkpoint_every", options.checkpoint_every,
                      "must be an integer >= 0 (evaluation chunks between checkpoints; 0 = never)")
