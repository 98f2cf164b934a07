"""Options of the training command: how the process runs, never what it computes.

`Config` describes a run; `Options` say where it writes, whether it resumes, how often it saves and
what it does when a seed diverges. A run may be resumed with other options, never another config.
`Cluster` says how the process joins a multi-process run (`vaco_jax.runtime` starts it).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Literal

import tyro

from vaco_jax.errors import check_types, invalid_option

# --logger: the package each backend imports, and the extra that installs it.
LOGGER_PACKAGES = {"tensorboard": ("tensorboardX", "tensorboard"), "wandb": ("wandb", "wandb")}
LoggerName = Literal[tuple(LOGGER_PACKAGES)]


@dataclasses.dataclass(frozen=True)
class LoggerOptions:
    """Where metrics go besides the output files (the same flags for every command). Logging
    only reads what a run has already computed: it never changes a result, and off it costs
    nothing."""

    logger: tuple[LoggerName, ...] = ()
    """Also send the metrics to these backends, any of: tensorboard (event files under
    `<out>/tensorboard/`, needs the `tensorboard` extra), wandb (Weights & Biases, the `wandb`
    extra), e.g. `--logger tensorboard wandb`."""
    wandb_entity: str = ""
    """The W&B entity (user or team) to log to (default: W&B's, e.g. WANDB_ENTITY or your user)."""
    wandb_project: str = "vaco_jax"
    """The W&B project."""
    wandb_group: str = ""
    """The W&B group of the runs (default: none for a training run; the output directory's name
    for a sweep or an LLM experiment, which log one W&B run per run)."""
    wandb_tags: tuple[str, ...] = ()
    """W&B tags added to every run (the runs' coordinates, e.g. `algo:vaco`, `capacity:4`, are
    added as tags too)."""
    wandb_mode: Literal["online", "offline", "disabled"] | None = None
    """W&B's mode: online, offline (kept under `<out>/wandb/` for a later `wandb sync`) or
    disabled (default: W&B's own, e.g. WANDB_MODE)."""


@dataclasses.dataclass(frozen=True)
class Options:
    """The command's process options (flags of `vaco-train`)."""

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
    logging: Annotated[LoggerOptions, tyro.conf.OmitArgPrefixes,
                       tyro.conf.arg(prefix_name=False)] = LoggerOptions()
    """Where every evaluation's metrics also go (`--logger`, `--wandb-*`)."""
    log_every: int = 0
    """Also write the training updates' metrics every this many learner iterations (0 = off): a row
    of `updates.jsonl`, also sent to every `--logger` (as `updates/<metric>/...`), with the losses,
    entropy, approx_kl, clip and filtered fractions, TV estimates and gradient norm, each per seed
    and averaged over those iterations, and the learner's steps/s. Written after each evaluation
    chunk; must divide the iterations per evaluation. Never changes a result."""
    compile_cache: str = "default"
    """JAX's persistent compilation cache: `default` (off if VACO_JAX_COMPILE_CACHE=off; else
    JAX_COMPILATION_CACHE_DIR if set, else the per-user cache, `vaco_jax.cache`), `off`, or a
    directory. A repeated run skips compiling."""
    verbose: bool = False
    """Show the libraries' own log messages (absl, orbax, jax); normally only errors."""
    dry_run: bool = False
    """Compile the run's program ahead of time, print its per-device memory and placement, and
    exit without training or writing anything."""


# Options that a resumed run may set anew (the others name the run or are implied by resuming).
RESUME_MAY_CHANGE = ("progress", "allow_version_change", "allow_code_change", "checkpoint_every",
                     "checkpoint_budget", "checkpoint_max_age", "keep_checkpoints", "on_nan",
                     "compile_cache", "verbose", "log_every",
                     *(f.name for f in dataclasses.fields(LoggerOptions)))

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


def _missing_logger_package(logger: str):
    import importlib.util

    package = LOGGER_PACKAGES.get(logger)
    return package if package and importlib.util.find_spec(package[0]) is None else None


def validate_logging(options: LoggerOptions) -> None:
    """Raise `ConfigError` naming the first bad logger option (before anything compiles)."""
    if not isinstance(options, LoggerOptions):
        raise invalid_option("logging", options, "must be a vaco_jax.options.LoggerOptions")
    for name in ("wandb_entity", "wandb_project", "wandb_group"):
        if not isinstance(getattr(options, name), str):
            raise invalid_option(name, getattr(options, name), "must be a string")
    for name in ("logger", "wandb_tags"):
        value = getattr(options, name)
        if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
            raise invalid_option(name, value, "must be a tuple of strings")
    modes = typing.get_args(typing.get_args(
        typing.get_type_hints(LoggerOptions)["wandb_mode"])[0])
    if options.wandb_mode is not None and options.wandb_mode not in modes:
        raise invalid_option("wandb_mode", options.wandb_mode, f"allowed values are {modes} or None "
                                                        f"(W&B's default)")
    for backend in options.logger:
        if backend not in LOGGER_PACKAGES:
            raise invalid_option("logger", backend, f"allowed values are {tuple(LOGGER_PACKAGES)}")
        missing = _missing_logger_package(backend)
        if missing:
            raise invalid_option("logger", backend,
                          f"needs the {missing[0]} package: pip install -e \".[{missing[1]}]\"")
    for tag in options.wandb_tags:
        if not 0 < len(tag) <= 64:   # W&B's limit
            raise invalid_option("wandb_tags", tag, "each tag must have 1 to 64 characters")


def validate_options(options: Options) -> None:
    """Raise `ConfigError` naming the first bad option (before anything compiles)."""
    check_types(options)
    if options.keep_checkpoints < 1:
        raise invalid_option("keep_checkpoints", options.keep_checkpoints, "must be an integer >= 1")
    if not 0 < options.checkpoint_budget <= 1:
        raise invalid_option("checkpoint_budget", options.checkpoint_budget,
                      "must be in (0, 1]: the share of run time checkpoint writing may take (1 = no limit)")
    try:
        duration_seconds(options.checkpoint_max_age)
    except ValueError:
        raise invalid_option("checkpoint_max_age", options.checkpoint_max_age,
                      "must be a duration such as 90s, 10min or 2h (0 = no maximum)") from None
    validate_logging(options.logging)
    if options.checkpoint_every < 0:
        raise invalid_option("checkpoint_every", options.checkpoint_every,
                      "must be an integer >= 0 (evaluation chunks between checkpoints; 0 = never)")
    if options.log_every < 0:
        raise invalid_option("log_every", options.log_every,
                             "must be an integer >= 0 (learner iterations per row of "
                             "updates.jsonl; 0 = off)")


def validate_log_every(log_every: int, iterations_per_eval: int) -> None:
    """Raise `ConfigError` unless `--log-every` divides the run's iterations per evaluation, so
    that every row's iterations lie in one chunk (rows are written after it)."""
    if log_every and iterations_per_eval % log_every:
        divisors = [n for n in range(1, iterations_per_eval + 1) if iterations_per_eval % n == 0]
        raise invalid_option("log_every", log_every,
                             f"must divide the run's {iterations_per_eval} learner iterations per "
                             f"evaluation (total_steps // (num_envs * unroll_length) // num_evals): "
                             f"one of {', '.join(map(str, divisors))} (0 = off)")


@dataclasses.dataclass(frozen=True)
class Cluster:
    """How this process joins a multi-process (multi-host) run; the defaults run one process."""

    distributed: bool = False
    """Start JAX's multi-controller runtime (`jax.distributed.initialize`): run the same command in
    every process. Automatic when SLURM or Open MPI launched more than one task."""
    coordinator_address: str = ""
    """host:port of process 0 (empty: from the environment: SLURM, Open MPI, Cloud TPU or
    JAX_COORDINATOR_ADDRESS)."""
    num_processes: int = 0
    """Processes in the run (0: from the environment)."""
    process_id: int = -1
    """This process's index in [0, num_processes) (-1: from the environment)."""


@dataclasses.dataclass(frozen=True)
class AsyncOptions:
    """`vaco-train --async`: the actor groups and the learner run at once, as threads that hand
    parameters and batches over for real (`vaco_jax.actor_learner`, docs/async.md). The batches'
    ages then come from the threads' timing, not from a ring buffer: how the process runs changes
    what it computes, so such a run is neither resumable nor reproducible bit for bit."""

    asynchronous: Annotated[bool, tyro.conf.arg(name="async")] = False
    """Train with real asynchrony: each of the `num_actors` actor groups (num_envs / num_actors
    envs each) acts in a thread of its own with the newest parameters the learner has published;
    the learner takes batches of num_actors segments as they come. Writes the batches' measured
    ages as a lag profile (`<out>/lag_profile.json`, for `--lag-profile`)."""
    async_handover: Literal["queued", "sync"] = "queued"
    """`queued`: actors make segments while the learner learns (at most `--async-queue` of them
    made or being made and not yet taken); `sync`: an actor group starts a segment only once the
    learner has published the update made with its last one (no concurrency: every age is 0)."""
    async_queue: int = 1
    """`queued`: the most segments, over all actor groups, made or being made and not yet taken
    by the learner (a larger queue lets actors run further ahead: older batches)."""
    async_actor_delay: tuple[float, ...] = (0.0,)
    """Seconds an actor group waits after taking the newest parameters and before acting with them
    (a slow actor or a slow transfer), drawn for every segment from `--async-delay-distribution`
    with this mean; several values: group g's mean is the (g mod n)-th, e.g. `0 0.2` makes every
    second group a straggler. A way to reach larger lags on a small machine."""
    async_delay_distribution: Literal["fixed", "exponential"] = "exponential"
    """The actor delay's distribution: `fixed` (always the mean) or `exponential`."""
    async_actor_devices: tuple[int, ...] = (0,)
    """Local devices the actor groups act on (group g on the (g mod n)-th of these n), as indices
    into `jax.local_devices()`."""
    async_learner_device: int = 0
    """The local device the learner runs on (its index in `jax.local_devices()`)."""


def validate_async(asynchrony: AsyncOptions, config, options: Options, cluster: Cluster) -> None:
    """Raise `ConfigError` naming the first flag that an `--async` run cannot honour, or an
    `--async-*` flag given without `--async` (before anything is imported or compiled; the device
    indices are checked against the devices when the run starts)."""
    check_types(asynchrony)
    if not asynchrony.asynchronous:
        given = [f.name for f in dataclasses.fields(AsyncOptions)
                 if getattr(asynchrony, f.name) != f.default]
        if given:
            raise invalid_option(given[0], getattr(asynchrony, given[0]),
                                 "only applies with --async (real actor and learner threads)")
        return
    if config.capacity != 1 or config.max_capacity > 1:
        raise invalid_option("capacity", config.capacity,
                             "must be 1 with --async: there the lag is real; --capacity, "
                             "--max-capacity and --lag-profile simulate it")
    if config.lag_profile or config.snapshot_sampling == "profile":
        raise invalid_option("lag_profile", config.lag_profile,
                             "cannot be replayed by an --async run, which measures its own lag "
                             "(and writes it as <out>/lag_profile.json)")
    refusals = {
        "resume": "cannot continue an --async run: its ages come from the threads' timing, which "
                  "a restart cannot replay, so it writes no checkpoints",
        "dry_run": "is not available with --async (its programs are compiled when it starts)",
        "log_every": "is not available with --async: the batches' ages and waits are in "
                     "<out>/batches.jsonl, the losses in metrics.jsonl",
    }
    for name, why in refusals.items():
        if getattr(options, name):
            raise invalid_option(name, getattr(options, name), why)
    if options.logging.logger:
        raise invalid_option("logger", options.logging.logger,
                             "is not available with --async (metrics.jsonl holds its metrics)")
    if cluster.distributed or cluster.num_processes > 1:
        raise invalid_option("distributed", cluster.distributed,
                             "--async runs in one process (its actors and learner are threads)")
    if asynchrony.async_queue < 1:
        raise invalid_option("async_queue", asynchrony.async_queue, "must be an integer >= 1")
    if asynchrony.async_handover == "sync" and asynchrony.async_queue != 1:
        raise invalid_option("async_queue", asynchrony.async_queue,
                             "must be 1 with --async-handover sync (each actor group hands over "
                             "one segment per learner update)")
    delays = asynchrony.async_actor_delay
    if not delays or not all(0 <= d < float("inf") for d in delays):
        raise invalid_option("async_actor_delay", delays,
                             "must be one or more finite numbers of seconds >= 0")
    if not asynchrony.async_actor_devices or min(asynchrony.async_actor_devices) < 0:
        raise invalid_option("async_actor_devices", asynchrony.async_actor_devices,
                             "must list one or more device indices >= 0")
    if asynchrony.async_learner_device < 0:
        raise invalid_option("async_learner_device", asynchrony.async_learner_device,
                             "must be a device index >= 0")
