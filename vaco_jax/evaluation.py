"""Deterministic evaluation of the current learner, inside the compiled program."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vaco_jax import networks


def evaluate(env, actor, actor_params, normalizer, key, *, num_episodes: int, episode_length: int,
             normalize_obs: bool):
    """Mean undiscounted return of `num_episodes` episodes acting with the Gaussian mean.

    Each episode starts from a fresh random state and runs until it terminates or reaches the
    time limit (whichever comes first). The loop stops as soon as every episode has ended (a
    `while_loop`, not a fixed-length scan): an early policy that falls within 20 steps costs 20
    steps, not `episode_length`. Steps after an episode's end add nothing to its return, so the
    result is the same as running all `episode_length` steps.
    """
    state = jax.vmap(env.reset)(jax.random.split(key, num_episodes))

    def running(carry):
        _, _, alive, t = carry
        return jnp.logical_and(t < episode_length, jnp.any(alive > 0))

    def step(carry):
        state, episode_return, alive, t = carry
        obs = networks.normalize(state.obs, normalizer, normalize_obs)
        loc, _ = actor.apply({"params": actor_params}, obs)
        state = jax.vmap(env.step)(state, jnp.clip(loc, -1.0, 1.0))
        episode_return = episode_return + alive * state.reward
        alive = alive * (1.0 - state.done)
        return state, episode_return, alive, t + 1

    init = (state, jnp.zeros(num_episodes), jnp.ones(num_episodes), jnp.int32(0))
    _, episode_return, _, _ = jax.lax.while_loop(running, step, init)
    return jnp.mean(episode_return)
