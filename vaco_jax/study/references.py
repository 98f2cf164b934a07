"""Reference returns for score normalisation (SPEC §7).

Per env, at a preset's budget: the return of a uniformly random policy and of synchronous
(`C = 1`) PPO-Clip. The normalised score of a run is `(R − R_random) / (R_ppo_sync − R_random)`
(`vaco_jax.study.stats.normalize`): 0 = random, 1 = what synchronous PPO-Clip reaches with the same
budget, network and shapes.

The table is a versioned JSON file (default `results/archive/reference_returns.json`), one entry per
(env, budget in env steps per run) with its provenance: budget, seeds, the full config, library versions, git commit.
An entry's PPO-Clip return is the mean over seeds of each seed's mean of its last `last_evals`
evaluations (1 in entries made before the field existed); an analysis that scores runs by another
number of final evaluations is refused, since the two would not measure the same thing.
PPO-Clip's reference seeds start at `REFERENCE_SEED` so they are disjoint from the sweep's seeds
(the sweep's own C = 1 PPO-Clip runs are *not* normalised by themselves).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import jax
import numpy as np
import pandas as pd

from vaco_jax import evaluation, io, spaces
from vaco_jax.envs import make_env
from vaco_jax.study import presets, stats, sweep

SCHEMA_VERSION = 1
REFERENCE_SEED = 10_000
FILE_NAME = "reference_returns.json"   # kept next to the sweep it normalises
DEFAULT_PATH = Path("results") / "archive" / FILE_NAME   # the table of the archived capacity sweeps


def random_policy_return(env_name: str, *, episode_length: int, num_episodes: int = 64,
                         seed: int = 0) -> tuple[float, float]:
    """Mean and standard error of the undiscounted return of uniform random actions: in
    [-1, 1]^d for continuous actions, each of the n equally likely for discrete ones.

    The trainer's evaluation protocol (`evaluation.episode_returns`): fresh random initial states,
    episodes run until they terminate or reach the time limit, finished episodes frozen.
    """
    env = make_env(env_name)
    space = spaces.action_space(env)

    @jax.jit
    def episodes(key):
        reset_key, action_key = jax.random.split(key)

        def act(state, t):
            return space.sample(jax.random.fold_in(action_key, t), (num_episodes,))

        return evaluation.episode_returns(env, act, reset_key, num_episodes=num_episodes,
                                          episode_length=episode_length)

    returns = np.asarray(episodes(jax.random.PRNGKey(seed)), np.float64)
    return float(returns.mean()), float(returns.std(ddof=1) / np.sqrt(num_episodes))


def measure(preset: presets.Preset, env: str, *, num_seeds: int = 5, random_episodes: int = 64,
            last_evals: int = 1, log=print) -> dict:
    """One table entry: random-policy and synchronous PPO-Clip returns on `env` at `preset`'s budget.

    PPO-Clip runs with capacity 1 and the preset's shapes and budget, `num_seeds` seeds from
    `REFERENCE_SEED`, in one vmapped program; its reference return is the mean over seeds of each
    seed's mean of its last `last_evals` evaluations (the rule the analysis scores runs by).
    """
    config = dataclasses.replace(preset.env_base(env), algo="ppo_clip", capacity=1, max_capacity=1)
    runs = tuple(sweep.Run(1, config.delta, REFERENCE_SEED + s) for s in range(num_seeds))
    cell = sweep.Cell("reference", env, "ppo_clip", "default", config, runs)
    if not 1 <= last_evals <= config.num_evals:
        raise ValueError(f"last_evals = {last_evals} is invalid: must be between 1 and the "
                         f"preset's num_evals ({config.num_evals})")
    rows, record = sweep.run_cell(cell)
    final = [float(np.mean([r["eval_return"] for r in rows if r["seed"] == run.seed
                            and r["eval_index"] >= config.num_evals - last_evals]))
             for run in runs]
    random_mean, random_sem = random_policy_return(
        env, episode_length=config.episode_length, num_episodes=random_episodes)
    log(f"{env}: random {random_mean:.1f} ± {random_sem:.1f}, ppo_clip C=1 "
        f"{np.mean(final):.1f} (seeds {np.round(final, 1).tolist()}), {record['wall_seconds']:.0f} s")
    return {
        "preset": preset.name, "env": env, "budget": config.env_steps,
        "random_return": random_mean, "random_return_sem": random_sem,
        "random_episodes": random_episodes,
        "ppo_sync_return": float(np.mean(final)), "ppo_sync_final_returns": final,
        "ppo_sync_seeds": [r.seed for r in runs], "last_evals": last_evals,
        "config": sweep._config_dict(config), "seconds": record["wall_seconds"],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"), **io.provenance(),
    }


def load(path: str | Path = DEFAULT_PATH) -> dict:
    path = Path(path)
    if not path.exists():
        return {"schema_version": SCHEMA_VERSION, "entries": []}
    table = json.loads(path.read_text())
    if table.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {table.get('schema_version')} is not "
                         f"{SCHEMA_VERSION}; re-measure with vaco-references")
    return table


def update(path: str | Path, entry: dict) -> None:
    """Add the entry, replacing any earlier one for the same (env, budget); atomic write."""
    table = load(path)
    entries = [e for e in table["entries"]
               if (e["env"], e["budget"]) != (entry["env"], entry["budget"])]
    entries.append(entry)
    entries.sort(key=lambda e: (e["preset"], e["env"]))
    io.write_json_atomic(path, {"schema_version": SCHEMA_VERSION, "entries": entries})


def lookup(table: dict, env: str, budget: int, last_evals: int = 1) -> dict:
    """The entry for `env` measured at exactly `budget` env steps per run, whose PPO-Clip return
    averages the last `last_evals` evaluations of each seed (entries without the field: 1)."""
    matches = [e for e in table["entries"] if e["env"] == env and e["budget"] == budget]
    if len(matches) > 1:
        raise KeyError(f"{len(matches)} reference entries for env {env!r} at budget {budget:,}")
    if not matches:
        have = [(e["preset"], e["env"], e["budget"]) for e in table["entries"]]
        raise KeyError(f"no reference returns for env {env!r} at budget {budget:,} steps "
                       f"(table has {have}); run `vaco-references --preset "
                       f"<the sweep's preset>`")
    entry = matches[-1]
    if entry.get("last_evals", 1) != last_evals:
        raise ValueError(
            f"the reference entry for env {env!r} at budget {budget:,} averages the last "
            f"{entry.get('last_evals', 1)} evaluation(s) of synchronous PPO-Clip, but the analysis "
            f"scores runs by the mean of their last {last_evals}: re-measure it with `vaco-references "
            f"--preset {entry.get('preset', '<preset>')} "
            f"--last-evals {last_evals}`")
    return entry


def add_scores(results: pd.DataFrame, table: dict, column: str = "eval_return",
               last_evals: int = 1) -> pd.DataFrame:
    """A copy of a sweep table with `score`, the normalised `column`, per row's (env, budget), by
    references measured with the analysis's `last_evals` (`lookup`)."""
    results = results.copy()
    score = np.full(len(results), np.nan)
    for (env, budget), index in results.groupby(["env", "budget"]).groups.items():
        entry = lookup(table, env, int(budget), last_evals)
        score[results.index.get_indexer(index)] = stats.normalize(
            results.loc[index, column].to_numpy(), entry["random_return"], entry["ppo_sync_return"])
    results["score"] = score
    return results
