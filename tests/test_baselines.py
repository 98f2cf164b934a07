"""The baselines in the form their authors use (SPEC §4): PPO-KL with its KL measured to π_T (the
policy before the update) and a bounded adaptive β_KL beside the textbook form; IMPALA's loss
against rlax's; an algorithm's own config defaults (IMPALA's one pass) and their precedence."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from vaco_jax import Config, ConfigError, Trainer, algorithms, envs, register_env, ring_buffer, rollout
from vaco_jax.commands import train as train_cli

sg = jax.lax.stop_gradient

TINY = Config(env="toy_reach", algo="ppo_kl", num_envs=8, unroll_length=8, num_epochs=2,
              num_minibatches=2, num_actors=2, episode_length=20, total_steps=8 * 8 * 2 * 4,
              num_evals=4, eval_envs=4, actor_hidden=(16, 16), critic_hidden=(16, 16),
              capacity=3, max_capacity=3, snapshot_sampling="oldest", kl_adaptive=True,
              learning_rate=1e-2)


def gaussian_kl(p, q):
    """KL(p ‖ q) of diagonal Gaussians `{"loc", "scale"}` `[..., A]`, summed over action dims."""
    return jnp.sum(jnp.log(q["scale"] / p["scale"])
                   + (p["scale"] ** 2 + (p["loc"] - q["loc"]) ** 2) / (2 * q["scale"] ** 2) - 0.5,
                   axis=-1)


def next_batch(trainer, state):
    """The batch `trainer.iteration(state)` learns from, built as it builds it."""
    config = trainer.config
    _, start_key, sample_key, rollout_key, _ = jax.random.split(state.key, 5)
    started = trainer.vec_env.start(state.env_state, start_key)
    snapshots, ages = ring_buffer.sample(state.buffer, sample_key, config.num_actors,
                                         config.snapshot_sampling)
    _, traj = rollout.collect(trainer.vec_env, trainer.actor, started, snapshots, rollout_key,
                              unroll_length=config.unroll_length, num_actors=config.num_actors,
                              normalize_obs=config.normalize_observations)
    batch, _ = trainer.realign(state.params, state.normalizer, traj, state.hparams)
    return batch, ages


def warmed_up(config, iterations=3, seed=0):
    """A trainer and its state after `iterations` iterations (with C = 3 and oldest sampling the
    next batch is acted by a snapshot 2 iterations old), β_KL back at its initial value."""
    trainer = Trainer(config)
    state = trainer.init(jax.random.PRNGKey(seed))
    iterate = jax.jit(trainer.iteration)
    for _ in range(iterations):
        state, _ = iterate(state)
    return trainer, state.replace(kl_coef=state.hparams.kl_coef), iterate


def perturbed(params, scale=0.05, seed=1):
    leaves, tree = jax.tree.flatten(params["actor"])
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    actor = jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape)
                                      for x, k in zip(leaves, keys)])
    return {**params, "actor": actor}


def penalty_kl(trainer, params, batch, hp):
    return float(trainer.loss(params, batch, hp, jnp.float32(0.1))[1]["kl_penalty"])


@pytest.fixture(scope="module")
def stale():
    """The learner form after 3 iterations at a constant lag of 2, and its next batch."""
    config = dataclasses.replace(TINY, kl_reference="learner")
    trainer, state, iterate = warmed_up(config)
    batch, ages = next_batch(trainer, state)
    assert np.all(np.asarray(ages) == 2)
    return trainer, state, iterate, batch


# --- PPO-KL: the KL to π_T ------------------------------------------------------------------------
def test_the_learner_form_penalises_the_analytic_kl_from_the_learner_at_the_start(stale):
    trainer, state, _, batch = stale
    learner = trainer.actor.apply({"params": state.params["actor"]}, batch.obs)
    np.testing.assert_array_equal(batch.learner_start["loc"], learner["loc"])
    np.testing.assert_array_equal(batch.learner_start["scale"], learner["scale"])
    # At θ = θ_T the penalty is 0: the update starts from the policy it is measured from ...
    assert penalty_kl(trainer, state.params, batch, state.hparams) == 0.0
    # ... while the KL from the stale behaviour policy β is not.
    behavior = float(jnp.mean(gaussian_kl(batch.behavior, learner)))
    assert behavior > 1e-4
    # At another θ it is E[KL(π_T ‖ π_θ)] by the closed form.
    params = perturbed(state.params)
    current = trainer.actor.apply({"params": params["actor"]}, batch.obs)
    np.testing.assert_allclose(penalty_kl(trainer, params, batch, state.hparams),
                               float(jnp.mean(gaussian_kl(learner, current))), rtol=1e-4)


def test_the_textbook_form_penalises_the_kl_from_behaviour_and_carries_no_learner_policy():
    trainer, state, _ = warmed_up(TINY)
    batch, _ = next_batch(trainer, state)
    assert batch.learner_start is None
    params = perturbed(state.params)
    current = trainer.actor.apply({"params": params["actor"]}, batch.obs)
    np.testing.assert_allclose(penalty_kl(trainer, params, batch, state.hparams),
                               float(jnp.mean(gaussian_kl(batch.behavior, current))), rtol=1e-4)


def test_with_capacity_one_the_kl_to_the_learner_is_the_kl_to_behaviour():
    config = dataclasses.replace(TINY, capacity=1, max_capacity=0, kl_reference="learner")
    trainer, state, _ = warmed_up(config)
    batch, _ = next_batch(trainer, state)   # carries π_T's parameters
    textbook = Trainer(dataclasses.replace(config, kl_reference="behavior"))
    params = perturbed(state.params)
    to_learner = penalty_kl(trainer, params, batch, state.hparams)
    assert to_learner > 1e-4
    np.testing.assert_allclose(to_learner, penalty_kl(textbook, params, batch, state.hparams),
                               rtol=1e-5)


def adapted(kl, coef, target, low=0.0, high=math.inf):
    """One step of the adaptive rule, by hand in float32 (Schulman et al. 2017 §4, then bounded)."""
    coef = np.float32(coef)
    if kl > 1.5 * target:
        coef = coef * np.float32(2.0)
    elif kl < target / 1.5:
        coef = coef / np.float32(2.0)
    return min(max(coef, np.float32(low)), np.float32(high))


def test_the_learner_form_adapts_on_the_kl_to_the_learner_within_its_bounds(stale):
    trainer, state, iterate, _ = stale
    _, metrics = iterate(state)
    d, to_behavior = float(metrics["kl_penalty"]), float(metrics["approx_kl"])
    # Under lag the KL to β (what the textbook rule reads) is far above the KL to π_T.
    assert to_behavior > 3 * d > 0
    cases = [  # (kl_target, kl_coef_min, kl_coef_max) → β_KL after one step from 0.1
        (d / 2, 0.0, math.inf),    # above 1.5 × target: doubled
        (2 * d, 0.0, math.inf),    # below target / 1.5: halved
        (d, 0.0, math.inf),        # within: kept (the KL to β would have doubled it)
        (d / 2, 0.0, 0.15),        # doubled, held at the upper bound
        (2 * d, 0.08, math.inf),   # halved, held at the lower bound
    ]
    expected = [np.float32(0.2), np.float32(0.05), np.float32(0.1), np.float32(0.15),
                np.float32(0.08)]
    for (target, low, high), want in zip(cases, expected):
        hp = state.hparams.replace(kl_target=jnp.float32(target), kl_coef_min=jnp.float32(low),
                                   kl_coef_max=jnp.float32(high))
        new_state, new_metrics = iterate(state.replace(hparams=hp))
        assert float(new_metrics["kl_penalty"]) == d      # the rule does not change the update
        assert new_state.kl_coef == adapted(d, 0.1, target, low, high) == want


def test_the_textbook_form_adapts_on_the_kl_to_behaviour_without_bounds():
    trainer, state, iterate = warmed_up(TINY)
    _, metrics = iterate(state)
    kl = float(metrics["approx_kl"])
    for target in (kl / 2, 2 * kl, kl):
        new_state, _ = iterate(state.replace(hparams=state.hparams.replace(
            kl_target=jnp.float32(target))))
        assert new_state.kl_coef == adapted(kl, 0.1, target)
    # Unbounded by default: doubling 40 times goes far past any published bound.
    hp = state.hparams.replace(kl_target=jnp.float32(1e-12))
    for _ in range(40):
        state, _ = iterate(state.replace(hparams=hp))
    assert float(state.kl_coef) == pytest.approx(0.1 * 2.0 ** 40, rel=1e-6)


def test_kl_settings_are_validated_before_compilation():
    with pytest.raises(ConfigError, match="kl_coef_max"):
        Trainer(dataclasses.replace(TINY, kl_coef_max=0.05))
    with pytest.raises(ConfigError, match="kl_coef_min"):
        Trainer(dataclasses.replace(TINY, kl_coef_min=-1.0))
    with pytest.raises(ConfigError, match="kl_reference.*ppo_clip"):
        Trainer(dataclasses.replace(TINY, algo="ppo_clip", kl_reference="learner"))


# --- IMPALA against rlax --------------------------------------------------------------------------
IMPALA = Config.for_env("toy_reach", algo="impala", num_envs=8, unroll_length=8,
                        num_minibatches=2, num_actors=2, episode_length=20,
                        total_steps=8 * 8 * 4, num_evals=4, eval_envs=4, actor_hidden=(16, 16),
                        critic_hidden=(16, 16), gae_lambda=0.9, ent_coef=0.01,
                        normalize_advantages=False)


@pytest.mark.parametrize("rho_bar", [1.0, 1.2])
def test_the_impala_loss_is_rlax_vtrace_with_the_policy_gradient_loss(rho_bar):
    """On one minibatch `[T, B]` of stale data with terminations: our loss (V-trace recomputed
    with the current θ, φ; `−E[sg(min(ρ̄, w)Â) log π]`; `½ E[(V − v)²]`; entropy bonus), value and
    gradient, equals the same loss written with `rlax.vtrace_td_error_and_advantage` (c̄ = 1, ρ̄
    for the TD errors and the policy gradient, as Stoix's IMPALA)."""
    config = dataclasses.replace(IMPALA, rho_bar=rho_bar)
    trainer = Trainer(config)
    state = trainer.init(jax.random.PRNGKey(0))
    params, hp = perturbed(state.params, scale=0.3), state.hparams
    T, B = 8, 4
    keys = jax.random.split(jax.random.PRNGKey(5), 6)
    obs_size = state.env_state.obs.shape[-1]
    observations = jax.random.normal(keys[0], (T + 1, B, obs_size))
    obs, next_obs = observations[:-1], observations[1:]
    action = jax.random.normal(keys[1], (T, B, trainer.vec_env.action_space.size))
    policy = lambda p: trainer.head.distribution(trainer.actor.apply({"params": p["actor"]}, obs))
    log_behavior = policy(params).log_prob(action) + 0.4 * jax.random.normal(keys[2], (T, B))
    reward = jax.random.normal(keys[3], (T, B))
    terminated = jax.random.bernoulli(keys[4], 0.15, (T, B))
    truncated = jnp.zeros((T, B), bool)   # rlax has no truncation flag
    from vaco_jax.trainer import LearnerBatch
    minibatch = LearnerBatch(obs, next_obs, action, reward, terminated, truncated, log_behavior,
                             None, log_behavior, None, None)

    def ours(p):
        return trainer.loss(p, minibatch, hp, jnp.float32(0.0))[0]

    def reference(p):
        dist = policy(p)
        log_prob = dist.log_prob(action)
        critic = lambda o: trainer.critic.apply({"params": p["critic"]}, o)  # noqa: E731
        out = jax.vmap(rlax.vtrace_td_error_and_advantage, in_axes=(1, 1, 1, 1, 1, None, None, None),
                       out_axes=1)(critic(obs), critic(next_obs), reward,
                                   config.gamma * (1.0 - terminated), sg(jnp.exp(log_prob - log_behavior)),
                                   config.gae_lambda, rho_bar, rho_bar)
        policy_loss = -jnp.mean(sg(out.pg_advantage) * log_prob)
        value_loss = 0.5 * jnp.mean(out.errors ** 2)
        return policy_loss + config.vf_coef * value_loss - config.ent_coef * jnp.mean(dist.entropy())

    # The sample is stale enough for the truncation to matter.
    rhos = jnp.exp(policy(params).log_prob(action) - log_behavior)
    assert float(jnp.mean(rhos > rho_bar)) > 0.2 and float(jnp.mean(rhos < 1.0)) > 0.2
    np.testing.assert_allclose(ours(params), reference(params), rtol=1e-5)
    ours_grad, reference_grad = jax.grad(ours)(params), jax.grad(reference)(params)
    for a, b in zip(jax.tree.leaves(ours_grad), jax.tree.leaves(reference_grad)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


# --- an algorithm's own defaults ------------------------------------------------------------------
def test_algorithm_defaults_sit_between_the_env_and_explicit_fields():
    register_env("reach_three_epochs", envs.ToyReach,
                 defaults={"num_epochs": 3, "num_minibatches": 4})
    assert algorithms.defaults("impala") == {"num_epochs": 1}
    assert algorithms.defaults("vtrace_every+impala_pg") == {}   # a pairing brings none
    assert algorithms.defaults("not an algo") == {}              # validation names it later
    assert Config(algo="impala").num_epochs == 4                 # the class: the shared protocol
    assert Config.for_env("reach_three_epochs").num_epochs == 3  # env > class
    config = Config.for_env("reach_three_epochs", algo="impala")
    assert (config.num_epochs, config.num_minibatches) == (1, 4)  # algorithm > env
    assert Config.for_env("reach_three_epochs", algo="impala", num_epochs=4).num_epochs == 4
    assert Config.for_env("reach_three_epochs", algo="vaco").num_epochs == 3


def test_the_command_line_applies_the_algorithm_defaults_and_explicit_flags_win(capsys):
    parsed = lambda *argv: train_cli.parse(list(argv)).config  # noqa: E731
    assert parsed("--env", "toy_reach", "--algo", "impala").num_epochs == 1
    assert parsed("--algo=impala", "--env=toy_reach").num_epochs == 1
    assert parsed("--algo", "impala", "--num-epochs", "4").num_epochs == 4
    assert parsed("--algo", "ppo_clip").num_epochs == 4
    assert parsed("--algo", "vaco", "--algo", "impala").num_epochs == 1   # the last one given
    with pytest.raises(SystemExit):
        train_cli.parse(["--algo", "impala", "--help"])
    help_text = capsys.readouterr().out
    line = next(i for i, text in enumerate(help_text.splitlines()) if "--num-epochs" in text)
    assert "(default: 1)" in " ".join(help_text.splitlines()[line:line + 3])
