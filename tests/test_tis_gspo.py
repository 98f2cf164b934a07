"""Truncated importance sampling (`tis`) and GSPO (`gspo`), the two objectives LLM RL systems use
most for stale or mismatched rollouts (docs/SPEC.md, "Stale-data objectives of other systems").

Sources read: verl `docs/algo/rollout_corr_math.md` and `verl/trainer/ppo/core_algos.py`
(`compute_policy_loss_vanilla`'s `rollout_is_weights`, `compute_policy_loss_gspo`, `agg_loss`),
verl `recipe/gspo/test_gspo_3b_math.sh`, slime `slime/backends/megatron_utils/loss.py`
(`vanilla_tis_function`) and slime's `--tis-clip` / `--tis-clip-low` arguments.

* `tis` is decoupled PPO with C = 2 in both systems: the weight `min(π_old/π_rollout, C)`, with
  π_old the learner recomputed at the iteration's start (π_T), multiplies PPO's clipped surrogate
  of `π_θ/π_old` per token, without gradient. So it is another name of `decoupled_ppo`.
* `gspo` clips `s_i = exp(mean_t log(π_θ/β))` per sequence, each token's term carrying the value
  `s_i` and the gradient `s_i ∇log π_θ`, averaged over each sequence's tokens and then over the
  sequences (verl's "seq-mean-token-mean"); ε_low = 3e-4, ε_high = 4e-4.

Each is checked against a plain-Python computation (loss and gradient) and its on-policy
reduction; GSPO is refused in control before anything compiles; both run in the LLM's GRPO.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vaco_jax import Trainer, algorithms, objectives
from vaco_jax.config import Config, validate
from vaco_jax.errors import ConfigError
from vaco_jax.llm import config as llm_config
from vaco_jax.llm import experiment, grpo, model

TINY = llm_config.preset("tiny")


def value_grad_metrics(name, log_prob, log_behavior, advantages, *, log_proximal=None,
                       mask=None, own=(), **params):
    """A registered objective's loss, its gradient w.r.t. log π_θ and its metrics (its own
    hyper-parameters at their defaults unless given in `own`)."""
    objective = algorithms.parse(name).objective
    p = algorithms.ObjectiveParams(**params, own={**objective.defaults, **dict(own)})

    def loss(lp):
        x = algorithms.PolicyInputs(lp, jnp.asarray(log_behavior), jnp.asarray(advantages),
                                    mask=None if mask is None else jnp.asarray(mask),
                                    log_proximal=None if log_proximal is None
                                    else jnp.asarray(log_proximal))
        return objective(x, p)
    (value, metrics), grad = jax.value_and_grad(loss, has_aux=True)(jnp.asarray(log_prob))
    return float(value), np.asarray(grad), {k: float(v) for k, v in metrics.items()}


# --- tis ------------------------------------------------------------------------------------------
# Six samples, written with probabilities (ε = 0.2, C = 2):
#   β       = 0.10  0.40  0.50  0.20  0.30  0.60
#   π_T     = 0.30  0.40  0.20  0.25  0.05  0.60
#   π_θ     = 0.33  0.60  0.17  0.25  0.07  0.30
#   Â       = 1.0  −2.0   0.5  −1.0   2.0  −0.5
#   π_T/β   = 3.0   1.0   0.4   1.25  0.167 1.0    → weight min(·, 2): sample 0 capped at 2
#   π_θ/π_T = 1.1   1.5   0.85  1.0   1.4   0.5    → the clip binds on 4 (Â > 0) and 5 (Â < 0)
BEHAVIOR = np.array([0.10, 0.40, 0.50, 0.20, 0.30, 0.60])
PROXIMAL = np.array([0.30, 0.40, 0.20, 0.25, 0.05, 0.60])
LEARNER = np.array([0.33, 0.60, 0.17, 0.25, 0.07, 0.30])
ADVANTAGES = np.array([1.0, -2.0, 0.5, -1.0, 2.0, -0.5], np.float32)
LOG_B, LOG_T, LOG_P = (np.log(p).astype(np.float32) for p in (BEHAVIOR, PROXIMAL, LEARNER))


def test_tis_is_decoupled_ppo_under_verl_and_slimes_name():
    # verl: pg_losses (PPO's clip of π_θ/π_old) × rollout_is_weights = min(π_old/π_rollout, C),
    # C = 2; slime: pg_loss × clamp(exp(old − rollout), tis_clip_low = 0, tis_clip = 2). Both
    # with π_old the learner at the iteration's start: decoupled PPO, whose C defaults to 2.
    assert algorithms.parse("tis") == algorithms.parse("decoupled_ppo")
    assert algorithms.parse("vtrace_once+tis").objective is algorithms.OBJECTIVES["decoupled_ppo"]
    assert Config().decoupled_is_max == llm_config.GRPOConfig().decoupled_is_max == 2.0
    assert algorithms.ObjectiveParams().decoupled_is_max == 2.0
    validate(Config(env="toy_reach", algo="tis"))
    hp = Config(env="toy_reach", algo="tis", decoupled_is_max=3.0).hparams()
    assert float(hp.decoupled_is_max) == 3.0 and hp.objective == {}   # C is the shared field
    with pytest.raises(ConfigError, match="objective_hparams"):
        Config(env="toy_reach", algo="tis", objective_hparams=("tis_clip=3",)).hparams()


def test_tis_against_a_hand_computation():
    loss, grad, metrics = value_grad_metrics("tis", LOG_P, LOG_B, ADVANTAGES, log_proximal=LOG_T,
                                             clip_eps=0.2, decoupled_is_max=2.0)
    terms, grads = [], []
    for b, t, p, a in zip(BEHAVIOR, PROXIMAL, LEARNER, ADVANTAGES):
        weight, r = min(t / b, 2.0), p / t
        clipped = min(max(r, 0.8), 1.2)
        terms.append(weight * min(r * a, clipped * a))
        binds = clipped * a < r * a                    # the clipped term is taken: no gradient
        grads.append(0.0 if binds else weight * r * a)  # d(w r a)/d log π_θ = w r a
    assert loss == pytest.approx(-np.mean(terms), rel=1e-6)
    assert loss == pytest.approx(-(2.2 - 3.0 + 0.17 - 1.25 + 0.4 - 0.4) / 6, rel=1e-5)
    np.testing.assert_allclose(grad, -np.array(grads) / 6, rtol=1e-5, atol=1e-8)
    # The clip takes the gradient of 4 and 5 away; the cap lowers sample 0's weight 3 → 2.
    np.testing.assert_array_equal(np.nonzero(grad == 0)[0], [4, 5])
    assert grad[0] == pytest.approx(-2.0 * 1.1 / 6, rel=1e-5)
    assert metrics["behavior_capped_fraction"] == pytest.approx(1 / 6)
    assert metrics["clip_fraction"] == pytest.approx(3 / 6)          # |π_θ/π_T − 1| > ε: 1, 4, 5


def test_tis_with_beta_equal_to_the_learner_is_ppo_clip_bit_for_bit():
    # β = π_T: every weight is min(1, C) = 1, and the clip is around β.
    loss, grad, metrics = value_grad_metrics("tis", LOG_P, LOG_B, ADVANTAGES, log_proximal=LOG_B,
                                             clip_eps=0.2, decoupled_is_max=2.0)
    ppo_loss, ppo_grad, ppo_metrics = value_grad_metrics("ppo_clip", LOG_P, LOG_B, ADVANTAGES,
                                                         clip_eps=0.2)
    assert loss == ppo_loss
    np.testing.assert_array_equal(grad, ppo_grad)
    assert metrics["clip_fraction"] == ppo_metrics["clip_fraction"]
    assert metrics["behavior_capped_fraction"] == 0.0


# --- gspo -----------------------------------------------------------------------------------------
# Five sequences of up to three tokens, ε_low = 0.05, ε_high = 0.1 (s in [0.95, 1.1] is unclipped):
#   0: log w = 0, log 1.25, (pad)      s = exp(0.1116) = 1.118  Â = +1  clip binds: no gradient
#   1: log w = log 1.2, 0, log(9/7)    s = exp(0.1445) = 1.156  Â = −1  unclipped side
#   2: log w = log 0.9, log 0.9, 0     s = exp(−0.0702) = 0.932 Â = −2  clip binds: no gradient
#   3: no tokens                                                        left out
#   4: log w = log 1.05, 0, 0          s = exp(0.0163) = 1.016  Â = ½   inside the range
SEQ_BEHAVIOR = np.array([[0.3, 0.4, 0.25], [0.5, 0.1, 0.7], [0.2, 0.5, 0.4], [0.2, 0.3, 0.4],
                         [0.4, 0.4, 0.4]])
SEQ_LEARNER = np.array([[0.3, 0.5, 0.2], [0.6, 0.1, 0.9], [0.18, 0.45, 0.4], [0.9, 0.1, 0.2],
                        [0.42, 0.4, 0.4]])
SEQ_MASK = np.array([[1, 1, 0], [1, 1, 1], [1, 1, 1], [0, 0, 0], [1, 1, 1]], np.float32)
SEQ_ADVANTAGES = np.repeat(np.array([[1.0], [-1.0], [-2.0], [5.0], [0.5]], np.float32), 3, 1)


def test_gspo_against_a_hand_computation():
    log_p, log_b = np.log(SEQ_LEARNER).astype(np.float32), np.log(SEQ_BEHAVIOR).astype(np.float32)
    loss, grad, metrics = value_grad_metrics("gspo", log_p, log_b, SEQ_ADVANTAGES, mask=SEQ_MASK,
                                             own={"gspo_eps_low": 0.05, "gspo_eps_high": 0.1})
    terms, expected_grad, binding_tokens = [], np.zeros_like(log_p), 0
    sequences = [i for i in range(5) if SEQ_MASK[i].sum() > 0]
    for i in sequences:
        tokens = np.nonzero(SEQ_MASK[i])[0]
        s = np.exp(np.mean(np.log(SEQ_LEARNER[i, tokens] / SEQ_BEHAVIOR[i, tokens])))
        a = SEQ_ADVANTAGES[i, 0]
        clipped = min(max(s, 0.95), 1.1)
        terms.append(min(s * a, clipped * a))
        binds = clipped * a < s * a
        binding_tokens += len(tokens) * binds
        # ∂/∂log π_θ(y_it) of −(1/4)(1/|y_i|) Σ_t s_it Â: −s Â / (4 |y_i|) unless the clip binds.
        expected_grad[i, tokens] = 0.0 if binds else -s * a / (len(sequences) * len(tokens))
    assert loss == pytest.approx(-np.mean(terms), rel=1e-5)
    assert loss == pytest.approx(-(1.1 - 1.1555 - 1.9 + 0.5082) / 4, rel=1e-3)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-8)
    assert np.all(grad[[0, 2, 3]] == 0) and np.all(grad[[1, 4]][SEQ_MASK[[1, 4]] > 0] != 0)
    # The clip took the gradient of sequences 0 and 2 away: 5 of the 11 tokens.
    assert metrics["intervened_fraction"] == pytest.approx(binding_tokens / SEQ_MASK.sum()) == \
        pytest.approx(5 / 11)


def test_gspo_with_one_token_sequences_is_ppo_clip():
    # One token per sequence: s = w, and the sequence mean is the token mean. With ε_low = ε_high
    # = ε it is PPO-Clip with that ε (GSPO's defaults, 3e-4 and 4e-4, are asymmetric).
    rng = np.random.default_rng(1)
    log_b = np.log(rng.uniform(0.05, 0.9, 12)).astype(np.float32)
    log_p = (log_b + rng.normal(0, 0.4, 12)).astype(np.float32)
    adv = rng.normal(size=12).astype(np.float32)
    mask = (rng.random(12) < 0.75).astype(np.float32)
    loss, grad, metrics = value_grad_metrics(
        "gspo", log_p[:, None], log_b[:, None], adv[:, None], mask=mask[:, None],
        own={"gspo_eps_low": 0.2, "gspo_eps_high": 0.2})
    ppo_loss, ppo_grad, ppo_metrics = value_grad_metrics("ppo_clip", log_p, log_b, adv,
                                                         mask=mask, clip_eps=0.2)
    assert loss == pytest.approx(ppo_loss, rel=1e-6)
    np.testing.assert_allclose(grad[:, 0], ppo_grad, rtol=1e-6, atol=1e-9)
    # Both count |w − 1| > ε as `clip_fraction`, and the tokens whose gradient the clip removed
    # as `intervened_fraction`.
    binds = mask * (((adv > 0) & (np.exp(log_p - log_b) > 1.2))
                    | ((adv < 0) & (np.exp(log_p - log_b) < 0.8)))
    assert 0 < metrics["intervened_fraction"] == pytest.approx(binds.sum() / mask.sum())
    assert metrics["intervened_fraction"] == pytest.approx(ppo_metrics["intervened_fraction"])
    assert metrics["clip_fraction"] == pytest.approx(ppo_metrics["clip_fraction"])
    assert metrics["intervened_fraction"] < metrics["clip_fraction"]


def test_gspo_at_theta_equal_beta_is_the_sequence_mean_policy_gradient():
    # On-policy at the first step (π_θ = β, s = 1): nothing is clipped and the gradient is the
    # policy gradient averaged over each answer's tokens, then over the answers.
    log_b = np.log(SEQ_BEHAVIOR).astype(np.float32)
    loss, grad, metrics = value_grad_metrics("gspo", log_b, log_b, SEQ_ADVANTAGES, mask=SEQ_MASK)
    lengths = SEQ_MASK.sum(1, keepdims=True)
    expected = -SEQ_ADVANTAGES * SEQ_MASK / (np.maximum(lengths, 1) * 4)   # 4 non-empty answers
    np.testing.assert_allclose(grad, expected, rtol=1e-6)
    assert loss == pytest.approx(-np.mean(SEQ_ADVANTAGES[[0, 1, 2, 4], 0]), rel=1e-6)
    assert metrics["clip_fraction"] == 0.0


def test_gspo_is_refused_in_control_before_anything_compiles():
    # A control sample is one action: there is no sequence to average a ratio over. Validation
    # (which the trainer runs first, on construction) names the field and says where GSPO runs.
    for algo in ("gspo", "vtrace_once+gspo"):
        config = Config(env="toy_reach", algo=algo)
        with pytest.raises(ConfigError, match=r"`algo` = .*GSPO.*sequence.*LLM"):
            validate(config)
        with pytest.raises(ConfigError, match=r"`algo` = .*sequence"):
            Trainer(config)


# --- in the LLM's GRPO ----------------------------------------------------------------------------
def stale_token_batch(seed=0):
    """Answers `[8, 10]` of varied lengths whose log π_T differs from log β (backward lag)."""
    rng = np.random.default_rng(seed)
    B, A = 8, 10
    log_behavior = -rng.random((B, A)).astype(np.float32) * 3
    log_learner_start = (log_behavior + 0.4 * rng.normal(size=(B, A))).astype(np.float32)
    log_prob = (log_learner_start + 0.2 * rng.normal(size=(B, A))).astype(np.float32)
    advantages = np.repeat(rng.normal(size=(B, 1)), A, 1).astype(np.float32)
    mask = (np.arange(A)[None] < rng.integers(3, A + 1, size=B)[:, None]).astype(np.float32)
    batch = grpo.Batch(prompts=None, answers=None, mask=jnp.asarray(mask),
                       advantages=jnp.asarray(advantages * mask),
                       log_behavior=jnp.asarray(log_behavior),
                       log_learner_start=jnp.asarray(log_learner_start))
    return jnp.asarray(log_prob), batch


def grpo_loss(objective, log_prob, batch, **grpo_fields):
    hp = llm_config.hparams(dataclasses.replace(TINY.grpo, objective=objective, **grpo_fields))
    (loss, metrics), grad = jax.value_and_grad(
        lambda lp: grpo.policy_loss(lp, batch, hp), has_aux=True)(log_prob)
    return float(loss), np.asarray(grad), {k: float(v) for k, v in metrics.items()}


def test_in_grpo_tis_is_decoupled_ppo_and_gspo_reads_its_own_clip_range():
    log_prob, batch = stale_token_batch()
    tis, decoupled = grpo_loss("tis", log_prob, batch), grpo_loss("decoupled_ppo", log_prob, batch)
    assert tis[0] == decoupled[0] and tis[2] == decoupled[2]
    np.testing.assert_array_equal(tis[1], decoupled[1])
    assert 0 < tis[2]["intervened_fraction"] < 1
    direct = objectives.gspo(log_prob, batch.log_behavior, batch.advantages, eps_low=3e-4,
                             eps_high=4e-4, mask=batch.mask)
    loss, grad, metrics = grpo_loss("gspo", log_prob, batch)
    assert loss == pytest.approx(float(direct[0]), rel=1e-6)
    assert metrics["intervened_fraction"] == pytest.approx(
        float(direct[1]["intervened_fraction"]))
    assert np.all(grad[np.asarray(batch.mask) == 0] == 0) and np.all(np.isfinite(grad))
    wide = grpo_loss("gspo", log_prob, batch, objective_hparams=("gspo_eps_low=0.9",
                                                                "gspo_eps_high=9"))
    assert wide[2]["intervened_fraction"] == 0.0 < metrics["intervened_fraction"]
    assert wide[0] == pytest.approx(float(objectives.gspo(
        log_prob, batch.log_behavior, batch.advantages, eps_low=0.9, eps_high=9.0,
        mask=batch.mask)[0]), rel=1e-6)


def test_one_grpo_iteration_on_stale_answers_is_finite_for_each():
    # Two iterations of the tiny config, generated by the oldest of two snapshots (the second
    # iteration's answers come from the snapshot one iteration old), every run in one program.
    config = llm_config.validate(llm_config.replace(
        TINY, grpo=dict(num_minibatches=2, max_capacity=2, snapshot_sampling="oldest")))
    train_set, test_set = experiment.load_problems(config)
    trainer = grpo.GRPO(config, train_set, test_set,
                        reward_fn=lambda answers, _: (answers[:, 0] % 2).astype(jnp.float32))
    runs = ["tis", "decoupled_ppo", "gspo"]
    hps = llm_config.stack_hparams([llm_config.hparams(dataclasses.replace(
        config.grpo, objective=name, capacity=2)) for name in runs])
    params = model.init_params(config.model, jax.random.PRNGKey(0))
    keys = jnp.stack([jax.random.PRNGKey(7)] * len(runs))
    step = jax.jit(jax.vmap(trainer.iteration), compiler_options=experiment.FAST_COMPILE)
    state = jax.vmap(trainer.init, in_axes=(0, None, 0))(keys, params, hps)
    state, _ = step(state)
    state, metrics = jax.device_get(step(state))
    assert np.all(metrics["snapshot_age"] == 1)
    for i, name in enumerate(runs):
        for key in ("policy_loss", "grad_norm", "intervened_fraction"):
            assert np.all(np.isfinite(metrics["steps"][key][i])), (name, key)
        assert np.all(metrics["steps"]["grad_norm"][i] > 0), name
        assert all(np.all(np.isfinite(x[i])) for x in jax.tree.leaves(state.params)), name
    for leaf in jax.tree.leaves(state.params):
        np.testing.assert_array_equal(leaf[0], leaf[1])      # tis is decoupled_ppo, bit for bit
