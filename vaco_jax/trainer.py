"""The fused asynchronous on-policy trainer: composition only.

One learner iteration (SPEC §1–§4):
    draw a snapshot per actor group → roll out → realign (advantages once, with π_T, V_φT)
    → K epochs × M minibatches of updates → update the normaliser → push the new snapshot.

`make_train(config, env=None)` returns `train(key, hparams=None) -> (state, metrics)`, a pure function whose
whole run can be jitted and vmapped over seeds (and over `HParams` leaves: δ, learning rate,
capacity ≤ max_capacity, ...). The run is a scan over `num_evals` chunks, each a scan over
`iterations_per_eval` iterations followed by a deterministic evaluation; `Trainer.init` and
`Trainer.run_chunk` expose the same pieces for a Python loop over chunks (progress bars, checkpoints).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from vaco_jax import (algorithms, cache, diagnostics, envs, evaluation, networks, objectives,
                      ring_buffer, rollout, spaces)
from vaco_jax.config import Config, validate, validate_hparams
from vaco_jax.errors import invalid
from vaco_jax.envs import EnvState, TracedOnce, VecEnv, as_env, make_env, observation_shape
from vaco_jax.hparams import HParams
from vaco_jax.networks import make_networks


# Bits of `Health.nonfinite`: which quantities an iteration produced non-finite. The last two are
# the env's: a reward or observation of its rollout that was not finite mid-episode (at an episode's
# end one is zeroed and counted instead, `envs.zero_nonfinite_ends`).
NONFINITE_LOSS, NONFINITE_GRADIENT, NONFINITE_PARAMS = 1, 2, 4
NONFINITE_REWARD, NONFINITE_OBSERVATION = 8, 16
ENV_NONFINITE = ("reward", "observation")


def nonfinite_names(flags: int) -> list[str]:
    """The quantities named by a `Health.nonfinite` bit mask, e.g. `["loss", "gradient"]`."""
    return [name for bit, name in ((NONFINITE_LOSS, "loss"), (NONFINITE_GRADIENT, "gradient"),
                                   (NONFINITE_PARAMS, "parameters"), (NONFINITE_REWARD, "reward"),
                                   (NONFINITE_OBSERVATION, "observation")) if int(flags) & bit]


@struct.dataclass
class Health:
    """Divergence record of one seed, written inside the compiled program."""

    nonfinite: jax.Array           # int32 bit mask of NONFINITE_* (0 = healthy)
    iteration: jax.Array           # int32 learner iteration (0-based) that diverged (-1 = none)

    @staticmethod
    def healthy() -> "Health":
        return Health(jnp.int32(0), jnp.int32(-1))


@struct.dataclass
class TrainState:
    """Everything a run needs to continue: one pytree (so it can be vmapped and checkpointed)."""

    params: Any                    # {"actor": ..., "critic": ...}
    opt_state: Any
    normalizer: Any                # running observation statistics (learner's)
    env_state: EnvState
    buffer: ring_buffer.PolicyRingBuffer
    key: jax.Array
    iteration: jax.Array           # learner iterations completed
    env_steps: jax.Array           # environment steps taken in training
    kl_coef: jax.Array             # PPO-KL's β_KL (adapted when kl_adaptive)
    hparams: HParams
    health: Health                 # a diverged seed is frozen at its last good state


@struct.dataclass
class LearnerBatch:
    """The rollout as the learner sees it at the start of iteration T, `[T, B, ...]`."""

    obs: jax.Array                 # normalised with the learner's statistics
    next_obs: jax.Array
    action: jax.Array
    reward: jax.Array              # scaled by reward_scale
    terminated: jax.Array
    truncated: jax.Array
    log_behavior: jax.Array        # log β(a|s)
    behavior: Any                  # β's distribution parameters (e.g. {"loc", "scale"})
    log_learner_start: jax.Array   # log π_T(a|s)
    advantages: jax.Array | None   # fixed for the iteration (None: estimated per minibatch)
    targets: jax.Array | None      # value targets, likewise
    learner_start: Any = None      # π_T's distribution parameters, carried only for the KL
                                   # penalty to π_T (`kl_reference="learner"`), else None


def make_optimizer(hparams: HParams, learning_rate, *, adaptive_actor_lr: bool = False):
    """Adam after global-norm clipping. With `adaptive_actor_lr` (static: an objective that adapts
    its learning rate) the actor's updates are then scaled by a leaf of the optimiser state
    (`actor_lr_scale`, `with_actor_lr_scale`), 1 at the start; without it the optimiser and its
    state are what they always were."""
    transforms = [optax.clip_by_global_norm(hparams.max_grad_norm),
                  optax.adam(learning_rate, eps=hparams.adam_eps)]
    if adaptive_actor_lr:
        # Adam's step is linear in its learning rate, so scaling the actor's updates scales the
        # actor's learning rate alone (the critic keeps the configured one).
        transforms.append(optax.masked(optax.inject_hyperparams(optax.scale)(step_size=1.0),
                                       {"actor": True, "critic": False}))
    return optax.chain(*transforms)


def actor_lr_scale(opt_state) -> jax.Array:
    """The actor's learning rate relative to the configured one, from the state of
    `make_optimizer(..., adaptive_actor_lr=True)`."""
    return opt_state[-1].inner_state.hyperparams["step_size"]


def with_actor_lr_scale(opt_state, scale):
    """`opt_state` with the actor's relative learning rate set to `scale`."""
    masked = opt_state[-1]
    injected = masked.inner_state._replace(hyperparams={"step_size": jnp.asarray(scale,
                                                                                 jnp.float32)})
    return (*opt_state[:-1], masked._replace(inner_state=injected))


class Trainer:
    """Static parts of a run (config, env, networks) and the pure functions built from them.

    The env is `config.env` resolved by name (`envs.make_env`), or `env`, an env object passed
    beside the config (anything `envs.as_env` takes: a Brax `Env` or any object with Brax's
    interface, a MuJoCo Playground `MjxEnv`, a gymnax environment or its `(env, params)` pair),
    which `config.env` then only names. `self.config` is `config` with the env's own episode limit
    when the env is the user's and the config leaves `episode_length` at its default.

    The actor and critic are `config.network`'s, or your own: `networks`, an `(actor_torso,
    critic_torso)` pair of Flax modules, each mapping observations in the env's shape
    `[..., *observation_shape]` to features `[..., F]` (None in a place: the config's network
    there); the heads (the action distribution's parameters, V) are put on them
    (`networks.make_networks`). Nothing else depends on which networks they are.

    `on_evaluation(metrics)`, if given, is called on the host after every evaluation of `train`
    (and `run_chunk`) with the chunk's metrics (`eval_return`, `env_steps`, losses, ...: numpy
    arrays, `[runs]` under a `vmap` over runs), so a notebook can draw the curve while the run
    learns. Without it nothing is added to the program.

    Building a trainer turns on the per-user compilation cache, so a second identical run loads
    its programs instead of compiling them, unless the process chose otherwise before
    (`vaco_jax.cache.default_compile_cache`: `VACO_JAX_COMPILE_CACHE=off`, a call
    `vaco_jax.cache.enable_compile_cache("off")`, or JAX's own cache settings)."""

    def __init__(self, config: Config, env=None, *, networks=None, on_evaluation=None):
        validate(config, env_given=env is not None)
        cache.default_compile_cache()   # the per-user compilation cache, unless turned off
        # An env of the user's is checked before anything compiles (`envs.check_env`); its own
        # episode limit is the default `episode_length` (`envs.with_time_limit`).
        if env is not None or envs.is_users(config.env):
            env = (make_env(config.env) if env is None
                   else envs.check_env(as_env(env), config.env))
            config = envs.with_time_limit(config, env)
        else:
            env = make_env(config.env, config.mjx_solver)
        self.config = config
        self.on_evaluation = on_evaluation
        self.algorithm = algorithms.parse(config.algo)
        self.env = TracedOnce(env)
        self.vec_env = VecEnv(self.env, config.num_envs, config.episode_length)
        self.observation_shape = observation_shape(self.env)   # before the env flattened it
        self.actor, self.critic = make_networks(config, self.vec_env.action_space,
                                                self.observation_shape, networks)
        self.head = self.actor.head   # the policy's distribution (Gaussian or categorical)

    # --- state ---------------------------------------------------------------------------------
    def init(self, key, hparams: HParams | None = None) -> TrainState:
        config = self.config
        hparams = config.hparams() if hparams is None else hparams
        # Settings made for a larger ring buffer would be clamped to this one's slots: refused.
        if hparams.slots > config.slots:
            raise invalid("max_capacity", config.max_capacity,
                          f"must be at least the max_capacity the hyper-parameters were made "
                          f"for ({hparams.slots}): their capacities need that many slots")
        validate_hparams(hparams, config.slots)   # values given by hand (traced ones: unread)
        params_key, key = jax.random.split(key)
        # The envs are reset by the first iteration (`VecEnv.start`); here they are only shaped,
        # from the trace of their reset that `TracedOnce` shares (Brax's `env.observation_size`
        # would trace another reset, of the unwrapped env).
        env_state = self.vec_env.unstarted(key)
        observation_size = env_state.obs.shape[-1]
        params = networks.init_networks(params_key, self.actor, self.critic, observation_size)
        normalizer = networks.init_normalizer(observation_size)
        capacity = jnp.clip(hparams.capacity, 1, config.slots)
        buffer = ring_buffer.init(self.snapshot(params, normalizer), config.slots, capacity)
        opt_state = make_optimizer(hparams, hparams.learning_rate,
                                   adaptive_actor_lr=self.adapts_learning_rate).init(params)
        return TrainState(params, opt_state, normalizer, env_state, buffer, key,
                          jnp.int32(0), jnp.int32(0), hparams.kl_coef, hparams, Health.healthy())

    @staticmethod
    def snapshot(params, normalizer):
        """What a behaviour policy needs to act: actor parameters and normaliser statistics."""
        return {"actor": params["actor"], "normalizer": normalizer}

    # --- one learner iteration ---------------------------------------------------------------
    def iteration(self, state: TrainState) -> tuple[TrainState, dict]:
        config, hp = self.config, state.hparams
        key, start_key, sample_key, rollout_key, update_key = jax.random.split(state.key, 5)

        # Act: each actor group draws a (possibly stale) snapshot and rolls out with it (a new
        # run's envs are reset first).
        started = self.vec_env.start(state.env_state, start_key)
        snapshots, snapshot_age = ring_buffer.sample(state.buffer, sample_key, config.num_actors,
                                                     config.snapshot_sampling, hp.lag_profile)
        env_state, traj = self.act(self.vec_env, started, snapshots, rollout_key)

        # Learn: realign, update, publish the new snapshot (`learn`).
        learned, metrics, update_metrics = self.learn(state, traj, snapshot_age, update_key)
        # Episodes that ended in a non-finite reward or observation (zeroed by `VecEnv.step`).
        metrics["nonfinite_episodes"] = episodes_nonfinite(started, env_state)
        new_state = learned.replace(env_state=env_state, key=key,
                                    iteration=state.iteration + 1,
                                    env_steps=state.env_steps + config.batch_size)
        return guard_divergence(state, new_state, update_metrics, traj), metrics

    def act(self, vec_env: VecEnv, env_state: EnvState, snapshots, key):
        """The actors' part of an iteration: `unroll_length` steps of `vec_env`'s started envs,
        actor group g (a block of consecutive envs) acting with `snapshots[g]` (a leading
        `[groups]` axis). `(env_state, traj)`, the trajectory `[T, num_envs, ...]`. The fused
        iteration calls it for every group at once; `actor_learner` for one group at a time."""
        return rollout.collect(
            vec_env, self.actor, env_state, snapshots, key,
            unroll_length=self.config.unroll_length,
            num_actors=jax.tree.leaves(snapshots)[0].shape[0],
            normalize_obs=self.config.normalize_observations)

    def learn(self, state: TrainState, traj: rollout.Transition, snapshot_age, update_key):
        """The learner's part of an iteration on the batch `traj` `[T, num_envs, ...]`, made by
        actor groups whose snapshots were `snapshot_age` `[num_actors]` learner iterations old:
        realign, K × M updates with `update_key`, fold the batch into the normaliser, push the new
        snapshot. `(state with the new params, optimiser state, normaliser, buffer and β_KL,
        the iteration's metrics, the update's metrics)`; the caller advances the key and the
        counters and guards against divergence (`iteration`, `actor_learner`)."""
        config, hp = self.config, state.hparams

        # Align: the learner's view of the batch with θ_T, φ_T, computed once (SPEC §3.1).
        batch, lag_metrics = self.realign(state.params, state.normalizer, traj, hp)

        # Update: K epochs × M minibatches of whole trajectory segments, a gradient step on
        # `loss` each.
        learning_rate = hp.learning_rate
        if config.anneal_lr:
            learning_rate = learning_rate * (1.0 - state.iteration / config.num_iterations)
        optimizer = make_optimizer(hp, learning_rate, adaptive_actor_lr=self.adapts_learning_rate)
        loss = functools.partial(self.loss, hp=hp, kl_coef=state.kl_coef)
        (params, opt_state), update_metrics, minibatch_of_env = self.update_epochs(
            loss, state.params, state.opt_state, batch, update_key, optimizer)
        if self.adapts_learning_rate:
            # E.g. GePPO: the next iteration's actor learning rate, from this update's TV from π_T.
            opt_state, rate_metrics = self.adapt_learning_rate(params, opt_state, batch, hp,
                                                               state.kl_coef)
            update_metrics = {**update_metrics, **rate_metrics}

        # Publish: fold the batch into the normaliser, push the new snapshot.
        normalizer = networks.update_normalizer(state.normalizer, traj.obs,
                                                config.normalize_observations)
        buffer = ring_buffer.push(state.buffer, self.snapshot(params, normalizer))
        kl_coef = state.kl_coef
        if config.kl_adaptive:
            # Schulman et al. 2017 §4, on the KL the penalty measures: to β, its k3 estimate (the
            # textbook form), or to π_T, the penalty's own analytic KL (as RLlib's PPO); both
            # averaged over the update's minibatch steps. Then kept in [kl_coef_min, kl_coef_max].
            kl = update_metrics["kl_penalty" if config.kl_reference == "learner" else "approx_kl"]
            kl_coef = jnp.where(kl > 1.5 * hp.kl_target, kl_coef * 2.0,
                                jnp.where(kl < hp.kl_target / 1.5, kl_coef / 2.0, kl_coef))
            kl_coef = jnp.clip(kl_coef, hp.kl_coef_min, hp.kl_coef_max)

        episodes_ended = jnp.sum(traj.terminated | traj.truncated)
        metrics = {
            **update_metrics, **lag_metrics,
            "snapshot_age": jnp.mean(snapshot_age.astype(jnp.float32)),
            "snapshot_age_max": jnp.max(snapshot_age).astype(jnp.float32),
            # A run that replays a lag profile logs the ages it realised, to compare with it.
            **(diagnostics.snapshot_age_histogram(snapshot_age, config.slots)
               if config.snapshot_sampling == "profile" else {}),
            # How many optimiser steps old each sample is when an update uses it.
            **diagnostics.update_age_metrics(
                snapshot_age, config.num_epochs, config.num_minibatches, config.slots,
                # Actor groups hold consecutive envs (`rollout.behavior_policy`).
                minibatch_of_env.reshape(config.num_actors, -1).max(axis=1)),
            "episode_return_sum": jnp.sum(traj.episode_return),
            "episodes": episodes_ended.astype(jnp.float32),
        }
        learned = state.replace(params=params, opt_state=opt_state, normalizer=normalizer,
                                buffer=buffer, kl_coef=kl_coef)
        return learned, metrics, update_metrics

    @property
    def adapts_learning_rate(self) -> bool:
        """Whether the objective adapts the actor's learning rate (`Objective.adapt_learning_rate`)."""
        return self.algorithm.objective.adapt_learning_rate is not None

    def adapt_learning_rate(self, params, opt_state, batch: LearnerBatch, hp: HParams, kl_coef):
        """The objective's learning-rate rule after the update: the TV from π_T of the updated
        policy on the whole batch, `½ mean |π_θ/β − π_T/β|` (`update_tv`), gives the actor's next
        relative learning rate (`actor_lr_scale`, the one this update used)."""
        dist = self.head.distribution(self.actor.apply({"params": params["actor"]}, batch.obs))
        tv = diagnostics.tv_forward(dist.log_prob(batch.action), batch.log_learner_start,
                                    batch.log_behavior)
        scale = actor_lr_scale(opt_state)
        new_scale = self.algorithm.objective.adapt_learning_rate(
            scale, tv, self.objective_params(hp, kl_coef))
        return with_actor_lr_scale(opt_state, new_scale), {"update_tv": tv,
                                                           "actor_lr_scale": scale}

    def realign(self, params, normalizer, traj: rollout.Transition, hp: HParams):
        """Normalise, evaluate π_T and V_φT on the batch, and fix advantages/targets for the iteration."""
        norm = functools.partial(networks.normalize, normalizer=normalizer,
                                 enabled=self.config.normalize_observations)
        obs, next_obs = norm(traj.obs), norm(traj.next_obs)
        learner_out = self.actor.apply({"params": params["actor"]}, obs)
        learner_dist = self.head.distribution(learner_out)
        log_learner_start = learner_dist.log_prob(traj.action)
        values = self.critic.apply({"params": params["critic"]}, obs)
        next_values = self.critic.apply({"params": params["critic"]}, next_obs)
        log_rhos = log_learner_start - traj.log_behavior
        rewards = traj.reward * hp.reward_scale
        estimator = self.algorithm.estimator
        if estimator.per_minibatch:  # re-estimated in `loss` with the current θ, φ
            targets = advantages = None
        else:
            targets, advantages = estimator.fn(log_rhos, rewards, values, next_values,
                                               traj.terminated, traj.truncated, hp)
        batch = LearnerBatch(obs, next_obs, traj.action, rewards, traj.terminated,
                             traj.truncated, traj.log_behavior, traj.behavior, log_learner_start,
                             advantages, targets,
                             learner_start=learner_out if self.config.kl_reference == "learner"
                             else None)
        behavior_dist = self.head.distribution(traj.behavior)
        behavior_tv = 0.5 * jnp.mean(
            jnp.abs(jnp.exp(jnp.minimum(log_rhos, objectives.MAX_LOG_RATIO)) - 1.0))
        lag_metrics = {  # the realised backward lag, measured on the batch (SPEC §2)
            "behavior_tv": behavior_tv,
            "tv_backward": behavior_tv,   # the same value, named as the lag split's backward part
            "behavior_kl": jnp.mean(behavior_dist.kl_divergence(learner_dist)),
        }
        return batch, lag_metrics

    def update_epochs(self, loss, params, opt_state, batch: LearnerBatch, key, optimizer):
        """K epochs × M minibatches of gradient steps on `loss(params, minibatch) -> (loss,
        metrics)`: `((params, opt_state), metrics averaged over the steps, the minibatch of each
        env in the last epoch [num_envs])`."""
        config = self.config
        num_mb = config.num_minibatches

        def minibatch_step(carry, minibatch):
            params, opt_state = carry
            grads, metrics = jax.grad(loss, has_aux=True)(params, minibatch)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            metrics["grad_norm"] = optax.global_norm(grads)
            return (params, opt_state), metrics

        def epoch(carry, epoch_key):
            # Shuffle whole segments (the env axis) and split them into M minibatches [T, B/M].
            order = jax.random.permutation(epoch_key, config.num_envs)
            minibatches = jax.tree.map(
                lambda x: jnp.swapaxes(
                    x[:, order].reshape((x.shape[0], num_mb, -1) + x.shape[2:]), 0, 1),
                batch)
            carry, metrics = jax.lax.scan(minibatch_step, carry, minibatches)
            minibatch_of_env = jnp.argsort(order) // (config.num_envs // num_mb)
            return carry, (metrics, minibatch_of_env)

        carry, (metrics, minibatch_of_env) = jax.lax.scan(
            epoch, (params, opt_state), jax.random.split(key, config.num_epochs))
        return carry, jax.tree.map(jnp.mean, metrics), minibatch_of_env[-1]

    def loss(self, params, mb: LearnerBatch, hp: HParams, kl_coef):
        """Total loss on one minibatch `[T, B/M]` and its metrics."""
        config, estimator = self.config, self.algorithm.estimator
        dist = self.head.distribution(self.actor.apply({"params": params["actor"]}, mb.obs))
        log_prob = dist.log_prob(mb.action)
        values = self.critic.apply({"params": params["critic"]}, mb.obs)
        if estimator.per_minibatch:  # e.g. IMPALA: re-estimate with the current θ, φ
            next_values = self.critic.apply({"params": params["critic"]}, mb.next_obs)
            targets, advantages = estimator.fn(log_prob - mb.log_behavior, mb.reward, values,
                                               next_values, mb.terminated, mb.truncated, hp)
        else:
            targets, advantages = mb.targets, mb.advantages
        if config.normalize_advantages:
            normalize = self.algorithm.objective.normalize_advantages
            if normalize is None:
                advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
            else:   # the objective's own (e.g. GePPO's, weighted by π_T/β)
                advantages = normalize(advantages, mb.log_behavior, mb.log_learner_start,
                                       self.objective_params(hp, kl_coef))

        # The algorithm's policy objective (VACO's: `objectives.tv_filter`) on what it sees.
        policy_loss, policy_metrics = self.algorithm.objective(
            self.policy_inputs(log_prob, mb, advantages, dist), self.objective_params(hp, kl_coef))
        value_loss = objectives.value_loss(values, targets)
        entropy = jnp.mean(dist.entropy())
        total = policy_loss + hp.vf_coef * value_loss - hp.ent_coef * entropy
        ratio_metrics = objectives.ratio_diagnostics(log_prob, mb.log_behavior,
                                                     clip_eps=hp.clip_eps)
        metrics = {
            **ratio_metrics,
            # |w − 1| > ε for every algorithm; `clip_fraction` becomes the objective's own below
            # when it reports one.
            "ratio_clip_fraction": ratio_metrics["clip_fraction"],
            **policy_metrics,
            **diagnostics.intervened_fraction(policy_metrics),
            "tv_forward": diagnostics.tv_forward(log_prob, mb.log_learner_start, mb.log_behavior),
            "policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy,
            "loss": total,
        }
        return total, metrics

    def policy_inputs(self, log_prob, mb: LearnerBatch, advantages,
                      dist) -> algorithms.PolicyInputs:
        """What the policy objective sees of a minibatch `[T, B/M]`, given `log_prob` and
        `dist`, π_θ's log-probabilities of the actions and its distribution."""
        config = self.config
        kl = None
        if self.algorithm.objective.needs_kl:
            # Analytic, by the distribution's own rule: KL(β or π_T ‖ π_θ).
            reference = mb.learner_start if config.kl_reference == "learner" else mb.behavior
            kl = self.head.distribution(reference).kl_divergence(dist)
        # π_T is decoupled PPO's proximal policy (an objective that does not read it costs nothing).
        return algorithms.PolicyInputs(
            log_prob, mb.log_behavior, advantages, kl=kl,
            log_reference=mb.log_learner_start if config.tv_reference == "learner" else None,
            log_proximal=mb.log_learner_start,
            discrete=isinstance(self.vec_env.action_space, spaces.Discrete))

    def objective_params(self, hp: HParams, kl_coef) -> algorithms.ObjectiveParams:
        return algorithms.ObjectiveParams(
            clip_eps=hp.clip_eps, delta=hp.delta, is_max=hp.is_max, rho_bar=hp.rho_bar,
            kl_coef=kl_coef, decoupled_is_max=hp.decoupled_is_max,
            filter_mode=self.config.filter_mode, own=hp.objective)

    # --- chunks and the whole run ------------------------------------------------------------
    def run_chunk(self, state: TrainState) -> tuple[TrainState, dict]:
        """`iterations_per_eval` iterations, then a deterministic evaluation; scalar metrics."""
        state, metrics = self.learn_chunk(state)
        metrics["eval_return"], key = self.evaluate(state.params["actor"], state.normalizer,
                                                    state.key)
        if self.on_evaluation is not None:   # else nothing is traced: the program is unchanged
            to_host(self.on_evaluation, metrics)
        return state.replace(key=key), metrics

    def learn_chunk(self, state: TrainState, *, per_iteration: bool = False):
        """`iterations_per_eval` iterations; their mean metrics (`train_return`: the mean return
        of the training episodes that ended in them; `nonfinite_episodes`: how many of those
        ended in a non-finite reward or observation, e.g. a physics blow-up).

        With `per_iteration` (static), also every iteration's own metrics, `[iterations_per_eval]`
        per leaf, as a third output: what the scan computes anyway, kept instead of only averaged
        (`--log-every`). Without it the program is the same as before it existed."""
        state, iterations = jax.lax.scan(lambda s, _: self.iteration(s), state, None,
                                         length=self.config.iterations_per_eval)
        metrics = jax.tree.map(jnp.mean, iterations)
        episodes = jnp.sum(iterations["episodes"])
        returns = jnp.sum(iterations["episode_return_sum"])
        del metrics["episodes"], metrics["episode_return_sum"]
        metrics["nonfinite_episodes"] = jnp.sum(iterations["nonfinite_episodes"])
        metrics["train_return"] = jnp.where(episodes > 0, returns / jnp.maximum(episodes, 1.0),
                                            jnp.nan)
        metrics["env_steps"] = state.env_steps
        metrics["iteration"] = state.iteration
        return (state, metrics, iterations) if per_iteration else (state, metrics)

    def evaluate(self, actor_params, normalizer, key) -> tuple[jax.Array, jax.Array]:
        """The deterministic evaluation of `run_chunk`: (mean return of `eval_envs` episodes of
        the policy's mode (the Gaussian mean, the likeliest choice), the run's next key)."""
        config = self.config
        eval_key, key = jax.random.split(key)
        eval_return = evaluation.evaluate(
            self.env, self.actor, actor_params, normalizer, eval_key,
            num_episodes=config.eval_envs, episode_length=config.episode_length,
            normalize_obs=config.normalize_observations)
        return eval_return, key

    def train(self, key, hparams: HParams | None = None) -> tuple[TrainState, dict]:
        """The whole run: metrics are stacked over evaluations, `[num_evals]` per leaf."""
        state = self.init(key, hparams)
        return jax.lax.scan(lambda s, _: self.run_chunk(s), state, None,
                            length=self.config.num_evals)


def episodes_nonfinite(started: EnvState, env_state: EnvState) -> jax.Array:
    """Episodes that ended in a non-finite reward or observation between two env states (they
    are zeroed and counted by `VecEnv.step`), as a float32 scalar."""
    return jnp.sum(env_state.nonfinite_episodes - started.nonfinite_episodes).astype(jnp.float32)


def guard_divergence(old: TrainState, new: TrainState, update_metrics,
                     traj: rollout.Transition) -> TrainState:
    """Detect a non-finite loss, gradient or parameter, or a non-finite reward or observation
    from the env in the iteration's rollout `traj`, inside the compiled program.

    A seed whose iteration produced one keeps its last good state (frozen: every later iteration is
    discarded) and records what went wrong and when in `health`; other seeds of a vmapped run are
    unaffected. For a healthy seed this returns `new` unchanged.
    """
    params_finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(new.params)]))
    nonfinite = (jnp.where(jnp.isfinite(update_metrics["loss"]), 0, NONFINITE_LOSS)
                 | jnp.where(jnp.isfinite(update_metrics["grad_norm"]), 0, NONFINITE_GRADIENT)
                 | jnp.where(params_finite, 0, NONFINITE_PARAMS)
                 | jnp.where(jnp.all(jnp.isfinite(traj.reward)), 0, NONFINITE_REWARD)
                 | jnp.where(jnp.all(jnp.isfinite(traj.obs)) & jnp.all(jnp.isfinite(traj.next_obs)),
                             0, NONFINITE_OBSERVATION)
                 ).astype(jnp.int32)
    already = old.health.nonfinite != 0
    # One flag for every leaf below, reduced from a vector so that XLA computes it once: as a chain
    # of scalar ops XLA would copy it into the select of each state leaf (hundreds of copies; a
    # quarter of the learner program). XLA turns a reduction over a few stacked scalars into such a
    # chain, hence a vector it cannot split.
    flags = jnp.zeros(64, jnp.int32).at[0].set(already).at[1].set(nonfinite)
    diverged = jnp.any(flags != 0)
    health = Health(jnp.where(already, old.health.nonfinite, nonfinite),
                    jnp.where(already, old.health.iteration,
                              jnp.where(nonfinite != 0, old.iteration, -1)).astype(jnp.int32))
    state = jax.tree.map(lambda good, candidate: jnp.where(diverged, good, candidate), old, new)
    return state.replace(health=health)


def make_train(config: Config, env=None, *, networks=None, on_evaluation=None):
    """`train(key, hparams=None) -> (final_state, metrics)` for `config` (validated now), on
    `config.env` or on `env`, an env object passed beside it, with `config.network`'s networks or
    `networks`, your own `(actor_torso, critic_torso)` Flax modules; `on_evaluation(metrics)` is
    called after every evaluation (see `Trainer`)."""
    return Trainer(config, env, networks=networks, on_evaluation=on_evaluation).train


def to_host(callback, tree) -> None:
    """Call `callback(tree)` on the host from inside a compiled program, once per call site
    execution and in program order, with `tree`'s arrays as numpy arrays. Under `jax.vmap` it is
    still called once, with every vmapped axis kept (`[seeds]`, or `[settings, seeds]` for nested
    vmaps): `jax.debug.callback` alone would be called once per member, not knowing which."""
    _host_call(callback, tree)


def _host_call(callback, tree) -> jax.Array:
    """`to_host`'s call, returning a zero (a `custom_vmap` function must return a value)."""
    @jax.custom_batching.custom_vmap
    def call(tree):
        jax.debug.callback(lambda values: callback(jax.tree.map(np.asarray, values)), tree,
                           ordered=True)
        return jnp.zeros(())

    @call.def_vmap
    def call_batched(axis_size, in_batched, tree):
        tree = jax.tree.map(
            lambda x, batched: x if batched else jnp.broadcast_to(x, (axis_size,) + jnp.shape(x)),
            tree, in_batched[0])
        return _host_call(callback, tree), False

    return call(tree)


def stack_hparams(hparams_list: list[HParams]) -> HParams:
    """Stack several `HParams` along a leading axis, to vmap `train` over them. Each setting is
    validated as `Config.grid` validates its settings (`ConfigError` naming the field), e.g. a
    capacity beyond the ring buffer of the config that made it."""
    slots = sorted({h.slots for h in hparams_list})
    if len(slots) > 1:
        raise invalid("max_capacity", slots, "must be one for every stacked setting: they run in "
                                             "one program, with one ring buffer")
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *hparams_list)
    validate_hparams(stacked)
    return stacked
