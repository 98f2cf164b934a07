"""What the π_T-anchored objectives read under lag: β and π_T on a stale batch, each with its own
observation-normaliser statistics, and the diagnostics of their weights ρ = π_T/β."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from vaco_jax import Config, Trainer, diagnostics, networks, ring_buffer, rollout

LAG = 2
CONFIG = Config(env="toy_reach", algo="decoupled_ppo", num_envs=8, unroll_length=8,
                num_epochs=2, num_minibatches=2, num_actors=2, episode_length=20,
                total_steps=8 * 8 * 8, num_evals=1, eval_envs=4, actor_hidden=(16, 16),
                critic_hidden=(16, 16), capacity=LAG + 1, snapshot_sampling="oldest",
                learning_rate=3e-3)


def test_a_stale_batch_is_read_with_each_policys_own_normaliser():
    """At lag k the rollout stores raw observations; β is the snapshot of k iterations ago acting
    on them normalised with *its* statistics, and π_T (the anchor of decoupled PPO, IcePop, M2PO
    and VACO's ρ) is the learner's parameters on them normalised with the *learner's*. The
    iteration's `behavior_kl` and `behavior_tv` are recomputed here from the states of k
    iterations ago and of now."""
    assert CONFIG.normalize_observations
    trainer = Trainer(CONFIG)
    iterate = jax.jit(trainer.iteration)
    history = [trainer.init(jax.random.PRNGKey(0))]
    for _ in range(5):
        history.append(iterate(history[-1])[0])
    state, stale = history[-1], history[-1 - LAG]   # π_T's state; β's: k iterations earlier
    _, metrics = iterate(state)

    # The iteration's rollout, from its own keys.
    _, _, sample_key, rollout_key, _ = jax.random.split(state.key, 5)
    snapshots, ages = ring_buffer.sample(state.buffer, sample_key, CONFIG.num_actors, "oldest")
    assert np.all(np.asarray(ages) == LAG)
    _, traj = rollout.collect(trainer.vec_env, trainer.actor, state.env_state, snapshots,
                              rollout_key, unroll_length=CONFIG.unroll_length,
                              num_actors=CONFIG.num_actors, normalize_obs=True)

    def policy(params, normalizer, obs):
        out = trainer.actor.apply({"params": params["actor"]},
                                  networks.normalize(obs, normalizer, True))
        return networks.gaussian(out["loc"], out["scale"])

    behavior = policy(stale.params, stale.normalizer, traj.obs)
    learner = policy(state.params, state.normalizer, traj.obs)
    np.testing.assert_allclose(traj.log_behavior, behavior.log_prob(traj.action), rtol=1e-5,
                               atol=1e-5)
    log_rho = learner.log_prob(traj.action) - traj.log_behavior
    expected_tv = 0.5 * float(jnp.mean(jnp.abs(jnp.exp(log_rho) - 1.0)))
    expected_kl = float(jnp.mean(behavior.kl_divergence(learner)))
    np.testing.assert_allclose(float(metrics["behavior_tv"]), expected_tv, rtol=1e-4)
    np.testing.assert_allclose(float(metrics["behavior_kl"]), expected_kl, rtol=1e-4)

    # The statistics moved over the k iterations enough that reading π_T with β's (or β with
    # the learner's) would change the measured lag: the check above can tell them apart.
    wrong = policy(state.params, stale.normalizer, traj.obs)
    wrong_tv = 0.5 * float(jnp.mean(jnp.abs(
        jnp.exp(wrong.log_prob(traj.action) - traj.log_behavior) - 1.0)))
    assert abs(wrong_tv - expected_tv) > 1e-2 * expected_tv
    assert not np.allclose(traj.log_behavior,
                           policy(stale.params, state.normalizer, traj.obs).log_prob(traj.action),
                           rtol=1e-3, atol=1e-3)


def test_behavior_weight_summary_against_a_python_loop():
    rng = np.random.default_rng(0)
    log_rho = rng.normal(0.0, 1.2, size=(16, 8)).astype(np.float32)
    got = diagnostics.behavior_weight_summary(jnp.asarray(log_rho), jnp.zeros_like(log_rho))
    rho = [float(np.exp(x)) for x in log_rho.reshape(-1)]
    n = len(rho)

    def ess(w):
        return sum(w) ** 2 / (n * sum(x * x for x in w))

    np.testing.assert_allclose(got["rho_below_low"], sum(r < 0.5 for r in rho) / n)
    np.testing.assert_allclose(got["rho_above_high"], sum(r > 2.0 for r in rho) / n)
    np.testing.assert_allclose(got["ess_rho"], ess(rho), rtol=1e-5)
    np.testing.assert_allclose(got["ess_truncated"], ess([min(r, 2.0) for r in rho]), rtol=1e-5)
    np.testing.assert_allclose(got["ess_masked"],
                               ess([r if 0.5 <= r <= 2.0 else 0.0 for r in rho]), rtol=1e-5)
    np.testing.assert_allclose(got["mean_truncated_weight"],
                               sum(min(r, 2.0) for r in rho) / n, rtol=1e-5)
    # On-policy: every weight is 1.
    same = diagnostics.behavior_weight_summary(jnp.asarray(log_rho), jnp.asarray(log_rho))
    assert float(same["rho_below_low"]) == 0.0 and float(same["rho_above_high"]) == 0.0
    np.testing.assert_allclose([same["ess_rho"], same["ess_truncated"], same["ess_masked"]], 1.0)
    # A masked entry counts for nothing, whatever it holds.
    mask = np.ones_like(log_rho)
    mask[0] = 0
    poisoned = log_rho.copy()
    poisoned[0] = np.nan
    masked = diagnostics.behavior_weight_summary(jnp.asarray(poisoned), jnp.zeros_like(log_rho),
                                                 mask=jnp.asarray(mask))
    expected = diagnostics.behavior_weight_summary(jnp.asarray(log_rho[1:]),
                                                   jnp.zeros_like(log_rho[1:]))
    for name in expected:
        np.testing.assert_allclose(masked[name], expected[name], rtol=1e-5)
