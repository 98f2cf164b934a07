"""Wall-clock to return: ours against Brax's PPO, at its published settings and at ours, compilation
included.

    python -m benchmarks.time_to_return --env inverted_double_pendulum            # ~25 min on 2 cores
    python -m benchmarks.time_to_return --env hopper --budget 700 --brax-seeds 1   # ~50 min
    python -m benchmarks.time_to_return --env inverted_pendulum --preset smoke     # a minute

What a user waits for: the seconds from the start of a fresh process's training call (cold: no
persistent compilation cache, no program store) until the mean deterministic evaluation return of
the seeds first reaches `--threshold`, and the mean return reached at equal wall-clock budgets.
Each contestant runs in its own subprocess and stops at the first evaluation after `--budget`
seconds:

  ppo_clip, vaco  ours, C = 1, the project's defaults (`Config()`: 32 envs × 32 steps, 4 epochs ×
                  8 minibatches, 10 evaluations of 8 episodes over `--total-steps`); all seeds in
                  one vmapped call, so its seconds are those of every seed at once.
  brax_ppo        `brax.training.agents.ppo.train` with the hyper-parameters Brax publishes for the
                  env (its training notebook; for hopper, where it publishes SAC, its PPO settings
                  for the locomotion tasks) and a deterministic evaluation like ours. Brax trains
                  one seed per call, so seeds run one after another: its curve is the mean over
                  seeds of each evaluation's return and of its seconds — the time of one seed's
                  run, not of all of them (`sequential_seconds` adds them up).
  brax_ppo_ours   Brax's PPO at *our* shapes and hyper-parameters (32 envs × 32 steps, 4 epochs ×
                  8 minibatches of whole segments, 64×64 tanh networks, our learning rate, γ, λ, ε,
                  reward scale, gradient clip, no entropy bonus; the same budget in env steps and
                  the same evaluations as ours): the implementations compared on one
                  configuration. `brax_ppo` compares configurations: settings Brax tuned for
                  thousands of envs on an accelerator, run on the same machine as ours.

The JSON written to `--out` holds every curve (seconds, env steps, mean and per-seed return).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# Brax's published PPO settings (github.com/google/brax, notebooks/training.ipynb).
BRAX_PUBLISHED = {
    "inverted_pendulum": dict(num_timesteps=2_000_000, num_evals=20, reward_scaling=10,
                              episode_length=1000, normalize_observations=True, action_repeat=1,
                              unroll_length=5, num_minibatches=32, num_updates_per_batch=4,
                              discounting=0.97, learning_rate=3e-4, entropy_cost=1e-2,
                              num_envs=2048, batch_size=1024),
    "inverted_double_pendulum": dict(num_timesteps=20_000_000, num_evals=20, reward_scaling=10,
                                     episode_length=1000, normalize_observations=True,
                                     action_repeat=1, unroll_length=5, num_minibatches=32,
                                     num_updates_per_batch=4, discounting=0.97, learning_rate=3e-4,
                                     entropy_cost=1e-2, num_envs=2048, batch_size=1024),
    # Brax publishes SAC for hopper; these are its PPO settings for the locomotion tasks (ant).
    "hopper": dict(num_timesteps=50_000_000, num_evals=10, reward_scaling=10, episode_length=1000,
                   normalize_observations=True, action_repeat=1, unroll_length=5,
                   num_minibatches=32, num_updates_per_batch=4, discounting=0.97,
                   learning_rate=3e-4, entropy_cost=1e-2, num_envs=4096, batch_size=2048),
}

PRESETS = {
    "cpu": dict(seeds=4, budget=300.0, total_steps={"inverted_pendulum": 200_000,
                                                    "inverted_double_pendulum": 300_000,
                                                    "hopper": 1_000_000},
                thresholds={"inverted_pendulum": 900.0, "inverted_double_pendulum": 9000.0,
                            "hopper": 1000.0}, brax={}),
    # Seconds: tiny shapes for both (used by the tests through `aggregate`/`summarise` only).
    "smoke": dict(seeds=2, budget=120.0, total_steps={"inverted_pendulum": 10240},
                  thresholds={"inverted_pendulum": 50.0},
                  brax=dict(num_timesteps=8192, num_evals=3, num_envs=16, batch_size=8,
                            num_minibatches=4, num_eval_envs=4)),
}
CONTESTANTS = ("brax_ppo", "brax_ppo_ours", "ppo_clip", "vaco")


def ours_in_brax_terms(total_steps: int) -> dict:
    """Brax PPO's settings for our default `Config` (the shapes and hyper-parameters of `ppo_clip`).

    Brax collects `batch_size × num_minibatches` segments per training step from `num_envs` envs:
    with `batch_size = num_envs / M` that is one `unroll_length` segment per env, our batch."""
    import functools

    from brax.training.agents.ppo import networks as ppo_networks
    from flax import linen

    from vaco_jax import Config

    c = Config()
    return dict(
        num_timesteps=total_steps, num_evals=c.num_evals + 1, num_eval_envs=c.eval_envs,
        episode_length=c.episode_length, num_envs=c.num_envs, unroll_length=c.unroll_length,
        batch_size=c.num_envs // c.num_minibatches, num_minibatches=c.num_minibatches,
        num_updates_per_batch=c.num_epochs, learning_rate=c.learning_rate, entropy_cost=c.ent_coef,
        discounting=c.gamma, gae_lambda=c.gae_lambda, clipping_epsilon=c.clip_eps,
        max_grad_norm=c.max_grad_norm, reward_scaling=c.reward_scale, normalize_observations=True,
        action_repeat=1,
        network_factory=functools.partial(
            ppo_networks.make_ppo_networks, policy_hidden_layer_sizes=c.actor_hidden,
            value_hidden_layer_sizes=c.critic_hidden, activation=linen.tanh))


class _Budget(Exception):
    """Raised from Brax's progress callback to stop its training at the wall-clock budget."""


def run_brax(env_name: str, seed: int, budget: float, overrides: dict,
             settings: dict | None = None) -> list[dict]:
    """One Brax PPO run; a point (seconds since the call, env steps, return) per evaluation.
    `settings`: Brax's arguments (default: its published ones for the env, with `overrides`)."""
    from brax.training.agents.ppo import train as ppo

    from vaco_jax.envs import make_env

    env = make_env(env_name)
    points, start = [], time.perf_counter()

    def progress(step, metrics):
        points.append({"seconds": time.perf_counter() - start, "steps": int(step),
                       "returns": [float(metrics["eval/episode_reward"])]})
        if points[-1]["seconds"] > budget:
            raise _Budget

    settings = {**BRAX_PUBLISHED[env_name], **overrides} if settings is None else settings
    try:
        ppo.train(environment=env, seed=seed, deterministic_eval=True, progress_fn=progress,
                  **settings)
    except _Budget:
        pass
    return points


def run_ours(env_name: str, algo: str, seeds: list[int], budget: float, total_steps: int) -> list[dict]:
    """Our CLI's program for every seed at once; a point per evaluation (all seeds' returns)."""
    from vaco_jax import Config, driver, program

    start = time.perf_counter()
    config = Config(env=env_name, algo=algo, num_seeds=len(seeds), seed=seeds[0],
                    total_steps=total_steps)
    built = program.TrainProgram.build(config, config.num_seeds, store=False, log=lambda _: None)
    state = driver.init_state(built, config)
    chunk, _ = built.compiled_chunk()
    points = []
    for k in range(config.num_evals):
        state, metrics = chunk(state)
        returns = np.asarray(built.layout.unpad(metrics)["eval_return"]).reshape(len(seeds), -1)
        points.append({"seconds": time.perf_counter() - start,
                       "steps": (k + 1) * config.iterations_per_eval * config.batch_size,
                       "returns": returns[:, -1].tolist()})
        if points[-1]["seconds"] > budget:
            break
    return points


def aggregate(runs: list[list[dict]]) -> list[dict]:
    """One curve from per-seed runs (or from one all-seeds run): per evaluation index reached by
    every run, the mean seconds, steps and the mean return over all seeds' returns."""
    length = min(len(r) for r in runs)
    curve = []
    for k in range(length):
        returns = [x for r in runs for x in r[k]["returns"]]
        curve.append({"seconds": float(np.mean([r[k]["seconds"] for r in runs])),
                      "steps": int(np.mean([r[k]["steps"] for r in runs])),
                      "mean_return": float(np.mean(returns)), "returns": returns})
    return curve


def seconds_to(curve: list[dict], threshold: float) -> float | None:
    """Seconds at the first evaluation whose mean return reaches `threshold` (None: never)."""
    return next((p["seconds"] for p in curve if p["mean_return"] >= threshold), None)


def return_at(curve: list[dict], seconds: float) -> float | None:
    """Mean return of the last evaluation finished within `seconds` (None: none was)."""
    done = [p["mean_return"] for p in curve if p["seconds"] <= seconds]
    return done[-1] if done else None


def summarise(curves: dict[str, list[dict]], threshold: float, budgets: list[float]) -> dict:
    out = {}
    for name, curve in curves.items():
        out[name] = {"seconds_to_threshold": seconds_to(curve, threshold),
                     "return_at": {str(b): return_at(curve, b) for b in budgets},
                     "final": curve[-1] if curve else None}
    for brax_name, suffix in (("brax_ppo", ""), ("brax_ppo_ours", "_ours")):
        brax = out.get(brax_name, {}).get("seconds_to_threshold")
        brax_curve = curves.get(brax_name) or []
        for name in out:
            mine = out[name]["seconds_to_threshold"]
            out[name][f"ratio_to_brax{suffix}"] = (mine / brax if mine is not None and brax else None)
            if mine is not None and brax is None and brax_curve:
                # Brax had not reached the threshold when it stopped: the ratio is at most this.
                out[name][f"ratio_to_brax{suffix}_at_most"] = mine / brax_curve[-1]["seconds"]
    return out


def _worker(spec: dict) -> list:
    import jax

    jax.config.update("jax_enable_compilation_cache", False)   # a cold start, as a new user's
    if spec["name"] == "brax_ppo":
        return [run_brax(spec["env"], s, spec["budget"], spec["brax"]) for s in spec["seeds"]]
    if spec["name"] == "brax_ppo_ours":
        settings = ours_in_brax_terms(spec["total_steps"])
        return [run_brax(spec["env"], s, spec["budget"], {}, settings) for s in spec["seeds"]]
    return [run_ours(spec["env"], spec["name"], spec["seeds"], spec["budget"], spec["total_steps"])]


def _run_worker(spec: dict) -> list:
    done = subprocess.run([sys.executable, "-m", "benchmarks.time_to_return", "--worker",
                           json.dumps(spec)], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{spec['name']} on {spec['env']} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.time_to_return",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="inverted_double_pendulum", choices=sorted(BRAX_PUBLISHED))
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--only", nargs="+", choices=CONTESTANTS, default=list(CONTESTANTS))
    parser.add_argument("--seeds", type=int, help="seeds per contestant (default: the preset's)")
    parser.add_argument("--brax-seeds", type=int,
                        help="Brax PPO runs only the first N of the seeds (its seeds run one after "
                             "another and its curve's seconds are one seed's run; default: all)")
    parser.add_argument("--budget", type=float, help="wall-clock seconds per run")
    parser.add_argument("--threshold", type=float, help="mean evaluation return to reach")
    parser.add_argument("--total-steps", type=int, help="our runs' --total-steps")
    parser.add_argument("--out", help="JSON output (default: benchmarks/results/time-to-return-<env>.json)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(_worker(json.loads(args.worker))), flush=True)
        return {}

    preset = PRESETS[args.preset]
    seeds = list(range(args.seeds or preset["seeds"]))
    budget = args.budget or preset["budget"]
    threshold = args.threshold if args.threshold is not None else preset["thresholds"][args.env]
    total_steps = args.total_steps or preset["total_steps"][args.env]
    brax_seeds = seeds[:args.brax_seeds] if args.brax_seeds else seeds
    curves, raw = {}, {}
    for name in args.only:
        started = time.perf_counter()
        raw[name] = _run_worker({"name": name, "env": args.env, "budget": budget,
                                 "seeds": brax_seeds if name.startswith("brax") else seeds,
                                 "total_steps": total_steps, "brax": preset["brax"]})
        curves[name] = aggregate(raw[name])
        last = curves[name][-1] if curves[name] else {}
        print(f"{args.env} {name}: {len(curves[name])} evaluations, last at "
              f"{last.get('seconds', 0):.0f} s / {last.get('steps', 0):,} steps: mean return "
              f"{last.get('mean_return', float('nan')):.1f}   [{time.perf_counter() - started:.0f} s]",
              flush=True)
    budgets = sorted({b for b in (30, 60, 120, 300, 600, 900, 1800) if b < budget} | {budget})
    summary = summarise(curves, threshold, budgets)
    brax_note = (f" (Brax PPO: {len(brax_seeds)})"
                 if "brax_ppo" in args.only and len(brax_seeds) != len(seeds) else "")
    print(f"\n{args.env}: seconds until the mean evaluation return of {len(seeds)} seeds{brax_note} reaches "
          f"{threshold:g} (compilation included), and the mean return at equal wall-clock budgets")
    print(f"| contestant | seconds to {threshold:g} | / brax_ppo | / brax_ppo_ours | "
          + " | ".join(f"return at {b:g} s" for b in budgets) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(budgets))
    for name, row in summary.items():
        seconds = row["seconds_to_threshold"]
        if seconds is None:
            seconds_shown = f"not within {curves[name][-1]['seconds']:.0f}" if curves[name] else "–"
        else:
            seconds_shown = f"{seconds:.0f}"
        ratios = []
        for suffix in ("", "_ours"):
            ratio, bound = row[f"ratio_to_brax{suffix}"], row.get(f"ratio_to_brax{suffix}_at_most")
            ratios.append(f"{ratio:.2f}" if ratio is not None else f"≤ {bound:.2f}" if bound else "–")
        returns = " | ".join("–" if row["return_at"][str(b)] is None
                             else f"{row['return_at'][str(b)]:.0f}" for b in budgets)
        print(f"| {name} | {seconds_shown} | {' | '.join(ratios)} | {returns} |")
    for brax_name in ("brax_ppo", "brax_ppo_ours"):
        if brax_name in raw:
            summary[brax_name]["sequential_seconds"] = float(sum(r[-1]["seconds"] for r in raw[brax_name]))

    from vaco_jax import io

    report = {"env": args.env, "preset": args.preset, "seeds": seeds, "brax_seeds": brax_seeds,
              "budget": budget,
              "threshold": threshold, "total_steps": total_steps,
              "brax_settings": {**BRAX_PUBLISHED[args.env], **preset["brax"]},
              "brax_ours_settings": {k: v for k, v in ours_in_brax_terms(total_steps).items()
                                     if k != "network_factory"},
              "summary": summary, "curves": curves,
              "command": "python -m benchmarks.time_to_return " + " ".join(
                  argv if argv is not None else sys.argv[1:]), **io.provenance()}
    out = Path(args.out or f"benchmarks/results/time-to-return-{args.env}.json")
    io.write_json_atomic(out, report)
    print(f"\nwrote {out}")
    return report


if __name__ == "__main__":
    main()
