"""Design-seed measurements for the LLM protocol `llm-cpu` v2 (design stage; exploratory).

Everything here runs on design seeds (900-902 here, of the protocol's 900-904), which no score uses. It measures two things:

1. Cost (`--timing`): the seconds of one GRPO iteration, vmapped over 10 runs as the board runs
   them (a ring buffer of 9 snapshots, as a program with k up to 8 holds), for a few batch shapes,
   and of one evaluation (held-out greedy and sampled answers to the 1,024 test problems), wall and
   process CPU time, with the machine's load. The model, the task and the shipped `cpu` warm start
   are the v1 preset's: only GRPO fields change, so no warm start has to be trained or shipped.
2. Learning (`--n N --ks K ...`): synchronous PPO-Clip (k = 0), and PPO-Clip at a constant lag, on
   the candidate shape (`SHAPE`) for the whole candidate run length, at N = 1 or N = 8, through the
   `vaco-llm` experiment (`vaco_jax.llm.experiment.run`: resumable by (k, N, objective)). Each N has
   its own directory, OUT/n<N>; each call's wall and CPU seconds go to OUT/calls.jsonl.

    nice -n 15 python -m experiments.design_llm_v2 OUT --timing 16x8 8x8 8x4   # cost per shape
    nice -n 15 python -m experiments.design_llm_v2 OUT --n 1 --ks 0            # k = 0, N = 1
    nice -n 15 python -m experiments.design_llm_v2 OUT --n 8 --ks 0 8          # adds k = 8 (resumes)
    python -m experiments.design_llm_v2 OUT --profile                          # the lag profile
    python -m experiments.design_llm_v2 OUT --summary                          # OUT/summary.md

The curves read held-out sampled accuracy (temperature 1, one answer per problem: the v2 primary)
and held-out greedy accuracy at every evaluation, mean over the design seeds, and k − k = 0 at the
end (paired by seed, 95% t interval).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

SEED, SEEDS = 900, 3                 # design seeds 900-902 (never a score): 3 of the 5, for time
SHAPE = dict(num_prompts=8, group_size=4, iterations=200, eval_every=50, train_eval_size=0)
"""The candidate v2 shape: 8 prompts x G = 4 answers (32 answers per batch; N = 8 takes 4 per
minibatch), T = 200 learner iterations, an evaluation every 50 (4 in all: an evaluation of the
1,024 held-out problems costs about as much as 6-10 iterations of the v1 batch), no training-set
evaluation (the held-out sampled accuracy is the primary)."""
RUNS_PER_CALL = 10


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def config(shape: dict | None = None, learning_rate: float | None = None):
    from vaco_jax.llm import config as llm_config

    base = llm_config.preset("cpu")
    lr = {} if learning_rate is None else {"learning_rate": learning_rate}
    return llm_config.replace(base, grpo=dict(**(shape or SHAPE), seed=SEED, num_seeds=SEEDS,
                                              **lr))


# --- 1. cost --------------------------------------------------------------------------------------
def timing(out: Path, shapes: list[str], runs: int = 10, iters: int = 4, reps: int = 2,
           log=print) -> list[dict]:
    """Seconds per GRPO iteration (a scan of `iters`, the best of `reps` calls) of `runs` vmapped
    runs with a 9-slot ring buffer, per shape "PxG" or "PxGxN"; then one evaluation's seconds.
    Appends to OUT/timing.jsonl."""
    import jax
    import jax.numpy as jnp

    from vaco_jax.llm import config as llm_config
    from vaco_jax.llm import experiment, sft
    from vaco_jax.llm.grpo import GRPO

    base = llm_config.preset("cpu")
    train_set, test_set = experiment.load_problems(base)
    params, _ = sft.warm_start(base, train_set, test_set, log=log)
    rows = []

    def best_of(fn, *args):
        best = None
        for _ in range(reps):
            wall, cpu = time.perf_counter(), _cpu_seconds()
            jax.block_until_ready(fn(*args))
            wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
            best = (wall, cpu) if best is None or wall < best[0] else best
        return best

    trainer = None
    for spec in shapes:
        parts = [int(x) for x in spec.split("x")]
        prompts, group, n = (parts + [1])[:3]
        cfg = llm_config.replace(base, grpo=dict(num_prompts=prompts, group_size=group,
                                                 num_minibatches=n, num_seeds=runs, seed=SEED))
        cfg = llm_config.with_lags(cfg, (0, 8), "constant")
        _, keys, hps = experiment.sweep_keys(cfg, ("ppo_clip",), None, (8,))
        trainer = GRPO(cfg, train_set, test_set,
                       objectives=llm_config.program_objectives(("ppo_clip",)))

        def chunk(key, p, hp, data, trainer=trainer):
            state = trainer.init(key, p, hp)
            state, metrics = jax.lax.scan(lambda s, _: trainer.iteration(s, data), state, None,
                                          length=iters)
            return metrics["reward"]

        start = time.perf_counter()
        compiled = jax.jit(jax.vmap(chunk, in_axes=(0, None, 0, None))).lower(
            keys, params, hps, trainer.data).compile()
        compile_s = time.perf_counter() - start
        wall, cpu = best_of(compiled, keys, params, hps, trainer.data)
        rows.append({"what": "iteration", "shape": f"{prompts}x{group}", "n": n, "runs": runs,
                     "wall_per_iteration": wall / iters, "cpu_per_iteration": cpu / iters,
                     "compile_seconds": compile_s, "load1": os.getloadavg()[0]})
        log(json.dumps(rows[-1]))
    if trainer is not None:
        stacked = jax.tree.map(lambda x: jnp.broadcast_to(x, (runs,) + x.shape), params)
        evaluate = jax.jit(jax.vmap(lambda p: trainer.evaluations(p, jnp.int32(8), trainer.data)))
        compiled = evaluate.lower(stacked).compile()
        wall, cpu = best_of(compiled, stacked)
        rows.append({"what": "evaluation", "runs": runs, "num_test": len(test_set),
                     "train_eval_size": trainer.config.grpo.train_eval_size, "wall": wall,
                     "cpu": cpu, "load1": os.getloadavg()[0]})
        log(json.dumps(rows[-1]))
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "timing.jsonl", "a") as fh:
        for row in rows:
            fh.write(json.dumps({**row, "host_cpus": os.cpu_count()}) + "\n")
    return rows


# --- 2. learning ----------------------------------------------------------------------------------
def run(out: Path, n: int, ks: tuple[int, ...], learning_rate: float | None = None,
        log=print) -> None:
    from vaco_jax.llm import config as llm_config
    from vaco_jax.llm import experiment

    name = f"n{n}" + ("" if learning_rate is None else f"-lr{learning_rate:g}")
    exp = llm_config.Experiment(config(learning_rate=learning_rate), ns=(n,), ks=tuple(ks),
                                lag_sampling="constant",
                                objectives=("ppo_clip",), out=str(out / name), plot=False,
                                throughput=False, runs_per_call=RUNS_PER_CALL)
    wall, cpu = time.perf_counter(), _cpu_seconds()
    experiment.run(exp, log=log)
    record = {"n": n, "ks": list(ks), "learning_rate": exp.config.grpo.learning_rate,
              "wall_seconds": time.perf_counter() - wall,
              "cpu_seconds": _cpu_seconds() - cpu, "load1": os.getloadavg()[0],
              "shape": SHAPE, "seeds": [SEED, SEED + SEEDS - 1]}
    with open(out / "calls.jsonl", "a") as fh:
        fh.write(json.dumps(record) + "\n")


# --- 3. the lag profile ---------------------------------------------------------------------------
def areal_profile(eta: int = 8, batch: int = 64, concurrency: int = 120, mean_latency: float = 2.0,
                  sigma: float = 1.0, cap: float = 8.0, steps: int = 3000, seed: int = 0,
                  bins: int | None = None):
    """Snapshot ages of a discrete-event model of AReaL's bounded-staleness rollout admission.

    AReaL (`areal/core/staleness_manager.py`, `StalenessManager.get_capacity`) admits new rollouts
    while `(max_head_offpolicyness + version + 1) * consumer_batch_size - (accepted + running)`
    and `max_concurrent_rollouts - running` are positive. Here: `eta` = max_head_offpolicyness,
    `batch` = consumer_batch_size, `concurrency` = max_concurrent_rollouts; each rollout takes a
    lognormal time (mean `mean_latency` trainer steps, log-sd `sigma`: the response-length tail,
    truncated at `cap` times the mean); the trainer takes the `batch` earliest-finished rollouts,
    one step of 1 time unit each, then its version advances. A sample's age is the version it is
    trained at minus the version it was submitted at (AReaL's head off-policyness; with
    interruptible rollouts later tokens are newer). The first 200 steps are dropped. Returns the
    histogram over ages 0..`bins` (default eta; a rollout that finishes after later-submitted
    ones may be older than eta: the last bin holds every older one too) and the mean age."""
    import heapq

    rng = np.random.default_rng(seed)
    mu = np.log(mean_latency) - sigma ** 2 / 2
    now, version, running, accepted, queue, ages = 0.0, 0, [], 0, [], []
    busy_until, busy = 0.0, False

    def admit():
        free = min(concurrency - len(running),
                   (eta + version + 1) * batch - (accepted + len(running)))
        for _ in range(max(0, free)):
            latency = min(rng.lognormal(mu, sigma), cap * mean_latency)
            heapq.heappush(running, (now + latency, version))

    admit()
    while version < steps:
        finish = running[0][0] if running else np.inf
        if busy and busy_until <= finish:
            now, busy, version = busy_until, False, version + 1
        else:
            now, submitted = heapq.heappop(running)
            accepted += 1
            queue.append(submitted)
        if not busy and len(queue) >= batch:
            taken, queue = queue[:batch], queue[batch:]
            if version >= 200:
                ages.extend(version - np.asarray(taken))
            busy, busy_until = True, now + 1.0
        admit()
    ages = np.asarray(ages)
    bins = eta if bins is None else bins
    counts = np.bincount(np.minimum(ages, bins), minlength=bins + 1)   # the last: bins or older
    return counts / counts.sum(), float(np.mean(ages))


BOARD_PROFILE = dict(mean_latency=4.0, concurrency=240, bins=12)
BOARD_PROFILE_WHY = (
    "AReaL's admission at max_head_offpolicyness 8 with rollouts of a mean latency of 4 trainer "
    "steps (long answers; 240 concurrent rollouts keep generation slightly slower than training), "
    "ages counted to 12 = T/16 (the last bin: 12 or older): the design runs saw no drop from a "
    "constant lag of 8, so the board's stress is the profile's tail past 8")
"""The board's profile (protocol llm-cpu v2) and why."""


def mean_profile(seeds: int = 4, **kw) -> tuple[list[float], float]:
    """`areal_profile(**kw)` averaged over `seeds` simulations, rounded to 3 decimals and summing
    to 1 (the rounding's remainder on the largest bin); and the mean age."""
    runs = [areal_profile(seed=s, **kw) for s in range(seeds)]
    probabilities = np.round(np.mean([p for p, _ in runs], 0), 3)
    probabilities[np.argmax(probabilities)] += round(1.0 - probabilities.sum(), 3)
    return ([round(float(x), 3) for x in probabilities],
            round(float(np.mean([m for _, m in runs])), 2))


def profile(out: Path, seeds: int = 4, log=print) -> dict:
    """The proposed v2 lag profile (`areal_profile`'s defaults, the mean over `seeds` simulations,
    rounded to 3 decimals), with variants of its assumptions, and the board's (`BOARD_PROFILE`);
    OUT/lag_profile.json."""
    probabilities, mean_age = mean_profile(seeds)
    variants = {}
    for name, kw in (("concurrency 116", dict(concurrency=116)),
                     ("concurrency 124", dict(concurrency=124)),
                     ("sigma 0.8", dict(sigma=0.8)), ("sigma 1.2", dict(sigma=1.2)),
                     ("latency 1, concurrency 60", dict(mean_latency=1.0, concurrency=60)),
                     ("latency 4, concurrency 240", dict(mean_latency=4.0, concurrency=240)),
                     ("concurrency 136 (generation faster than training)",
                      dict(concurrency=136))):
        p, mean = areal_profile(**kw)
        variants[name] = {"probabilities": np.round(p, 3).tolist(), "mean_age": round(mean, 2)}
    record = {"description": (
        "Snapshot ages 0..8 of a discrete-event model of AReaL's bounded-staleness rollout "
        "admission (areal/core/staleness_manager.py): max_head_offpolicyness 8, consumer batch "
        "64, 120 concurrent rollouts, lognormal rollout latency of mean 2 trainer steps (log-sd "
        "1, capped at 8x the mean): generation slightly slower than training. Modelled, not "
        "logged (experiments/design_llm_v2.py --profile)."),
        "probabilities": probabilities, "mean_age": mean_age, "variants": variants}
    board, board_mean = mean_profile(seeds, **BOARD_PROFILE)
    record["board"] = {"probabilities": board, "mean_age": board_mean,
                       "model": BOARD_PROFILE, "why": BOARD_PROFILE_WHY}
    out.mkdir(parents=True, exist_ok=True)
    (out / "lag_profile.json").write_text(json.dumps(record, indent=1) + "\n")
    log(json.dumps(record, indent=1))
    return record


# --- 4. which objectives compute the same thing ---------------------------------------------------
IDENTITY = dict(num_prompts=8, group_size=4, iterations=16, eval_every=16, train_eval_size=0)
"""The identity check's runs: the v2 batch, 16 iterations (long enough for a difference in one
update to change later batches), one evaluation at the end."""
IDENTITY_METRICS = ("reward", "grad_norm_mean", "eval_accuracy", "eval_sampled_accuracy")
"""Per-iteration training reward and gradient norm, and the final held-out accuracies: two runs
whose parameters follow the same path agree on every one."""
IDENTITY_RTOL = 1e-5


def identity(out: Path, ks=(0, 8), ns=(1, 8), seeds: int = 2, log=print) -> None:
    """Every built-in objective at each (N, k), design seeds 900-901, the same learning rate and
    its default constraint, in one program per N: OUT/identity/results.jsonl. `identity_groups`
    reads which runs are the same computation."""
    from vaco_jax.llm import config as llm_config
    from vaco_jax.llm import experiment

    cfg = llm_config.replace(llm_config.preset("cpu"),
                             grpo=dict(**IDENTITY, seed=SEED, num_seeds=seeds))
    exp = llm_config.Experiment(cfg, ns=tuple(ns), ks=tuple(ks), lag_sampling="constant",
                                objectives=llm_config.OBJECTIVES, out=str(out / "identity"),
                                plot=False, throughput=False, runs_per_call=14)
    wall, cpu = time.perf_counter(), _cpu_seconds()
    experiment.run(exp, log=log)
    with open(out / "calls.jsonl", "a") as fh:
        fh.write(json.dumps({"n": list(ns), "ks": list(ks), "what": "identity",
                             "learning_rate": cfg.grpo.learning_rate,
                             "wall_seconds": time.perf_counter() - wall,
                             "cpu_seconds": _cpu_seconds() - cpu, "load1": os.getloadavg()[0],
                             "shape": IDENTITY, "seeds": [SEED, SEED + seeds - 1]}) + "\n")


def same_runs(a: list[dict], b: list[dict], rtol: float = IDENTITY_RTOL) -> bool:
    """Do two objectives' runs (one row per seed, the same seeds) agree on every metric of
    `IDENTITY_METRICS` on every seed, within `rtol` (relative) or 1e-9?"""
    by_seed = {r["seed"]: r for r in b}
    if sorted(by_seed) != sorted(r["seed"] for r in a):
        return False
    return all(np.allclose(np.asarray(r[m], float), np.asarray(by_seed[r["seed"]][m], float),
                           rtol=rtol, atol=1e-9) for r in a for m in IDENTITY_METRICS)


def identity_groups(rows) -> dict[tuple[int, int], list[list[str]]]:
    """Per (N, k): the objectives in groups whose runs are the same (`same_runs`), in the order of
    `OBJECTIVES`; each group is compared by its first member."""
    from vaco_jax.llm.config import OBJECTIVES

    groups = {}
    for n, k in sorted({(r["n"], r["k"]) for r in rows}):
        cell = {o: [r for r in rows if (r["n"], r["k"], r["objective"]) == (n, k, o)]
                for o in OBJECTIVES}
        found: list[list[str]] = []
        for o in OBJECTIVES:
            if not cell[o]:
                continue
            home = next((g for g in found if same_runs(cell[g[0]], cell[o])), None)
            if home is None:
                found.append([o])
            else:
                home.append(o)
        groups[(n, k)] = found
    return groups


def identity_summary(rows) -> list[str]:
    """The identity check as markdown lines: per (N, k), the groups of objectives whose runs agree
    (`identity_groups`), and the groups that agree at every k of an N."""
    groups = identity_groups(rows)
    seeds = sorted({r["seed"] for r in rows})
    lines = ["## Which objectives compute the same thing (identity check)", "",
             f"Every objective, {IDENTITY['iterations']} iterations of the v2 batch, seeds "
             f"{', '.join(str(SEED + s) for s in seeds)}, learning rate 1e-4 and each objective's "
             "default constraint. Objectives in one cell agree on every seed in "
             f"{', '.join(IDENTITY_METRICS)} (relative {IDENTITY_RTOL:g}).", "",
             "| N | k | groups of two or more | distinct |", "|---|---|---|---|"]
    for (n, k), found in groups.items():
        merged = "; ".join(" = ".join(g) for g in found if len(g) > 1) or "none"
        lines.append(f"| {n} | {k} | {merged} | {len(found)} of {sum(map(len, found))} |")
    lines.append("")
    for n in sorted({n for n, _ in groups}):
        cells = [found for (m, _), found in groups.items() if m == n]
        home = lambda o, found: next(i for i, g in enumerate(found) if o in g)  # noqa: E731
        together: dict[tuple, list[str]] = {}   # the meet of the partitions of every k
        for o in [o for g in cells[0] for o in g]:
            together.setdefault(tuple(home(o, found) for found in cells), []).append(o)
        same = "; ".join(" = ".join(g) for g in together.values() if len(g) > 1) or "none"
        lines.append(f"At N = {n}, the same at every k: {same}.")
    return lines + [""]


# --- summary --------------------------------------------------------------------------------------
def _interval(x: np.ndarray) -> str:
    from vaco_jax.study import stats

    mean, low, high = stats.paired_t_interval(x)
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"


def summary(out: Path) -> str:
    from vaco_jax import io

    rows = []
    for directory in sorted(out.glob("n*")):
        if io.has_rows(directory / "results.jsonl"):
            lr = json.loads((directory / "config.json").read_text())["config"]["grpo"][
                "learning_rate"]
            rows += [{**r, "lr": lr} for r in io.read_rows(directory / "results.jsonl")]
    lines = ["# LLM protocol v2: design measurements (exploratory, design seeds "
             f"{SEED}–{SEED + SEEDS - 1})", "",
             f"Shape: {SHAPE['num_prompts']} prompts × G = {SHAPE['group_size']}, "
             f"T = {SHAPE['iterations']} iterations, an evaluation every {SHAPE['eval_every']}; "
             "`cpu` preset's model, task and shipped warm start; PPO-Clip, Adam. The warm start "
             "scores 0.235 (sampled) and 0.272 (greedy) on the held-out problems.", ""]
    if not rows:
        return "\n".join(lines + ["No runs yet."]) + "\n"
    cells = sorted({(r["lr"], r["n"], r["k"]) for r in rows}, key=lambda c: (-c[0], c[1], c[2]))
    for metric, name in (("eval_sampled_accuracy", "held-out sampled accuracy (primary)"),
                         ("eval_accuracy", "held-out greedy accuracy")):
        evals = rows[0]["eval_iterations"]
        lines += [f"## {name}: mean over seeds at each evaluation", "",
                  "| lr | N | k | seeds | " + " | ".join(f"it {i}" for i in evals) + " |",
                  "|---|---|---|---|" + "---|" * len(evals)]
        for lr, n, k in cells:
            curves = np.array([r[metric] for r in rows if (r["lr"], r["n"], r["k"]) == (lr, n, k)])
            lines.append(f"| {lr:g} | {n} | {k} | {len(curves)} | "
                         + " | ".join(f"{v:.3f}" for v in curves.mean(0)) + " |")
        lines.append("")
    lines += ["## At the end: k − k = 0 (paired by seed; mean [95% t interval])", "",
              "| lr | N | k | sampled | greedy | sampled, mean over evaluations (AUC) |",
              "|---|---|---|---|---|---|"]
    for lr, n, k in cells:
        if k == 0:
            continue
        base = {r["seed"]: r for r in rows if (r["lr"], r["n"], r["k"]) == (lr, n, 0)}
        lag = {r["seed"]: r for r in rows if (r["lr"], r["n"], r["k"]) == (lr, n, k)}
        seeds = sorted(set(base) & set(lag))
        if len(seeds) < 2:
            continue
        diff = lambda f: np.array([f(lag[s]) - f(base[s]) for s in seeds])   # noqa: E731
        lines.append(f"| {lr:g} | {n} | {k} | "
                     f"{_interval(diff(lambda r: r['final_sampled_accuracy']))} | "
                     f"{_interval(diff(lambda r: r['final_accuracy']))} | "
                     f"{_interval(diff(lambda r: float(np.mean(r['eval_sampled_accuracy']))))} |")
    lines.append("")
    if io.has_rows(out / "identity" / "results.jsonl"):
        lines += identity_summary(io.read_rows(out / "identity" / "results.jsonl"))
    calls = out / "calls.jsonl"
    if calls.exists():
        lines += ["## Calls (wall and process CPU seconds on a shared 2-core machine)", "",
                  "| N | ks | lr | wall s | CPU s | load (1 min) at the end |",
                  "|---|---|---|---|---|---|"]
        for line in calls.read_text().splitlines():
            c = json.loads(line)
            cpu = "–" if c.get("cpu_seconds") is None else f"{c['cpu_seconds']:.0f}"
            lines.append(f"| {c['n']} | {c['ks']} | {c.get('learning_rate', 1e-4):g} | "
                         f"{c['wall_seconds']:.0f} | {cpu} | {c['load1']:.1f} |"
                         + (f" {c['note']}" if c.get("note") else ""))
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.design_llm_v2",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--timing", nargs="+", metavar="PxG[xN]", help="measure these shapes")
    parser.add_argument("--n", type=int, help="updates per batch of the PPO-Clip runs")
    parser.add_argument("--ks", type=int, nargs="+", default=[0], help="constant lags")
    parser.add_argument("--lr", type=float, help="learning rate (default: the preset's, 1e-4): "
                        "runs go to OUT/n<N>-lr<LR>")
    parser.add_argument("--profile", action="store_true",
                        help="model AReaL's staleness histogram: OUT/lag_profile.json")
    parser.add_argument("--identity", action="store_true",
                        help="every objective at k = 0 and 8, N = 1 and 8, 16 iterations: which "
                             "are the same computation (OUT/identity)")
    parser.add_argument("--summary", action="store_true", help="write OUT/summary.md")
    args = parser.parse_args(argv)
    if args.timing:
        timing(args.out, args.timing)
    elif args.identity:
        identity(args.out)
    elif args.profile:
        profile(args.out)
    elif args.summary:
        text = summary(args.out)
        (args.out / "summary.md").write_text(text)
        sys.stdout.write(text)
    elif args.n:
        run(args.out, args.n, tuple(args.ks), args.lr)
    else:
        parser.error("give --timing, --n or --summary")
    return 0


if __name__ == "__main__":
    sys.exit(main())
