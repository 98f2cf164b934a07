"""The lag sweep (SPEC §6): backward lag k × N minibatch updates per generated batch (forward lag)
× objective × seeds.

`run(experiment)` builds the problems, loads or trains the warm start, then for each N compiles one
program that trains every (k, objective, seed) run side by side (`jax.vmap` over keys and
hyper-parameters: the objective and k, the ring buffer's capacity k + 1, are leaves). Each N's rows
are appended to `results.jsonl` as soon as they finish, so a crashed or interrupted sweep resumes
where it stopped. `summary.json` holds the per-(objective, N) statistics over seeds at k = 0
(`by_objective`) and at every k (`by_lag`); `plot` draws greedy and sampled accuracy and the
fractions against N at k = 0 (`out/forward_lag.png`, and with more than four objectives the others
beside PPO-Clip and VACO in `out/forward_lag_objectives.png`; `replot` draws them again from a
finished sweep), and accuracy against k where several k ran (`out/backward_lag.png`).
Everything a run writes is under `out`; only the warm start is cached elsewhere, per user
(`vaco_jax.cache`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import defaultdict
from pathlib import Path

import jax
import numpy as np

from vaco_jax import algorithms, cache, io, loggers, program as program_lib, runtime
from vaco_jax.config import read_lag_profile
from vaco_jax.errors import invalid, invalid_option
from vaco_jax.options import LoggerOptions, validate_logging
from vaco_jax.llm import benchmark, dataset, problems, sft
from vaco_jax.llm.config import (OBJECTIVES, Experiment, LLMConfig, hparams, program_objectives,
                                 replace, resolve, stack_hparams, validate, validate_lags,
                                 with_lags)
from vaco_jax.llm.grpo import GRPO
from vaco_jax.llm.model import num_params
from vaco_jax.study import specs
from vaco_jax.study.lag import PRE_REGISTRATION


FIGURE = "forward_lag.png"   # written into the results directory
LAG_FIGURE = "backward_lag.png"   # accuracy against k, where several k ran
# More objectives than `MAX_PER_PANEL` in a sweep: the main figure keeps those of `MAIN_OBJECTIVES`
# that ran, and each other objective gets its own panels beside PPO-Clip and VACO in a second
# figure, the main one's name with `_objectives` added.
MAX_PER_PANEL = 4
MAIN_OBJECTIVES = ("ppo_clip", "vaco", "decoupled_ppo")
REFERENCES = ("ppo_clip", "vaco")

# What each evaluation measures (`GRPO.evaluations`), `[num_evals]` per row.
EVALUATIONS = ("eval_accuracy", "eval_sampled_accuracy", "train_greedy_accuracy")

# The update-age diagnostics a summary keeps (`vaco_jax.diagnostics.update_age_metrics`), and the
# prefixes of the histograms' bins: update ages, and the snapshot ages a lag profile's run drew.
AGE_METRICS = ("update_age_mean", "update_age_p90", "update_age_max")
AGE_HISTOGRAMS = ("update_age_hist_", "snapshot_age_hist_")

# The lag diagnostics each (k, objective) line of the log gives, where several k ran.
LAG_LOGGED = ("tv_backward", "tv_forward_mean", "intervened_fraction_mean", "update_age_mean",
              "update_age_max")

# Row entries that are not one value per iteration (`train_one_n`).
NOT_PER_ITERATION = ("eval_iterations", "tv_estimate_by_step")

# XLA options that roughly halve CPU compile time at the cost of run time (tests, tiny runs).
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def load_problems(config: LLMConfig):
    """`(train_set, test_set)` as arrays, from the generator or GSM8K-format files."""
    t = config.task
    if t.source == "gsm8k":
        train = problems.load_gsm8k_jsonl(t.gsm8k_train)[:t.num_train]
        test = problems.load_gsm8k_jsonl(t.gsm8k_test)[:t.num_test]
        overlap = {p.question for p in train} & {p.question for p in test}
        if overlap:
            raise invalid("task.gsm8k_test", t.gsm8k_test,
                          f"{len(overlap)} of its questions are also in task.gsm8k_train")
    else:
        train = problems.generate("train", t.num_train, t.seed, t.difficulty)
        test = problems.generate("test", t.num_test, t.seed, t.difficulty)
    train = problems.without_working(train, t.direct_fraction, t.seed)
    return (dataset.encode(train, t.prompt_len, t.answer_len),
            dataset.encode(test, t.prompt_len, t.answer_len))


def sweep_keys(config: LLMConfig, objectives, program=None, ks=(0,)):
    """Keys and stacked hyper-parameters for every (k, objective, seed) run, k-major then
    objective-major, for a GRPO program that runs `program` (default:
    `program_objectives(objectives)`) with ring-buffer slots for the largest k (`with_lags`); run
    k's `capacity` is k + 1.

    Seed s uses `PRNGKey(grpo.seed + s)` for every k and objective (common random numbers: the
    first batch of every run of a seed is the same draw, made by the warm start whatever k)."""
    g = config.grpo
    runs = [(k, o, s) for k in ks for o in objectives for s in range(g.num_seeds)]
    keys = program_lib.seed_keys([g.seed + s for _, _, s in runs])
    program = program_objectives(objectives) if program is None else program
    hps = stack_hparams([hparams(dataclasses.replace(g, objective=o, capacity=k + 1), program)
                         for k, o, _ in runs])
    return runs, keys, hps


def lag_mode(k: int, lag_sampling: str) -> str:
    """A run's lag mode as its row records it: `lag_sampling`, except "constant" at k = 0 (every
    mode is on-policy there)."""
    return "constant" if k == 0 else lag_sampling


def lag_of(row) -> tuple[str, int]:
    """A row's (lag mode, k); rows of versions before the backward-lag axis are k = 0."""
    k = int(row.get("k", 0))
    return lag_mode(k, row.get("lag_sampling", "constant")), k


def train_one_n(config: LLMConfig, n: int, objectives, params, train_set, test_set, log=print,
                compiler_options=None, program=None, runs_per_call: int = 0, ks=(0,),
                lag_sampling: str = "constant", lag_profile=()):
    """Train every (k, objective, seed) run at N = n, each k of `ks` a backward lag drawn as
    `lag_sampling` says (`vaco_jax.llm.config.with_lags`; "profile": from `lag_profile`, whose
    oldest age is the largest k), in one compiled program (one that can
    run every objective of `program`, default `program_objectives(objectives)`), or, with
    `runs_per_call`, in chunks of at most that many runs that share one compiled program; rows to
    save."""
    cfg = with_lags(replace(config, grpo=dict(num_minibatches=n)), ks, lag_sampling, lag_profile)
    program = program_objectives(objectives) if program is None else tuple(program)
    validate(cfg, program)
    runs, keys, hps = sweep_keys(cfg, objectives, program, ks)
    metrics, compile_s, run_s, where = train_runs(cfg, program, keys, hps, params, train_set,
                                                  test_set, compiler_options, runs_per_call)
    lags = "" if tuple(ks) == (0,) else f", k = {', '.join(map(str, ks))} ({lag_sampling})"
    profile = {"lag_profile": list(cfg.grpo.lag_profile)} if cfg.grpo.lag_profile else {}
    log(f"N={n:>2}{lags}: {len(runs)} runs ({where}) in {run_s:.0f} s (+{compile_s:.0f} s compile)")
    rows = []
    for i, (k, objective, seed) in enumerate(runs):
        m = jax.tree.map(lambda x: np.asarray(x[i]), metrics)
        steps = m.pop("steps")
        evaluations = {name: m.pop(name) for name in EVALUATIONS}             # [num_evals]
        rows.append({
            "k": k, "lag_sampling": lag_mode(k, lag_sampling), **(profile if k else {}),
            "n": n, "objective": objective, "seed": seed,
            "eval_iterations": [(j + 1) * cfg.grpo.eval_every
                                for j in range(len(evaluations["eval_accuracy"]))],
            **evaluations,
            **m,                                                              # [iterations]
            **{f"{name}_mean": v.mean(-1) for name, v in steps.items()},    # [iterations]
            "tv_estimate_max": steps["tv_estimate"].max(-1),
            "max_ratio_max": steps["max_ratio"].max(-1),
            "tv_estimate_by_step": steps["tv_estimate"].mean(0),              # [K·N]
            "compile_seconds": compile_s, "run_seconds": run_s,
        })
        rows[-1]["final_accuracy"] = float(evaluations["eval_accuracy"][-1])
        rows[-1]["final_sampled_accuracy"] = float(evaluations["eval_sampled_accuracy"][-1])
        rows[-1]["final_train_greedy_accuracy"] = float(evaluations["train_greedy_accuracy"][-1])
    return rows


def train_runs(cfg: LLMConfig, program, keys, hps, params, train_set, test_set,
               compiler_options=None, runs_per_call: int = 0):
    """Train one run per row of `keys` and `hps` (stacked hyper-parameters, `stack_hparams`) with
    `cfg`'s shapes, in one compiled program that runs every objective of `program`, in chunks of
    at most `runs_per_call`: (per-run metrics, compile seconds, training seconds, where they ran)."""
    trainer = GRPO(cfg, train_set, test_set, objectives=tuple(program))
    # Every run spreads over every device (vaco_jax.program); the chunks are equal in size (the
    # last padded with copies of its last run, then dropped).
    num_runs = len(keys)
    chunks = _chunks(num_runs, runs_per_call)
    size = chunks[0].stop - chunks[0].start
    placed = program_lib.layout(size)
    train = program_lib.jit_runs(trainer.train, placed, in_run_axes=(True, False, True, False))
    shared_params, data = placed.replicate((params, trainer.data))
    compiled, compile_s, parts = None, 0.0, []
    start = time.perf_counter()
    for chunk in chunks:
        take = lambda x: _pad_to(np.asarray(x)[chunk], size)   # noqa: E731
        chunk_keys, chunk_hps = placed.put((take(keys), jax.tree.map(take, hps)))
        args = (chunk_keys, shared_params, chunk_hps, data)
        if compiled is None:
            compile_start = time.perf_counter()
            compiled = train.lower(*args).compile(compiler_options)
            compile_s = time.perf_counter() - compile_start
        _, metrics = compiled(*args)
        parts.append(jax.tree.map(lambda x: x[:chunk.stop - chunk.start], placed.unpad(metrics)))
    metrics = jax.tree.map(lambda *xs: np.concatenate(xs), *parts)
    run_s = time.perf_counter() - start - compile_s
    calls = f" in {len(chunks)} calls of {size}" if len(chunks) > 1 else ""
    return metrics, compile_s, run_s, f"{placed.describe()}{calls}"


def _chunks(num_runs: int, runs_per_call: int) -> list[slice]:
    """The runs `0..num_runs` in consecutive chunks of at most `runs_per_call` (0: one chunk), as
    equal as can be so that the padding of the last is least."""
    if runs_per_call <= 0 or runs_per_call >= num_runs:
        return [slice(0, num_runs)]
    count = -(-num_runs // runs_per_call)
    size = -(-num_runs // count)
    return [slice(k, min(k + size, num_runs)) for k in range(0, num_runs, size)]


def _pad_to(x: np.ndarray, size: int) -> np.ndarray:
    """`x [k, ...]` → `[size, ...]`, the padding copies of its last entry."""
    return np.concatenate([x, np.repeat(x[-1:], size - len(x), axis=0)]) if len(x) < size else x


def scalars_by_iteration(row: dict) -> dict[int, dict[str, float]]:
    """One run's row as `{iteration: {metric: value}}` (1-based generated batches): every
    per-iteration metric at its iteration, each evaluation at the iteration after which it ran."""
    by_iteration = defaultdict(dict)
    for name, values in row.items():
        if name in NOT_PER_ITERATION or name in EVALUATIONS:
            continue
        values = np.asarray(values)
        if values.ndim == 1 and np.issubdtype(values.dtype, np.number):
            for i, value in enumerate(values):
                by_iteration[i + 1][name] = value
    for i, iteration in enumerate(row["eval_iterations"]):
        by_iteration[iteration].update({name: row[name][i] for name in EVALUATIONS})
    return dict(sorted(by_iteration.items()))


def log_runs(options: LoggerOptions, out: Path, config: LLMConfig, rows) -> None:
    """Each row, one (k, N, objective, seed), as a logged run (`vaco_jax.loggers`) named
    `N=<N>/<objective>/seed=<seed>` (at k > 0 under `k=<k>/`, or `uniform-k=<k>/`,
    `profile-k=<k>/` for a uniform lag or a lag profile) and tagged with those coordinates; what an earlier attempt logged for it is replaced."""
    for row in rows:
        mode, k = lag_of(row)
        coordinates = {"k": k, "lag_sampling": mode, "n": row["n"],
                       "objective": row["objective"], "seed": row["seed"]}
        lag = "" if k == 0 else f"{'' if mode == 'constant' else mode + '-'}k={k}/"
        name = f"{lag}N={row['n']}/{row['objective']}/seed={row['seed']}"
        logger = loggers.make(options, out, {**io.to_jsonable(config), **coordinates}, name=name,
                              coordinates=coordinates, group=Path(out).name, first_step=0)
        try:
            for iteration, scalars in scalars_by_iteration(row).items():
                logger.log(iteration, loggers.finite(scalars))
        finally:
            logger.close()


def summarize(rows, base_accuracy: float):
    """`by_objective`: `summarize_lag` of the rows at k = 0 (rows without k are k = 0); `by_lag`:
    lag mode → k → the same of its rows (k = 0 under "constant")."""
    by_lag = {}
    for mode, k in sorted({lag_of(r) for r in rows}):
        by_lag.setdefault(mode, {})[str(k)] = summarize_lag([r for r in rows
                                                             if lag_of(r) == (mode, k)])
    return {"base_accuracy": base_accuracy, "by_objective": by_lag.get("constant", {}).get("0", {}),
            "by_lag": by_lag}


def summarize_lag(rows) -> dict:
    """Per (objective, N) of rows of one backward lag: final held-out greedy accuracy over seeds
    (mean, std, min, max, per seed); the mean clip fraction, filtered fraction and TV estimate over
    all minibatch steps of all seeds, with the lag diagnostics `intervened_fraction`, `tv_forward`
    and `tv_backward` (rows of earlier versions lack them); and, to tell an optimisation failure
    from a generalisation gap, the training reward (sampled answers to the training batches)
    beside the final greedy accuracy on a fixed sample of training problems
    (`train_greedy_accuracy`, and its excess over held-out, `generalization_gap`) and the final
    held-out accuracy of sampled answers (`sampled_accuracy`), means over seeds with per-seed
    lists; and the backward lag's diagnostics, means over iterations and seeds: the snapshot's age
    (`snapshot_age`), the update age (`update_age_mean`, `_p90`, `_max`) and its histogram
    (`update_age_hist`, bin → share of sample uses), and a lag profile's run's drawn snapshot
    ages (`snapshot_age_hist`, age → share of batches). (Rows of versions before these evaluations
    have none: their entries lack them.)"""
    summary = {}
    for objective in sorted({r["objective"] for r in rows}):
        table = {}
        for n in sorted({r["n"] for r in rows if r["objective"] == objective}):
            runs = [r for r in rows if r["objective"] == objective and r["n"] == n]
            acc = np.array([r["final_accuracy"] for r in runs])
            mean_of = lambda k: float(np.mean([np.mean(r[k]) for r in runs]))  # noqa: E731
            table[str(n)] = {
                "final_accuracy": acc.tolist(), "mean": float(acc.mean()),
                "std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                "min": float(acc.min()), "max": float(acc.max()),
                "curve_mean": np.mean([r["eval_accuracy"] for r in runs], 0).tolist(),
                "curve_iterations": list(runs[0]["eval_iterations"]),
                "train_reward": mean_of("reward"),
                "clip_fraction": mean_of("clip_fraction_mean"),
                "filtered_fraction": mean_of("filtered_fraction_mean"),
                "tv_estimate": mean_of("tv_estimate_mean"),
                "tv_estimate_max": float(np.max([np.max(r["tv_estimate_max"]) for r in runs])),
                "approx_kl": mean_of("approx_kl_mean"),
            }
            for key in ("masked_fraction", "truncated_fraction"):   # rows of later versions
                if all(f"{key}_mean" in r for r in runs):
                    table[str(n)][key] = mean_of(f"{key}_mean")
            for key, name in (("intervened_fraction_mean", "intervened_fraction"),
                              ("tv_forward_mean", "tv_forward"), ("tv_backward", "tv_backward"),
                              ("snapshot_age", "snapshot_age"),
                              *((k, k) for k in AGE_METRICS)):
                if all(key in r for r in runs):   # lag diagnostics (docs/diagnostics.md)
                    table[str(n)][name] = mean_of(key)
            for prefix in AGE_HISTOGRAMS:
                bins = [k for k in runs[0] if k.startswith(prefix)]
                if bins and all(b in r for b in bins for r in runs):
                    table[str(n)][prefix.rstrip("_")] = {b.removeprefix(prefix): mean_of(b)
                                                         for b in bins}
            for key, name in (("final_train_greedy_accuracy", "train_greedy_accuracy"),
                              ("final_sampled_accuracy", "sampled_accuracy")):
                # absent in earlier rows; None (NaN) where no training problem was evaluated
                # (`train_eval_size` = 0)
                if all(r.get(key) is not None for r in runs):
                    values = np.array([r[key] for r in runs])
                    table[str(n)][name] = float(values.mean())
                    table[str(n)][f"{name}_by_seed"] = values.tolist()
            if "train_greedy_accuracy" in table[str(n)]:
                table[str(n)]["generalization_gap"] = (table[str(n)]["train_greedy_accuracy"]
                                                       - float(acc.mean()))
        summary[objective] = table
    return summary


PRIMARY = "primary.csv"
PRIMARY_METRICS = (("final_accuracy", "held-out greedy accuracy"),
                   ("final_sampled_accuracy", "held-out sampled accuracy"))
PRE_REGISTERED_N = (1, 8, 16, 32)
PRE_REGISTERED_SEEDS = 10


def primary_tests(rows, commit: str | None = None):
    """The LLM study's pre-registered family (docs/preregistrations.md): VACO − PPO-Clip in
    final held-out greedy and sampled accuracy at each N of `PRE_REGISTERED_N`, paired by seed; the
    two-sided paired t-test, Holm over the family's 8 comparisons, the exact sign-flip test beside.
    Verdicts when `commit` (the results' git commit) descends from the pre-registration and the
    family is whole (every N, both accuracies, `PRE_REGISTERED_SEEDS` seeds each): Holm over part
    of it, or over fewer seeds, is another test than the one fixed in advance, so those rows say
    how much is in instead; else the same tests labelled exploratory. Other N are reported as
    exploratory rows outside the family. A pandas DataFrame (columns as the lag study's
    primary.csv)."""
    import pandas as pd

    from vaco_jax.study import lag

    pre_registered = bool(commit) and lag.git_descends_from(commit, lag.PRE_REGISTRATION) is True
    rows = [r for r in rows if lag_of(r)[1] == 0]   # the family is on-policy: backward lag k = 0
    tests = []
    for n in sorted({r["n"] for r in rows}):
        by = {o: {r["seed"]: r for r in rows if r["n"] == n and r["objective"] == o}
              for o in ("vaco", "ppo_clip")}
        seeds = sorted(set(by["vaco"]) & set(by["ppo_clip"]))
        if len(seeds) < 2:
            continue
        for key, metric in PRIMARY_METRICS:
            if not all(key in by[o][s] for o in by for s in seeds):
                continue
            d = [by["vaco"][s][key] - by["ppo_clip"][s][key] for s in seeds]
            tests.append({"comparison": "vaco − ppo_clip", "task": "llm", "setting": f"N={n}",
                          "metric": metric, "differences": d, "family": n in PRE_REGISTERED_N})
    table = lag.paired_family(tests, pre_registered)
    if not len(table):
        return pd.DataFrame()
    family = table["family"].astype(bool)
    table.loc[~family, "verdict"] = "exploratory (N not pre-registered)"
    expected = len(PRE_REGISTERED_N) * len(PRIMARY_METRICS)
    whole = family & (table["seeds"] >= PRE_REGISTERED_SEEDS)
    if pre_registered and whole.sum() < expected:
        table.loc[family, "verdict"] = (
            f"no verdict: {int(whole.sum())} of the family's {expected} comparisons are in with "
            f"{PRE_REGISTERED_SEEDS} seeds (Holm needs them all)")
    table["analysis"] = "pre-registered" if pre_registered else "exploratory"
    return table


def write_primary(directory, out=None, rows=None) -> Path | None:
    """`primary_tests` of a results directory (results.jsonl, or `rows` read from it, and
    config.json) into its primary.csv (or `out`'s); None when there is nothing to test (no rows,
    or no N with both VACO and PPO-Clip on 2 seeds)."""
    directory = Path(directory)
    out = directory if out is None else Path(out)
    if rows is None:
        if not io.has_rows(directory / "results.jsonl"):
            return None
        rows = io.read_rows(directory / "results.jsonl")
    config = json.loads((directory / "config.json").read_text())
    table = primary_tests(rows, config.get("git_commit"))
    if not len(table):
        return None
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / PRIMARY, index=False)
    return out / PRIMARY


# Each objective's colour, as the lag study draws the same names (`lag.lag_colors`); other
# objectives take the remaining colours in sorted order. Markers differ too, drawn hollow, so that
# objectives whose results coincide (decoupled PPO and PPO-Clip at backward lag 0) both show.
COLORS = {"vaco": "tab:blue", "ppo_clip": "tab:orange", "spo": "tab:red", "impala": "tab:purple",
          "decoupled_ppo": "tab:brown", "pg": "tab:gray"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")


def styles(objectives) -> dict[str, dict]:
    """objective → `color` and `marker`: the same for an objective in every panel."""
    objectives = sorted(objectives)
    palette = [f"tab:{c}" for c in ("blue", "orange", "green", "red", "purple", "brown", "pink",
                                    "gray", "olive", "cyan")]
    free = [c for c in palette if c not in {COLORS[o] for o in objectives if o in COLORS}]
    colors, others = {}, iter(free)
    for objective in objectives:
        colors[objective] = COLORS.get(objective) or next(others, "k")
    return {o: {"color": colors[o], "marker": MARKERS[i % len(MARKERS)]}
            for i, o in enumerate(objectives)}


def figure_title(grpo: dict, num_params: int) -> str:
    """The figure's title from the sweep's `grpo` configuration (config.json's) and model size."""
    optimizer = "SGD" if grpo["optimizer"] == "sgd" else "Adam"
    return (f"GRPO under forward lag: {num_params / 1e3:.0f}k-parameter transformer, "
            f"{grpo['num_seeds']} seeds, {optimizer} lr {grpo['learning_rate']:g}, "
            f"PPO ε = {grpo['clip_eps']:g}, VACO δ = {grpo['delta']:g}")


def split_objectives(objectives) -> tuple[list[str], list[str]]:
    """The objectives of the main figure and those drawn apart (`MAX_PER_PANEL`)."""
    objectives = sorted(objectives)
    if len(objectives) <= MAX_PER_PANEL:
        return objectives, []
    main = [o for o in objectives if o in MAIN_OBJECTIVES]
    return main, [o for o in objectives if o not in main]


def _only(summary, objectives) -> dict:
    return {**summary, "by_objective": {o: summary["by_objective"][o] for o in objectives}}


def lag_tables(summary, mode: str) -> dict[int, dict]:
    """k → `summarize_lag` table of one lag mode, with k = 0 (on-policy, filed under "constant")
    for every mode; {} for summaries of versions before the backward-lag axis."""
    by_lag = summary.get("by_lag", {})
    tables = {int(k): table for k, table in by_lag.get(mode, {}).items()}
    if "0" in by_lag.get("constant", {}):
        tables[0] = by_lag["constant"]["0"]
    return dict(sorted(tables.items()))


def lag_figure(summary, mode: str = "constant", title=""):
    """Accuracy against the backward lag k, a column per N: final held-out greedy (top) and sampled
    (bottom) accuracy, the mean over seeds with a ± std band, an objective per line (colours and
    markers as in `figure`); None where fewer than two k ran."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables = lag_tables(summary, mode)
    if len(tables) < 2:
        return None
    objectives = sorted({o for table in tables.values() for o in table})
    ns = sorted({int(n) for table in tables.values() for entries in table.values()
                 for n in entries})
    style = styles(objectives)
    fig, axes = plt.subplots(2, len(ns), figsize=(max(3.4 * len(ns) + 0.8, 7.0), 6.4),
                             squeeze=False, sharey="row")
    ks = list(tables)
    rows = (("mean", "final_accuracy", "held-out greedy accuracy"),
            ("sampled_accuracy", "sampled_accuracy_by_seed", "held-out sampled accuracy"))
    for j, n in enumerate(ns):
        for i, (mean_key, seeds_key, label) in enumerate(rows):
            ax = axes[i][j]
            for objective in objectives:
                points = [(k, tables[k][objective][str(n)]) for k in ks
                          if str(n) in tables[k].get(objective, {})
                          and seeds_key in tables[k][objective][str(n)]]
                if not points:
                    continue
                x = np.array([k for k, _ in points], float)
                seeds = [np.asarray(e[seeds_key], float) for _, e in points]
                mean = np.array([e.get(mean_key, np.mean(v)) for (_, e), v in zip(points, seeds)])
                std = np.array([v.std(ddof=1) if len(v) > 1 else 0.0 for v in seeds])
                s = style[objective]
                ax.plot(x, mean, "-", marker=s["marker"], color=s["color"], mfc="none", ms=6,
                        label=objective, gid=objective)
                ax.fill_between(x, mean - std, mean + std, color=s["color"], alpha=0.1)
            ax.set_xscale("symlog", base=2, linthresh=1)
            ax.set_xticks(ks, [str(k) for k in ks])
            ax.grid(alpha=0.3)
            if i == 0:
                ax.set_title(f"N = {n}", fontsize=10)
            else:
                ax.set_xlabel("k: backward lag (learner iterations)"
                              + {"uniform": ", uniform over 0..k",
                                 "profile": ", the lag profile's oldest age"}.get(mode, ""))
            if j == 0:
                ax.set_ylabel(f"{label}\n(mean ± std over seeds)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title.replace("forward lag", "backward lag") or "GRPO under backward lag",
                 fontsize=9)
    fig.tight_layout()
    return fig


def plot(summary, path, title="") -> list[Path]:
    """Save `figure` as `path` (PNG) where k = 0 ran, and where the sweep has more objectives
    than `MAX_PER_PANEL`, `objectives_figure` of the others beside it
    (`<path stem>_objectives.png`); where several k ran, `lag_figure` per lag mode
    (`backward_lag.png` beside `forward_lag.png`, `backward_lag_uniform.png` for a uniform lag;
    beside another name, `<path stem>_backward_lag.png`); returns the paths written."""
    import matplotlib
    matplotlib.use("Agg")
    from vaco_jax.pipeline import figures

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    drawn = []
    if summary["by_objective"]:
        main, others = split_objectives(summary["by_objective"])
        drawn.append((figure(_only(summary, main), title), path))
        if others:
            drawn.append((objectives_figure(summary, others, title),
                          path.with_name(f"{path.stem}_objectives{path.suffix}")))
    stem = Path(LAG_FIGURE).stem if path.name == FIGURE else f"{path.stem}_{Path(LAG_FIGURE).stem}"
    for mode in summary.get("by_lag", {}):
        fig = lag_figure(summary, mode, title)
        if fig is not None:
            suffix = "" if mode == "constant" else f"_{mode}"
            drawn.append((fig, path.with_name(f"{stem}{suffix}{path.suffix}")))
    for fig, where in drawn:
        figures.save(fig, where, dpi=120)
    return [where for _, where in drawn]


def objectives_figure(summary, objectives, title=""):
    """Each of `objectives` in its own column beside the references (PPO-Clip and VACO, where they
    ran): final held-out greedy accuracy (top) and sampled accuracy (bottom) against N (log
    scale), the mean over seeds with a ± std band, each seed a dot; one y scale per row, colours
    and markers as in `figure`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_objective = summary["by_objective"]
    style = styles(by_objective)
    references = [o for o in REFERENCES if o in by_objective]
    fig, axes = plt.subplots(2, len(objectives), figsize=(3.2 * len(objectives) + 0.6, 6.4),
                             squeeze=False, sharey="row")
    rows = (("mean", "final_accuracy", "held-out greedy accuracy"),
            ("sampled_accuracy", "sampled_accuracy_by_seed", "held-out sampled accuracy"))
    all_ns = sorted({int(n) for table in by_objective.values() for n in table})
    for j, objective in enumerate(objectives):
        shown = [*references, objective]
        for i, (mean_key, seeds_key, label) in enumerate(rows):
            ax = axes[i][j]
            for k, name in enumerate(shown):
                series = _accuracy_series(by_objective[name], mean_key, seeds_key)
                if series is None:
                    continue
                ns, mean, std, seeds = series
                xs = ns * 2.0 ** (0.05 * (k - (len(shown) - 1) / 2))
                s = style[name]
                ax.plot(xs, mean, "-", marker=s["marker"], color=s["color"], mfc="none", ms=6,
                        label=name, gid=name, lw=1.6 if name == objective else 1.0)
                ax.fill_between(xs, mean - std, mean + std, color=s["color"], alpha=0.1)
                if name == objective:
                    for x, v in zip(xs, seeds):
                        ax.scatter([x] * len(v), v, color=s["color"], s=8, alpha=0.5)
            ax.set_xscale("log", base=2)
            ax.set_xticks(all_ns, [str(n) for n in all_ns])
            ax.grid(alpha=0.3)
            if i == 0:
                ax.set_title(objective, fontsize=10)
                ax.legend(fontsize=7)
            else:
                ax.set_xlabel("N: minibatch updates per batch")
            if j == 0:
                ax.set_ylabel(f"{label}\n(mean ± std over seeds)")
    fig.suptitle((title or "GRPO under forward lag") + ": each objective beside "
                 + " and ".join(references), fontsize=10)
    fig.tight_layout()
    return fig


def _accuracy_series(table, mean_key, seeds_key):
    """One objective's accuracy against N from its summary table: (ns, mean, std over seeds,
    per-seed values), or None where the results did not record `seeds_key`."""
    ns = np.array(sorted(int(n) for n in table))
    if not all(seeds_key in table[str(n)] for n in ns):
        return None
    seeds = [np.asarray(table[str(n)][seeds_key], float) for n in ns]
    mean = np.array([table[str(n)].get(mean_key, np.mean(v)) for n, v in zip(ns, seeds)])
    std = np.array([v.std(ddof=1) if len(v) > 1 else 0.0 for v in seeds])
    return ns, mean, std, seeds


def figure(summary, title=""):
    """The sweep's figure from its `summarize` summary, four panels. Against N (log scale): final
    held-out greedy accuracy and final held-out sampled accuracy (one answer sampled per problem
    at temperature 1), each the mean over seeds with a ± std band and each seed a dot, on one y
    scale; the fractions (PPO clip fraction, VACO filtered fraction, with VACO's TV estimate on a
    second axis). And the held-out greedy accuracy over training (mean over seeds) at the
    smallest and the largest N, from the warm start (dashed grey). Each objective has its colour
    and hollow marker, its points set a little apart along x so that coinciding results all
    show. Results of versions without sampled accuracy leave its panel empty, saying so."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_objective = summary["by_objective"]
    style = styles(by_objective)
    # Each objective's points a little apart along x, so coinciding results stay visible.
    dodge = {o: i - (len(by_objective) - 1) / 2 for i, o in enumerate(sorted(by_objective))}
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    (ax_acc, ax_sampled), (ax_frac, ax_curve) = axes
    ax_sampled.sharey(ax_acc)
    for objective, table in by_objective.items():
        ns = np.array(sorted(int(n) for n in table))
        s = style[objective]
        xs = ns * 2.0 ** (0.05 * dodge[objective])         # on the log₂ axis: a fixed offset
        for ax, mean_key, seeds_key in ((ax_acc, "mean", "final_accuracy"),
                                        (ax_sampled, "sampled_accuracy",
                                         "sampled_accuracy_by_seed")):
            series = _accuracy_series(table, mean_key, seeds_key)
            if series is None:
                continue
            _, mean, std, seeds = series
            ax.plot(xs, mean, "-", marker=s["marker"], color=s["color"], mfc="none", ms=7,
                    label=objective, gid=objective)
            ax.fill_between(xs, mean - std, mean + std, color=s["color"], alpha=0.12)
            for x, v in zip(xs, seeds):
                ax.scatter([x] * len(v), v, color=s["color"], s=8, alpha=0.5)
        for n, dashes in zip(sorted({ns[0], ns[-1]}), ("-", "--")):
            entry = table[str(n)]
            iterations = entry.get("curve_iterations") or list(range(1, len(entry["curve_mean"]) + 1))
            ax_curve.plot(np.array([0] + iterations) + 0.25 * dodge[objective],
                          [summary["base_accuracy"]] + entry["curve_mean"],
                          dashes, marker=s["marker"], mfc="none", color=s["color"],
                          label=f"{objective}, N = {n}")
        if objective == "ppo_clip":
            ax_frac.plot(ns, [table[str(n)]["clip_fraction"] for n in ns], "-", marker="o",
                         color=s["color"], label="PPO-clip: clip fraction")
        if objective == "vaco":
            ax_frac.plot(ns, [table[str(n)]["filtered_fraction"] for n in ns], "-", marker="s",
                         color=s["color"], label="VACO: filtered fraction")
            ax_tv = ax_frac.twinx()
            ax_tv.plot(ns, [table[str(n)]["tv_estimate"] for n in ns], "^--", color="tab:green",
                       label="VACO: mean TV estimate (right)")
            ax_tv.set_ylabel("TV estimate  ½·mean|w − 1|")
            ax_tv.legend(loc="upper right", fontsize=8)
    ax_curve.axhline(summary["base_accuracy"], color="grey", ls="--", lw=1,
                     label=f"warm start ({summary['base_accuracy']:.3f})")
    all_ns = sorted({int(n) for table in by_objective.values() for n in table})
    for ax in (ax_acc, ax_sampled, ax_frac):
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_ns, [str(n) for n in all_ns])
        ax.set_xlabel("N: minibatch updates per generated batch")
        ax.grid(alpha=0.3)
    ax_acc.set_title("held-out greedy accuracy", fontsize=10)
    ax_acc.set_ylabel("accuracy at the end (mean ± std over seeds)")
    ax_sampled.set_title("held-out sampled accuracy (temperature 1)", fontsize=10)
    ax_sampled.set_ylabel("accuracy at the end (mean ± std over seeds)")
    if not ax_sampled.lines:
        ax_sampled.text(0.5, 0.5, "not recorded by the code that made these results",
                        transform=ax_sampled.transAxes, ha="center", color="0.4")
    for ax in (ax_acc, ax_sampled):
        if ax.lines:
            ax.legend(fontsize=8)
    ax_frac.set_title("clipped and filtered answer tokens", fontsize=10)
    ax_frac.set_ylabel("fraction of answer tokens (mean over steps)")
    ax_frac.legend(loc="upper left", fontsize=8)
    ax_curve.set_title("held-out greedy accuracy over training", fontsize=10)
    ax_curve.set_xlabel("generated batches")
    ax_curve.set_ylabel("accuracy (mean over seeds)")
    ax_curve.grid(alpha=0.3)
    ax_curve.legend(fontsize=8)
    fig.suptitle(title or "GRPO under forward lag")
    fig.tight_layout()
    return fig


def replot(directory, path=None) -> list[Path]:
    """Draw a finished sweep's figures again (`plot`), from `directory`'s summary.json and
    config.json (no training), into `path` (default `directory/forward_lag.png`, and then the
    pre-registered tests into `directory/primary.csv` too, `write_primary`); returns the paths."""
    directory = Path(directory)
    summary = json.loads((directory / "summary.json").read_text())
    grpo = json.loads((directory / "config.json").read_text())["config"]["grpo"]
    in_place = not path
    path = Path(path) if path else directory / FIGURE
    written = plot(summary, path, figure_title(grpo, summary["num_params"]))
    if in_place:
        write_primary(directory)
    return written


def same_config(stored, spec, defaults=None) -> bool:
    """Whether a results directory's stored configuration is `spec` (both `io.to_jsonable`). A
    field the stored one lacks counts as equal when `spec` holds its default: a field added by a
    later version, so a finished sweep can still be extended."""
    if not isinstance(spec, dict):
        return stored == spec
    if not isinstance(stored, dict) or set(stored) - set(spec):
        return False
    defaults = io.to_jsonable(LLMConfig()) if defaults is None else defaults
    defaults = defaults if isinstance(defaults, dict) else {}
    for key, value in spec.items():
        if key in stored:
            if not same_config(stored[key], value, defaults.get(key, {})):
                return False
        elif key not in defaults or defaults[key] != value:
            return False
    return True


def log_cell(log, runs, objective: str, mode: str, k: int, show_lag: bool) -> None:
    """One log line per (k, objective) of an N: final accuracies over seeds and, where the sweep
    has several k, the lag diagnostics (backward and forward TV, the objective's intervened
    fraction, the mean update age), means over iterations and seeds, and the oldest update age."""
    if not runs:
        return
    mean = lambda key: np.mean([np.mean(r[key]) for r in runs])  # noqa: E731
    acc = [r["final_accuracy"] for r in runs]
    spread = f" ± {np.std(acc, ddof=1):.3f}" if len(acc) > 1 else ""
    lag = ""
    if show_lag:
        lag = f"k={k}{'' if mode == 'constant' else ' ' + mode} "
    log(f"       {lag}{objective:>8}: final accuracy {np.mean(acc):.3f}{spread} "
        f"(seeds {', '.join(f'{a:.3f}' for a in acc)}); on train problems "
        f"{mean('final_train_greedy_accuracy'):.3f}, sampled {mean('final_sampled_accuracy'):.3f}")
    if show_lag and all(key in runs[0] for key in LAG_LOGGED):
        log(f"         tv_backward {mean('tv_backward'):.4f}, tv_forward "
            f"{mean('tv_forward_mean'):.4f}, intervened {mean('intervened_fraction_mean'):.3f}, "
            f"update age {mean('update_age_mean'):.1f} (max "
            f"{max(np.max(r['update_age_max']) for r in runs):.0f})")


def run(experiment: Experiment, log=print) -> dict:
    """The whole sweep; returns the summary (also written to `out/summary.json`).

    Resumes: (k, N, objective) cells already in `out/results.jsonl` (from the same configuration;
    compacted or not, `io.read_rows`) are not run again, so objectives, k or N values can also be
    added to a finished sweep."""
    config = experiment.config
    profile = read_lag_profile(experiment.lag_profile) if experiment.lag_profile else ()
    validate_lags(config, experiment.ks, experiment.lag_sampling, profile)
    ks, mode = tuple(sorted(set(experiment.ks))), experiment.lag_sampling
    if profile:   # the profile's runs at its oldest age, beside k = 0 if asked
        ks, mode = tuple(sorted({0} & set(ks) | {len(profile) - 1})), "profile"
    codes, user = {}, {}   # a user objective's code: recorded in config.json and rows, checked
    for o in experiment.objectives:
        objective = resolve(o, field="objectives", tv_reference=config.grpo.tv_reference)
        if o not in OBJECTIVES:
            mine = [item for item in config.grpo.objective_hparams
                    if str(item).partition("=")[0].strip() in objective.defaults]
            user[o] = algorithms.objective_record(objective, mine)
            codes[o] = (user[o].get("code") or {}).get("fingerprint")   # what it computes
    program = program_objectives(experiment.objectives)
    config = validate(config, experiment.objectives)
    for n in experiment.ns:
        validate(with_lags(replace(config, grpo=dict(num_minibatches=n)), ks, mode, profile),
                 experiment.objectives)
    validate_logging(experiment.logging)
    if experiment.runs_per_call < 0:
        raise invalid_option("--runs-per-call", experiment.runs_per_call,
                             "0 (every run of an N in one program) or a positive number of runs")
    cache.default_compile_cache()   # before the warm start compiles (the command chose already)
    out = Path(experiment.out)
    results_path = out / "results.jsonl"
    spec = io.to_jsonable(config)
    primary = runtime.is_primary()   # process 0 writes; every process computes
    if not experiment.overwrite and (out / "config.json").exists():
        if not same_config(json.loads((out / "config.json").read_text()).get("config"), spec):
            raise invalid("out", str(out), "it holds results of another configuration; choose "
                                           "another directory or --overwrite")
    rows = ([] if experiment.overwrite or not io.has_rows(results_path)
            else io.read_rows(results_path))
    for row in rows:
        if row["objective"] in codes and row.get("objective_code") != codes[row["objective"]]:
            raise invalid("objectives", row["objective"],
                          f"{results_path} holds results of {row['objective']!r} made by other "
                          f"code ({row.get('objective_code')}; now {codes[row['objective']]}): "
                          "choose another --out, or --overwrite to start afresh")
    others = {tuple(r.get("lag_profile", ())) for r in rows if r.get("lag_sampling") == "profile"
              and tuple(r.get("lag_profile", ())) != profile}
    if profile and others:   # the rows of one profile are keyed by its oldest age alone
        raise invalid_option("--lag-profile", experiment.lag_profile,
                             f"{results_path} holds runs of another lag profile "
                             f"({', '.join(str(list(p)) for p in sorted(others))}; this one "
                             f"{list(profile)}): choose another --out")
    runtime.barrier("llm results read")
    if primary:
        if experiment.overwrite:
            io.remove_rows(results_path)
        io.finish_compaction(results_path)   # before appending: no row counts twice
        io.write_json_atomic(out / "config.json", {"config": spec, **io.provenance(),
                                                   **({"user_objectives": user} if user else {})})
    wall_start = time.perf_counter()

    train_set, test_set = load_problems(config)
    options = FAST_COMPILE if experiment.fast_compile else None
    params, warm = sft.warm_start(config, train_set, test_set, experiment.cache_dir or None, log=log,
                                  compiler_options=options, shipped=not experiment.train_warm_start)
    warm_start = warm["digest"]
    log(f"model: {num_params(params):,} parameters; {len(train_set)} train / {len(test_set)} test "
        f"problems; warm-start held-out accuracy {warm['base_accuracy']:.3f} (parameters "
        f"{warm_start}, {warm['origin']})")
    others = sorted({r["warm_start"] for r in rows
                     if r.get("warm_start", warm_start) != warm_start})
    if others:   # a resume on another machine may have trained its own warm start
        shipped = ("--train-warm-start and " if warm["origin"] == "shipped" else "")
        raise invalid("cache_dir", experiment.cache_dir or "(the user cache)",
                      f"{results_path} holds results made from another warm start (parameters "
                      f"{', '.join(others)}; this one {warm_start} ({warm['origin']}), held-out "
                      f"accuracy {warm['base_accuracy']:.3f}): pass {shipped}--cache-dir with the "
                      "warm start they were made from, or choose another --out")

    lags = {(lag_mode(k, mode), k) for k in ks}

    def done(k, n, o):
        return any(r["n"] == n and r["objective"] == o and lag_of(r) == (lag_mode(k, mode), k)
                   for r in rows)

    for n in experiment.ns:
        # The objectives that miss the same k values train together (a fresh sweep: all at once).
        groups = {}
        for o in experiment.objectives:
            todo_ks = tuple(k for k in ks if not done(k, n, o))
            if todo_ks:
                groups.setdefault(todo_ks, []).append(o)
        if not groups:
            log(f"N={n:>2}: already in {results_path}, skipped")
        for todo_ks, todo in groups.items():
            lag_args = {} if todo_ks == (0,) else {"ks": todo_ks, "lag_sampling": mode,
                                                   **({"lag_profile": profile} if profile else {})}
            new_rows = train_one_n(config, n, todo, params, train_set, test_set, log, options,
                                   program=program, runs_per_call=experiment.runs_per_call,
                                   **lag_args)
            for row in new_rows:   # the code that made it: a resumed sweep may mix versions
                row["source"] = io.source_hash()
                row["warm_start"] = warm_start
                if row["objective"] in codes:
                    row["objective_code"] = codes[row["objective"]]
            if primary:
                io.append_jsonl(results_path, new_rows)
                if experiment.logging.logger:
                    log_runs(experiment.logging, out, config, new_rows)
            rows += io.to_jsonable(new_rows)
            for lag in sorted({lag_of(r) for r in new_rows}):
                for o in todo:
                    log_cell(log, [r for r in new_rows if r["objective"] == o
                                   and lag_of(r) == lag], o, *lag, show_lag=len(ks) > 1)

    wanted = [r for r in rows if r["n"] in experiment.ns and r["objective"] in experiment.objectives
              and lag_of(r) in lags]
    summary = summarize(wanted, warm["base_accuracy"])
    summary["sources"] = sorted({r.get("source", "unrecorded") for r in wanted})
    if len(summary["sources"]) > 1:
        log(f"note: these results were made by {len(summary['sources'])} versions of the code "
            f"(source hashes {', '.join(summary['sources'])}; each row records its own)")
    summary.update(warm_start={k: warm[k] for k in ("base_accuracy", "final_loss", "seconds",
                                                    "cached", "key", "digest", "sha256", "origin",
                                                    "path")},
                   num_params=num_params(params))
    if experiment.throughput:
        summary["throughput"] = benchmark.measure(config, params, test_set, log=log)
    elif (out / "summary.json").exists():   # keep an earlier measurement
        previous = json.loads((out / "summary.json").read_text())
        if "throughput" in previous:
            summary["throughput"] = previous["throughput"]
    if profile:
        summary["lag_profile"] = {"file": experiment.lag_profile, "probabilities": list(profile)}
    summary["wall_seconds"] = time.perf_counter() - wall_start   # this call (not resumed parts)
    if not primary:
        return summary
    io.write_json_atomic(out / "summary.json", summary)
    primary_path = write_primary(out)
    if primary_path is not None:
        log(f"pre-registered tests: {primary_path}")
    if experiment.plot:
        for figure in plot(summary, out / FIGURE, figure_title(spec["grpo"], num_params(params))):
            log(f"plot: {figure}")
    log(f"done in {summary['wall_seconds']:.0f} s")
    return summary


# --- the committed study, as a spec (`vaco-report --study llm-forward-lag`) --------------------
OBJECTIVE_TABLE = "objectives.csv"


def objective_table(rows) -> "pd.DataFrame":
    """Per objective, N and final held-out accuracy (greedy, sampled) at backward lag k = 0: the
    mean over seeds with its 95% t interval, and the difference from PPO-Clip paired by seed with
    its 95% t interval (exploratory: the only tests fixed in advance are `primary_tests`')."""
    import pandas as pd

    from vaco_jax.study import stats

    rows = [r for r in rows if lag_of(r)[1] == 0]
    by = {}
    for r in rows:
        by.setdefault((r["objective"], r["n"]), {})[r["seed"]] = r
    out = []
    for (objective, n), runs in sorted(by.items(), key=lambda item: (item[0][1], item[0][0])):
        reference = by.get(("ppo_clip", n), {})
        for key, metric in PRIMARY_METRICS:
            values = [runs[s][key] for s in sorted(runs)]
            mean, low, high = stats.paired_t_interval(values)
            seeds = sorted(set(runs) & set(reference))
            d = [runs[s][key] - reference[s][key] for s in seeds]
            diff = (stats.paired_t_interval(d) if len(d) > 1 and objective != "ppo_clip"
                    else (float("nan"),) * 3)
            out.append({"objective": objective, "N": n, "metric": metric, "mean": mean,
                        "low": low, "high": high, "minus_ppo_clip": diff[0],
                        "minus_ppo_clip_low": diff[1], "minus_ppo_clip_high": diff[2],
                        "seeds": len(values)})
    return pd.DataFrame(out)


def _primary_make(spec: specs.Spec, out: Path) -> list[Path]:
    directory = Path(spec.directories[0])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = io.read_rows(directory / "results.jsonl")
    objective_table(rows).to_csv(out / OBJECTIVE_TABLE, index=False)
    return [write_primary(directory, out, rows), out / OBJECTIVE_TABLE]


SPEC = specs.Spec(
    "llm-forward-lag", "Does VACO match PPO-Clip's GRPO accuracy under forward lag?",
    ("results/llm/forward-lag-10seeds",), "the same N with PPO-Clip, paired by seed",
    "VACO − PPO-Clip, greedy and sampled accuracy, N ∈ {1, 8, 16, 32} (Holm over 8)",
    "results/llm/forward-lag-10seeds", (PRIMARY, OBJECTIVE_TABLE), "8e2bba5", _primary_make,
    (specs.Estimate("VACO − PPO-Clip at N = 32, greedy accuracy", PRIMARY,
                    (("setting", "N=32"), ("metric", "held-out greedy accuracy"))),
     specs.Estimate("sampled", PRIMARY,
                    (("setting", "N=32"), ("metric", "held-out sampled accuracy")))),
    specs.family_verdicts, specs.seeds_of(PRIMARY),
    registration=PRE_REGISTRATION)   # docs/preregistrations.md, section 7
