"""Train one algorithm on one env, many seeds in one vmapped call, in checkpointed chunks.

    vaco-train --env inverted_pendulum --algo vaco --capacity 4 --num-seeds 4 \\
        --total-steps 300000 --out runs/ip_vaco_c4
    vaco-train --resume runs/ip_vaco_c4      # continue after a crash or pre-emption
    vaco-train --lag-profile docs/lag_profiles/example.json   # replay a system's staleness
    vaco-train --async --num-actors 4 --async-queue 8 --out runs/ip_async   # real actor threads

The command (`python -m vaco_jax.commands.train` where the script is not installed): its flags are the run's `Config`, the
process `Options` and the `Cluster`; the run is `vaco_jax.run` (`vaco_jax.driver`), imported once
the flags are parsed, so `--help`, which lists every config field and option with its default,
imports no JAX.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Annotated

import tyro

from vaco_jax.config import Config, read_config_file, with_lag_profile
from vaco_jax.errors import CheckpointError, ConfigError, DivergenceError
from vaco_jax.options import AsyncOptions, Cluster, Options, validate_async


@dataclasses.dataclass(frozen=True)
class Command:
    """`vaco-train`: the run's config, the process options, the cluster (flat flags;
    tyro heads each group of `--help` with its field's name, so `options` is named `process`)."""

    config: Annotated[Config, tyro.conf.OmitArgPrefixes] = Config()
    options: Annotated[Options, tyro.conf.OmitArgPrefixes, tyro.conf.arg(name="process")] = Options()
    cluster: Annotated[Cluster, tyro.conf.OmitArgPrefixes] = Cluster()
    asynchrony: Annotated[AsyncOptions, tyro.conf.OmitArgPrefixes] = AsyncOptions()
    config_file: Annotated[str, tyro.conf.arg(name="config", metavar="FILE")] = ""
    """Start from the config in this file: a run's config.json (or its directory) or a JSON object
    of config fields; config flags given override it (e.g. another --seed or --total-steps)."""


def parse(argv: list[str], default: Command | None = None, prog: str = "vaco-train") -> Command:
    """The command of `argv`. Without a `default`, every config flag not given takes the default
    of the env named by `--env`, then of the algorithm named by `--algo` (`Config.for_env`),
    which `--help` shows."""
    if default is None:
        default = Command(config=Config.for_env(env_in(argv), algo=algo_in(argv)))
    description = __doc__.split("\n\n")[0]
    command = tyro.cli(Command, args=argv, default=default, description=description, prog=prog)
    if _given(argv, "--lag-profile"):
        # The profile draws the snapshot ages, from a buffer as long as it, unless flags say
        # otherwise (a wrong --snapshot-sampling, or a --capacity too small, is refused).
        config = with_lag_profile(command.config, command.config.lag_profile,
                                  sampling=not _given(argv, "--snapshot-sampling"),
                                  capacity=not _given(argv, "--capacity"))
        command = dataclasses.replace(command, config=config)
    return command


def _given(argv: list[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in argv)


def env_in(argv: list[str]) -> str:
    """The value of `--env` in `argv` (`--env X` or `--env=X`; the last one given), or the
    default env."""
    return _flag_in(argv, "--env", Config().env)


def algo_in(argv: list[str]) -> str:
    """The value of `--algo` in `argv` (the last one given), or the default algorithm."""
    return _flag_in(argv, "--algo", Config().algo)


def _flag_in(argv: list[str], flag: str, default: str) -> str:
    value = default
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.partition("=")[2]
    return value


def with_stored_config(command: Command, argv: list[str], prog: str = "vaco-train") -> Command:
    """With `--resume DIR`, the stored run's config is the default of every config flag (flags
    given must agree with it, which `run` checks); with `--config FILE`, the file's (flags given
    override it)."""
    if command.options.resume and command.config_file:
        raise ConfigError("option `config` is invalid with --resume: a resumed run continues with "
                          "its own config; leave --config out")
    if command.options.resume:
        from vaco_jax import checkpoint

        stored = checkpoint.stored_config(command.options.resume)
    elif command.config_file:
        stored = read_config_file(command.config_file)
    else:
        return command
    return parse(argv, default=dataclasses.replace(command, config=stored), prog=prog)


def main(argv: list[str] | None = None, prog: str = "vaco-train") -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    out = None
    try:
        command = parse(argv, prog=prog)   # the env's defaults: a user's env is built here
        validate_async(command.asynchrony, command.config, command.options, command.cluster)
        if command.asynchrony.asynchronous:
            return _main_async(command, argv, prog)
        # The library is imported once the flags are parsed: --help imports no JAX.
        import numpy as np

        from vaco_jax import runtime
        from vaco_jax.driver import run

        runtime.start(command.cluster, compile_cache=command.options.compile_cache,
                      verbose=command.options.verbose)
        command = with_stored_config(command, argv, prog)
        if not command.options.resume and not command.options.out:   # named now, to resume it
            from vaco_jax.driver import default_out

            command = dataclasses.replace(command, options=dataclasses.replace(
                command.options, out=str(default_out(command.config))))
        out = command.options.resume or command.options.out
        summary = run(command.config, command.options)
    except KeyboardInterrupt:
        print("interrupted: nothing was written" if out is None else
              f"interrupted: the checkpoints saved so far are kept in {out}; resume with: "
              f"{prog} --resume {out}", file=sys.stderr)
        return 130
    except (ConfigError, CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except DivergenceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 3
    if command.options.dry_run or not runtime.is_primary():
        return 0
    returns = [None if r is None or not np.isfinite(r) else round(float(r), 1)
               for r in np.asarray(summary["final_eval_return"], dtype=float)]
    print(f"final eval return per seed: {returns}  ({summary['env_steps']:,} steps/seed, "
          f"{summary['sps']:,.0f} steps/s, compile {summary['compile_seconds']:.1f} s, evaluation "
          f"{summary['eval_fraction']:.0%} of the time, "
          f"{summary['devices']}) -> {summary['out']}")
    if summary.get("snapshot_ages"):
        ages = summary["snapshot_ages"]
        print("snapshot ages, profile -> realised (all seeds): " + ", ".join(
            f"{k}: {p:.3f} -> {r:.3f}" for k, (p, r) in enumerate(zip(ages["profile"],
                                                                      ages["realised"]))))
    return 0


def _main_async(command: Command, argv: list[str], prog: str) -> int:
    """`vaco-train --async`: actor and learner threads (`vaco_jax.actor_learner`)."""
    command = with_stored_config(command, argv, prog)
    from vaco_jax import cache
    from vaco_jax.actor_learner import run_async

    cache.default_compile_cache(command.options.compile_cache)
    summary = run_async(command.config, command.options, command.asynchrony)
    ages = summary["ages"]
    print(f"final eval return per seed: {summary['final_eval_return']}  "
          f"({summary['env_steps']:,} steps/seed, {summary['sps']:,.0f} steps/s, compile "
          f"{summary['compile_seconds']:.1f} s, {summary['devices']}) -> {summary['out']}")
    print(f"measured ages of {ages['segments']} segments: mean {ages['mean']:.2f}, max "
          f"{ages['max']}, counts {ages['counts']} -> {summary['out']}/lag_profile.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m vaco_jax.commands.train"))
