"""The forward-lag sweep (SPEC §6): N minibatch updates per generated batch × objective × seeds.

`run(experiment)` builds the problems, loads or trains the warm start, then for each N compiles one
program that trains every (objective, seed) pair side by side (`jax.vmap` over keys and
hyper-parameters: the objective is a leaf). Each N's rows are appended to `results.jsonl` as soon as
they finish, so a crashed or interrupted sweep resumes where it stopped. `summary.json` holds the
per-(objective, N) statistics over seeds; `plot` draws accuracy and the fractions against N
(`out/forward_lag.png`). Everything a run writes is under `out`; only the warm start is cached
elsewhere, per user (`vaco_jax.cache`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import defaultdict
from pathlib import Path

import jax
import numpy as np

from vaco_jax import cache, io, loggers, program as program_lib, runtime
from vaco_jax.errors import invalid
from vaco_jax.options import LoggerOptions, validate_logging
from vaco_jax.llm import benchmark, dataset, problems, sft
from vaco_jax.llm.config import (OBJECTIVES, Experiment, LLMConfig, hparams, replace,
                                  stack_hparams, validate)
from vaco_jax.llm.grpo import GRPO
from vaco_jax.llm.model import num_params


FIGURE = "forward_lag.png"   # written into the results directory

# What each evaluation measures (`GRPO.evaluations`), `[num_evals]` per row.
EVALUATIONS = ("eval_accuracy", "eval_sampled_accuracy", "train_greedy_accuracy")

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


def sweep_keys(config: LLMConfig, objectives):
    """Keys and stacked hyper-parameters for every (objective, seed) pair, objective-major.

    Seed s uses `PRNGKey(grpo.seed + s)` for every objective (common random numbers: the first
    batch of every objective is the same draw)."""
    g = config.grpo
    pairs = [(o, s) for o in objectives for s in range(g.num_seeds)]
    keys = program_lib.seed_keys([g.seed + s for _, s in pairs])
    hps = stack_hparams([hparams(dataclasses.replace(g, objective=o)) for o, _ in pairs])
    return pairs, keys, hps


def train_one_n(config: LLMConfig, n: int, objectives, params, train_set, test_set, log=print,
                compiler_options=None):
    """Train every (objective, seed) pair at N = n in one compiled program; rows to save."""
    cfg = replace(config, grpo=dict(num_minibatches=n))
    validate(cfg)
    pairs, keys, hps = sweep_keys(cfg, objectives)
    trainer = GRPO(cfg, train_set, test_set)
    # Every (objective, seed) pair is a run: spread over every device (vaco_jax.program).
    placed = program_lib.layout(len(pairs))
    train = program_lib.jit_runs(trainer.train, placed, in_run_axes=(True, False, True, False))
    keys, hps = placed.put((keys, hps))
    shared_params, data = placed.replicate((params, trainer.data))
    args = (keys, shared_params, hps, data)
    start = time.perf_counter()
    compiled = train.lower(*args).compile(compiler_options)
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    _, metrics = compiled(*args)
    metrics = placed.unpad(metrics)
    run_s = time.perf_counter() - start
    log(f"N={n:>2}: {len(pairs)} runs ({placed.describe()}) in {run_s:.0f} s "
        f"(+{compile_s:.0f} s compile)")
    rows = []
    for i, (objective, seed) in enumerate(pairs):
        m = jax.tree.map(lambda x: np.asarray(x[i]), metrics)
        steps = m.pop("steps")
        evaluations = {k: m.pop(k) for k in EVALUATIONS}                      # [num_evals]
        rows.append({
            "n": n, "objective": objective, "seed": seed,
            "eval_iterations": [(j + 1) * cfg.grpo.eval_every
                                for j in range(len(evaluations["eval_accuracy"]))],
            **evaluations,
            **{k: v for k, v in m.items()},                                   # [iterations]
            **{f"{k}_mean": v.mean(-1) for k, v in steps.items()},          # [iterations]
            "tv_estimate_max": steps["tv_estimate"].max(-1),
            "max_ratio_max": steps["max_ratio"].max(-1),
            "tv_estimate_by_step": steps["tv_estimate"].mean(0),              # [K·N]
            "compile_seconds": compile_s, "run_seconds": run_s,
        })
        rows[-1]["final_accuracy"] = float(evaluations["eval_accuracy"][-1])
        rows[-1]["final_sampled_accuracy"] = float(evaluations["eval_sampled_accuracy"][-1])
        rows[-1]["final_train_greedy_accuracy"] = float(evaluations["train_greedy_accuracy"][-1])
    return rows


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
    """Each row, one (N, objective, seed), as a logged run (`vaco_jax.loggers`) named
    `N=<N>/<objective>/seed=<seed>` and tagged with those coordinates; what an earlier attempt
    logged for it is replaced."""
    for row in rows:
        coordinates = {"n": row["n"], "objective": row["objective"], "seed": row["seed"]}
        name = f"N={row['n']}/{row['objective']}/seed={row['seed']}"
        logger = loggers.make(options, out, {**io.to_jsonable(config), **coordinates}, name=name,
                              coordinates=coordinates, group=Path(out).name, first_step=0)
        try:
            for iteration, scalars in scalars_by_iteration(row).items():
                logger.log(iteration, loggers.finite(scalars))
        finally:
            logger.close()


def summarize(rows, base_accuracy: float):
    """Per (objective, N): final held-out greedy accuracy over seeds (mean, std, min, max, per
    seed); the mean clip fraction, filtered fraction and TV estimate over all minibatch steps of all
    seeds, with the lag diagnostics `intervened_fraction`, `tv_forward` and `tv_backward` (rows of
    earlier versions lack them); and, to tell an optimisation failure from a generalisation gap, the training reward
    (sampled answers to the training batches) beside the final greedy accuracy on a fixed sample of
    training problems (`train_greedy_accuracy`, and its excess over held-out, `generalization_gap`)
    and the final held-out accuracy of sampled answers (`sampled_accuracy`), means over seeds with
    per-seed lists. (Rows of versions before these evaluations have none: their entries lack them.)"""
    summary = {"base_accuracy": base_accuracy, "by_objective": {}}
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
                              ("tv_forward_mean", "tv_forward"), ("tv_backward", "tv_backward")):
                if all(key in r for r in runs):   # lag diagnostics (docs/diagnostics.md)
                    table[str(n)][name] = mean_of(key)
            for key, name in (("final_train_greedy_accuracy", "train_greedy_accuracy"),
                              ("final_sampled_accuracy", "sampled_accuracy")):
                if all(key in r for r in runs):
                    values = np.array([r[key] for r in runs])
                    table[str(n)][name] = float(values.mean())
                    table[str(n)][f"{name}_by_seed"] = values.tolist()
            if "train_greedy_accuracy" in table[str(n)]:
                table[str(n)]["generalization_gap"] = (table[str(n)]["train_greedy_accuracy"]
                                                       - float(acc.mean()))
        summary["by_objective"][objective] = table
    return summary


def plot(summary, path, title=""):
    """Three panels: against N (log scale), final held-out accuracy (mean ± std over seeds, each
    seed a dot, the warm start dashed) and the fractions (PPO clip fraction, VACO filtered
    fraction, with VACO's TV estimate on a second axis); and the held-out accuracy over training
    (mean over seeds) at the smallest and the largest N."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"ppo_clip": "tab:red", "vaco": "tab:blue", "pg": "tab:gray",
              "decoupled_ppo": "tab:purple"}
    fig, (ax_acc, ax_frac, ax_curve) = plt.subplots(1, 3, figsize=(16, 4))
    for objective, table in summary["by_objective"].items():
        ns = np.array(sorted(int(n) for n in table))
        mean = np.array([table[str(n)]["mean"] for n in ns])
        std = np.array([table[str(n)]["std"] for n in ns])
        c = colors.get(objective)
        for n, style in zip(sorted({ns[0], ns[-1]}), ("-", "--")):
            entry = table[str(n)]
            iterations = entry.get("curve_iterations") or list(range(1, len(entry["curve_mean"]) + 1))
            ax_curve.plot([0] + iterations, [summary["base_accuracy"]] + entry["curve_mean"], style,
                          color=c, label=f"{objective}, N = {n}")
        ax_acc.plot(ns, mean, "o-", color=c, label=objective)
        ax_acc.fill_between(ns, mean - std, mean + std, color=c, alpha=0.15)
        for n in ns:
            seeds = table[str(n)]["final_accuracy"]
            ax_acc.scatter([n] * len(seeds), seeds, color=c, s=8, alpha=0.5)
        if objective == "ppo_clip":
            ax_frac.plot(ns, [table[str(n)]["clip_fraction"] for n in ns], "o-", color=c,
                         label="PPO-clip: clip fraction")
        if objective == "vaco":
            ax_frac.plot(ns, [table[str(n)]["filtered_fraction"] for n in ns], "s-", color=c,
                         label="VACO: filtered fraction")
            ax_tv = ax_frac.twinx()
            ax_tv.plot(ns, [table[str(n)]["tv_estimate"] for n in ns], "^--", color="tab:green",
                       label="VACO: mean TV estimate (right)")
            ax_tv.set_ylabel("TV estimate  ½·mean|w − 1|")
            ax_tv.legend(loc="upper right", fontsize=8)
    ax_acc.axhline(summary["base_accuracy"], color="k", ls="--", lw=1, label="warm start")
    all_ns = sorted({int(n) for table in summary["by_objective"].values() for n in table})
    for ax in (ax_acc, ax_frac):
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_ns, [str(n) for n in all_ns])
        ax.set_xlabel("N: minibatch updates per generated batch")
    ax_acc.set_ylabel("held-out greedy accuracy (final)")
    ax_acc.legend(fontsize=8)
    ax_frac.set_ylabel("fraction of answer tokens (mean over steps)")
    ax_frac.legend(loc="upper left", fontsize=8)
    ax_curve.set_xlabel("generated batches")
    ax_curve.set_ylabel("held-out greedy accuracy (mean over seeds)")
    ax_curve.legend(fontsize=8)
    fig.suptitle(title or "GRPO under forward lag")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


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


def run(experiment: Experiment, log=print) -> dict:
    """The whole sweep; returns the summary (also written to `out/summary.json`).

    Resumes: (N, objective) pairs already in `out/results.jsonl` (from the same configuration)
    are not run again, so objectives or N values can also be added to a finished sweep."""
    config = validate(experiment.config)
    cache.default_compile_cache()   # before the warm start compiles (the command chose already)
    for n in experiment.ns:
        validate(replace(config, grpo=dict(num_minibatches=n)))
    for o in experiment.objectives:
        if o not in OBJECTIVES:
            raise invalid("objectives", o, f"one of {OBJECTIVES}")
    validate_logging(experiment.logging)
    out = Path(experiment.out)
    results_path = out / "results.jsonl"
    spec = io.to_jsonable(config)
    primary = runtime.is_primary()   # process 0 writes; every process computes
    if not experiment.overwrite and (out / "config.json").exists():
        if not same_config(json.loads((out / "config.json").read_text()).get("config"), spec):
            raise invalid("out", str(out), "it holds results of another configuration; choose "
                                           "another directory or --overwrite")
    rows = [] if experiment.overwrite or not results_path.exists() else io.read_jsonl(results_path)
    runtime.barrier("llm results read")
    if primary:
        if experiment.overwrite:
            results_path.unlink(missing_ok=True)
        io.write_json_atomic(out / "config.json", {"config": spec, **io.provenance()})
    wall_start = time.perf_counter()

    train_set, test_set = load_problems(config)
    options = FAST_COMPILE if experiment.fast_compile else None
    params, warm = sft.warm_start(config, train_set, test_set, experiment.cache_dir or None, log=log,
                                  compiler_options=options)
    log(f"model: {num_params(params):,} parameters; {len(train_set)} train / {len(test_set)} test "
        f"problems; warm-start held-out accuracy {warm['base_accuracy']:.3f}")

    for n in experiment.ns:
        todo = [o for o in experiment.objectives
                if not any(r["n"] == n and r["objective"] == o for r in rows)]
        if not todo:
            log(f"N={n:>2}: already in {results_path}, skipped")
            continue
        new_rows = train_one_n(config, n, todo, params, train_set, test_set, log, options)
        for row in new_rows:   # the code that made it: a resumed sweep may mix versions
            row["source"] = io.source_hash()
        if primary:
            io.append_jsonl(results_path, new_rows)
            if experiment.logging.logger:
                log_runs(experiment.logging, out, config, new_rows)
        rows += io.to_jsonable(new_rows)
        for o in todo:
            runs = [r for r in new_rows if r["objective"] == o]
            acc = [r["final_accuracy"] for r in runs]
            spread = f" ± {np.std(acc, ddof=1):.3f}" if len(acc) > 1 else ""
            log(f"       {o:>8}: final accuracy {np.mean(acc):.3f}{spread} "
                f"(seeds {', '.join(f'{a:.3f}' for a in acc)}); on train problems "
                f"{np.mean([r['final_train_greedy_accuracy'] for r in runs]):.3f}, sampled "
                f"{np.mean([r['final_sampled_accuracy'] for r in runs]):.3f}")

    wanted = [r for r in rows if r["n"] in experiment.ns and r["objective"] in experiment.objectives]
    summary = summarize(wanted, warm["base_accuracy"])
    summary["sources"] = sorted({r.get("source", "unrecorded") for r in wanted})
    if len(summary["sources"]) > 1:
        log(f"note: these results were made by {len(summary['sources'])} versions of the code "
            f"(source hashes {', '.join(summary['sources'])}; each row records its own)")
    summary.update(warm_start={k: warm[k] for k in ("base_accuracy", "final_loss", "seconds",
                                                    "cached", "key")},
                   num_params=num_params(params))
    if experiment.throughput:
        summary["throughput"] = benchmark.measure(config, params, test_set, log=log)
    elif (out / "summary.json").exists():   # keep an earlier measurement
        previous = json.loads((out / "summary.json").read_text())
        if "throughput" in previous:
            summary["throughput"] = previous["throughput"]
    summary["wall_seconds"] = time.perf_counter() - wall_start   # this call (not resumed parts)
    if not primary:
        return summary
    io.write_json_atomic(out / "summary.json", summary)
    if experiment.plot:
        g = config.grpo
        figure = out / FIGURE
        optimizer = "SGD" if g.optimizer == "sgd" else "Adam"
        plot(summary, figure,
             f"GRPO under forward lag: {num_params(params) / 1e3:.0f}k-parameter transformer, "
             f"{g.num_seeds} seeds, {optimizer} lr {g.learning_rate:g}, PPO ε = {g.clip_eps:g}, "
             f"VACO δ = {g.delta:g}")
        log(f"plot: {figure}")
    log(f"done in {summary['wall_seconds']:.0f} s")
    return summary
