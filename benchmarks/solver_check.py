"""Physics check of the `fast` MJX solver settings against the default solver (SPEC §5).

    python -m benchmarks.solver_check --env hopper walker2d halfcheetah inverted_pendulum

For each env, the same fixed policies are run under both solvers from the same initial states with
the same action noise, and their returns compared:
  zero      the zero action (passive dynamics plus contacts);
  random    uniform random actions in [-1, 1], one fixed sequence per episode;
  trained   a PPO policy trained for `--train-steps` with the *default* solver (its Gaussian mean);
plus the one-step error: from states visited by the default-solver random rollout, one env step
under each solver, `‖qvel_fast − qvel_default‖ / ‖qvel_default‖` (median and 95th percentile).

Tolerance (stated before looking): for every policy, the mean return under `fast` is within 5%
of the default solver's, or within two standard errors of the difference of the two means
(independent of scale when returns are near zero). PASS only if every policy passes.
Also reports the raw step speed of both (`limit`, 32 envs) so the speed-up is on record.
"""

from __future__ import annotations

import argparse
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from vaco_jax import Config, networks
from vaco_jax.envs import FAST_SOLVER, make_env, set_solver
from vaco_jax.trainer import Trainer

REL_TOL = 0.05


def rollout_returns(env, policy, keys, episode_length: int):
    """Returns `[N]` and episode lengths of `policy(obs, key) -> action` from `reset(keys[i])`."""
    def episode(key):
        reset_key, noise_key = jax.random.split(key)
        state = env.reset(reset_key)

        def step(carry, step_key):
            state, total, alive, length = carry
            action = jnp.clip(policy(state.obs, step_key), -1.0, 1.0)
            state = env.step(state, action)
            total = total + alive * state.reward
            length = length + alive
            alive = alive * (1.0 - state.done)
            return (state, total, alive, length), None

        init = (state, jnp.zeros(()), jnp.ones(()), jnp.zeros(()))
        (_, total, _, length), _ = jax.lax.scan(step, init,
                                                jax.random.split(noise_key, episode_length))
        return total, length

    return jax.jit(jax.vmap(episode))(keys)


def one_step_error(env_default, env_fast, num_envs: int, steps: int, key):
    """Relative qvel error of one fast-solver step from states of a default-solver rollout."""
    def run(key):
        state = jax.vmap(env_default.reset)(jax.random.split(key, num_envs))

        def step(state, k):
            action = jax.random.uniform(k, (num_envs, env_default.action_size), minval=-1, maxval=1)
            ref = jax.vmap(env_default.step)(state, action)
            fast = jax.vmap(env_fast.step)(state, action)
            err = jnp.linalg.norm(fast.pipeline_state.qd - ref.pipeline_state.qd, axis=-1)
            scale = jnp.maximum(jnp.linalg.norm(ref.pipeline_state.qd, axis=-1), 1e-6)
            # Continue from the reference, resetting ended episodes (done) to stay in-distribution.
            fresh = jax.vmap(env_default.reset)(jax.random.split(k, num_envs))
            done = ref.done > 0.5
            ref = jax.tree.map(
                lambda a, b: jnp.where(done.reshape(done.shape + (1,) * (a.ndim - 1)), a, b),
                fresh, ref)
            return ref, err / scale

        return jax.lax.scan(step, state, jax.random.split(key, steps))[1]

    errors = np.asarray(jax.jit(run)(key)).ravel()
    return {"median": float(np.median(errors)), "p95": float(np.percentile(errors, 95)),
            "p99": float(np.percentile(errors, 99)), "max": float(errors.max())}


def step_speed(env, num_envs: int = 32, steps: int = 200) -> float:
    def run(key):
        state = jax.vmap(env.reset)(jax.random.split(key, num_envs))

        def step(state, k):
            action = jax.random.uniform(k, (num_envs, env.action_size), minval=-1, maxval=1)
            state = jax.vmap(env.step)(state, action)
            return state, state.reward + state.obs.sum(-1)

        return jnp.sum(jax.lax.scan(step, state, jax.random.split(key, steps))[1])

    compiled = jax.jit(run).lower(jax.random.PRNGKey(0)).compile()
    compiled(jax.random.PRNGKey(0)).block_until_ready()
    best = math.inf
    for i in range(3):
        start = time.perf_counter()
        compiled(jax.random.PRNGKey(i)).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return num_envs * steps / best


def train_policy(env_name: str, train_steps: int):
    """A PPO-Clip policy trained with the default solver: `obs -> mean action` (deterministic)."""
    config = Config(env=env_name, algo="ppo_clip", total_steps=train_steps, num_evals=2,
                    eval_envs=4)
    trainer = Trainer(config)
    state, metrics = jax.jit(trainer.train)(jax.random.PRNGKey(0))
    print(f"  trained ppo_clip for {config.env_steps:,} steps (default solver): eval return "
          f"{np.asarray(metrics['eval_return']).round(1).tolist()}", flush=True)
    actor, params, normalizer = trainer.actor, state.params["actor"], state.normalizer

    def policy(obs, key):
        return actor.apply({"params": params}, networks.normalize(obs, normalizer, True))["loc"]

    return policy


def check(env_name: str, episodes: int, episode_length: int, train_steps: int,
          candidate: dict | None = None) -> dict:
    """Compare `FAST_SOLVER[env_name]` (or `candidate` settings) with the default solver."""
    env_default = make_env(env_name)
    settings = candidate or FAST_SOLVER.get(env_name, {})
    env_fast = set_solver(make_env(env_name), **settings)
    action_size = env_default.action_size
    policies = {
        "zero": lambda obs, key: jnp.zeros(action_size),
        "random": lambda obs, key: jax.random.uniform(key, (action_size,), minval=-1, maxval=1),
    }
    if train_steps:
        policies["trained"] = train_policy(env_name, train_steps)
    keys = jax.random.split(jax.random.PRNGKey(123), episodes)
    result = {"env": env_name, "fast": settings, "policies": {}}
    for name, policy in policies.items():
        row = {}
        for solver, env in (("default", env_default), ("fast", env_fast)):
            returns, lengths = map(np.asarray, rollout_returns(env, policy, keys, episode_length))
            row[solver] = {"mean": float(returns.mean()), "se": float(returns.std(ddof=1) / math.sqrt(episodes)),
                           "mean_length": float(lengths.mean())}
        diff = row["fast"]["mean"] - row["default"]["mean"]
        se = math.hypot(row["fast"]["se"], row["default"]["se"])
        rel = abs(diff) / max(abs(row["default"]["mean"]), 1e-8)
        row.update(diff=diff, rel_diff=rel, se_diff=se,
                   passed=bool(rel <= REL_TOL or abs(diff) <= 2 * se))
        result["policies"][name] = row
        print(f"  {name:>8}: default {row['default']['mean']:9.2f} ± {row['default']['se']:.2f} "
              f"(len {row['default']['mean_length']:.0f})  fast {row['fast']['mean']:9.2f} ± "
              f"{row['fast']['se']:.2f} (len {row['fast']['mean_length']:.0f})  rel diff {rel:.3f}  "
              f"{'PASS' if row['passed'] else 'FAIL'}", flush=True)
    error = one_step_error(env_default, env_fast, 32, 200, jax.random.PRNGKey(7))
    result["one_step_qvel_rel_error"] = error
    result["speed"] = {"default": step_speed(env_default), "fast": step_speed(env_fast)}
    result["passed"] = all(p["passed"] for p in result["policies"].values())
    print(f"  one-step qvel relative error: median {error['median']:.1e}, p95 {error['p95']:.1e}, "
          f"p99 {error['p99']:.1e}, max {error['max']:.1e};  raw speed (32 envs) "
          f"default {result['speed']['default']:,.0f} → fast {result['speed']['fast']:,.0f} steps/s"
          f"  => {'PASS' if result['passed'] else 'FAIL'}", flush=True)
    return result


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.solver_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", nargs="+", default=sorted(FAST_SOLVER))
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--episode-length", type=int, default=1000)
    parser.add_argument("--train-steps", type=int, default=200_000,
                        help="PPO steps for the trained policy (0: skip it)")
    parser.add_argument("--candidate", nargs="*", default=[],
                        help="check these settings instead of FAST_SOLVER, e.g. iterations=1 ls_iterations=4")
    parser.add_argument("--out", default="benchmarks/results/solver_check.json")
    args = parser.parse_args(argv)
    candidate = {k: int(v) for k, v in (item.split("=") for item in args.candidate)} or None
    from vaco_jax import io

    results = []
    for env_name in args.env:
        print(f"{env_name}: fast = {candidate or FAST_SOLVER.get(env_name)}", flush=True)
        results.append(check(env_name, args.episodes, args.episode_length, args.train_steps,
                             candidate))
    io.write_json_atomic(args.out, {"tolerance": {"rel": REL_TOL, "se": 2}, "results": results,
                                    "command": "python -m benchmarks.solver_check " + " ".join(
                                        argv if argv is not None else __import__("sys").argv[1:]),
                                    **io.provenance()})
    return results


if __name__ == "__main__":
    main()
