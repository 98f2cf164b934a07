"""VACO in one screen (SPEC §2–§3.2), PureJaxRL-style: `make_train(config) -> train(key)`.

One learner iteration, top to bottom:
    act with stale snapshots from the ring buffer → realign once with V-trace (§3.1)
    → K epochs × M minibatches of the TV-filtered update (§3.2) → push the new snapshot.

This is a reading copy of what `vaco_jax.trainer` runs for `algo="vaco"`, with no algorithm
registry and no divergence guard: it reads only plain `Config` fields and the core modules (envs,
networks, ring buffer, rollout, V-trace, the filter). It draws its random numbers in the trainer's
order, so from the same key it computes the same run (tests/test_reference.py holds it to that).
`train(key)` runs `num_evals` chunks of `iterations_per_eval` iterations, each chunk followed by
a deterministic evaluation, as the trainer does; `jax.vmap(train)(keys)` runs many seeds.
`train.init(key)` and `train.iteration(state)` are its two parts, for a Python loop or a test.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from vaco_jax import advantages, envs, evaluation, networks, objectives, ring_buffer, rollout
from vaco_jax.config import Config


class State(NamedTuple):
    params: Any             # {"actor": θ, "critic": φ}
    opt_state: Any
    normalizer: Any         # the learner's running observation statistics
    env_state: envs.EnvState
    buffer: ring_buffer.PolicyRingBuffer
    key: jax.Array
    iteration: jax.Array


def make_train(config: Config):
    c = config
    env = envs.make_env(c.env, c.mjx_solver)
    vec_env = envs.VecEnv(env, c.num_envs, c.episode_length)
    actor, critic = networks.make_networks(c, vec_env.action_space, envs.observation_shape(env))
    profile = (ring_buffer.profile_probabilities(c.lag_profile, c.slots)
               if c.snapshot_sampling == "profile" else None)

    def optimizer(learning_rate):
        return optax.chain(optax.clip_by_global_norm(c.max_grad_norm),
                           optax.adam(learning_rate, eps=c.adam_eps))

    def snapshot(params, normalizer):   # what a behaviour policy needs to act (SPEC §2)
        return {"actor": params["actor"], "normalizer": normalizer}

    def init(key) -> State:
        params_key, key = jax.random.split(key)
        env_state = vec_env.unstarted(key)      # reset by the first iteration
        obs_size = env_state.obs.shape[-1]
        params = networks.init_networks(params_key, actor, critic, obs_size)
        normalizer = networks.init_normalizer(obs_size)
        buffer = ring_buffer.init(snapshot(params, normalizer), c.slots, c.capacity)
        return State(params, optimizer(c.learning_rate).init(params), normalizer, env_state,
                     buffer, key, jnp.int32(0))

    def policy(params, obs):
        return actor.head.distribution(actor.apply({"params": params["actor"]}, obs))

    def value(params, obs):
        return critic.apply({"params": params["critic"]}, obs)

    def loss(params, mb):
        """The filtered policy gradient plus the value loss on one minibatch `[T, B/M]` (§3.2)."""
        dist = policy(params, mb["obs"])
        log_prob = dist.log_prob(mb["action"])
        adv = mb["advantages"]
        if c.normalize_advantages:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        policy_loss, info = objectives.tv_filter(
            log_prob, mb["log_behavior"], adv, delta=c.delta, filter_mode=c.filter_mode,
            is_max=c.is_max,
            log_reference=mb["log_learner_start"] if c.tv_reference == "learner" else None)
        value_loss = objectives.value_loss(value(params, mb["obs"]), mb["targets"])
        entropy = jnp.mean(dist.entropy())
        return policy_loss + c.vf_coef * value_loss - c.ent_coef * entropy, info

    def iteration(state: State, _=None):
        key, start_key, sample_key, rollout_key, update_key = jax.random.split(state.key, 5)

        # 1. Act: each actor group draws a (possibly stale) snapshot, rolls out a whole segment.
        env_state = vec_env.start(state.env_state, start_key)
        snapshots, ages = ring_buffer.sample(state.buffer, sample_key, c.num_actors,
                                             c.snapshot_sampling, profile)
        env_state, traj = rollout.collect(vec_env, actor, env_state, snapshots, rollout_key,
                                          unroll_length=c.unroll_length, num_actors=c.num_actors,
                                          normalize_obs=c.normalize_observations)

        # 2. Align (§3.1): with θ_T, φ_T, once; v and Â stay fixed for all K × M steps.
        obs = networks.normalize(traj.obs, state.normalizer, c.normalize_observations)
        next_obs = networks.normalize(traj.next_obs, state.normalizer, c.normalize_observations)
        log_learner_start = policy(state.params, obs).log_prob(traj.action)
        targets, adv = advantages.vtrace(
            log_learner_start - traj.log_behavior, traj.reward * c.reward_scale,
            value(state.params, obs), value(state.params, next_obs), traj.terminated,
            traj.truncated, gamma=c.gamma, lambda_=c.gae_lambda, clip_rho=c.rho_bar,
            clip_c=c.c_bar)
        batch = {"obs": obs, "action": traj.action, "log_behavior": traj.log_behavior,
                 "log_learner_start": log_learner_start, "advantages": adv, "targets": targets}

        # 3. Filter (§3.2): K epochs × M minibatches of whole segments (shuffled env columns).
        learning_rate = c.learning_rate
        if c.anneal_lr:
            learning_rate = learning_rate * (1.0 - state.iteration / c.num_iterations)
        tx = optimizer(learning_rate)

        def minibatch_step(carry, mb):
            params, opt_state = carry
            grads, info = jax.grad(loss, has_aux=True)(params, mb)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), info

        def epoch(carry, epoch_key):
            order = jax.random.permutation(epoch_key, c.num_envs)
            minibatches = jax.tree.map(lambda x: jnp.swapaxes(
                x[:, order].reshape((x.shape[0], c.num_minibatches, -1) + x.shape[2:]), 0, 1),
                batch)
            return jax.lax.scan(minibatch_step, carry, minibatches)

        (params, opt_state), info = jax.lax.scan(
            epoch, (state.params, state.opt_state), jax.random.split(update_key, c.num_epochs))

        # 4. Publish: fold the batch into the normaliser, push the new snapshot.
        normalizer = networks.update_normalizer(state.normalizer, traj.obs,
                                                c.normalize_observations)
        buffer = ring_buffer.push(state.buffer, snapshot(params, normalizer))
        state = State(params, opt_state, normalizer, env_state, buffer, key, state.iteration + 1)
        return state, {"advantages": adv, "snapshot_age": ages,
                       **jax.tree.map(jnp.mean, info)}   # filter_tv, filtered_fraction

    def chunk(state: State, _):
        state, info = jax.lax.scan(iteration, state, None, length=c.iterations_per_eval)
        eval_key, key = jax.random.split(state.key)
        eval_return = evaluation.evaluate(
            env, actor, state.params["actor"], state.normalizer, eval_key,
            num_episodes=c.eval_envs, episode_length=c.episode_length,
            normalize_obs=c.normalize_observations)
        return state._replace(key=key), {"eval_return": eval_return, **info}

    def train(key):
        """`(final state, metrics)`: `eval_return [num_evals]`; per iteration
        `[num_evals, iterations_per_eval, ...]`: `advantages [T, B]`, `snapshot_age
        [num_actors]`, the update's mean `filter_tv` and `filtered_fraction`."""
        return jax.lax.scan(chunk, init(key), None, length=c.num_evals)

    train.init, train.iteration = init, iteration
    return train
