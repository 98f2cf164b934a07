"""Acting: each actor group runs its own (possibly stale) snapshot for a whole segment (SPEC §2)."""

from __future__ import annotations

from typing import Any

import jax
from flax import struct

from vaco_jax import networks
from vaco_jax.envs import EnvState, VecEnv


@struct.dataclass
class Transition:
    """A rollout, time-major `[T, B, ...]`. Observations are raw (each learner normalises them)."""

    obs: jax.Array
    action: jax.Array             # the policy's sample: an unclipped Gaussian one (the env
                                  # receives it clipped to [-1, 1]) or a categorical choice
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_obs: jax.Array           # true next observation s'_t
    log_behavior: jax.Array       # log β(a_t|s_t), joint over action dimensions
    behavior: Any                 # β's distribution parameters ({"loc", "scale"} or {"logits"}),
                                  # for exact KL/TV diagnostics
    episode_return: jax.Array     # return of an episode that ended at this step, else 0


def behavior_policy(actor, snapshots, obs, num_actors: int, normalize_obs: bool):
    """β's distribution parameters `[B, ...]` (the actor's output, e.g. `{"loc", "scale"}`) for
    `obs [B, d]`, actor group g using `snapshots[g]`."""
    grouped = obs.reshape((num_actors, -1) + obs.shape[1:])

    def group_policy(snapshot, group_obs):
        normalized = networks.normalize(group_obs, snapshot["normalizer"], normalize_obs)
        return actor.apply({"params": snapshot["actor"]}, normalized)

    per_group = jax.vmap(group_policy)(snapshots, grouped)
    return jax.tree.map(lambda x: x.reshape(obs.shape[:1] + x.shape[2:]), per_group)


def collect(env: VecEnv, actor, env_state: EnvState, snapshots, key, *, unroll_length: int,
            num_actors: int, normalize_obs: bool) -> tuple[EnvState, Transition]:
    """Run `unroll_length` steps of every env with its group's snapshot."""
    head = actor.head
    action_keys, reset_keys = jax.vmap(jax.random.split, out_axes=1)(
        jax.random.split(key, unroll_length))
    # The policy's noise of every step, drawn before the loop: the same numbers as
    # `sample(seed=action_key)` at each step, but inside the loop XLA copied the sampler
    # (threefry and the inverse error function) into each fusion that used the action.
    noise = jax.vmap(head.noise, in_axes=(0, None))(action_keys, (env.num_envs,))

    def step(env_state, inputs):
        step_noise, reset_key = inputs
        obs = env_state.obs
        behavior = behavior_policy(actor, snapshots, obs, num_actors, normalize_obs)
        dist = head.distribution(behavior)
        action = head.sample(dist, step_noise)
        log_behavior = dist.log_prob(action)
        env_state, result = env.step(env_state, action, reset_key)
        transition = Transition(obs, action, result.reward, result.terminated, result.truncated,
                                result.next_obs, log_behavior, behavior, result.episode_return)
        return env_state, transition

    return jax.lax.scan(step, env_state, (noise, reset_keys))
