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
    action_keys, reset_keys = jax.vmap(jax.random.split, out_axes=1)(
        jax.random.split(key, unroll_length))
    # The policy's standard-normal noise of every step, drawn before the loop: the same numbers as
    # `sample(seed=action_key)` at each step, but inside the loop XLA copied the sampler
    # (threefry and the inverse error function) into each fusion that used the action.
    noise = jax.vmap(networks.standard_noise, in_axes=(0, None))(
        action_keys, (env.num_envs, env.action_size))

    def step(env_state, inputs):
        step_noise, reset_key = inputs
        obs = env_state.obs
        loc, scale = behavior_policy(actor, snapshots, obs, num_actors, normalize_obs)
        dist = networks.gaussian(loc, scale)
        action = networks.sample_with_noise(dist, step_noise)
        log_behavior = dist.log_prob(action)
        env_state, result = env.step(env_state, action, reset_key)
        transition = Transition(obs, action, result.reward, result.terminated, result.truncated,
                                result.next_obs, log_behavior, loc, scale, result.episode_return)
        return env_state, transition

    return jax.lax.scan(step, env_state, (noise, reset_keys))
