"""Lag diagnostics (vaco_jax.diagnostics, docs/diagnostics.md): the update-age distribution against a
hand computation and an enumeration of every sample use, the TV split at its zeros, and the
intervened fraction as the objective's own key."""

import dataclasses
import itertools

import chex

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vaco_jax import Config, Trainer, diagnostics, objectives, ring_buffer, rollout, stack_hparams

TINY = Config(env="toy_reach", algo="vaco", num_envs=8, unroll_length=8, num_epochs=2,
              num_minibatches=2, num_actors=2, episode_length=20, total_steps=8 * 8 * 2 * 4,
              num_evals=4, eval_envs=4, actor_hidden=(16, 16), critic_hidden=(16, 16),
              capacity=3, max_capacity=4)


def test_update_age_by_hand():
    # Two actors, snapshot ages 0 and 2 (iterations); K = 2 epochs × M = 2 minibatches, so a
    # sample of age a is used at a·4 + 0, 1, 2, 3 optimiser steps: {0, 1, 2, 3} and {8, ..., 11}.
    m = diagnostics.update_age_metrics(jnp.array([0, 2]), num_epochs=2, num_minibatches=2, slots=3)
    assert [b[2] for b in diagnostics.age_bins(3, 2, 2)] == [
        "update_age_hist_0_0", "update_age_hist_1_1", "update_age_hist_2_3", "update_age_hist_4_7",
        "update_age_hist_8_15"]   # the oldest possible age is 3·4 − 1 = 11
    assert float(m["update_age_mean"]) == 5.5              # (1.5 + 9.5) / 2
    assert float(m["update_age_p50"]) == 3.0               # 4 of the 8 uses are ≤ 3
    assert float(m["update_age_p90"]) == 11.0
    assert float(m["update_age_max"]) == 11.0
    np.testing.assert_array_equal(
        [float(m[f"update_age_hist_{lo}_{hi}"]) for lo, hi in
         [(0, 0), (1, 1), (2, 3), (4, 7), (8, 15)]], [1 / 8, 1 / 8, 2 / 8, 0.0, 4 / 8])


@pytest.mark.parametrize("ages, epochs, minibatches, slots", [
    ([0, 0, 0, 0], 4, 8, 1), ([3, 1, 1, 0, 3, 2], 3, 5, 4), ([5, 5, 2], 1, 1, 6),
    ([0, 7, 7, 7, 1], 10, 32, 8)])
def test_update_age_equals_an_enumeration_of_every_sample_use(ages, epochs, minibatches, slots):
    # Each actor's samples are used once at every step e·M + m of the iteration (on average over
    # the shuffle): enumerate (actor, epoch, minibatch) and compare.
    steps = epochs * minibatches
    uses = np.array([a * steps + e * minibatches + m for a, e, m in
                     itertools.product(ages, range(epochs), range(minibatches))])
    got = jax.jit(diagnostics.update_age_metrics, static_argnums=(1, 2, 3))(
        jnp.array(ages), epochs, minibatches, slots)
    np.testing.assert_allclose(got["update_age_mean"], uses.mean(), rtol=1e-6)
    assert float(got["update_age_max"]) == uses.max()
    for q in diagnostics.AGE_QUANTILES:
        assert float(got[f"update_age_p{q}"]) == np.percentile(uses, q, method="inverted_cdf"), q
    bins = diagnostics.age_bins(slots, epochs, minibatches)
    counts, _ = np.histogram(uses, [lo for lo, _, _ in bins] + [bins[-1][1] + 1])
    np.testing.assert_allclose([got[name] for _, _, name in bins], counts / uses.size, atol=1e-7)
    assert bins[-1][1] >= slots * steps - 1                  # every possible age has a bin


def test_update_age_max_is_the_oldest_use_not_a_bound():
    # Ages 2 and 0, K = 2 × M = 2. In the last epoch the old group's samples all fall in
    # minibatch 0, so its oldest use is step (K − 1)·M + 0 = 2 of block 2: 2·4 + 2 = 10, not 11.
    m = diagnostics.update_age_metrics(jnp.array([2, 0]), num_epochs=2, num_minibatches=2,
                                       slots=3, last_minibatch=jnp.array([0, 1]))
    assert float(m["update_age_max"]) == 10.0
    assert float(m["update_age_mean"]) == 5.5                # the distribution is unchanged


def test_a_runs_update_age_max_reads_the_last_epochs_shuffle():
    # One env per actor group and per minibatch, groups of different ages (uniform sampling): the
    # oldest group's env is often not in the last minibatch, and the maximum says so.
    config = dataclasses.replace(TINY, num_envs=4, num_actors=4, num_minibatches=4,
                                 total_steps=4 * 8 * 12, num_evals=1)
    trainer = Trainer(config)
    learn = jax.jit(lambda state: trainer.learn_chunk(state, per_iteration=True)[2])
    metrics = learn(trainer.init(jax.random.PRNGKey(0)))             # [12 iterations]
    steps, epochs_before_last = 2 * 4, 1 * 4
    oldest = np.asarray(metrics["snapshot_age_max"]).ravel() * steps
    age_max = np.asarray(metrics["update_age_max"]).ravel()
    assert np.all(age_max >= oldest + epochs_before_last)   # within the last epoch's block
    assert np.all(age_max <= oldest + steps - 1)
    assert np.any(age_max < oldest + steps - 1)              # below the bound K·M − 1


def test_intervened_fraction_is_the_objectives_own_key():
    assert diagnostics.intervened_fraction({"filtered_fraction": 0.3, "filter_tv": 0.1}) == {
        "intervened_fraction": 0.3}
    assert diagnostics.intervened_fraction({"truncated_fraction": 0.2}) == {
        "intervened_fraction": 0.2}
    assert diagnostics.intervened_fraction({"masked_fraction": 0.4}) == {"intervened_fraction": 0.4}
    # An objective with several rules reports their union itself, which comes first.
    assert diagnostics.intervened_fraction({"clip_fraction": 0.1, "masked_fraction": 0.5,
                                            "intervened_fraction": 0.55}) == {
        "intervened_fraction": 0.55}
    assert diagnostics.intervened_fraction({"kl_penalty": 0.1}) == {}


def test_tv_forward_is_the_filters_divergence_from_the_learner():
    key = jax.random.PRNGKey(0)
    log_prob, log_start, log_behavior = 0.3 * jax.random.normal(key, (3, 16, 8))
    advantages = jnp.ones((16, 8))
    _, m = objectives.tv_filter(log_prob, log_behavior, advantages, delta=0.2,
                                log_reference=log_start)
    assert float(diagnostics.tv_forward(log_prob, log_start, log_behavior)) == float(m["filter_tv"])
    # β = π_T: ½ mean |π_θ/π_T − 1|; π_θ = π_T: 0.
    np.testing.assert_allclose(diagnostics.tv_forward(log_prob, log_start, log_start),
                               0.5 * np.mean(np.abs(np.exp(log_prob - log_start) - 1)), rtol=1e-5)
    assert float(diagnostics.tv_forward(log_start, log_start, log_behavior)) == 0.0


@pytest.fixture(scope="module")
def stale_batch():
    """TINY after 3 iterations at capacity 3, then the next iteration's acting (every actor with
    the oldest snapshot, 2 iterations old) and realignment: (trainer, state, snapshot ages, lag
    metrics, the first minibatch)."""
    trainer = Trainer(TINY)
    config = trainer.config
    state = trainer.init(jax.random.PRNGKey(0))
    step = jax.jit(trainer.iteration)
    for _ in range(3):
        state, _ = step(state)

    @jax.jit
    def act_and_realign(state):
        started = trainer.vec_env.start(state.env_state, jax.random.PRNGKey(1))
        snapshots, ages = ring_buffer.sample(state.buffer, jax.random.PRNGKey(2),
                                             config.num_actors, "oldest")
        _, traj = rollout.collect(trainer.vec_env, trainer.actor, started, snapshots,
                                  jax.random.PRNGKey(3), unroll_length=config.unroll_length,
                                  num_actors=config.num_actors,
                                  normalize_obs=config.normalize_observations)
        batch, lag = trainer.realign(state.params, state.normalizer, traj, state.hparams)
        return ages, lag, batch

    ages, lag, batch = act_and_realign(state)
    minibatch = jax.tree.map(lambda x: x[:, : config.num_envs // config.num_minibatches], batch)
    return trainer, state, ages, lag, minibatch


def first_step_metrics(algo, stale_batch, **changes):
    """The loss metrics of `algo` on the first minibatch at π_θ = π_T."""
    _, state, _, _, minibatch = stale_batch
    trainer = Trainer(dataclasses.replace(TINY, algo=algo, **changes))
    hp = trainer.config.hparams()
    return jax.jit(trainer.loss)(state.params, minibatch, hp, hp.kl_coef)[1]


def test_tv_forward_is_zero_at_the_first_step_while_tv_backward_is_not(stale_batch):
    _, _, ages, lag, _ = stale_batch
    metrics = first_step_metrics("vaco", stale_batch)
    assert np.all(np.asarray(ages) == 2)
    assert float(lag["tv_backward"]) == float(lag["behavior_tv"]) > 1e-3
    assert float(metrics["tv_estimate"]) > 1e-3
    assert abs(float(metrics["tv_forward"])) < 1e-6


def test_intervened_fraction_is_what_each_objective_reports_and_ratio_clip_fraction_is_w(
        stale_batch):
    # A tiny ε: |w − 1| > ε on stale samples.
    ppo = first_step_metrics("ppo_clip", stale_batch, clip_eps=1e-3)
    assert 0 < float(ppo["clip_fraction"]) == float(ppo["ratio_clip_fraction"])
    # It intervened on the samples whose gradient its clip removed: those outside the band on
    # the side the advantage pushes them (tests/test_intervened_fraction.py counts them by hand).
    assert 0 < float(ppo["intervened_fraction"]) < float(ppo["clip_fraction"])
    # Decoupled PPO clips π_θ/π_T, which is 1 at the first step: its own `clip_fraction` (and
    # intervention) is 0 while `ratio_clip_fraction` still measures |w − 1| > ε.
    decoupled = first_step_metrics("decoupled_ppo", stale_batch, clip_eps=1e-3)
    assert float(decoupled["clip_fraction"]) == float(decoupled["intervened_fraction"]) == 0.0
    assert float(decoupled["ratio_clip_fraction"]) == float(ppo["ratio_clip_fraction"])
    # SPO's penalty intervenes on no sample: nothing to report, and `clip_fraction` stays the
    # diagnostic |w − 1| > ε as before.
    spo = first_step_metrics("spo", stale_batch, clip_eps=1e-3)
    assert "intervened_fraction" not in spo
    assert float(spo["clip_fraction"]) == float(spo["ratio_clip_fraction"]) > 0


def test_icepop_and_m2po_report_their_masks_at_the_first_step(stale_batch):
    # At π_θ = π_T nothing is clipped; tight bounds (IcePop) and a small τ (M2PO) mask part of
    # the stale batch, and that is what each intervened on.
    icepop = first_step_metrics("icepop", stale_batch,
                                objective_hparams=("mis_low=0.99", "mis_high=1.01"))
    m2po = first_step_metrics("m2po", stale_batch, objective_hparams=("m2_tau=1e-5",))
    for metrics in (icepop, m2po):
        assert float(metrics["clip_fraction"]) == 0.0
        assert 0.0 < float(metrics["masked_fraction"]) < 1.0
        assert float(metrics["intervened_fraction"]) >= float(metrics["masked_fraction"])
    assert float(icepop["intervened_fraction"]) == float(icepop["masked_fraction"])


def test_a_run_reports_the_split_and_the_objectives_intervention():
    # VACO at C = 1 and C = 3 (oldest snapshots) in one program; a tiny δ makes the filter act.
    config = dataclasses.replace(TINY, delta=1e-6, snapshot_sampling="oldest")
    hparams = stack_hparams([dataclasses.replace(config, capacity=c).hparams() for c in (1, 3)])
    _, metrics = jax.jit(jax.vmap(Trainer(config).train, in_axes=(None, 0)))(
        jax.random.PRNGKey(0), hparams)
    synchronous, stale = ({k: np.asarray(v[i]) for k, v in metrics.items()} for i in (0, 1))
    # C = 1: no backward lag; the updates still drift from π_T.
    assert np.all(synchronous["tv_backward"] < 1e-6)
    assert np.all(synchronous["tv_forward"] > 1e-4)
    assert np.all(synchronous["update_age_max"] == 3.0)     # K·M − 1
    assert np.all(stale["tv_backward"] > 1e-4)
    np.testing.assert_array_equal(stale["tv_backward"], stale["behavior_tv"])
    assert np.all(stale["update_age_mean"][1:] == 2 * 4 + 1.5)  # age 2 from the 3rd iteration on
    # The objective's own fraction, beside the key it reports.
    np.testing.assert_array_equal(stale["intervened_fraction"], stale["filtered_fraction"])
    assert np.all(stale["intervened_fraction"] > 0)
    for run in (synchronous, stale):
        shares = sum(v for k, v in run.items() if k.startswith("update_age_hist_"))
        np.testing.assert_allclose(shares, 1.0, rtol=1e-6)


def test_a_lag_profile_run_logs_its_snapshot_ages_and_a_last_age_profile_trains_as_oldest():
    # Two profiles in one program: all mass on age C − 1 = 2, and a skewed one.
    config = dataclasses.replace(TINY, snapshot_sampling="profile", lag_profile=(0.0, 0.0, 1.0))
    hparams = stack_hparams([dataclasses.replace(config, lag_profile=p).hparams()
                             for p in [(0.0, 0.0, 1.0), (0.5, 0.0, 0.5)]])
    states, metrics = jax.jit(jax.vmap(Trainer(config).train, in_axes=(None, 0)))(
        jax.random.PRNGKey(0), hparams)
    last_age, skewed = ({k: np.asarray(v[i]) for k, v in metrics.items()} for i in (0, 1))
    hist = [f"snapshot_age_hist_{k}" for k in range(TINY.slots)]
    for run in (last_age, skewed):
        np.testing.assert_allclose(sum(run[k] for k in hist), 1.0, rtol=1e-6)
    assert np.all(skewed["snapshot_age_hist_1"][1:] == 0)   # age 1 only while the buffer fills
    assert np.all(skewed["snapshot_age_hist_3"] == 0)        # beyond the profile
    # The same run as oldest sampling (vmapped alike), bit for bit; a run without a profile logs
    # no histogram.
    oldest_config = dataclasses.replace(TINY, snapshot_sampling="oldest")
    oldest_states, oldest = jax.jit(jax.vmap(Trainer(oldest_config).train, in_axes=(None, 0)))(
        jax.random.PRNGKey(0), stack_hparams([oldest_config.hparams()] * 2))
    assert not set(hist) & set(oldest)
    for name, values in oldest.items():
        np.testing.assert_array_equal(last_age[name], np.asarray(values[0]), err_msg=name)
    first = lambda tree: jax.tree.map(lambda x: x[0], tree)  # noqa: E731
    chex.assert_trees_all_equal(first(states.params), first(oldest_states.params))
