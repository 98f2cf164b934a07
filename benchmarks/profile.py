"""Where one learner iteration's time goes: our trainer's parts, each timed as its own program.

    python -m benchmarks.profile --preset cpu                        # inverted_pendulum and hopper
    python -m benchmarks.profile --preset cpu --env hopper --algos vaco --regime frozen
    python -m benchmarks.profile --preset smoke                      # seconds; used by the tests

For each env, algorithm and regime (`frozen`: learning rate 1e-20, every algorithm acting with the
same policy; `learning`: the default rate), it builds the trainer on the throughput benchmark's
shapes (`benchmarks.throughput`), runs a few iterations so the envs are mid-episode, then times
(median of `calls` calls, each waited for) the parts of `Trainer.iteration` compiled on their own:

  env        the rollout's `num_envs × unroll_length` steps of our `VecEnv` alone, replaying the
             actions `acting` takes (physics, time limit, truncation bookkeeping, fresh-state
             auto-resets);
  acting     the iteration's rollout: snapshot draw, the actor groups' policy passes, sampling and
             the same env steps, from the same state (`acting − env`: the cost of acting);
  realign    the learner's pass over the batch: normalisation, π_T and V_φT (twice), the
             advantage estimator (VACO's V-trace, GAE, …), the lag diagnostics;
  update     the K epochs × M minibatches of gradient steps;
  publish    normaliser update and the ring-buffer push;
  iteration  the whole iteration as the trainer runs it (one program: XLA fuses across parts, so
             the parts need not add up to it; `other` is the difference).

Seconds are per iteration and per seed (one seed). The raw simulator's figure (`limit` of
`benchmarks.throughput`: `vmap(env.step)`, no wrapper) is printed beside them so machines can be
compared. Brax's PPO trainer is one program without such seams; its whole-iteration throughput is
`benchmarks.throughput`'s `brax_ppo` row.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp

from benchmarks.measure import Case, limit
from benchmarks.throughput import PRESETS as THROUGHPUT_PRESETS
from vaco_jax import io, networks, ring_buffer, rollout
from vaco_jax.trainer import Trainer, make_optimizer

REGIMES = {"frozen": 1e-20, "learning": None}
PARTS = ("env", "acting", "realign", "update", "publish", "iteration")


def _median_seconds(fn, args, calls: int, carry: bool) -> float:
    """Median wall seconds of `calls` calls of compiled `fn` (after one warm-up call); with
    `carry`, each call's first output is the next call's first argument."""
    out = fn(*args)
    jax.block_until_ready(out)
    seconds = []
    for _ in range(calls):
        if carry:
            args = (out[0],) + tuple(args[1:])
        start = time.perf_counter()
        out = fn(*args)
        jax.block_until_ready(out)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def profile(case: Case, algo: str, calls: int = 20, warmup_iterations: int = 4) -> dict:
    """Seconds per iteration of each part of `Trainer.iteration` (see the module docstring)."""
    config = case.config(algo)
    trainer = Trainer(config)
    vec_env, hp = trainer.vec_env, config.hparams()
    state = jax.jit(trainer.init)(jax.random.PRNGKey(0))
    warm = jax.jit(lambda s: jax.lax.scan(lambda s, _: trainer.iteration(s), s, None,
                                          length=warmup_iterations)[0])
    state = warm(state)
    jax.block_until_ready(state)

    def env(env_state, actions, key):
        """The rollout's env steps alone: the actions `acting` took, the same reset keys."""
        def step(env_state, inputs):
            action, step_key = inputs
            env_state, result = vec_env.step(env_state, action, jax.random.split(step_key)[1])
            return env_state, result.reward
        rollout_key = jax.random.split(key)[1]
        env_state, rewards = jax.lax.scan(
            step, env_state, (actions, jax.random.split(rollout_key, config.unroll_length)))
        return env_state, jnp.sum(rewards)

    def acting(env_state, buffer, key):
        sample_key, rollout_key = jax.random.split(key)
        snapshots, _ = ring_buffer.sample(buffer, sample_key, config.num_actors,
                                          config.snapshot_sampling)
        return rollout.collect(vec_env, trainer.actor, env_state, snapshots, rollout_key,
                               unroll_length=config.unroll_length, num_actors=config.num_actors,
                               normalize_obs=config.normalize_observations)

    def update(params, opt_state, batch, key):
        loss = functools.partial(trainer.loss, hp=hp, kl_coef=state.kl_coef)
        return trainer.update_epochs(loss, params, opt_state, batch, key,
                                     make_optimizer(hp, hp.learning_rate))[:2]

    def publish(normalizer, buffer, params, obs):
        normalizer = networks.update_normalizer(normalizer, obs, config.normalize_observations)
        return normalizer, ring_buffer.push(buffer, trainer.snapshot(params, normalizer))

    key = jax.random.PRNGKey(1)
    _, traj = jax.jit(acting)(state.env_state, state.buffer, key)
    batch, _ = jax.jit(trainer.realign)(state.params, state.normalizer, traj, hp)
    # A copy: the whole iteration donates the state it is given, which must not share the
    # buffers of `state`.
    copy = jax.jit(lambda tree: jax.tree.map(lambda x: x + 0 if x.dtype != bool else ~~x, tree))
    # `env` and `acting` start from the same state every call, with the same keys: `env` replays
    # exactly the steps `acting` takes, so `acting − env` is the cost of acting.
    seconds = {
        "env": _median_seconds(jax.jit(env), (state.env_state, traj.action, key), calls,
                               carry=False),
        "acting": _median_seconds(jax.jit(acting), (state.env_state, state.buffer, key), calls,
                                  carry=False),
        "realign": _median_seconds(jax.jit(trainer.realign),
                                   (state.params, state.normalizer, traj, hp), calls, carry=False),
        "update": _median_seconds(jax.jit(update), (state.params, state.opt_state, batch, key),
                                  calls, carry=False),
        "publish": _median_seconds(jax.jit(publish), (state.normalizer, state.buffer, state.params,
                                                      traj.obs), calls, carry=False),
        "iteration": _median_seconds(jax.jit(trainer.iteration, donate_argnums=0), (copy(state),),
                                     calls, carry=True),
    }
    seconds["other"] = seconds["iteration"] - sum(seconds[p] for p in PARTS
                                                  if p not in ("env", "iteration"))
    return {"seconds": seconds, "env_steps_per_iteration": config.batch_size,
            "sps": config.batch_size / seconds["iteration"]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="cpu", choices=sorted(THROUGHPUT_PRESETS))
    parser.add_argument("--env", nargs="+", default=None)
    parser.add_argument("--algos", nargs="+", default=["ppo_clip", "vaco"])
    parser.add_argument("--regime", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", default=None, help="JSON path (default: print only)")
    args = parser.parse_args(argv)
    preset = THROUGHPUT_PRESETS[args.preset]
    shapes = {k: v for k, v in preset["case"].items() if k not in ("iterations", "repeats")}
    report = {"preset": args.preset, "shapes": shapes, "profiles": [], **io.provenance()}
    for env in args.env or preset["envs"]:
        raw = limit(Case(env=env, **shapes, iterations=4, repeats=3))["sps"]
        print(f"{env}: raw simulator {raw:,.0f} env steps/s (vmap(env.step), random actions); "
              f"milliseconds per iteration:")
        print(f"  {'algo':<9} {'regime':<8} " + " ".join(f"{p:>9}" for p in PARTS + ("other",))
              + "  env steps/s")
        for regime in args.regime:
            for algo in args.algos:
                case = Case(env=env, **shapes, learning_rate=REGIMES[regime])
                result = profile(case, algo, calls=args.calls)
                ms = result["seconds"]
                print(f"  {algo:<9} {regime:<8} " + " ".join(
                    f"{1e3 * ms[p]:9.2f}" for p in PARTS + ("other",)) + f"  {result['sps']:12,.0f}")
                report["profiles"].append({"env": env, "algo": algo, "regime": regime,
                                           "limit_sps": raw, **result})
    if args.out:
        io.write_json_atomic(args.out, report)
        print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
