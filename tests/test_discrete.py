"""Discrete actions: a categorical head behind the one policy interface (SPEC §3.2, §4).

The objectives and diagnostics see log-probabilities only; PPO-KL's analytic KL(β ‖ π_θ) is the
distribution's own. Checked against hand computations on small logits written out here:

    sample 1: π_θ logits (2, 0, −1), β uniform (0, 0, 0), action 0
        log w = 2 − log(e² + 1 + e⁻¹) + log 3 = 0.928766,  w = 2.531385
        KL(β ‖ π_θ) = −log 3 − mean(log π_θ) = 0.737901
    sample 2: π_θ logits (0, 1, 0), β logits (1, 0, 0), action 1
        log w = 1 exactly (the normalisers are equal),  w = e = 2.718282
        KL(β ‖ π_θ) = 0.576117 · 1 + 0.211942 · (−1) + 0.211942 · 0 = 0.364175
"""

import dataclasses

import distrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from brax.envs.base import Env, State

from vaco_jax import Trainer, networks, objectives, policy, register_env, spaces
from vaco_jax import envs
from vaco_jax import trainer as trainer_lib

from test_trainer import TINY, _rollout

LEARNER_LOGITS = jnp.array([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
BEHAVIOR_LOGITS = jnp.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
ACTIONS = jnp.array([0, 1], jnp.int32)
ADVANTAGES = jnp.array([1.0, -0.5])
RATIOS = np.array([2.531385, 2.718282])
KL = np.array([0.737901, 0.364175])


class ToyChoice(Env):
    """A one-step-per-episode bandit with three arms: the observation shows which arm pays 1
    (one-hot); every step terminates."""

    action_space = spaces.Discrete(3)

    def reset(self, rng):
        arm = jax.random.randint(rng, (), 0, 3)
        zero = jnp.zeros(())
        return State(arm, jax.nn.one_hot(arm, 3), zero, zero, {}, {})

    def step(self, state, action):
        return state.replace(reward=(action == state.pipeline_state).astype(jnp.float32),
                             done=jnp.ones(()))

    observation_size, action_size, backend = 3, 3, "jax"


class AlwaysTwo(ToyChoice):
    """ToyChoice whose paying arm is always arm 2."""

    def reset(self, rng):
        state = super().reset(rng)
        return state.replace(pipeline_state=jnp.int32(2), obs=jax.nn.one_hot(2, 3))


@pytest.fixture(scope="module")
def trainer():
    return Trainer(dataclasses.replace(TINY, env="toy_choice"), env=ToyChoice())


def test_a_discrete_env_gets_the_categorical_head(trainer):
    assert isinstance(trainer.actor, networks.CategoricalActor)
    assert trainer.head == networks.Categorical(3) and trainer.vec_env.action_space.n == 3
    params = trainer.init(jax.random.PRNGKey(0)).params["actor"]
    assert networks.action_space_of(params) == spaces.Discrete(3)
    # A continuous env keeps the Gaussian actor, with the parameters it always had.
    continuous = Trainer(TINY)
    assert continuous.head == networks.Gaussian(2)
    assert "log_std" in continuous.init(jax.random.PRNGKey(0)).params["actor"]


def test_categorical_log_ratio_and_tv_estimate_by_hand():
    learner = networks.Categorical(3).distribution({"logits": LEARNER_LOGITS})
    behavior = networks.Categorical(3).distribution({"logits": BEHAVIOR_LOGITS})
    log_ratio = learner.log_prob(ACTIONS) - behavior.log_prob(ACTIONS)
    np.testing.assert_allclose(log_ratio, [0.928766, 1.0], atol=2e-6)
    diagnostics = objectives.ratio_diagnostics(learner.log_prob(ACTIONS), behavior.log_prob(ACTIONS),
                                               clip_eps=0.2)
    # ½ mean |w − 1| = ½ (1.531385 + 1.718282) / 2
    np.testing.assert_allclose(diagnostics["tv_estimate"], 0.812417, atol=2e-6)
    assert float(diagnostics["clip_fraction"]) == 1.0
    np.testing.assert_allclose(diagnostics["max_ratio"], RATIOS[1], rtol=2e-6)


def minibatch(log_behavior):
    return trainer_lib.LearnerBatch(
        obs=None, next_obs=None, action=ACTIONS, reward=None, terminated=None, truncated=None,
        log_behavior=log_behavior, behavior={"logits": BEHAVIOR_LOGITS},
        log_learner_start=log_behavior, advantages=None, targets=None)


def objective(trainer, algo, **hparams):
    """The trainer's policy objective for `algo` on the two samples, and its metrics."""
    trainer = Trainer(dataclasses.replace(trainer.config, algo=algo), env=ToyChoice())
    dist = trainer.head.distribution({"logits": LEARNER_LOGITS})
    log_behavior = trainer.head.distribution({"logits": BEHAVIOR_LOGITS}).log_prob(ACTIONS)
    hp = dataclasses.replace(trainer.config, **hparams).hparams()
    inputs = trainer.policy_inputs(dist.log_prob(ACTIONS), minibatch(log_behavior), ADVANTAGES,
                                   dist)
    return trainer.algorithm.objective(inputs, trainer.objective_params(hp, hp.kl_coef))


def test_ppo_kl_uses_the_categorical_distributions_analytic_kl(trainer):
    np.testing.assert_allclose(
        distrax.Categorical(logits=BEHAVIOR_LOGITS).kl_divergence(
            distrax.Categorical(logits=LEARNER_LOGITS)), KL, atol=2e-6)
    loss, metrics = objective(trainer, "ppo_kl", kl_coef=0.1)
    np.testing.assert_allclose(metrics["kl_penalty"], KL.mean(), atol=2e-6)   # 0.551038
    # −mean(w Â) + β_KL · mean KL = −(2.531385 − 1.359141) / 2 + 0.1 · 0.551038
    np.testing.assert_allclose(loss, -0.531018, atol=2e-6)


def test_spo_objective_on_the_categorical_ratio_by_hand(trainer):
    loss, _ = objective(trainer, "spo", clip_eps=0.2)
    # −mean(w Â − |Â| (w − 1)² / (2ε)):
    #   sample 1: 2.531385 − 1.531385² / 0.4 = −3.331465
    #   sample 2: −0.5 · 2.718282 − 0.5 · 1.718282² / 0.4 = −5.049756
    np.testing.assert_allclose(loss, 4.190611, atol=5e-6)


def test_vaco_filter_and_ppo_clip_on_the_categorical_ratio(trainer):
    # D̂_TV = 0.812417 > δ = 0.2: the outward sample (Â > 0, w > 1) is dropped, the other kept.
    loss, metrics = objective(trainer, "vaco", delta=0.2)
    np.testing.assert_allclose(metrics["filter_tv"], 0.812417, atol=2e-6)
    assert float(metrics["filtered_fraction"]) == 0.5
    np.testing.assert_allclose(loss, -(RATIOS[1] * -0.5) / 2, rtol=2e-6)
    loss, _ = objective(trainer, "ppo_clip", clip_eps=0.2)
    # min(wÂ, clip(w)Â): sample 1 → 1.2 · 1, sample 2 → 2.718282 · (−0.5)
    np.testing.assert_allclose(loss, -(1.2 - 0.5 * RATIOS[1]) / 2, rtol=2e-6)


def test_rollout_stores_the_logits_and_samples_each_steps_categorical(trainer):
    state, key = trainer.init(jax.random.PRNGKey(0)), jax.random.PRNGKey(1)
    _, traj = jax.jit(lambda s, k: _rollout(trainer, s, k))(state, key)
    assert set(traj.behavior) == {"logits"} and traj.action.dtype == jnp.int32
    for t, step_key in enumerate(jax.random.split(key, TINY.unroll_length)):
        action_key, _ = jax.random.split(step_key)
        logits = traj.behavior["logits"][t]
        np.testing.assert_array_equal(
            traj.action[t], distrax.Categorical(logits=logits).sample(seed=action_key))
        np.testing.assert_allclose(traj.log_behavior[t], jax.nn.log_softmax(logits)[
            np.arange(TINY.num_envs), traj.action[t]], rtol=1e-6)
    assert np.all(np.isin(np.asarray(traj.reward), [0.0, 1.0]))


def test_discrete_actions_reach_the_env_unclipped():
    # The [-1, 1] clip is for continuous actions: arm 2 must arrive as 2 (it paid 0 when clipped
    # to 1).
    vec_env = envs.VecEnv(AlwaysTwo(), num_envs=4, episode_length=10)
    state = vec_env.reset(jax.random.PRNGKey(3))
    _, result = vec_env.step(state, jnp.full(4, 2, jnp.int32), jax.random.PRNGKey(4))
    np.testing.assert_array_equal(result.reward, 1.0)


def test_a_discrete_policy_acts_with_its_likeliest_choice_or_a_sample(trainer):
    params = trainer.init(jax.random.PRNGKey(0)).params["actor"]
    params = jax.tree.map(lambda x: x * 300.0, params)   # decisive logits
    trained = policy.Policy(params, networks.init_normalizer(3), trainer.actor, trainer.config)
    obs = jax.nn.one_hot(jnp.array([0, 1, 2, 1]), 3)
    logits = trainer.actor.apply({"params": params}, obs)["logits"]
    assert trained.action_space == spaces.Discrete(3)
    np.testing.assert_array_equal(jax.jit(trained.act)(obs), jnp.argmax(logits, axis=-1))
    sampled = trained.act(obs, jax.random.PRNGKey(5))
    assert sampled.dtype == jnp.int32 and np.all((0 <= sampled) & (sampled < 3))
    # The evaluation acts the same way: with arm 2 always paying, a mode of arm 2 earns 1 per
    # episode (unclipped), a mode of arm 0 nothing.
    always_two = Trainer(trainer.config, env=AlwaysTwo())
    evaluate = jax.jit(always_two.evaluate)
    for arm, expected in ((2, 1.0), (0, 0.0)):
        constant = jax.tree.map(jnp.zeros_like, params)
        constant["MLP_0"]["Dense_2"]["bias"] = 5.0 * jax.nn.one_hot(arm, 3)
        eval_return, _ = evaluate(constant, networks.init_normalizer(3), jax.random.PRNGKey(6))
        assert float(eval_return) == expected


def test_the_random_policy_of_a_discrete_env_draws_each_action_alike():
    # ToyChoice pays 1 for one arm of three: a uniformly random policy's return is 1/3.
    from vaco_jax.study import references

    register_env("toy_choice_random", ToyChoice)
    mean, sem = references.random_policy_return("toy_choice_random", episode_length=1,
                                                num_episodes=16384)
    assert abs(mean - 1 / 3) < 4 * sem and sem < 0.01
