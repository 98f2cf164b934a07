"""Deterministic evaluation of the current learner, inside the compiled program."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vaco_jax import networks


def evaluate(env, actor, actor_params, normalizer, key, *, num_episodes: int, episode_length: int,
             normalize_obs: bool):
    """Mean undiscounted return of `num_episodes` episodes acting with the Gaussian mean.

    Each episode starts from a fresh random state and runs until it terminates or reaches the
    time limit (whichever comes first).
    """
    state = jax.vmap(env.reset)(jax.random.split(key, num_episodes))

    def step(carry, _):
        state, episode_return, alive = carry
        obs = networks.normalize(state.obs, normalizer, normalize_obs)
        loc, _ = actor.apply({"params": actor_params}, obs)
        state = jax.vmap(env.step)(state, jnp.clip(loc, -1.0, 1.0))
        episode_return = episode_return + alive * state.reward
        alive = alive * (1.0 - state.done)
        return (state, episode_return, alive), None

    init = (state, jnp.zeros(num_episodes), jnp.ones(num_episodes))
    (_, episode_return, _), _ = jax.lax.scan(step, init, None, length=episode_length)
    return jnp.mean(episode_return)
