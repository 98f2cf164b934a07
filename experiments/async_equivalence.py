"""Does the simulated lag predict a real asynchronous run? (docs/preregistrations.md, section 9)

For each method, task and asynchrony regime:

* **real**: `vaco-train --async` runs, `CALLS` calls of `SEEDS_PER_CALL` seeds (the seeds of one
  call share its threads' schedule of ages, so the calls give independent schedules); each call
  writes the ages it realised (`lag_profile.json`);
* **simulated**: the fused program acting with the pooled histogram of those ages
  (`snapshot_sampling="profile"`), on the same seeds;
* **synchronous**: the fused program at lag 0, on the same seeds: the size of the lag's effect.

A run's score is its AUC (the mean of its evaluation returns). Per method, task and regime the
scores are normalised by the task's random return (0) and the method's synchronous mean (1). The
estimand is mean(real) − mean(simulated); the simulator predicts the real run when the 90%
Welch interval of that difference lies within ±`MARGIN` (two one-sided tests at 5%).

    python -m experiments.async_equivalence OUT --plan
    python -m experiments.async_equivalence OUT                  # every stage, resumable
    python -m experiments.async_equivalence OUT --report         # OUT/report.md, OUT/report.csv
    python -m experiments.async_equivalence OUT --preset tiny    # the pipeline in a minute
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np

from vaco_jax import io
from vaco_jax.config import Config

METHODS = ("ppo_clip", "vaco", "decoupled_ppo", "impala")
REGIMES = {   # the flags of `vaco-train --async` each regime runs with
    "queue16": {"async_queue": 16},
    "straggler": {"async_queue": 8, "async_actor_delay": (0.0, 0.3)},
}
MARGIN = 0.10
SEED = 1000


@dataclasses.dataclass(frozen=True)
class Preset:
    tasks: dict
    methods: tuple = METHODS
    calls: int = 8
    seeds_per_call: int = 5


PRESETS = {
    # cpu v3's inverted_double_pendulum and CartpoleSwingup shapes: T = 128 iterations
    "cpu": Preset({
        "inverted_double_pendulum": dict(num_envs=16, total_steps=65_536),
        "dmc:CartpoleSwingup": dict(num_envs=128, total_steps=524_288)}),
    "tiny": Preset({"toy_reach": dict(num_envs=8, unroll_length=8, num_epochs=2,
                                      num_minibatches=2, episode_length=50, total_steps=4_096,
                                      num_evals=4, eval_envs=4, learning_rate=1e-3)},
                   methods=("ppo_clip", "vaco"), calls=2, seeds_per_call=2),
}
SHAPES = dict(unroll_length=32, num_epochs=4, num_minibatches=8, num_actors=4, num_evals=16,
              eval_envs=16)


def config(preset: Preset, env: str, method: str, **fields) -> Config:
    own = {**SHAPES, **preset.tasks[env]}
    own.setdefault("episode_length", Config.for_env(env).episode_length)
    return Config(env=env, algo=method, **{**own, **fields})


def runs(preset: Preset):
    """Every run directory of the study, in the order it runs them: (stage, method, env, regime,
    call, its config's fields, its async options' fields)."""
    n = preset.calls * preset.seeds_per_call
    for env in preset.tasks:
        for method in preset.methods:
            yield ("sync", method, env, "", 0, dict(seed=SEED, num_seeds=n, capacity=1), None)
            for regime, flags in REGIMES.items():
                for call in range(preset.calls):
                    yield ("real", method, env, regime, call,
                           dict(seed=SEED + call * preset.seeds_per_call,
                                num_seeds=preset.seeds_per_call), {"asynchronous": True, **flags})
                yield ("sim", method, env, regime, 0, dict(seed=SEED, num_seeds=n), None)


def directory(out: Path, stage, method, env, regime, call) -> Path:
    name = env.replace(":", "_")
    return out / stage / name / method / (f"{regime}-{call}" if stage == "real" else regime or "k0")


def pooled_profile(out: Path, method, env, regime, calls: int) -> list[float]:
    """The real calls' ages, pooled: the share of all their segments of each age."""
    counts = []
    for call in range(calls):
        summary = json.loads((directory(out, "real", method, env, regime, call)
                              / "summary.json").read_text())
        c = summary["ages"]["counts"]
        counts = [a + b for a, b in zip(counts + [0] * (len(c) - len(counts)),
                                        c + [0] * (len(counts) - len(c)))]
    total = sum(counts)
    return [c / total for c in counts]


def run_all(out: Path, preset: Preset, log=print) -> None:
    from vaco_jax import driver
    from vaco_jax.actor_learner import run_async
    from vaco_jax.options import AsyncOptions, Options

    for stage, method, env, regime, call, fields, asynchrony in runs(preset):
        where = directory(out, stage, method, env, regime, call)
        if (where / "summary.json").exists():
            continue
        if stage == "sim":
            profile = pooled_profile(out, method, env, regime, preset.calls)
            fields = {**fields, "snapshot_sampling": "profile", "lag_profile": tuple(profile),
                      "capacity": len(profile), "max_capacity": len(profile)}
        log(f"{stage} {method} {env} {regime} {call}")
        cfg = config(preset, env, method, **fields)
        options = Options(out=str(where), overwrite=True, progress=False)
        if asynchrony:
            run_async(cfg, options, AsyncOptions(**asynchrony))
        else:
            driver.run(cfg, options)


def scores(where: Path) -> np.ndarray:
    """Per seed, the run's AUC: the mean of its evaluation returns (metrics.jsonl)."""
    rows = io.read_jsonl(where / "metrics.jsonl")
    returns = np.array([row["eval_return"] for row in rows if "eval_return" in row], np.float64)
    return returns.mean(0)


def welch(a: np.ndarray, b: np.ndarray, confidence: float = 0.90) -> tuple[float, float, float]:
    """mean(a) − mean(b) and its Welch interval at `confidence`."""
    from scipy import stats

    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    dof = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    half = stats.t.ppf(0.5 + confidence / 2, dof) * np.sqrt(va + vb)
    d = a.mean() - b.mean()
    return float(d), float(d - half), float(d + half)


def report(out: Path, preset: Preset) -> list[dict]:
    from vaco_jax.study import references

    rows = []
    for env in preset.tasks:
        random, _ = references.random_policy_return(
            env, episode_length=config(preset, env, preset.methods[0]).episode_length,
            num_episodes=64, seed=0)
        for method in preset.methods:
            sync = scores(directory(out, "sync", method, env, "", 0))
            scale = sync.mean() - random
            for regime in REGIMES:
                real = np.concatenate([scores(directory(out, "real", method, env, regime, c))
                                       for c in range(preset.calls)])
                sim = scores(directory(out, "sim", method, env, regime, 0))
                norm = lambda x: (x - random) / scale  # noqa: E731
                d, low, high = welch(norm(real), norm(sim))
                effect, e_low, e_high = welch(norm(sim), norm(sync), 0.95)
                profile = pooled_profile(out, method, env, regime, preset.calls)
                rows.append({"task": env, "method": method, "regime": regime,
                             "mean_age": float(np.dot(np.arange(len(profile)), profile)),
                             "real": float(norm(real).mean()), "simulated": float(norm(sim).mean()),
                             "difference": d, "low90": low, "high90": high,
                             "equivalent": bool(-MARGIN < low and high < MARGIN),
                             "lag_effect": effect, "lag_effect_low": e_low,
                             "lag_effect_high": e_high, "seeds": int(real.size)})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| task | method | regime | mean age | real | simulated | real − simulated [90%] | "
             f"within ±{MARGIN:g} | lag effect (simulated − k = 0) [95%] |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['task']}` | {r['method']} | {r['regime']} | {r['mean_age']:.2f} | "
                     f"{r['real']:.3f} | {r['simulated']:.3f} | {r['difference']:+.3f} "
                     f"[{r['low90']:+.3f}, {r['high90']:+.3f}] | "
                     f"{'yes' if r['equivalent'] else 'no'} | {r['lag_effect']:+.3f} "
                     f"[{r['lag_effect_low']:+.3f}, {r['lag_effect_high']:+.3f}] |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.async_equivalence",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--plan", action="store_true", help="print the runs and stop")
    parser.add_argument("--report", action="store_true", help="write the report and stop")
    args = parser.parse_args(argv)
    preset, out = PRESETS[args.preset], Path(args.out)
    if args.plan:
        planned = list(runs(preset))
        steps = sum(config(preset, env, m, **f).env_steps * f["num_seeds"]
                    for _, m, env, _, _, f, _ in planned)
        print(f"{len(planned)} runs (calls), {steps:,} env steps over every seed")
        return
    if not args.report:
        run_all(out, preset)
    rows = report(out, preset)
    io.write_bytes_atomic(out / "report.md", markdown(rows).encode())
    io.write_json_atomic(out / "report.json", rows)
    print(markdown(rows))


if __name__ == "__main__":
    main()
