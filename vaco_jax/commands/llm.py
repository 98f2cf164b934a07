"""GRPO under forward and backward lag (SPEC §6): held-out accuracy and clip/filter fractions
against N (minibatch updates per batch) and k (the generating snapshot's age).

    vaco-llm cpu                      # the CPU preset (under 30 min on 2 cores)
    vaco-llm cpu --objectives pg      # add pg to the same sweep
    vaco-llm cpu --ks 0 2 4 8         # backward lag k beside N (--lag-sampling uniform: 0..k)
    vaco-llm tiny --out /tmp/llm_tiny # seconds
    vaco-llm gpu                      # a ~0.3B model, for an accelerator

Every field can be overridden (`--help`), e.g. `--config.grpo.delta 0.01`. Everything is written
under `--out` (results, summary, log, forward_lag.png). The warm start of the `tiny` and `cpu`
presets' model/task/sft configuration ships with the package and is loaded without training;
any other (or with `--train-warm-start`) is trained once and cached per user (`--cache-dir` to
change), keyed by the model/task/sft configuration, the data and the code that makes it. Results
resume.
`--logger tensorboard wandb` also logs every (k, N, objective, seed) run (`vaco_jax.loggers`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import tyro

from vaco_jax.llm.config import Experiment, preset


def presets():
    return {
        "tiny": ("Seconds: a 1-layer model on 1-step problems (tests, notebook).",
                 Experiment(preset("tiny"), ns=(1, 4), out="runs/llm/tiny", fast_compile=True)),
        "cpu": ("The CPU preset: 113k-parameter model, N in 1..32, 5 seeds.",
                Experiment(preset("cpu"), out="runs/llm/cpu")),
        "gpu": ("A ~0.3B-parameter bf16 model for one accelerator (not run on CPU).",
                Experiment(preset("gpu"), ns=(1, 2, 4, 8, 16), out="runs/llm/gpu")),
    }


def main(argv: list[str] | None = None, prog: str = "vaco-llm") -> int:
    experiment = tyro.extras.overridable_config_cli(presets(), prog=prog, args=argv)
    # The library is imported once the flags are parsed: --help imports no JAX.
    from vaco_jax import runtime
    from vaco_jax.llm.experiment import run

    runtime.start(compile_cache=experiment.compile_cache)   # multi-process under SLURM/Open MPI
    log_path = Path(experiment.out) / "log.txt"
    if runtime.is_primary():
        log_path.parent.mkdir(parents=True, exist_ok=True)

    def log(line):  # to the terminal and, with a timestamp, to out/log.txt (process 0 only)
        if not runtime.is_primary():
            return
        print(line, flush=True)
        with open(log_path, "a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {line}\n")

    log(f"running {dataclasses.replace(experiment, config=None)}")
    run(experiment, log=log)
    return 0

