"""The fused trainer: determinism, seed vmapping, hyper-parameter vmapping, C = 1 semantics."""

import dataclasses
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vaco_jax import Config, ConfigError, Trainer, stack_hparams
from vaco_jax import advantages as adv_lib
from vaco_jax import envs, networks, program, ring_buffer, rollout
from vaco_jax import trainer as trainer_lib
from vaco_jax.trainer import make_optimizer

TINY = Config(env="toy_reach", algo="vaco", num_envs=8, unroll_length=8, num_epochs=2,
              num_minibatches=2, num_actors=2, episode_length=20, total_steps=8 * 8 * 2 * 4,
              num_evals=4, eval_envs=4, actor_hidden=(16, 16), critic_hidden=(16, 16),
              capacity=3, max_capacity=4)


@pytest.fixture(scope="module")
def vaco():
    trainer = Trainer(TINY)
    return trainer, jax.jit(trainer.train)


def test_same_key_gives_identical_metrics(vaco):
    _, train = vaco
    state_a, metrics_a = train(jax.random.PRNGKey(3))
    state_b, metrics_b = train(jax.random.PRNGKey(3))
    chex.assert_trees_all_equal(metrics_a, metrics_b)
    chex.assert_trees_all_equal(state_a.params, state_b.params)
    _, metrics_c = train(jax.random.PRNGKey(4))
    assert not np.allclose(metrics_a["eval_return"], metrics_c["eval_return"])


def test_seed_i_of_a_vmapped_run_equals_a_single_run(vaco):
    trainer, train = vaco
    keys = jnp.stack([jax.random.PRNGKey(i) for i in range(3)])
    states, metrics = jax.jit(jax.vmap(trainer.train))(keys)
    for i in range(3):
        single_state, single_metrics = train(keys[i])
        chex.assert_trees_all_close(jax.tree.map(lambda x: x[i], (metrics, states.params)),
                                    (single_metrics, single_state.params), rtol=1e-5, atol=1e-6)


def test_hyperparameters_vmap_like_separate_runs(vaco):
    trainer, train = vaco
    key = jax.random.PRNGKey(7)
    variants = [dataclasses.replace(TINY, capacity=1, delta=0.05).hparams(),
                dataclasses.replace(TINY, capacity=4, delta=0.5, learning_rate=1e-3).hparams()]
    _, batched = jax.jit(jax.vmap(trainer.train, in_axes=(None, 0)))(key, stack_hparams(variants))
    for i, hparams in enumerate(variants):
        _, single = train(key, hparams)
        chex.assert_trees_all_close(jax.tree.map(lambda x: x[i], batched), single, rtol=1e-5,
                                    atol=1e-6)
    # The capacity leaf really changes the lag: C = 1 is on-policy, C = 4 is not.
    assert np.all(batched["snapshot_age"][0] == 0) and np.all(batched["behavior_tv"][0] < 1e-5)
    assert batched["snapshot_age"][1, -1] > 0.5 and batched["behavior_tv"][1, -1] > 1e-3


def test_snapshot_age_follows_the_buffer():
    # Oldest-snapshot sampling with C = 3: the lag grows 0, 1, 2 and then stays at C − 1 = 2.
    config = dataclasses.replace(TINY, snapshot_sampling="oldest", total_steps=8 * 8 * 6,
                                 num_evals=6)
    trainer = Trainer(config)
    state = trainer.init(jax.random.PRNGKey(0))
    ages = []
    iterate = jax.jit(trainer.iteration)
    for _ in range(5):
        state, metrics = iterate(state)
        ages.append(float(metrics["snapshot_age"]))
    assert ages == [0.0, 1.0, 2.0, 2.0, 2.0]
    assert int(state.buffer.num_pushed) == 6


def _rollout(trainer, state, key):
    snapshots, _ = ring_buffer.sample(state.buffer, jax.random.PRNGKey(2), TINY.num_actors,
                                      "uniform")
    env_state = trainer.vec_env.start(state.env_state, jax.random.PRNGKey(3))
    return rollout.collect(trainer.vec_env, trainer.actor, env_state, snapshots, key,
                           unroll_length=TINY.unroll_length, num_actors=TINY.num_actors,
                           normalize_obs=True)


def test_rollout_actions_are_the_policy_samples_of_each_step_key(vaco):
    # The noise is drawn before the loop; each action is still the Gaussian's own sample for its
    # step's key (so seeded runs are unchanged by where the draw happens).
    trainer, _ = vaco
    state, key = trainer.init(jax.random.PRNGKey(0)), jax.random.PRNGKey(1)
    _, traj = jax.jit(lambda s, k: _rollout(trainer, s, k))(state, key)
    chex.assert_tree_shape_prefix(traj, (TINY.unroll_length, TINY.num_envs))   # time-major
    for t, step_key in enumerate(jax.random.split(key, TINY.unroll_length)):
        action_key, _ = jax.random.split(step_key)
        behavior = jax.tree.map(lambda x: x[t], traj.behavior)   # {"loc", "scale"}
        sample = networks.gaussian(behavior["loc"], behavior["scale"]).sample(seed=action_key)
        np.testing.assert_array_equal(traj.action[t], sample)


def test_the_compiled_rollout_holds_one_copy_of_the_gaussian_sampler(vaco):
    # Drawn inside the loop, XLA copied the sampler (threefry, inverse error function) into each
    # fusion that used the action: ten computations of this rollout held it.
    trainer, _ = vaco
    state = trainer.init(jax.random.PRNGKey(0))
    hlo = jax.jit(lambda s, k: _rollout(trainer, s, k)).lower(state, jax.random.PRNGKey(1))
    computations = hlo.compile().as_text().split("\n\n")
    assert sum("erf_inv" in computation for computation in computations) == 1


def test_the_programs_of_a_run_trace_the_env_once():
    # The initial state (its shape while building, then its program), the learner (its first
    # reset, rollout and pool refill) and the evaluation all reset and step the env; each program
    # used to trace MJX's reset (a forward pass) and step afresh, and the build traced the reset
    # twice more (for the observation size, and on arguments placed unlike the program's).
    calls = {"reset": 0, "step": 0}

    class CountedToyReach(envs.ToyReach):
        def reset(self, rng):
            calls["reset"] += 1
            return super().reset(rng)

        def step(self, state, action):
            calls["step"] += 1
            return super().step(state, action)

        @property
        def observation_size(self):   # as Brax's envs answer it: from a reset
            return self.reset(jax.random.PRNGKey(0)).obs.shape[-1]

    # A config of its own, so no program built by another test (with another env) is reused.
    config = dataclasses.replace(TINY, episode_length=21)
    built = program.TrainProgram.build(config, 2, env=CountedToyReach(), store=False)
    built.init.trace(*built.layout.put((program.seed_keys(range(2)),
                                         stack_hparams([config.hparams()] * 2))))
    state = built.abstract_state
    built.learn.trace(state)
    built.evaluate.trace(state.params["actor"], state.normalizer, state.key)
    assert calls == {"reset": 1, "step": 1}
    # Inside a program, the env behind `TracedOnce` computes what the env computes.
    def episode_start(env, key):
        return env.step(env.reset(key), jnp.full((env.action_size,), 0.3))

    raw, wrapped = CountedToyReach(), envs.TracedOnce(CountedToyReach())
    key = jax.random.PRNGKey(5)
    chex.assert_trees_all_equal(jax.jit(episode_start, static_argnums=0)(wrapped, key),
                                jax.jit(episode_start, static_argnums=0)(raw, key))


def _calls_of(jaxpr, name: str) -> int:
    """Calls of the jitted function `name` in `jaxpr` and the jaxprs nested in it."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.params.get("name") == name
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    count += _calls_of(sub.jaxpr, name)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    count += _calls_of(sub, name)
    return count


def test_the_initial_state_runs_no_reset_and_the_first_iteration_starts_the_envs(vaco):
    # A new run's initial state only shapes its envs (it used to reset them: on MJX a program of
    # its own, compiled on every cold start); the first iteration resets them with its own key.
    trainer, _ = vaco
    key = jax.random.PRNGKey(6)
    assert _calls_of(jax.make_jaxpr(trainer.init)(key).jaxpr, "reset") == 0
    assert _calls_of(jax.make_jaxpr(trainer.iteration)(trainer.init(key)).jaxpr, "reset") == 2
    state = trainer.init(key)
    assert not bool(state.env_state.started)
    iterate = jax.jit(trainer.iteration)
    started, metrics = iterate(state)
    assert bool(started.env_state.started)
    start_key = jax.random.split(state.key, 5)[1]
    reset = state.replace(env_state=trainer.vec_env.reset(start_key))
    chex.assert_trees_all_equal(iterate(reset), (started, metrics))
    # Started envs are left as they are: the next iteration steps on from them.
    again = trainer.vec_env.start(started.env_state, jax.random.PRNGKey(0))
    chex.assert_trees_all_equal(again, started.env_state)


def test_capacity_one_vaco_without_filter_is_importance_sampled_pg_with_gae():
    """C = 1 VACO with δ = ∞ takes exactly the update of −E[w Â_GAE] (one epoch, one minibatch)."""
    config = dataclasses.replace(TINY, capacity=1, max_capacity=0, delta=math.inf, num_epochs=1,
                                 num_minibatches=1)
    trainer = Trainer(config)
    state = trainer.init(jax.random.PRNGKey(11))
    # Run a few iterations first, so the normaliser and critic are not at their initial values.
    iterate = jax.jit(trainer.iteration)
    for _ in range(3):
        state, _ = iterate(state)
    next_state, metrics = iterate(state)

    # The same update, written directly from the definitions.
    hp = state.hparams
    _, _, sample_key, rollout_key, _ = jax.random.split(state.key, 5)
    snapshots, ages = ring_buffer.sample(state.buffer, sample_key, config.num_actors, "uniform")
    assert np.all(np.asarray(ages) == 0)
    _, traj = rollout.collect(trainer.vec_env, trainer.actor, state.env_state, snapshots,
                              rollout_key, unroll_length=config.unroll_length,
                              num_actors=config.num_actors, normalize_obs=True)
    obs = networks.normalize(traj.obs, state.normalizer, True)
    next_obs = networks.normalize(traj.next_obs, state.normalizer, True)
    critic = lambda p, o: trainer.critic.apply({"params": p["critic"]}, o)  # noqa: E731
    values, next_values = critic(state.params, obs), critic(state.params, next_obs)
    advantages = adv_lib.gae(traj.reward * hp.reward_scale, values, next_values, traj.terminated, traj.truncated,
                             gamma=hp.gamma, lambda_=hp.gae_lambda)
    targets = advantages + values
    normalized = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    def loss(params):
        out = trainer.actor.apply({"params": params["actor"]}, obs)
        log_prob = networks.gaussian(out["loc"], out["scale"]).log_prob(traj.action)
        ratio = jnp.exp(log_prob - traj.log_behavior)
        return -jnp.mean(ratio * normalized) + hp.vf_coef * 0.5 * jnp.mean(
            (critic(params, obs) - targets) ** 2)

    optimizer = make_optimizer(hp, hp.learning_rate)
    updates, _ = optimizer.update(jax.grad(loss)(state.params), state.opt_state, state.params)
    expected = optax.apply_updates(state.params, updates)
    assert float(metrics["behavior_tv"]) < 1e-6  # C = 1: the behaviour is the learner
    assert float(metrics["filtered_fraction"]) == 0.0
    chex.assert_trees_all_close(next_state.params, expected, rtol=2e-4, atol=1e-6)


def test_capacity_one_vaco_matches_unclipped_ppo_over_a_run():
    """Over several K × M iterations, C = 1 VACO (δ = ∞) follows PPO-Clip with ε = ∞ (GAE, w Â)."""
    base = dataclasses.replace(TINY, capacity=1, max_capacity=0, delta=math.inf, clip_eps=1e9)
    _, vaco_metrics = jax.jit(Trainer(base).train)(jax.random.PRNGKey(5))
    _, ppo_metrics = jax.jit(Trainer(dataclasses.replace(base, algo="ppo_clip")).train)(
        jax.random.PRNGKey(5))
    for key in ["eval_return", "policy_loss", "value_loss", "approx_kl"]:
        np.testing.assert_allclose(vaco_metrics[key], ppo_metrics[key], rtol=1e-3, atol=1e-5,
                                   err_msg=key)


def test_capacity_one_decoupled_ppo_is_ppo_clip_and_stale_data_is_reweighted():
    """At C = 1 the proximal policy π_T is the behaviour policy (log π_T is log β bit for bit), so
    decoupled PPO is PPO-Clip exactly; with stale snapshots (C = 3) π_T/β ≠ 1 and, with the cap at
    1, a share of the samples is capped (none when π_T is β)."""
    config = dataclasses.replace(TINY, capacity=1, max_capacity=0, decoupled_is_max=1.0)
    runs = {(algo, c): jax.jit(Trainer(dataclasses.replace(config, algo=algo, capacity=c)).train)(
        jax.random.PRNGKey(3)) for algo, c in [("ppo_clip", 1), ("decoupled_ppo", 1),
                                               ("decoupled_ppo", 3)]}
    chex.assert_trees_all_equal(runs["decoupled_ppo", 1][0].params, runs["ppo_clip", 1][0].params)
    assert np.all(runs["decoupled_ppo", 1][1]["behavior_capped_fraction"] == 0.0)
    assert np.all(runs["decoupled_ppo", 3][1]["behavior_capped_fraction"][1:] > 0.1)


# (The five named algorithms also learn, with finite metrics, in test_learning.py.)
@pytest.mark.parametrize("algo", ["gae+tv_filter", "vtrace_once+clip", "vtrace_every+tv_filter"])
def test_every_pairing_runs_and_reports_finite_metrics(algo):
    config = dataclasses.replace(TINY, algo=algo, total_steps=8 * 8 * 2, num_evals=2)
    _, metrics = jax.jit(Trainer(config).train)(jax.random.PRNGKey(0))
    for key in ["loss", "policy_loss", "value_loss", "tv_estimate", "eval_return"]:
        assert np.all(np.isfinite(metrics[key])), key
    assert metrics["env_steps"][-1] == config.env_steps


class BlowUpBandit(envs.ToyBandit):
    """toy_bandit whose episode ends in a NaN reward and observation when the action exceeds 0.5,
    as a physics blow-up ends a DM Control episode."""

    def step(self, state, action):
        state = super().step(state, action)
        blown = action[0] > 0.5
        return state.replace(obs=jnp.where(blown, jnp.nan, state.obs),
                             reward=jnp.where(blown, jnp.nan, state.reward))


def test_episodes_ending_in_nan_are_counted_and_do_not_poison_the_update():
    # A NaN reward, or the NaN final observation's value (multiplied by a zero discount), used to
    # make the advantages and the loss NaN: the divergence guard then froze the seed.
    trainer = Trainer(dataclasses.replace(TINY, env="toy_bandit"), env=BlowUpBandit())
    state, metrics = jax.jit(trainer.learn_chunk)(trainer.init(jax.random.PRNGKey(0)))
    assert trainer_lib.nonfinite_names(state.health.nonfinite) == []
    for name in ("loss", "policy_loss", "value_loss", "train_return"):
        assert np.isfinite(metrics[name]), name
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state.params))
    steps = TINY.iterations_per_eval * TINY.unroll_length * TINY.num_envs   # one episode each
    assert 0 < float(metrics["nonfinite_episodes"]) < steps


def test_evaluations_reach_a_callback_per_evaluation_with_every_seed_and_the_policy_acts(vaco):
    # A notebook draws its curve while the run learns: `on_evaluation` gets each evaluation's
    # metrics once, with a [seeds] axis under vmap; the numbers are the run's own.
    _, train = vaco
    reports = []
    watched = Trainer(TINY, on_evaluation=reports.append)
    keys = jnp.stack([jax.random.PRNGKey(i) for i in range(2)])
    states, metrics = jax.jit(jax.vmap(watched.train))(keys)
    jax.effects_barrier()
    assert len(reports) == TINY.num_evals
    for i, report in enumerate(reports):
        assert isinstance(report["eval_return"], np.ndarray) and report["eval_return"].shape == (2,)
        np.testing.assert_array_equal(report["eval_return"], metrics["eval_return"][:, i])
        np.testing.assert_array_equal(report["env_steps"], metrics["env_steps"][:, i])
    single_state, single = train(keys[1])
    chex.assert_trees_all_close(jax.tree.map(lambda x: x[1], metrics), single, rtol=1e-5,
                                atol=1e-6)
    # Off, nothing is added to the program.
    assert "callback" in jax.jit(watched.train).lower(keys[0]).as_text()
    assert "callback" not in jax.jit(Trainer(TINY).train).lower(keys[0]).as_text()

    # The in-memory state's policy acts without a file, one run's or one of several.
    from vaco_jax import Policy
    policy = Policy.from_state(TINY, single_state)
    assert policy.index == 0 and policy.diverged is None and policy.meta["seeds"] == [0]
    obs = jax.random.normal(jax.random.PRNGKey(9), (5, 4))
    mean = watched.actor.apply({"params": single_state.params["actor"]},
                               networks.normalize(obs, single_state.normalizer, True))["loc"]
    np.testing.assert_allclose(jax.jit(policy.act)(obs), jnp.clip(mean, -1.0, 1.0), rtol=1e-5,
                               atol=1e-7)
    second = Policy.from_state(TINY, states, seed=1)
    chex.assert_trees_all_equal(second.params,
                                jax.tree.map(lambda x: x[1], states.params["actor"]))
    assert second.meta["env_steps"] == TINY.env_steps and second.meta["num_seeds"] == 2
    with pytest.raises(ConfigError, match="`seed` = 2 is invalid: must be in 0..1"):
        Policy.from_state(TINY, states, seed=2)
