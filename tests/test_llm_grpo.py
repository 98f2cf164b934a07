"""GRPO under forward lag (SPEC §6): advantages, the objectives on token ratios, the on-policy
identity at N = 1, backward lag through the ring buffer, the shipped and the cached warm start,
the sweep driver."""

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vaco_jax.config import ConfigError
from vaco_jax.errors import CheckpointError
from vaco_jax.llm import config as llm_config
from vaco_jax import io, runtime
from vaco_jax.llm import dataset, experiment, grpo, model, problems, sft, tokenizer

TINY = llm_config.preset("tiny")


# --- advantages ---------------------------------------------------------------------------------
def test_group_advantages_match_the_formula():
    rng = np.random.default_rng(0)
    rewards = (rng.random((6, 8)) < 0.4).astype(np.float32)
    rewards[0] = 1.0                                  # all correct: no signal
    rewards[1] = 0.0                                  # all wrong: no signal
    rewards[2] = rng.normal(size=8)                   # real-valued rewards work too
    got = np.asarray(grpo.group_advantages(jnp.asarray(rewards)))
    mean = rewards.mean(1, keepdims=True)
    std = rewards.std(1, keepdims=True)               # population std over the G answers
    np.testing.assert_allclose(got, (rewards - mean) / (std + 1e-6), rtol=1e-5, atol=1e-6)
    assert np.all(got[:2] == 0.0)
    # One right out of four: (1 − 1/4)/√(3/16) = √3 for it, −1/√3 for the others.
    one = np.asarray(grpo.group_advantages(jnp.array([[1.0, 0.0, 0.0, 0.0]])))[0]
    np.testing.assert_allclose(one, [np.sqrt(3), -1 / np.sqrt(3), -1 / np.sqrt(3),
                                     -1 / np.sqrt(3)], rtol=1e-5)
    centred = np.asarray(grpo.group_advantages(jnp.asarray(rewards), scale=False))
    np.testing.assert_allclose(centred, rewards - mean, atol=1e-6)


# --- objectives on token ratios -----------------------------------------------------------------
def token_batch(seed, spread, delta_log=0.0):
    rng = np.random.default_rng(seed)
    B, A = 8, 10
    log_behavior = -rng.random((B, A)).astype(np.float32) * 3
    log_prob = (log_behavior + spread * rng.normal(size=(B, A))).astype(np.float32)
    advantages = np.repeat(rng.normal(size=(B, 1)), A, 1).astype(np.float32)
    lengths = rng.integers(3, A + 1, size=B)
    mask = (np.arange(A)[None] < lengths[:, None]).astype(np.float32)
    batch = grpo.Batch(prompts=None, answers=None, mask=jnp.asarray(mask),
                       advantages=jnp.asarray(advantages * mask),
                       log_behavior=jnp.asarray(log_behavior),
                       log_learner_start=jnp.asarray(log_behavior))
    return jnp.asarray(log_prob), batch


def hp_for(objective, **kw):
    return llm_config.hparams(dataclasses.replace(TINY.grpo, objective=objective, **kw))


def loss_grad(objective, log_prob, batch, **kw):
    def f(lp):
        return grpo.policy_loss(lp, batch, hp_for(objective, **kw))
    (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(log_prob)
    return float(loss), jax.tree.map(float, metrics), np.asarray(grad)


def test_vaco_filter_drops_exactly_the_outward_tokens_when_tv_exceeds_delta():
    log_prob, batch = token_batch(0, spread=0.3)
    mask = np.asarray(batch.mask) > 0
    ratio = np.exp(np.asarray(log_prob - batch.log_behavior))
    adv = np.asarray(batch.advantages)
    tv = 0.5 * np.abs(ratio - 1)[mask].mean()
    outward = mask & (adv * np.sign(ratio - 1) > 0)
    assert 0 < outward.sum() < mask.sum()
    n = mask.sum()
    # Above δ: an outward token's gradient is exactly 0, a kept one's is −w·Â/n; padding is 0.
    loss, metrics, grad = loss_grad("vaco", log_prob, batch, delta=0.99 * tv)
    assert metrics["tv_estimate"] == pytest.approx(tv, rel=1e-5)
    assert metrics["filtered_fraction"] == pytest.approx(outward.sum() / n, rel=1e-6)
    assert np.all(grad[outward] == 0.0) and np.all(grad[~mask] == 0.0)
    kept = mask & ~outward
    np.testing.assert_allclose(grad[kept], (-ratio * adv / n)[kept], rtol=1e-5)
    assert loss == pytest.approx(-(ratio * adv)[kept].sum() / n, rel=1e-5)
    # At or below δ nothing is dropped: vaco is then the unconstrained pg.
    _, metrics, grad_low = loss_grad("vaco", log_prob, batch, delta=1.01 * tv)
    _, _, grad_pg = loss_grad("pg", log_prob, batch)
    assert metrics["filtered_fraction"] == 0.0
    np.testing.assert_allclose(grad_low, grad_pg, rtol=1e-6)
    np.testing.assert_allclose(grad_pg[mask], (-ratio * adv / n)[mask], rtol=1e-5)


def test_ppo_clip_on_token_ratios():
    log_prob, batch = token_batch(1, spread=0.4)
    mask = np.asarray(batch.mask) > 0
    ratio = np.exp(np.asarray(log_prob - batch.log_behavior))
    adv = np.asarray(batch.advantages)
    loss, metrics, grad = loss_grad("ppo_clip", log_prob, batch, clip_eps=0.2)
    n = mask.sum()
    expected = -np.minimum(ratio * adv, np.clip(ratio, 0.8, 1.2) * adv)[mask].sum() / n
    assert loss == pytest.approx(expected, rel=1e-5)
    assert metrics["clip_fraction"] == pytest.approx((np.abs(ratio - 1) > 0.2)[mask].mean())
    assert metrics["filtered_fraction"] == 0.0
    clipped = mask & (((ratio > 1.2) & (adv > 0)) | ((ratio < 0.8) & (adv < 0)))
    assert clipped.any() and np.all(grad[clipped] == 0.0) and np.all(grad[~mask] == 0.0)


def test_decoupled_ppo_on_an_on_policy_batch_is_ppo_clip():
    # Without backward lag the proximal policy π_T is the behaviour policy (log π_T is log β),
    # so the behavioural weight is 1 and the decoupled objective is PPO-clip, bit for bit.
    log_prob, batch = token_batch(1, spread=0.4)
    loss, metrics, grad = loss_grad("decoupled_ppo", log_prob, batch, clip_eps=0.2)
    ppo_loss, ppo_metrics, ppo_grad = loss_grad("ppo_clip", log_prob, batch, clip_eps=0.2)
    assert loss == ppo_loss and np.all(np.isfinite(grad))
    np.testing.assert_array_equal(grad, ppo_grad)
    assert metrics == ppo_metrics
    # With a stale behaviour policy it weighs each token by min(π_T/β, C), here C = 2.
    stale = batch.replace(log_learner_start=batch.log_behavior + 0.5 * batch.mask)
    loss, _, grad = loss_grad("decoupled_ppo", stale.log_behavior + 0.5, stale,
                              decoupled_is_max=2.0)
    _, _, grad_ppo = loss_grad("ppo_clip", batch.log_behavior, batch)
    mask = np.asarray(batch.mask) > 0
    np.testing.assert_allclose(grad[mask], np.exp(0.5) * grad_ppo[mask], rtol=1e-5)


def test_sgd_steps_along_the_clipped_gradient_where_adam_moves_every_weight_alike():
    grads = {"a": jnp.array([3.0, -4.0]), "b": jnp.array([1e-3])}   # global norm 5 > 1
    moves = {}
    for name in ("sgd", "adam"):
        config = llm_config.validate(llm_config.replace(TINY, grpo=dict(optimizer=name)))
        optimizer = grpo.GRPO(config, None, None).optimizer
        moves[name], _ = optimizer.update(grads, optimizer.init(grads))
    np.testing.assert_allclose(moves["sgd"]["a"], [0.6, -0.8], rtol=1e-4)    # clipped to norm 1
    np.testing.assert_allclose(moves["sgd"]["b"], [2e-4], rtol=1e-3)
    np.testing.assert_allclose(moves["adam"]["a"], [1.0, -1.0], rtol=1e-3)   # about ±1 per weight
    np.testing.assert_allclose(moves["adam"]["b"], [1.0], rtol=0.1)
    with pytest.raises(ConfigError, match="grpo.optimizer"):
        llm_config.validate(llm_config.replace(TINY, grpo=dict(optimizer="rmsprop")))


# --- the GRPO loop ------------------------------------------------------------------------------
def parity_reward(answers, targets):
    # Random-looking but deterministic rewards for an untrained policy (the verifiable reward is
    # 0 for every answer of a random network, which would make every advantage 0).
    return (answers[:, 0] % 2).astype(jnp.float32)


@pytest.fixture(scope="module")
def two_iterations():
    """Two iterations at N = 1 of five runs in one program, from the same key and random params:
    ppo_clip, vaco, pg on-policy (C = 1), vaco with backward lag (C = 2, oldest snapshot), and
    decoupled_ppo on-policy."""
    config = llm_config.replace(TINY, grpo=dict(num_minibatches=1, max_capacity=2,
                                                snapshot_sampling="oldest"))
    llm_config.validate(config)
    train_set, test_set = experiment.load_problems(config)
    trainer = grpo.GRPO(config, train_set, test_set, reward_fn=parity_reward)
    params = model.init_params(config.model, jax.random.PRNGKey(0))
    runs = [("ppo_clip", 1), ("vaco", 1), ("pg", 1), ("vaco", 2), ("decoupled_ppo", 1)]
    hps = llm_config.stack_hparams([hp_for(o, capacity=c) for o, c in runs])
    keys = jnp.stack([jax.random.PRNGKey(7)] * len(runs))
    init = jax.vmap(trainer.init, in_axes=(0, None, 0))
    step = jax.jit(jax.vmap(trainer.iteration), compiler_options=experiment.FAST_COMPILE)
    state = init(keys, params, hps)
    state1, metrics1 = step(state)
    state2, metrics2 = step(state1)
    return params, state1, state2, jax.device_get(metrics1), jax.device_get(metrics2)


def test_on_policy_at_n1_nothing_is_clipped_or_filtered(two_iterations):
    _, _, _, m1, m2 = two_iterations
    for m in (m1, m2):
        on_policy = slice(0, 3)
        assert np.all(np.abs(m["steps"]["tv_estimate"][on_policy]) < 1e-6)
        assert np.all(m["steps"]["clip_fraction"][on_policy] == 0.0)
        assert np.all(m["steps"]["filtered_fraction"][on_policy] == 0.0)
        assert np.all(m["snapshot_age"][on_policy] == 0)
        assert np.all(np.abs(m["steps"]["max_ratio"][on_policy] - 1.0) < 1e-5)
    # The rewards vary, so the update is real (advantages are not all 0).
    assert 0.2 < m1["reward"][0] < 0.8 and m1["steps"]["grad_norm"][0, 0] > 0


def test_on_policy_at_n1_the_three_objectives_take_the_same_step(two_iterations):
    params, state1, state2, _, _ = two_iterations
    for state in (state1, state2):
        leaves = [np.concatenate([np.ravel(x[i]) for x in jax.tree.leaves(state.params)])
                  for i in range(5)]
        np.testing.assert_allclose(leaves[1], leaves[0], atol=1e-6)   # vaco == ppo_clip
        np.testing.assert_allclose(leaves[2], leaves[0], atol=1e-6)   # pg == ppo_clip
        # decoupled_ppo == ppo_clip (bit for bit op by op: test_decoupled_ppo_on_an_on_policy_batch;
        # here the compiled branches round in the last bit now and then)
        np.testing.assert_allclose(leaves[4], leaves[0], atol=1e-6)
    start = np.concatenate([np.ravel(x) for x in jax.tree.leaves(params)])
    assert np.abs(leaves[0] - start).max() > 1e-5                      # and it moved


def test_backward_lag_generates_with_the_stale_snapshot(two_iterations):
    _, state1, _, m1, m2 = two_iterations
    # Iteration 1: the buffer holds only the initial parameters, so C = 2 is still on-policy and
    # takes exactly the C = 1 step.
    assert m1["snapshot_age"][3] == 0 and m1["steps"]["tv_estimate"][3, 0] < 1e-6
    for leaf in jax.tree.leaves(state1.params):
        np.testing.assert_allclose(leaf[3], leaf[1], atol=1e-6)
    # Iteration 2: generated by the oldest snapshot (age 1), so even the first update sees a ratio
    # π_T/β ≠ 1, while the on-policy vaco run does not.
    assert m2["snapshot_age"][3] == 1
    assert m2["steps"]["tv_estimate"][3, 0] > 1e-4 > m2["steps"]["tv_estimate"][1, 0]


def test_the_lag_diagnostics_split_backward_from_forward_lag(two_iterations):
    _, _, _, m1, m2 = two_iterations
    on_policy = slice(0, 3)
    for m in (m1, m2):
        # β is π_T (log π_T recomputed by a teacher-forced pass: the KV cache's round-off)
        assert np.all(m["tv_backward"][on_policy] < 1e-6)
        # N = 1: the only step is at π_θ = π_T.
        assert np.all(np.abs(m["steps"]["tv_forward"]) < 1e-6)
        assert np.all(m["update_age_max"][on_policy] == 0.0)    # K·N = 1 step per batch
    # Iteration 2 of the stale run (age 1): the backward part is the whole divergence of the step.
    assert m2["tv_backward"][3] > 1e-4 and m2["update_age_mean"][3] == 1.0
    np.testing.assert_allclose(m2["tv_backward"][3], m2["steps"]["tv_estimate"][3, 0], rtol=1e-4)
    # The objective's own fraction: PPO-Clip's clip, VACO's filter, 0 for pg.
    steps = m2["steps"]
    # (PPO-Clip's: the tokens whose gradient its clip removed, a part of those outside the band)
    assert np.all(steps["intervened_fraction"][0] <= steps["clip_fraction"][0])
    np.testing.assert_array_equal(steps["intervened_fraction"][1], steps["filtered_fraction"][1])
    assert np.all(steps["intervened_fraction"][2] == 0.0)


def test_at_k0_beside_stale_runs_log_pi_t_is_the_samplers_own_log_beta(two_iterations):
    # A snapshot of age 0 holds π_T's very parameters: log π_T is then log β as the sampler drew
    # it, not a teacher-forced recomputation that differs by the KV cache's round-off, so k = 0 in
    # a program with a ring buffer is the run of the program without one.
    _, _, _, m1, m2 = two_iterations
    assert np.all(m1["tv_backward"] == 0.0) and np.all(m2["tv_backward"][[0, 1, 2, 4]] == 0.0)
    assert m2["tv_backward"][3] > 1e-4                    # the stale run's is recomputed


@pytest.fixture(scope="module")
def stale_batches():
    """A run at constant backward lag k = 2 (C = 3, the oldest snapshot), with a learning rate
    large enough for every snapshot to differ: the batch generated at the start of iterations 1
    and 3 (numbered from 0), its `generate_batch` info, and log π of its tokens recomputed with
    the learner's parameters at the start of every iteration up to it."""
    config = llm_config.validate(llm_config.replace(TINY, grpo=dict(max_capacity=3,
                                                                    snapshot_sampling="oldest")))
    train_set, test_set = experiment.load_problems(config)
    trainer = grpo.GRPO(config, train_set, test_set, reward_fn=parity_reward)
    hp = llm_config.hparams(dataclasses.replace(config.grpo, objective="ppo_clip", capacity=3,
                                                learning_rate=3e-2))
    params = model.init_params(config.model, jax.random.PRNGKey(0))
    state = trainer.init(jax.random.PRNGKey(7), params, hp)
    step = jax.jit(trainer.iteration, compiler_options=experiment.FAST_COMPILE)
    generate = jax.jit(trainer.generate_batch, compiler_options=experiment.FAST_COMPILE)
    log_probs = jax.jit(lambda p, b: model.sequence_log_probs(trainer.apply, p, b.prompts,
                                                             b.answers, hp.temperature))
    history, batches = [state.params], {}
    for t in range(4):   # history[t]: the learner's parameters at the start of iteration t
        if t in (1, 3):
            batch, info = generate(state, jax.random.PRNGKey(100 + t))
            batches[t] = jax.device_get((batch, info, [log_probs(p, batch) for p in history]))
        state, _ = step(state)
        history.append(state.params)
    return hp, batches


def test_a_stale_batch_holds_its_snapshots_log_beta_and_the_learners_log_pi_t(stale_batches):
    hp, batches = stale_batches
    # Iteration 1: two snapshots exist, so the oldest (age 1) generates; iteration 3: age k = 2.
    for t, age in ((1, 1), (3, 2)):
        batch, info, log_pi = batches[t]
        assert info["snapshot_age"] == age
        mask = np.asarray(batch.mask) > 0

        def gap(a, b):
            return np.abs(np.asarray(a) - np.asarray(b))[mask].max()

        for version, log_pi_v in enumerate(log_pi):
            # log β: the generating snapshot's own (KV-cache) log-probability, no other's.
            if version == t - age:
                assert gap(batch.log_behavior, log_pi_v) < 1e-4, (t, version)
            else:
                assert gap(batch.log_behavior, log_pi_v) > 1e-2, (t, version)
            # log π_T: the learner's at the start of iteration t, no snapshot's.
            if version == t:
                assert gap(batch.log_learner_start, log_pi_v) < 1e-5, (t, version)
            else:
                assert gap(batch.log_learner_start, log_pi_v) > 1e-2, (t, version)
        # And it is the proximal policy decoupled PPO is given: at θ = θ_T its clip is idle and
        # its loss is −mean(min(π_T/β, C) Â) (hand computation, C = 2).
        index = llm_config.OBJECTIVES.index("decoupled_ppo")
        loss, _ = grpo.policy_loss(jnp.asarray(log_pi[t]), batch,
                                   hp.replace(objective=jnp.int32(index)))
        weight = np.minimum(np.exp(log_pi[t] - log_pi[t - age]), 2.0)
        advantages = np.asarray(batch.advantages)
        assert np.abs(advantages[mask]).max() > 0 and (weight[mask] != 1).any()
        assert float(loss) == pytest.approx(-(weight * advantages)[mask].sum() / mask.sum(),
                                            rel=1e-4)


# --- warm start ---------------------------------------------------------------------------------
def test_warm_start_is_trained_once_then_loaded(tmp_path):
    config = llm_config.replace(TINY, sft=dict(steps=40))
    train_set, test_set = experiment.load_problems(config)
    logs = []
    params, info = sft.warm_start(config, train_set, test_set, tmp_path, log=logs.append,
                                  compiler_options=experiment.FAST_COMPILE)
    assert not info["cached"] and info["final_loss"] < 0.8 * info["first_loss"]
    saved = sorted(p.name for p in tmp_path.iterdir())
    assert saved == [f"sft-{sft.cache_key(config)}.json", f"sft-{sft.cache_key(config)}.msgpack"]
    again, info2 = sft.warm_start(config, train_set, test_set, tmp_path, log=logs.append)
    assert info2["cached"] and info2["base_accuracy"] == info["base_accuracy"]
    # Its record names the parameters (saved with them, and recomputed from what is loaded).
    assert info["digest"] == info2["digest"] == sft.digest(params) and len(info["digest"]) == 16
    assert json.loads((tmp_path / saved[0]).read_text())["digest"] == info["digest"]
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert "loaded" in logs[-1]
    # Any change to model, task or warm start is a different entry.
    assert sft.cache_key(llm_config.replace(config, sft=dict(steps=41))) != sft.cache_key(config)
    assert sft.cache_key(llm_config.replace(config, grpo=dict(delta=0.5))) == sft.cache_key(config)


def test_in_a_multi_process_run_only_process_0_trains_the_warm_start(tmp_path, monkeypatch):
    # Process 0 trains and writes; every other process waits at the barrier and reads what it
    # wrote (never training a warm start of its own, never writing the shared cache).
    config = llm_config.replace(TINY, sft=dict(steps=5))
    train_set, test_set = experiment.load_problems(config)
    events = []
    monkeypatch.setattr(runtime, "barrier", lambda name: events.append("barrier"))

    def as_process(index):
        monkeypatch.setattr(runtime, "is_primary", lambda: index == 0)
        return sft.warm_start(config, train_set, test_set, tmp_path,
                              log=lambda line: events.append(f"{index}: {line.split(' (')[0]}"),
                              compiler_options=experiment.FAST_COMPILE)

    # Another process reaching the barrier before anything was written is told why.
    with pytest.raises(ConfigError, match="cache_dir"):
        as_process(1)
    assert events == ["barrier"] and not any(tmp_path.iterdir())
    events.clear()
    params, info = as_process(0)
    assert not info["cached"] and events[0].startswith("0: warm start: training")
    assert events[-1] == "barrier"
    events.clear()
    again, info1 = as_process(1)
    assert events[0] == "barrier" and events[1].startswith("1: warm start: loaded")
    assert info1["cached"]
    assert info1["base_accuracy"] == info["base_accuracy"]
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_warm_start_key_follows_the_data_and_the_code_that_makes_it(tmp_path, monkeypatch):
    # A data file rewritten in place, or an edit to the code that turns problems into training
    # data (or to the warm start's own code), is another warm start: the key must change.
    sample = (Path(sft.__file__).parent / "data" / "gsm8k_sample.jsonl").read_text().splitlines()
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("\n".join(sample[:-2]) + "\n")
    test.write_text("\n".join(sample[-2:]) + "\n")
    config = llm_config.replace(TINY, task=dict(source="gsm8k", gsm8k_train=str(train),
                                                gsm8k_test=str(test)))
    key = sft.cache_key(config)
    assert sft.cache_key(config) == key                      # deterministic
    train.write_text("\n".join(sample[1:-2]) + "\n")         # same path, other problems
    assert sft.cache_key(config) != key
    train.write_text("\n".join(sample[:-2]) + "\n")
    assert sft.cache_key(config) == key
    procedural = sft.cache_key(TINY)
    for module in (problems, tokenizer, dataset, sft):
        copy = tmp_path / f"{module.__name__}.py"
        copy.write_text(Path(module.__file__).read_text() + "\n# edited\n")
        with monkeypatch.context() as m:
            m.setattr(module, "__file__", str(copy))
            assert sft.cache_key(TINY) != procedural, module.__name__
    assert sft.cache_key(TINY) == procedural


class SFTRan(Exception):
    """Raised by a stand-in for the supervised trainer: training was attempted."""


@pytest.fixture
def no_sft(monkeypatch):
    """Supervised training raises `SFTRan`: a warm start that loads runs no SFT step."""
    def make_sft(config):
        raise SFTRan(config.sft)
    monkeypatch.setattr(sft, "make_sft", make_sft)


@pytest.mark.parametrize("name", ["tiny", "cpu"])
def test_each_shipped_warm_start_is_the_one_its_record_names(name):
    # The record's configuration is the preset's, its data the problems this code draws from it,
    # its SHA-256 that of the parameters in the file, which stays small.
    record = json.loads((sft.SHIPPED_DIR / f"{name}.json").read_text())
    config = llm_config.preset(name)
    assert record["config"] == sft.warm_start_config(config)
    assert record["format_version"] == sft.FORMAT_VERSION
    assert sft.shipped_record(config) == sft.SHIPPED_DIR / f"{name}.json"
    train_set, test_set = experiment.load_problems(config)
    assert record["data"] == sft.data_digest(train_set, test_set)
    params, info = sft.load_shipped(config, train_set, test_set, log=lambda _: None)
    assert info["sha256"] == record["sha256"] == sft.sha256(params)
    assert info["digest"] == record["digest"] == sft.digest(params)
    assert (sft.SHIPPED_DIR / f"{name}.npz").stat().st_size < 500_000
    assert all(np.asarray(a).dtype == np.float32 for a in jax.tree.leaves(params))
    assert sorted(p.name for p in sft.SHIPPED_DIR.iterdir()) == [
        "cpu.json", "cpu.npz", "tiny.json", "tiny.npz"]


def test_the_shipped_configuration_loads_without_supervised_training(tmp_path, no_sft):
    # The preset's model, task and sft, whatever GRPO does: the shipped parameters, nothing trained
    # or written; asked to train its own, it trains.
    config = llm_config.replace(TINY, grpo=dict(delta=0.5, num_seeds=1))
    train_set, test_set = experiment.load_problems(config)
    logs = []
    params, info = sft.warm_start(config, train_set, test_set, tmp_path, log=logs.append)
    record = json.loads((sft.SHIPPED_DIR / "tiny.json").read_text())
    assert info["origin"] == "shipped" and info["cached"] and info["sha256"] == record["sha256"]
    assert info["base_accuracy"] == record["base_accuracy"] and sft.sha256(params) == info["sha256"]
    assert logs == [logs[0]] and f"shipped tiny, sha256 {record['sha256']}" in logs[0]
    assert not any(tmp_path.iterdir())
    with pytest.raises(SFTRan):
        sft.warm_start(config, train_set, test_set, tmp_path, log=logs.append, shipped=False)


@pytest.mark.parametrize("section, field, value", [
    ("sft", "steps", 61), ("sft", "seed", 1), ("task", "num_train", 256), ("model", "d_ff", 32)])
def test_a_configuration_one_field_away_from_the_shipped_one_trains(
        tmp_path, no_sft, section, field, value):
    config = llm_config.replace(TINY, **{section: {field: value}})
    assert sft.shipped_record(config) is None
    train_set, test_set = experiment.load_problems(config)
    with pytest.raises(SFTRan):
        sft.warm_start(config, train_set, test_set, tmp_path, log=lambda _: None)


def test_a_shipped_warm_start_on_other_problems_is_not_used(tmp_path, monkeypatch, no_sft):
    # Same configuration, other data (the generator changed since it was shipped): trained anew.
    for suffix in (".json", ".npz"):
        shutil.copy(sft.SHIPPED_DIR / f"tiny{suffix}", tmp_path / f"tiny{suffix}")
    record = json.loads((tmp_path / "tiny.json").read_text())
    (tmp_path / "tiny.json").write_text(json.dumps({**record, "data": "0" * 64}))
    monkeypatch.setattr(sft, "SHIPPED_DIR", tmp_path)
    train_set, test_set = experiment.load_problems(TINY)
    logs = []
    with pytest.raises(SFTRan):
        sft.warm_start(TINY, train_set, test_set, tmp_path / "cache", log=logs.append)
    assert "not used: it was trained on other problems" in logs[0]


def test_a_tampered_shipped_warm_start_is_refused(tmp_path, monkeypatch, no_sft):
    for suffix in (".json", ".npz"):
        shutil.copy(sft.SHIPPED_DIR / f"tiny{suffix}", tmp_path / f"tiny{suffix}")
    monkeypatch.setattr(sft, "SHIPPED_DIR", tmp_path)
    train_set, test_set = experiment.load_problems(TINY)
    with np.load(tmp_path / "tiny.npz") as npz:
        arrays = {name: npz[name] for name in npz.files}
    name = sorted(arrays)[0]
    arrays[name] = arrays[name].copy()
    arrays[name].flat[0] += 1e-3                                    # one weight changed
    np.savez_compressed(tmp_path / "tiny.npz", **arrays)
    record = json.loads((tmp_path / "tiny.json").read_text())
    with pytest.raises(CheckpointError, match=f"tiny.npz.*sha256 .*{record['sha256']}"):
        sft.warm_start(TINY, train_set, test_set, tmp_path / "cache", log=lambda _: None)
    arrays[name] = arrays[name].astype(np.float64)                  # another dtype
    np.savez_compressed(tmp_path / "tiny.npz", **arrays)
    with pytest.raises(CheckpointError, match="other arrays than the model's parameters"):
        sft.warm_start(TINY, train_set, test_set, tmp_path / "cache", log=lambda _: None)
    (tmp_path / "tiny.npz").write_bytes((sft.SHIPPED_DIR / "tiny.npz").read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="cannot be read"):
        sft.warm_start(TINY, train_set, test_set, tmp_path / "cache", log=lambda _: None)
    assert not (tmp_path / "cache").exists()


def test_a_sweep_records_its_warm_starts_origin_and_hash(tmp_path, monkeypatch, no_sft):
    # The sweep with the tiny preset starts from the shipped warm start (no SFT) and says so in
    # its summary and rows; --train-warm-start trains its own.
    monkeypatch.setattr(experiment, "train_one_n", fake_rows)
    run = dataclasses.replace(experiment.Experiment(TINY), ns=(1,), out=str(tmp_path / "out"),
                              throughput=False, plot=False, cache_dir=str(tmp_path / "cache"))
    lines = []
    summary = experiment.run(run, log=lines.append)
    record = json.loads((sft.SHIPPED_DIR / "tiny.json").read_text())
    assert summary["warm_start"]["origin"] == "shipped"
    assert summary["warm_start"]["sha256"] == record["sha256"]
    assert {r["warm_start"] for r in io.read_jsonl(tmp_path / "out" / "results.jsonl")} == {
        record["digest"]}
    assert any(f"shipped tiny, sha256 {record['sha256']}" in line for line in lines)
    with pytest.raises(SFTRan):
        experiment.run(dataclasses.replace(run, train_warm_start=True, overwrite=True),
                       log=lambda _: None)


def test_each_evaluation_tells_optimisation_from_generalisation(tmp_path):
    # Beside held-out greedy accuracy: greedy accuracy on a fixed sample of training problems and
    # sampled (temperature 1) accuracy on held-out problems, per evaluation, per row, summarised.
    config = llm_config.replace(TINY, grpo=dict(num_seeds=1))
    train_set, test_set = experiment.load_problems(config)
    params = model.init_params(config.model, jax.random.PRNGKey(0))
    rows = experiment.train_one_n(config, 1, ("ppo_clip",), params, train_set, test_set,
                                  log=lambda _: None, compiler_options=experiment.FAST_COMPILE)
    (row,) = rows
    for key in experiment.EVALUATIONS:
        assert len(row[key]) == len(row["eval_iterations"]) == 2, key
        assert np.all((0 <= row[key]) & (row[key] <= 1)), (key, row[key])
    for key in ("final_accuracy", "final_train_greedy_accuracy", "final_sampled_accuracy"):
        assert 0 <= row[key] <= 1, key
    entry = experiment.summarize(io.to_jsonable(rows), 0.0)["by_objective"]["ppo_clip"]["1"]
    for key in ("mean", "train_reward", "train_greedy_accuracy", "sampled_accuracy"):
        assert 0 <= entry[key] <= 1, key
    assert entry["train_greedy_accuracy_by_seed"] == [row["final_train_greedy_accuracy"]]
    assert entry["generalization_gap"] == pytest.approx(
        row["final_train_greedy_accuracy"] - row["final_accuracy"])


def test_runs_split_over_calls_give_each_run_the_results_of_one_program():
    # --runs-per-call bounds the memory of a program; the last chunk is padded and the padding
    # dropped; each (objective, seed) keeps its keys and hyper-parameters, so its results agree
    # with the one-program run up to the rounding of reductions over a differently sized batch.
    config = llm_config.replace(TINY, grpo=dict(num_seeds=3))
    train_set, test_set = experiment.load_problems(config)
    params = model.init_params(config.model, jax.random.PRNGKey(0))
    lines = []
    one, split = (experiment.train_one_n(config, 1, ("ppo_clip",), params, train_set, test_set,
                                         log=lines.append, runs_per_call=k,
                                         compiler_options=experiment.FAST_COMPILE) for k in (0, 2))
    assert "3 runs (2 runs on 1 device in 2 calls of 2)" in lines[-1]
    assert [(r["objective"], r["seed"]) for r in split] == [(r["objective"], r["seed"]) for r in one]
    arrays = lambda r: np.concatenate([np.ravel(v) for _, v in sorted(r.items())  # noqa: E731
                                       if isinstance(v, np.ndarray)]).tobytes()
    assert len({arrays(r) for r in one}) == 3   # the seeds differ: a mixed-up order would show
    for a, b in zip(one, split):
        for key, value in a.items():
            if isinstance(value, (np.ndarray, float)) and not key.endswith("seconds"):
                np.testing.assert_allclose(b[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    assert experiment._chunks(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert experiment._chunks(30, 10) == [slice(0, 10), slice(10, 20), slice(20, 30)]
    assert experiment._chunks(7, 0) == experiment._chunks(7, 9) == [slice(0, 7)]


def test_every_k_of_an_n_trains_in_one_program_and_its_rows_record_the_lag():
    # k = 0 and k = 3 side by side, the lag uniform over 0..k: before k snapshots exist, the
    # ages drawn stay below the iteration (the oldest there is); each row records k and the mode.
    config = llm_config.replace(TINY, grpo=dict(num_seeds=2))
    train_set, test_set = experiment.load_problems(config)
    params = model.init_params(config.model, jax.random.PRNGKey(0))
    lines = []
    rows = experiment.train_one_n(config, 1, ("ppo_clip", "vaco"), params, train_set, test_set,
                                  log=lines.append, ks=(0, 3), lag_sampling="uniform",
                                  compiler_options=experiment.FAST_COMPILE)
    assert "N= 1, k = 0, 3 (uniform): 8 runs (8 runs on 1 device)" in lines[-1]
    assert [(r["k"], r["lag_sampling"], r["objective"], r["seed"]) for r in rows] == [
        (k, mode, o, s) for k, mode in ((0, "constant"), (3, "uniform"))
        for o in ("ppo_clip", "vaco") for s in (0, 1)]
    ages = np.array([r["snapshot_age"] for r in rows])                # [run, iteration]
    assert np.all(ages[:4] == 0)
    assert np.all(ages[4:] <= np.minimum(np.arange(4), 3)) and len({tuple(a) for a in ages[4:]}) > 1
    np.testing.assert_array_equal(ages[4], ages[6])    # the same seed draws the same lags
    # At N = 1 an update's age is its snapshot's: the histogram holds each iteration's age.
    for r in rows:
        hist = {int(k.split("_")[-2]): np.asarray(v) for k, v in r.items()
                if k.startswith("update_age_hist_")}
        np.testing.assert_array_equal(sum(hist.values()), np.ones(4))
        np.testing.assert_array_equal(r["update_age_mean"], r["snapshot_age"])
    assert llm_config.with_lags(config, (0, 2)).grpo.snapshot_sampling == "oldest"
    assert llm_config.with_lags(config, (0, 2), "profile", (0, 0, 1)).grpo.lag_profile == (0, 0, 1)
    assert llm_config.with_lags(config, (0, 2), "uniform").grpo.max_capacity == 3
    assert llm_config.with_lags(config, (0,)) is config                # no buffer at k = 0


def test_a_lag_profile_draws_each_batchs_age_from_its_probabilities():
    # All its mass on age 2: the oldest snapshot there is, as constant k = 2 (the buffer fills
    # first: ages 0, 1, 2, 2); beside it k = 0 in the same program. The drawn ages are logged.
    config = llm_config.replace(TINY, grpo=dict(num_seeds=1))
    train_set, test_set = experiment.load_problems(config)
    params = model.init_params(config.model, jax.random.PRNGKey(0))
    rows = experiment.train_one_n(config, 1, ("ppo_clip",), params, train_set, test_set,
                                  log=lambda _: None, ks=(0, 2), lag_sampling="profile",
                                  lag_profile=(0.0, 0.0, 1.0),
                                  compiler_options=experiment.FAST_COMPILE)
    on_policy, profiled = rows
    assert (profiled["k"], profiled["lag_sampling"], profiled["lag_profile"]) == (
        2, "profile", [0.0, 0.0, 1.0])
    assert "lag_profile" not in on_policy and on_policy["lag_sampling"] == "constant"
    np.testing.assert_array_equal(profiled["snapshot_age"], [0, 1, 2, 2])
    np.testing.assert_array_equal(on_policy["snapshot_age"], [0, 0, 0, 0])
    np.testing.assert_array_equal(profiled["snapshot_age_hist_2"], [0, 0, 1, 1])
    np.testing.assert_array_equal(on_policy["snapshot_age_hist_0"], [1, 1, 1, 1])
    with pytest.raises(ConfigError, match="grpo.lag_profile"):
        llm_config.validate(llm_config.replace(config, grpo=dict(snapshot_sampling="profile")))
    with pytest.raises(ConfigError, match="grpo.lag_profile"):
        llm_config.validate(llm_config.replace(config, grpo=dict(
            snapshot_sampling="profile", lag_profile=(0.5, 0.5), max_capacity=1)))


# --- the sweep driver (no compilation: training is replaced by a stub) ---------------------------
def fake_rows(config, n, objectives, params, train_set, test_set, log=print,
              compiler_options=None, program=None, runs_per_call=0, ks=(0,),
              lag_sampling="constant", lag_profile=()):
    rows = []
    for k, o in ((k, o) for k in ks for o in objectives):
        for seed in range(config.grpo.num_seeds):
            acc = 0.5 - 0.01 * n * (o == "ppo_clip") + 0.01 * seed - 0.02 * k
            rows.append({"k": k, "lag_sampling": experiment.lag_mode(k, lag_sampling),
                         **({"lag_profile": list(lag_profile)} if k and lag_profile else {}),
                         "tv_backward": [0.0, 0.01 * k], "tv_forward_mean": [0.0, 0.001 * n],
                         "intervened_fraction_mean": [0.0, 0.1], "snapshot_age": [0, min(k, 1)],
                         "update_age_mean": [0.0, n * min(k, 1) + (n - 1) / 2],
                         "update_age_max": [n - 1, n * (min(k, 1) + 1) - 1],
                         "update_age_p90": [n - 1, n * (min(k, 1) + 1) - 1],
                         "update_age_hist_0_0": [1.0, float(k == 0)],
                         "update_age_hist_1_1": [0.0, float(k > 0)],
                         "n": n, "objective": o, "seed": seed, "eval_iterations": [2, 4],
                         "eval_accuracy": [0.4, acc], "final_accuracy": acc,
                         "eval_sampled_accuracy": [0.3, acc - 0.1],
                         "final_sampled_accuracy": acc - 0.1,
                         "train_greedy_accuracy": [0.5, acc + 0.2],
                         "final_train_greedy_accuracy": acc + 0.2,
                         "reward": [0.3, 0.4], "clip_fraction_mean": [0.01 * n, 0.03 * n],
                         "filtered_fraction_mean": [0.0, 0.02 * n * (o == "vaco")],
                         "tv_estimate_mean": [0.001 * n, 0.001 * n],
                         "tv_estimate_max": [0.002 * n, 0.003 * n], "approx_kl_mean": [0.0, 0.0]})
    return rows


@pytest.fixture
def stubbed_sweep(monkeypatch, stub_warm_start):
    """The LLM sweep without training: fake rows (each (N, objectives) trained is recorded in the
    list returned, with (ks, lag_sampling) where k > 0 is asked) from a stub warm start of seed
    0."""
    calls = []
    monkeypatch.setattr(experiment, "train_one_n", lambda *a, **k: calls.append(
        (a[1], tuple(a[2])) + ((k["ks"], k["lag_sampling"]) if "ks" in k else ()))
        or fake_rows(*a, **k))
    stub_warm_start(TINY.model)
    return calls


def test_sweep_resumes_summarises_and_refuses_other_configs(tmp_path, monkeypatch, stubbed_sweep):
    monkeypatch.chdir(tmp_path)   # to see that nothing is written outside `out`
    calls = stubbed_sweep
    run = dataclasses.replace(experiment.Experiment(TINY), ns=(1, 4), out=str(tmp_path / "out"),
                              throughput=False)
    summary = experiment.run(run, log=lambda _: None)
    assert calls == [(1, ("ppo_clip", "vaco")), (4, ("ppo_clip", "vaco"))]
    ppo4 = summary["by_objective"]["ppo_clip"]["4"]
    assert ppo4["final_accuracy"] == pytest.approx([0.46, 0.47])
    assert ppo4["mean"] == pytest.approx(0.465)
    assert ppo4["std"] == pytest.approx(np.std([0.46, 0.47], ddof=1))
    assert ppo4["clip_fraction"] == pytest.approx(0.08)
    assert summary["by_objective"]["vaco"]["4"]["filtered_fraction"] == pytest.approx(0.04)
    assert ppo4["train_greedy_accuracy"] == pytest.approx(0.665)
    assert ppo4["sampled_accuracy_by_seed"] == pytest.approx([0.36, 0.37])
    assert ppo4["generalization_gap"] == pytest.approx(0.2)
    assert summary["base_accuracy"] == 0.45
    # Every output, the figure included, is under `out`.
    assert (tmp_path / "out" / "forward_lag.png").stat().st_size > 10_000
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert saved["by_objective"]["vaco"]["1"]["mean"] == pytest.approx(0.505)
    # Resuming runs only what is missing: here, pg at both N.
    calls.clear()
    summary = experiment.run(dataclasses.replace(run, objectives=("ppo_clip", "vaco", "pg")),
                             log=lambda _: None)
    assert calls == [(1, ("pg",)), (4, ("pg",))]
    assert set(summary["by_objective"]) == {"ppo_clip", "vaco", "pg"}
    # Each row records the code that made it; rows from other code are shown, not hidden.
    rows = io.read_jsonl(tmp_path / "out" / "results.jsonl")
    assert {r["source"] for r in rows} == {io.source_hash()} and len(rows) == 12
    assert summary["sources"] == [io.source_hash()]
    rows[0]["source"] = "0123456789abcdef"
    io.write_jsonl_atomic(tmp_path / "out" / "results.jsonl", rows)
    lines = []
    summary = experiment.run(dataclasses.replace(run, objectives=("ppo_clip", "vaco", "pg")),
                             log=lines.append)
    assert summary["sources"] == sorted(["0123456789abcdef", io.source_hash()])
    assert any("2 versions of the code" in line for line in lines)
    # Another configuration in the same directory is refused before anything runs.
    other = dataclasses.replace(run, config=llm_config.replace(TINY, grpo=dict(delta=0.1)))
    with pytest.raises(ConfigError, match="out"):
        experiment.run(other, log=lambda _: None)
    with pytest.raises(ConfigError, match="objectives"):
        experiment.run(dataclasses.replace(run, objectives=("ppo",)), log=lambda _: None)
    with pytest.raises(ConfigError, match="--runs-per-call"):
        experiment.run(dataclasses.replace(run, runs_per_call=-1), log=lambda _: None)


def test_backward_lags_are_run_resumed_and_summarised_by_k_and_the_family_stays_at_k0(
        tmp_path, stubbed_sweep):
    calls, lines = stubbed_sweep, []
    run = dataclasses.replace(experiment.Experiment(TINY), ns=(1, 4), ks=(2, 0),
                              out=str(tmp_path / "out"), throughput=False)
    summary = experiment.run(run, log=lines.append)
    both = ("ppo_clip", "vaco")
    assert calls == [(1, both, (0, 2), "constant"), (4, both, (0, 2), "constant")]
    assert summary["by_objective"] == summary["by_lag"]["constant"]["0"]
    at_k2 = summary["by_lag"]["constant"]["2"]["ppo_clip"]["4"]
    assert at_k2["mean"] == pytest.approx(0.425)
    assert at_k2["tv_backward"] == pytest.approx(0.01)
    assert at_k2["tv_forward"] == pytest.approx(0.002)
    assert at_k2["update_age_mean"] == pytest.approx(2.75) and at_k2["snapshot_age"] == 0.5
    assert at_k2["update_age_hist"] == {"0_0": 0.5, "1_1": 0.5}
    assert at_k2["intervened_fraction"] == pytest.approx(0.05)
    assert any(line.startswith("         tv_backward 0.0100") for line in lines)   # per k logged
    out = tmp_path / "out"
    assert (out / "forward_lag.png").exists() and (out / "backward_lag.png").stat().st_size > 10_000
    rows = io.read_jsonl(out / "results.jsonl")
    assert sorted({(r["k"], r["lag_sampling"]) for r in rows}) == [(0, "constant"), (2, "constant")]
    # The pre-registered family is VACO − PPO-Clip on-policy: rows at k > 0 do not enter it.
    pd_testing = pytest.importorskip("pandas").testing
    pd_testing.assert_frame_equal(experiment.primary_tests(rows),
                                  experiment.primary_tests([r for r in rows if r["k"] == 0]))
    # Resuming runs only the missing k; a uniform lag shares the on-policy k = 0.
    calls.clear()
    experiment.run(dataclasses.replace(run, ks=(0, 2, 4)), log=lambda _: None)
    assert calls == [(1, both, (4,), "constant"), (4, both, (4,), "constant")]
    calls.clear()
    summary = experiment.run(dataclasses.replace(run, ks=(0, 2), lag_sampling="uniform"),
                             log=lambda _: None)
    assert calls == [(1, both, (2,), "uniform"), (4, both, (2,), "uniform")]
    assert {m: sorted(t) for m, t in summary["by_lag"].items()} == {"constant": ["0"],
                                                                  "uniform": ["2"]}
    assert (out / "backward_lag_uniform.png").exists()
    assert experiment.lag_tables(summary, "uniform").keys() == {0, 2}
    # Rows written before the lag axis (no k) are the on-policy k = 0: nothing reruns.
    rows = io.read_jsonl(out / "results.jsonl")
    io.write_jsonl_atomic(out / "results.jsonl",
                          [{key: v for key, v in r.items() if key not in ("k", "lag_sampling")}
                           for r in rows if r["k"] == 0])
    calls.clear()
    experiment.run(dataclasses.replace(run, ks=(0,)), log=lambda _: None)
    assert calls == []
    # Lags the sweep cannot run are refused before anything runs.
    for bad, field in (({"ks": (0, -1)}, "--ks"), ({"ks": ()}, "--ks"),
                       ({"lag_sampling": "poisson"}, "--lag-sampling"),
                       ({"config": llm_config.replace(TINY, grpo=dict(capacity=2, max_capacity=2))},
                        "grpo.capacity"),
                       ({"config": llm_config.replace(TINY, grpo=dict(snapshot_sampling="oldest"))},
                        "grpo.snapshot_sampling")):
        with pytest.raises(ConfigError, match=field):
            experiment.run(dataclasses.replace(run, **bad), log=lambda _: None)
    assert calls == []


def test_a_lag_profile_runs_beside_k0_recorded_at_its_oldest_age_and_one_per_directory(
        tmp_path, stubbed_sweep):
    calls = stubbed_sweep
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"probabilities": [0.5, 0.25, 0.25]}))
    run = dataclasses.replace(experiment.Experiment(TINY), ns=(1,), lag_profile=str(profile),
                              out=str(tmp_path / "out"), throughput=False)
    summary = experiment.run(run, log=lambda _: None)
    assert calls == [(1, ("ppo_clip", "vaco"), (0, 2), "profile")]
    assert {m: sorted(t) for m, t in summary["by_lag"].items()} == {"constant": ["0"],
                                                                  "profile": ["2"]}
    assert summary["lag_profile"]["probabilities"] == [0.5, 0.25, 0.25]
    rows = io.read_jsonl(tmp_path / "out" / "results.jsonl")
    assert {r.get("lag_profile") and tuple(r["lag_profile"]) for r in rows if r["k"]} == {
        (0.5, 0.25, 0.25)}
    assert (tmp_path / "out" / "backward_lag_profile.png").exists()
    calls.clear()
    experiment.run(run, log=lambda _: None)                 # resumed: nothing left to run
    assert calls == []
    # Another profile of the same length in the same directory would be filed under the same k.
    profile.write_text(json.dumps({"probabilities": [0.2, 0.3, 0.5]}))
    with pytest.raises(ConfigError, match="--lag-profile.*another lag profile"):
        experiment.run(run, log=lambda _: None)
    for bad, field in (({"lag_sampling": "uniform"}, "--lag-sampling"), ({"ks": (0, 1)}, "--ks")):
        with pytest.raises(ConfigError, match=field):
            experiment.run(dataclasses.replace(run, out=str(tmp_path / "other"), **bad),
                           log=lambda _: None)
    profile.write_text(json.dumps({"probabilities": [0.5, 0.6]}))
    with pytest.raises(ConfigError, match="sum to 1"):
        experiment.run(dataclasses.replace(run, out=str(tmp_path / "other")), log=lambda _: None)
    assert calls == []


def test_a_resume_from_another_warm_start_is_refused(tmp_path, stubbed_sweep, stub_warm_start):
    calls = stubbed_sweep
    run = dataclasses.replace(experiment.Experiment(TINY), ns=(1,), out=str(tmp_path / "out"),
                              throughput=False, plot=False)
    experiment.run(run, log=lambda _: None)
    first = experiment.sft.digest(model.init_params(TINY.model, jax.random.PRNGKey(0)))
    assert io.compact_jsonl(tmp_path / "out" / "results.jsonl") > 0   # resumes from either form
    rows = io.read_rows(tmp_path / "out" / "results.jsonl")
    assert {r["warm_start"] for r in rows} == {first} and len(first) == 16
    # The same warm start resumes; other parameters under the same key are refused, naming both.
    calls.clear()
    experiment.run(dataclasses.replace(run, ns=(1, 4)), log=lambda _: None)
    assert calls == [(4, ("ppo_clip", "vaco"))]
    stub_warm_start(TINY.model, seed=1)
    calls.clear()
    with pytest.raises(ConfigError, match=f"cache_dir.*another warm start.*{first}") as refused:
        experiment.run(dataclasses.replace(run, ns=(1, 4, 8)), log=lambda _: None)
    other = experiment.sft.digest(model.init_params(TINY.model, jax.random.PRNGKey(1)))
    assert calls == [] and other in str(refused.value)


def test_more_than_four_objectives_are_drawn_apart_each_beside_ppo_clip_and_vaco(tmp_path):
    import matplotlib.pyplot as plt

    objectives = ("cispo", "decoupled_ppo", "icepop", "m2po", "ppo_clip", "vaco")
    rows = [r for n in (1, 4) for r in fake_rows(TINY, n, objectives, None, None, None)]
    summary = experiment.summarize(rows, 0.45)
    assert experiment.split_objectives(objectives) == (["decoupled_ppo", "ppo_clip", "vaco"],
                                                       ["cispo", "icepop", "m2po"])
    assert experiment.split_objectives(objectives[:4]) == (list(objectives[:4]), [])
    written = experiment.plot(summary, tmp_path / "f.png")
    assert [p.name for p in written] == ["f.png", "f_objectives.png"]
    assert all(p.stat().st_size > 10_000 for p in written)
    fig = experiment.objectives_figure(summary, ["cispo", "icepop", "m2po"])
    assert len(fig.axes) == 6                                        # 2 rows × 3 objectives
    for index, ax in enumerate(fig.axes):
        column, key = ("cispo", "icepop", "m2po")[index % 3], \
            ("mean", "sampled_accuracy")[index // 3]                 # greedy top, sampled below
        drawn = {line.get_gid(): line for line in ax.get_lines() if line.get_gid()}
        assert set(drawn) == {"ppo_clip", "vaco", column}          # three to a panel
        np.testing.assert_allclose(
            drawn[column].get_ydata(),
            [summary["by_objective"][column][n][key] for n in ("1", "4")])
    assert sorted(ax.get_title() for ax in fig.axes if ax.get_title()) == ["cispo", "icepop",
                                                                           "m2po"]
    plt.close(fig)


def test_the_figure_shows_sampled_beside_greedy_accuracy_and_is_redrawn_from_results(tmp_path):
    import matplotlib.pyplot as plt

    from experiments import plot_llm

    objectives = ("decoupled_ppo", "ppo_clip", "vaco")
    rows = [r for n in (1, 4) for r in fake_rows(TINY, n, objectives, None, None, None)]
    summary = experiment.summarize(rows, 0.45)
    fig = experiment.figure(summary)
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    greedy, sampled = panels["held-out greedy accuracy"], \
        panels["held-out sampled accuracy (temperature 1)"]
    lines = {name: {line.get_gid(): line for line in ax.get_lines() if line.get_gid()}
             for name, ax in (("greedy", greedy), ("sampled", sampled))}
    assert set(lines["greedy"]) == set(lines["sampled"]) == set(objectives)
    for o in objectives:
        means = [summary["by_objective"][o][n]["sampled_accuracy"] for n in ("1", "4")]
        np.testing.assert_allclose(lines["sampled"][o].get_ydata(), means)
        assert lines["sampled"][o].get_color() == lines["greedy"][o].get_color()
    assert len({lines["sampled"][o].get_color() for o in objectives}) == len(objectives)
    assert sampled.get_ylim() == greedy.get_ylim()                 # one scale for both
    plt.close(fig)
    # Results of a version without sampled accuracy say so instead of drawing nothing silently.
    for table in summary["by_objective"].values():
        for entry in table.values():
            entry.pop("sampled_accuracy"), entry.pop("sampled_accuracy_by_seed")
    fig = experiment.figure(summary)
    sampled = next(ax for ax in fig.axes if ax.get_title().startswith("held-out sampled"))
    assert not sampled.get_lines() and "not recorded" in sampled.texts[0].get_text()
    plt.close(fig)
    # Redrawn from a finished sweep's files, without training, where it is asked to go.
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    io.write_json_atomic(sweep / "summary.json", {**experiment.summarize(rows, 0.45),
                                                  "num_params": 12_345})
    io.write_json_atomic(sweep / "config.json", {"config": io.to_jsonable(TINY)})
    assert plot_llm.main([str(sweep), "--out", str(tmp_path / "f.png")]) == 0
    assert (tmp_path / "f.png").stat().st_size > 10_000
    assert sorted(p.name for p in sweep.iterdir()) == ["config.json", "summary.json"]
    assert plot_llm.main([str(tmp_path / "nothing")]) == 2
    title = experiment.figure_title(io.to_jsonable(TINY)["grpo"], 12_345)
    assert title.startswith("GRPO under forward lag: 12k-parameter transformer, "
                            f"{TINY.grpo.num_seeds} seeds")


# --- top-p sampling: what w means under a nucleus -----------------------------------------------
TOP_PS = (1.0, 0.999, 0.9)


@pytest.fixture(scope="module")
def nucleus_batches():
    """Per top_p: an on-policy batch of the tiny config, the learner's log π_θ on it at θ = θ_T,
    and one update of every LLM objective from it (objectives vmapped: one program per top_p).
    Random parameters scaled ×3 make the next-token distributions peaked enough for a nucleus to
    leave tokens out, and with this key some answers end early (padding follows)."""
    train_set, test_set = experiment.load_problems(TINY)
    params = jax.tree.map(lambda x: 3.0 * x, model.init_params(TINY.model, jax.random.PRNGKey(0)))
    hps = llm_config.stack_hparams([hp_for(o) for o in llm_config.OBJECTIVES])
    results = {}
    for top_p in TOP_PS:
        config = llm_config.validate(llm_config.replace(TINY, grpo=dict(top_p=top_p)))
        trainer = grpo.GRPO(config, train_set, test_set, reward_fn=parity_reward)

        def run(params, hps):
            state = trainer.init(jax.random.PRNGKey(3), params, hp_for("vaco"))
            batch, _ = trainer.generate_batch(state, jax.random.PRNGKey(5))
            log_prob = model.sequence_log_probs(trainer.apply, params, batch.prompts,
                                                batch.answers, state.hparams.temperature)
            update = jax.vmap(trainer.update, in_axes=(None, None, None, 0))
            new_params, _, metrics = update(params, state.opt_state, batch, hps)
            return batch, log_prob, new_params, metrics

        results[top_p] = jax.device_get(
            jax.jit(run, compiler_options=experiment.FAST_COMPILE)(params, hps))
    return results


@pytest.mark.parametrize("top_p", TOP_PS)
def test_on_policy_the_ratio_is_one_at_any_top_p(nucleus_batches, top_p):
    # β is the model's own (tempered) distribution at the behaviour parameters, read from the
    # logits the sampler drew with; top-p only restricts which tokens get drawn. So on-policy
    # log π_θ − log β is 0 up to the KV cache's float32 round-off (exactly 0 without the cache:
    # test_llm_model), and no objective clips or filters at the first update.
    batch, log_prob, _, metrics = nucleus_batches[top_p]
    live = np.asarray(batch.mask) > 0
    assert (~live).any(), "no answer ended early: the padding case is not exercised"
    log_ratio = np.asarray(log_prob - batch.log_behavior)[live]
    assert np.abs(log_ratio).max() <= 1e-5, (top_p, np.abs(log_ratio).max())   # 1.4e-6 here
    assert np.all(np.isfinite(np.asarray(batch.log_behavior)))
    np.testing.assert_array_equal(metrics["clip_fraction"], 0.0)
    np.testing.assert_array_equal(metrics["filtered_fraction"], 0.0)
    assert np.all(metrics["tv_estimate"] < 1e-6), metrics["tv_estimate"]


def test_every_objective_stays_finite_with_a_top_p_nucleus(nucleus_batches):
    # top_p = 0.999 turned every parameter NaN on the first update: log β was −inf on the padding
    # after an answer's end (outside the nucleus) and 0 · NaN stays NaN.
    batch, _, new_params, metrics = nucleus_batches[0.999]
    for name, i in zip(llm_config.OBJECTIVES, range(len(llm_config.OBJECTIVES))):
        assert np.isfinite(metrics["policy_loss"][i]) and np.isfinite(metrics["grad_norm"][i]), \
            (name, metrics["policy_loss"][i], metrics["grad_norm"][i])
        assert metrics["grad_norm"][i] > 0, name
        assert all(np.all(np.isfinite(x[i])) for x in jax.tree.leaves(new_params)), name
    # On-policy every objective takes the same step (the ratio is 1), but GSPO, which averages
    # over each answer's tokens and then over the answers, not over all tokens at once.
    flat = [np.concatenate([np.ravel(x[i]) for x in jax.tree.leaves(new_params)])
            for i in range(len(llm_config.OBJECTIVES))]
    for name, leaves in zip(llm_config.OBJECTIVES[1:], flat[1:]):
        if not llm_config.resolve(name).sequences:
            np.testing.assert_allclose(leaves, flat[0], atol=1e-6, err_msg=name)


def test_a_summary_of_runs_without_training_set_evaluations_leaves_that_entry_out():
    """`train_eval_size = 0` evaluates no training problem: its accuracy is NaN, written as None,
    and the summary has no entry for it (nor a generalisation gap) rather than failing."""
    from vaco_jax.llm import experiment

    def row(seed, train):
        return {"objective": "ppo_clip", "n": 1, "seed": seed, "k": 0, "final_accuracy": 0.5,
                "eval_accuracy": [0.4, 0.5], "eval_iterations": [1, 2], "reward": [0.1],
                "clip_fraction_mean": [0.0], "filtered_fraction_mean": [0.0],
                "tv_estimate_mean": [0.0], "tv_estimate_max": [0.0], "approx_kl_mean": [0.0],
                "final_sampled_accuracy": 0.25, "final_train_greedy_accuracy": train}

    table = experiment.summarize_lag([row(0, None), row(1, None)])["ppo_clip"]["1"]
    assert "train_greedy_accuracy" not in table and "generalization_gap" not in table
    assert table["sampled_accuracy"] == 0.25
    table = experiment.summarize_lag([row(0, 0.75), row(1, 0.75)])["ppo_clip"]["1"]
    assert table["generalization_gap"] == 0.25
