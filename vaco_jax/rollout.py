"""Acting: each actor group runs its own (possibly stale) snapshot for a whole segment (SPEC §2)."""

from __future__ import annotations

import jax
from flax import struct

from vaco_jax import networks
from vaco_jax.envs import EnvState, VecEnv


@struct.dataclass
class Transition:
    """A rollout, time-major `[T, B, ...]`. Observations are raw (each learner normalises them)."""

    obs: jax.Array
    action: jax.Array             # the unclipped Gaussian sample (the env receives it clipped)
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_obs: jax.Array           # true next observation s'_t
    log_behavior: jax.Array       # log β(a_t|s_t), joint over action dimensions
    behavior_loc: jax.Array       # β's Gaussian mean, for exact KL/TV diagnostics
    behavior_scale: jax.Array
    episode_return: jax.Array     # return of an episode that ended at this step, else 0


def behavior_policy(actor, snapshots, obs, num_actors: int, normalize_obs: bool):
    """`(loc, scale) [B, A]` for `obs [B, d]`, actor group g using `snapshots[g]`."""
    grouped = obs.reshape((num_actors, -1) + obs.shape[1:])

    def group_policy(snapshot, group_obs):
        normalized = networks.normalize(group_obs, snapshot["normalizer"], normalize_obs)
        return actor.apply({"params": snapshot["actor"]}, normalized)

    loc, scale = jax.vmap(group_policy)(snapshots, grouped)
    return loc.reshape(obs.shape[:1] + loc.shape[2:]), scale.reshape(obs.shape[:1] + scale.shape[2:])


def collect(env: VecEnv, actor, env_state: EnvState, snapshots, key, *, unroll_length: int,
            num_actors: int, normalize_obs: bool) -> tuple[EnvState, Transition]:
    """Run `unroll_length` steps of every env with its group's snapshot."""

    def step(env_state, step_key):
        action_key, reset_key = jax.random.split(step_key)
        obs = env_state.obs
        loc, scale = behavior_policy(actor, snapshots, obs, num_actors, normalize_obs)
        dist = networks.gaussian(loc, scale)
        action = dist.sample(seed=action_key)
        log_behavior = dist.log_prob(action)
        env_state, result = env.step(env_state, action, reset_key)
        transition = Transition(obs, action, result.reward, result.terminated, result.truncated,
                                result.next_obs, log_behavior, loc, scale, result.episode_return)
        return env_state, transition

    return jax.lax.scan(step, env_state, jax.random.split(key, unroll_length))
