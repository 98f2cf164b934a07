"""Why the objectives anchored at π_T lose to PPO-Clip under a constant lag: diagnostics on the
design seeds.

Runs methods on one task of a benchmark protocol (its shapes, budget and config fields) at
constant lags k (`snapshot_sampling="oldest"`, capacity k + 1) and the given learning rates, on the
design seeds (`design_seed` …, never a scoring seed). Each run's state follows the trainer's own
program (`Trainer.iteration`, then `Trainer.evaluate` every `iterations_per_eval` iterations, as
`run_chunk`). Every `--probe-every` iterations a probe, on a batch of its own (drawn as the
iteration draws, with other keys; the run's state is not touched), measures:

* `behavior_kl` KL(β‖π_T), the realised lag in nats, and `diagnostics.behavior_weight_summary` of
  `ρ = π_T/β`: the shares of ρ outside [0.5, 2] and the effective sample sizes;
* `step_kl`: KL(π_T ‖ π_{T+1}) of the iteration that follows, on the same observations: how far
  one iteration moves the policy;
* the trainer's own metrics of that iteration (entropy, clip and intervened fractions, ...).

    python -m experiments.anchor_diagnostics OUT --env gymnax:Pendulum-v1 \
        --algos ppo_clip decoupled_ppo icepop m2po --lags 0 8 --learning-rates 3e-3
    python -m experiments.anchor_diagnostics OUT ... --set decoupled_is_max=1e9   # a field

Writes `OUT/runs.csv` (one row per run × evaluation: return, probe and iteration metrics averaged
over the chunk) and `OUT/summary.csv` (per method, lag and learning rate, the mean over seeds of
the AUC (mean evaluation return), the final return (last 3 evaluations) and each diagnostic
averaged over the run), with `OUT/config.json` (the command's arguments and library versions).
Appends to both files when OUT exists (one call per group of settings).

    python -m experiments.anchor_diagnostics OUT --from-board results/lag-bench/cpu-v2

reads a committed leaderboard instead (nothing runs): `OUT/board.csv`, per method and constant
lag at K = 4, the mean over tasks and seeds of the normalised AUC (`scores.csv`) and of the logged
`behavior_kl` (KL(β‖π_T)) and `behavior_tv` (per-run Parquet), for `--algos`; for an LLM
leaderboard (`results/lag-bench/llm-cpu`), per k and N, the logged `tv_backward` and the final
greedy accuracy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path


def parse(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.anchor_diagnostics",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--env", default="gymnax:Pendulum-v1")
    parser.add_argument("--protocol", default="cpu")
    parser.add_argument("--algos", nargs="+", default=["ppo_clip", "decoupled_ppo"])
    parser.add_argument("--lags", nargs="+", type=int, default=[0, 8])
    parser.add_argument("--learning-rates", nargs="+", type=float, default=[3e-3])
    parser.add_argument("--seeds", type=int, default=5, help="design seeds, from the protocol's")
    parser.add_argument("--total-steps", type=int, default=None, help="default: the task's")
    parser.add_argument("--probe-every", type=int, default=4)
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                        help="Config fields for every run (as vaco-bench --set)")
    parser.add_argument("--label", default="", help="a name for these runs in the tables")
    parser.add_argument("--alignment", nargs="*", default=[], metavar="ALGO",
                        help="also measure, at each probe, the cosine between each of these "
                             "algorithms' policy gradient on the stale batch and the on-policy "
                             "gradient at π_T (from --reference-batches fresh batches of π_T)")
    parser.add_argument("--reference-batches", type=int, default=8)
    parser.add_argument("--from-board", default=None, metavar="DIR",
                        help="tabulate a committed leaderboard's lag diagnostics instead")
    return parser.parse_args(argv)


def probe_fn(trainer, alignment=(), reference_batches=8):
    """`(state, next_state, key) -> metrics` of one probe batch (see the module docstring).

    With `alignment` (algorithm names), also `cos_<algo>`: the cosine between that algorithm's
    actor gradient at θ = θ_T on the stale batch (one minibatch of the whole batch) and the
    on-policy gradient at π_T, PPO-Clip's (= the policy gradient with GAE at θ = θ_T) averaged
    over `reference_batches` fresh batches acted by π_T itself; `cos_noise`: the cosine between
    the reference's two halves (the floor its own noise sets)."""
    import jax
    import jax.numpy as jnp

    from vaco_jax import diagnostics, ring_buffer, rollout

    config = trainer.config
    import dataclasses as _dc

    from vaco_jax import Trainer
    others = {name: Trainer(_dc.replace(config, algo=name)) for name in ("ppo_clip", *alignment)}

    def batch_of(state, key, mode):
        sample_key, start_key, rollout_key = jax.random.split(key, 3)
        snapshots, _ = ring_buffer.sample(state.buffer, sample_key, config.num_actors, mode,
                                          state.hparams.lag_profile)
        started = trainer.vec_env.start(state.env_state, start_key)
        _, traj = rollout.collect(trainer.vec_env, trainer.actor, started, snapshots, rollout_key,
                                  unroll_length=config.unroll_length,
                                  num_actors=config.num_actors,
                                  normalize_obs=config.normalize_observations)
        return trainer.realign(state.params, state.normalizer, traj, state.hparams)[0]

    def actor_gradient(name, state, batch):
        grads, _ = jax.grad(others[name].loss, has_aux=True)(
            state.params, batch, hp=state.hparams, kl_coef=state.kl_coef)
        return jnp.concatenate([x.reshape(-1) for x in jax.tree.leaves(grads["actor"])])

    def cosine(a, b):
        return jnp.dot(a, b) / (jnp.linalg.norm(a) * jnp.linalg.norm(b) + 1e-30)

    def alignment_metrics(state, stale, key):
        if not alignment:
            return {}
        keys = jax.random.split(key, reference_batches)
        fresh = jax.lax.map(lambda k: actor_gradient("ppo_clip", state,
                                                     batch_of(state, k, "newest")), keys)
        half = reference_batches // 2
        reference = jnp.mean(fresh, axis=0)
        return {"cos_noise": cosine(jnp.mean(fresh[:half], 0), jnp.mean(fresh[half:], 0)),
                **{f"cos_{name}": cosine(actor_gradient(name, state, stale), reference)
                   for name in alignment}}

    def probe(state, next_state, key):
        hp = state.hparams
        sample_key, start_key, rollout_key = jax.random.split(key, 3)
        snapshots, _ = ring_buffer.sample(state.buffer, sample_key, config.num_actors,
                                          config.snapshot_sampling, hp.lag_profile)
        started = trainer.vec_env.start(state.env_state, start_key)
        _, traj = rollout.collect(trainer.vec_env, trainer.actor, started, snapshots, rollout_key,
                                  unroll_length=config.unroll_length,
                                  num_actors=config.num_actors,
                                  normalize_obs=config.normalize_observations)
        batch, lag = trainer.realign(state.params, state.normalizer, traj, hp)
        start = trainer.head.distribution(
            trainer.actor.apply({"params": state.params["actor"]}, batch.obs))
        after = trainer.head.distribution(
            trainer.actor.apply({"params": next_state.params["actor"]}, batch.obs))
        return {**alignment_metrics(state, batch, jax.random.fold_in(key, 1)),
                "behavior_kl": lag["behavior_kl"],
                "step_kl": jnp.mean(start.kl_divergence(after)),
                **diagnostics.behavior_weight_summary(batch.log_learner_start,
                                                      batch.log_behavior)}

    return probe


def run(config, seeds, probe_every: int, alignment=(), reference_batches=8):
    """Per seed, per evaluation: the evaluation return and the chunk's mean metrics."""
    import jax
    import numpy as np

    from vaco_jax import Trainer

    trainer = Trainer(config)
    keys = jax.numpy.stack([jax.random.PRNGKey(s) for s in seeds])
    state = jax.jit(jax.vmap(trainer.init))(keys)
    iterate = jax.jit(jax.vmap(trainer.iteration))
    probe = jax.jit(jax.vmap(probe_fn(trainer, alignment, reference_batches)))
    evaluate = jax.jit(jax.vmap(lambda s: trainer.evaluate(s.params["actor"], s.normalizer,
                                                           s.key)))
    probe_keys = jax.vmap(lambda k: jax.random.fold_in(k, 7919))(keys)
    rows = []
    for chunk in range(config.num_evals):
        sums, counts = {}, {}
        for i in range(config.iterations_per_eval):
            next_state, metrics = iterate(state)
            if i % probe_every == 0:
                step = chunk * config.iterations_per_eval + i
                found = probe(state, next_state,
                              jax.vmap(jax.random.fold_in, (0, None))(probe_keys, step))
                metrics = {**metrics, **{f"probe_{k}": v for k, v in found.items()}}
            for name, value in metrics.items():
                if np.ndim(value) == 1:
                    sums[name] = sums.get(name, 0.0) + np.asarray(value, np.float64)
                    counts[name] = counts.get(name, 0) + 1
            state = next_state
        returns, new_keys = evaluate(state)
        state = state.replace(key=new_keys)
        for j, seed in enumerate(seeds):
            rows.append({"seed": seed, "eval_index": chunk,
                         "step": (chunk + 1) * config.iterations_per_eval * config.batch_size,
                         "eval_return": float(returns[j]),
                         **{name: float(sums[name][j] / counts[name]) for name in sums}})
    return rows


def board_table(directory, methods):
    """Per method and constant lag k at K = 4: mean normalised AUC over tasks and seeds, and the
    mean of the logged KL(β‖π_T) and ½E|π_T/β − 1| over every evaluation's chunk."""
    import pandas as pd

    root = Path(directory)
    scores = pd.read_csv(root / "scores.csv")
    scores = scores[(scores.K == 4) & (scores.sampling == "oldest")
                    & scores.method.isin(methods)]
    table = scores.groupby(["method", "k"]).auc_score.mean().rename("auc_score")
    logged = []
    for method in methods:
        runs = pd.read_parquet(root / method / "runs" / "results.parquet")
        runs = runs[(runs.num_epochs == 4) & (runs.snapshot_sampling == "oldest")]
        logged.append(runs.groupby("lag")[["behavior_kl", "behavior_tv"]].mean()
                      .assign(method=method).reset_index().rename(columns={"lag": "k"}))
    logged = pd.concat(logged).set_index(["method", "k"])
    return table.to_frame().join(logged).reset_index()


def llm_board_table(directory, methods):
    """The LLM leaderboard's counterpart: per objective, constant lag k and N, the mean over
    iterations and seeds of the logged `tv_backward` (½E|π_T/β − 1| over tokens) and the mean
    final greedy accuracy."""
    import numpy as np
    import pandas as pd

    rows = []
    for method in methods:
        runs = pd.read_parquet(Path(directory) / method / "results.parquet")
        runs = runs[runs.lag_sampling == "constant"]
        for (k, n), g in runs.groupby(["k", "n"]):
            rows.append({"method": method, "k": k, "N": n,
                         "tv_backward": float(np.mean([np.mean(x) for x in g.tv_backward])),
                         "final_accuracy": g.final_accuracy.mean()})
    return pd.DataFrame(rows)


def main(argv=None):
    args = parse(argv)
    if args.from_board:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        llm = not (Path(args.from_board) / "scores.csv").exists()
        table = (llm_board_table if llm else board_table)(args.from_board, args.algos)
        table.to_csv(out / "board.csv", index=False)
        print(table.round(3).to_string(index=False))
        return
    import numpy as np
    import pandas as pd

    import vaco_jax
    from vaco_jax.config import validate
    from vaco_jax.study import bench

    proto = bench.protocol(args.protocol)
    task = next(t for t in proto.tasks if t.env == args.env)
    seeds = list(range(proto.design_seed, proto.design_seed + args.seeds))
    overrides = bench.parse_overrides(args.set)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "config.json", "a") as f:
        f.write(json.dumps({"args": vars(args), "seeds": seeds,
                            "vaco_jax": getattr(vaco_jax, "__version__", ""),
                            **vaco_jax_versions()}) + "\n")
    all_rows = []
    for algo in args.algos:
        # The task's config as the learning-rate choice runs it (k = 0), then set to each lag.
        base = next(cell.config for cell in bench.tuning_cells(bench.Method(algo, overrides), proto)
                    if cell.env == args.env)
        if args.total_steps:
            base = dataclasses.replace(base, total_steps=args.total_steps)
        for lag in args.lags:
            for lr in args.learning_rates:
                config = dataclasses.replace(base, capacity=lag + 1, max_capacity=0,
                                             snapshot_sampling="oldest", lag_profile=(),
                                             learning_rate=lr)
                validate(config)
                began = time.time()
                rows = run(config, seeds, args.probe_every, args.alignment,
                           args.reference_batches)
                seconds = time.time() - began
                method = args.label or (algo if not args.set else f"{algo}[{' '.join(args.set)}]")
                for row in rows:
                    row.update(env=args.env, method=method, lag=lag, learning_rate=lr)
                frame = pd.DataFrame(rows)
                auc = frame.groupby("seed").eval_return.mean()
                final = frame[frame.eval_index >= config.num_evals - 3].groupby(
                    "seed").eval_return.mean()
                print(f"{method} k={lag} lr={lr:g}: AUC {auc.mean():.1f} final "
                      f"{final.mean():.1f} per seed {np.round(final.values, 1).tolist()} "
                      f"({seconds:.0f} s)", flush=True)
                all_rows += rows
    frame = pd.DataFrame(all_rows)
    runs_path = out / "runs.csv"
    if runs_path.exists():
        frame = pd.concat([pd.read_csv(runs_path), frame], ignore_index=True)
    frame.to_csv(runs_path, index=False)
    summarise(frame).to_csv(out / "summary.csv", index=False)


def summarise(frame):
    """Per (env, method, lag, learning rate): the mean over seeds of each run's AUC, final return
    and run-mean diagnostics."""
    import pandas as pd

    keys = ["env", "method", "lag", "learning_rate"]
    metric_columns = [c for c in frame.columns if c not in keys + ["seed", "eval_index", "step"]]

    def per_run(g):
        g = g.sort_values("eval_index")
        return pd.Series({"auc": g.eval_return.mean(), "final": g.eval_return.iloc[-3:].mean(),
                          **g[metric_columns].mean().to_dict()})

    per_seed = frame.groupby(keys + ["seed"])[["eval_index", *metric_columns]].apply(per_run)
    return per_seed.groupby(keys).mean().reset_index()


def vaco_jax_versions() -> dict:
    from importlib import metadata
    return {name: metadata.version(name) for name in ("jax", "jaxlib", "flax", "optax")}


if __name__ == "__main__":
    main()
