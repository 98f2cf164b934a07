"""Compile-time benchmark: Brax PPO's training step vs our programs, with where ours goes.

    python -m benchmarks.compile                                  # inverted_pendulum and hopper
    python -m benchmarks.compile --envs hopper --out compile.json

For each env, on the throughput benchmark's CPU shapes (`benchmarks.throughput` preset `cpu`), each
measurement in its own fresh subprocess with JAX's persistent compilation cache off (a cold start):
  brax_ppo    Brax PPO's training epoch: its first epoch's time minus a steady epoch's;
  init        our initial state's program (parameters, optimiser, buffer; the envs are shaped, not
              reset: the first iteration resets them): trace, lower, XLA compile;
  iteration   our learner iterations (`ppo_clip` / `vaco`, no evaluation): the same stages;
  evaluation  our deterministic evaluation program: the same stages;
  chunk       the CLI's chunk (`vaco_jax.program`: iterations and evaluation, compiled at once);
  sweep_cell  a sweep cell's chunk: 3 capacities × 2 seeds of `vaco` in one program.
Each of ours also reports how many copies of the env's `step` and `reset` the program holds (the
calls made while it is traced: the trainer's env, `envs.TracedOnce`, shares one trace of each
across programs, so traces do not count copies) and the size of the optimised HLO
(instructions). Prints a table and the ratios to Brax's training-step compile; `--out` writes
JSON with the library versions and device.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import jax

from benchmarks.measure import Case, Clock, brax_ppo
from benchmarks.throughput import PRESETS

MEASUREMENTS = ("brax_ppo", "init", "iteration_ppo_clip", "iteration_vaco", "evaluation", "chunk",
                "sweep_cell")


def _case(env: str) -> Case:
    return Case(env=env, **{**PRESETS["cpu"]["case"], "repeats": 2})


class TraceCounter:
    """Within `with`, counts the calls of an env class's `step` and `reset` while programs are
    traced (a call is a copy in the program being built); the class is restored on exit."""

    def __init__(self, env_class):
        self.env_class = env_class
        self.counts = {"step": 0, "reset": 0}
        self._originals = {name: getattr(env_class, name) for name in self.counts}

    def __enter__(self):
        for name, original in self._originals.items():
            setattr(self.env_class, name, self._counting(name, original))
        return self

    def __exit__(self, *exc):
        for name, original in self._originals.items():
            setattr(self.env_class, name, original)

    def _counting(self, name, original):
        def counted(env, *args, **kwargs):
            self.counts[name] += 1
            return original(env, *args, **kwargs)
        return counted

    def take(self) -> dict:
        counts, self.counts = dict(self.counts), {k: 0 for k in self.counts}
        return counts


def _hlo_instructions(compiled) -> int:
    return len(re.findall(r"^\s*(?:ROOT )?%?[\w.\-]+ = ", compiled.as_text(), flags=re.M))


def _stages(jitted, *args) -> tuple[object, dict]:
    """Trace, lower and compile `jitted` for `args`, timing each stage."""
    with Clock() as trace:
        traced = jitted.trace(*args)
    with Clock() as lower:
        lowered = traced.lower()
    with Clock() as xla:
        compiled = lowered.compile()
    return compiled, {"trace_s": trace.wall, "lower_s": lower.wall, "xla_compile_s": xla.wall,
                      "compile_s": trace.wall + lower.wall + xla.wall,
                      "hlo_instructions": _hlo_instructions(compiled)}


def measure(name: str, env: str) -> dict:
    """One measurement (the command runs each in a fresh process, with the cache off)."""
    case = _case(env)
    if name == "brax_ppo":
        result = brax_ppo(case)
        return {"compile_s": result["compile_s"]}

    import jax.numpy as jnp

    from vaco_jax import envs, program
    from vaco_jax.trainer import Trainer

    if name == "init":   # traces the env's reset for its state's shape only: no copies to count
        trainer = Trainer(case.config("vaco", capacity=1, max_capacity=16))
        _, result = _stages(jax.jit(jax.vmap(trainer.init)),
                            jax.random.split(jax.random.PRNGKey(0), 1))
        return result
    with TraceCounter(envs.TracedOnce) as counter:   # the trainer's env: one call per copy
        if name.startswith("iteration"):
            config = case.config(name.split("_", 1)[1])
            trainer = Trainer(config)
            state = jax.jit(jax.vmap(trainer.init))(jax.random.split(jax.random.PRNGKey(0), 1))
            counter.take()

            def iterations(state):
                state, metrics = jax.lax.scan(lambda s, _: trainer.iteration(s), state, None,
                                              length=case.iterations)
                return state, jax.tree.map(jnp.mean, metrics)

            _, result = _stages(jax.jit(jax.vmap(iterations), donate_argnums=0), state)
            return {**result, **counter.take()}
        config = case.config("vaco", capacity=1, max_capacity=16)
        runs = 6 if name == "sweep_cell" else 1
        built = program.TrainProgram.build(config, runs, donate=True, store=False)
        counter.take()
        if name == "evaluation":
            state = built.abstract_state
            _, result = _stages(built.evaluate, state.params["actor"], state.normalizer, state.key)
            return {**result, **counter.take()}
        with Clock() as clock:
            compiled, _ = built.compiled_chunk()
        instructions = _hlo_instructions(compiled.learn) + _hlo_instructions(compiled.evaluate)
        return {"compile_s": clock.wall, "compile_cpu_s": clock.cpu, **counter.take(),
                "hlo_instructions": instructions}


def _run_worker(name: str, env: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "benchmarks.compile", "--worker", name, env],
                          capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{name} on {env} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compile",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=["inverted_pendulum", "hopper"])
    parser.add_argument("--only", nargs="+", choices=MEASUREMENTS, default=list(MEASUREMENTS))
    parser.add_argument("--out", default="", help="write the results as JSON here")
    parser.add_argument("--worker", nargs=2, metavar=("NAME", "ENV"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        jax.config.update("jax_enable_compilation_cache", False)
        print(json.dumps(measure(*args.worker)))
        return 0

    from vaco_jax import io

    results = {}
    for env in args.envs:
        for name in args.only:
            start = time.perf_counter()
            results[f"{env}/{name}"] = row = _run_worker(name, env)
            print(f"{env:18s} {name:20s} compile {row['compile_s']:6.1f} s"
                  + (f"  (trace {row['trace_s']:.1f} + lower {row['lower_s']:.1f} + XLA "
                     f"{row['xla_compile_s']:.1f})" if "trace_s" in row else "")
                  + (f"  step ×{row['step']}, reset ×{row['reset']}" if "step" in row else "")
                  + (f", {row['hlo_instructions']:,} HLO instructions"
                     if "hlo_instructions" in row else "")
                  + f"   [{time.perf_counter() - start:.0f} s]", flush=True)
        brax = results.get(f"{env}/brax_ppo", {}).get("compile_s")
        if brax:
            for name in args.only[1:]:
                if f"{env}/{name}" in results:
                    print(f"{env:18s} {name:20s} / brax_ppo training step: "
                          f"{results[f'{env}/{name}']['compile_s'] / brax:.2f}")
    if args.out:
        io.write_json_atomic(Path(args.out), {"case": PRESETS["cpu"]["case"], "results": results,
                                              **io.provenance()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
