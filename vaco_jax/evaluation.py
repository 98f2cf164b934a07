"""Evaluation inside the compiled program: episodes run until each ends, finished ones frozen."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vaco_jax import networks, spaces
from vaco_jax.envs import select_per_env


def evaluate(env, actor, actor_params, normalizer, key, *, num_episodes: int, episode_length: int,
             normalize_obs: bool):
    """Mean undiscounted return of `num_episodes` episodes acting with the policy's mode (the
    Gaussian mean, clipped to the env's [-1, 1]; the likeliest discrete choice)."""
    space = spaces.action_space(env)

    def act(state, t):
        obs = networks.normalize(state.obs, normalizer, normalize_obs)
        return space.clip(actor.head.distribution(actor.apply({"params": actor_params}, obs)).mode())

    return jnp.mean(episode_returns(env, act, key, num_episodes=num_episodes,
                                    episode_length=episode_length))


def episode_returns(env, act, key, *, num_episodes: int, episode_length: int):
    """Undiscounted returns `[num_episodes]` of episodes acting with `act(states, t) -> actions`.

    Each episode starts from a fresh random state and runs until it terminates or reaches the
    time limit (whichever comes first). The loop stops as soon as every episode has ended (a
    `while_loop`, not a fixed-length scan): an early policy that falls within 20 steps costs 20
    steps, not `episode_length`. An episode that has ended is frozen (its state is not stepped
    on and it adds no reward) while the others finish: stepping a terminated MJX state for
    hundreds of steps can reach NaN physics, which would poison the return (`0 · NaN = NaN`) and
    slow the constraint solver ~20×. A step with a non-finite reward (physics that blew up)
    ends its episode with the return so far. This is the one such rule: evaluation and the
    random-policy reference return both use it.
    """
    state = jax.vmap(env.reset)(jax.random.split(key, num_episodes))

    def running(carry):
        _, _, alive, t = carry
        return jnp.logical_and(t < episode_length, jnp.any(alive > 0))

    def step(carry):
        state, episode_return, alive, t = carry
        stepped = jax.vmap(env.step)(state, act(state, t))
        running_before = alive > 0
        state = select_per_env(running_before, stepped, state)
        # A non-finite reward (physics that blew up) adds nothing and ends the episode there, as
        # in training (`envs.zero_nonfinite_ends`); a finite step is added as it is.
        counted = running_before & jnp.isfinite(stepped.reward)
        episode_return = episode_return + jnp.where(counted, stepped.reward, 0.0)
        alive = jnp.where(counted, 1.0 - stepped.done, 0.0)
        return state, episode_return, alive, t + 1

    init = (state, jnp.zeros(num_episodes), jnp.ones(num_episodes), jnp.int32(0))
    init = batched_as_one(init, (state, act(state, init[3])))
    _, episode_return, _, _ = jax.lax.while_loop(running, step, init)
    return episode_return


def batched_as_one(carry, sources):
    """`carry`, the same values, with every leaf batched under `vmap` where any of `sources` is.

    For the initial carry of a loop whose body mixes `sources` into every carried value (the
    state and first action of `episode_returns`). `lax.while_loop`'s batching rule finds which
    carries are batched by batching the body again until that set stops growing, then once more
    when the predicate is batched. Under a seed `vmap` the episode counters start as constants and
    the env state's constant fields (reward, done, step counts) start unbatched, so the
    evaluation's env step was batched several times while tracing (three on toy_reach); starting
    every carry batched batches it once (inverted_pendulum's evaluation traced in 7.4 s of CPU
    instead of 12.0 on a 2-core machine). Nothing of this runs: XLA folds `select(p, x, x)` to `x`.
    """
    firsts = [jnp.ravel(x)[0] for x in jax.tree.leaves(sources)
              if jnp.size(x) and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)]
    if not firsts:
        return carry
    anchor = jnp.any(jnp.stack([x.astype(jnp.float32) for x in firsts]) != 0)
    return jax.tree.map(lambda x: jax.lax.select(anchor, x, x), carry)   # empty leaves too
