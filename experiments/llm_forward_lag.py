"""GRPO under forward lag (SPEC §6): held-out accuracy and clip/filter fractions against N.

    python -m experiments.llm_forward_lag cpu       # the CPU preset (under 30 min on 2 cores)
    python -m experiments.llm_forward_lag cpu --objectives pg   # add pg to the same sweep
    python -m experiments.llm_forward_lag tiny --out /tmp/llm_tiny   # seconds
    python -m experiments.llm_forward_lag gpu                       # a ~0.3B model, for an accelerator

Every field can be overridden (`--help`), e.g. `--config.grpo.delta 0.01`. The warm start is
cached under `--cache-dir`, keyed by the model/task/sft configuration; results resume.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import jax
import tyro

from vaco_jax import runtime
from vaco_jax.llm.config import preset
from vaco_jax.llm.experiment import Experiment, run


def presets():
    return {
        "tiny": ("Seconds: a 1-layer model on 1-step problems (tests, notebook).",
                 Experiment(preset("tiny"), ns=(1, 4), out="results/llm/tiny",
                            plot="results/llm/tiny/forward_lag.png", fast_compile=True)),
        "cpu": ("The CPU preset: 113k-parameter model, N in 1..32, 3 seeds.",
                Experiment(preset("cpu"), out="results/llm/cpu", plot="docs/llm_forward_lag.png")),
        "gpu": ("A ~0.3B-parameter bf16 model for one accelerator (not run on CPU).",
                Experiment(preset("gpu"), ns=(1, 2, 4, 8, 16), out="results/llm/gpu",
                           plot="docs/llm_forward_lag_gpu.png", cache_dir="runs/llm_cache")),
    }


def main():
    experiment = tyro.extras.overridable_config_cli(presets())
    runtime.initialize()   # multi-process when launched so by SLURM or Open MPI
    runtime.announce()
    jax.config.update("jax_compilation_cache_dir", ".jax_cache")
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


if __name__ == "__main__":
    main()
