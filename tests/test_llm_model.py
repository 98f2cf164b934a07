"""The transformer policy and its sampler (SPEC §6): KV-cache decoding equals the full forward pass,
padding does not leak, sampling rules, the accelerator preset's shapes, config errors."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vaco_jax.config import ConfigError
from vaco_jax.llm import config as llm_config
from vaco_jax.llm import model, sampling, tokenizer
from vaco_jax.llm.experiment import FAST_COMPILE

CONFIG = model.ModelConfig(d_model=32, num_layers=2, num_heads=2, d_ff=48, max_len=64)
ANSWER_LEN = 12
QUESTIONS = ["Ann has 7 eggs.", "Bob has 12 pens. Bob sells 3.", "x", "How many?"]
APPLY = model.Transformer(CONFIG).apply


def generate(params, prompts, key, **kwargs):
    """`sampling.generate` for CONFIG, jitted with cheap compilation (tests are compile-bound)."""
    return _jitted(tuple(sorted(kwargs.items())))(params, prompts, key)


@functools.cache
def _jitted(kwargs):
    return jax.jit(lambda p, x, k: sampling.generate(APPLY, p, x, k, model_config=CONFIG,
                                                     max_new_tokens=ANSWER_LEN, **dict(kwargs)),
                   compiler_options=FAST_COMPILE)


@pytest.fixture(scope="module")
def params():
    # Random weights scaled up so attention is sharp and logits differ strongly between positions
    # (std ~2): a masking or cache-indexing bug then shows up far above float32 round-off (~1e-5).
    p = model.init_params(CONFIG, jax.random.PRNGKey(0))
    return jax.tree.map(lambda x: 4.0 * x, p)


@pytest.fixture(scope="module")
def prompts():
    return jnp.asarray(np.stack([tokenizer.pad_left([tokenizer.BOS] + tokenizer.encode(q), 40)
                                 for q in QUESTIONS]))


def test_kv_cache_logits_equal_full_forward(params, prompts):
    key = jax.random.PRNGKey(1)
    answers, logits = generate(params, prompts, key, use_cache=True, return_logits=True)
    answers_nc, logits_nc = generate(params, prompts, key, use_cache=False, return_logits=True)
    answers, logits = np.asarray(answers), np.asarray(logits)
    assert logits.std() > 1.0                       # the comparison is not between near-constants
    # Same keys, same logits: the cached and uncached samplers write the same tokens.
    np.testing.assert_array_equal(answers, np.asarray(answers_nc))
    np.testing.assert_allclose(logits, np.asarray(logits_nc), atol=1e-4)
    # And both equal one teacher-forced forward pass over prompt + answer, at every answer token
    # up to EOS (the log-probabilities the GRPO ratios are made of).
    teacher = np.asarray(model.sequence_log_probs(APPLY, params, prompts, jnp.asarray(answers)))
    sampled = np.take_along_axis(np.asarray(model.policy_log_probs(jnp.asarray(logits))),
                                 answers[..., None], -1)[..., 0]
    mask = np.asarray(model.answer_mask(jnp.asarray(answers))) > 0
    assert mask.sum() > 10
    np.testing.assert_allclose(teacher[mask], sampled[mask], atol=1e-4)


def test_left_padding_does_not_change_a_sequence(params, prompts):
    # Greedy decoding of one prompt alone, with less left padding, gives exactly the logits it got
    # inside the batch: padded slots are invisible and RoPE positions count real tokens only.
    key = jax.random.PRNGKey(0)
    batch_answers, batch_logits = generate(params, prompts, key, greedy=True, return_logits=True)
    short = prompts[1:2, -31:]
    assert int((short == tokenizer.PAD).sum()) < int((prompts[1] == tokenizer.PAD).sum())
    assert tokenizer.decode(short[0]) == tokenizer.decode(prompts[1])
    answers, logits = generate(params, short, key, greedy=True, return_logits=True)
    np.testing.assert_array_equal(np.asarray(answers[0]), np.asarray(batch_answers[1]))
    live = np.asarray(model.answer_mask(answers))[0] > 0
    np.testing.assert_allclose(np.asarray(logits[0])[live], np.asarray(batch_logits[1])[live],
                               atol=1e-4)


def test_sampling_rules(params, prompts):
    key = jax.random.PRNGKey(3)
    greedy, greedy_logits = generate(params, prompts, key, greedy=True, return_logits=True)
    greedy, greedy_logits = np.asarray(greedy), np.asarray(greedy_logits)
    live = np.asarray(model.answer_mask(jnp.asarray(greedy))) > 0
    # Greedy writes the argmax of the allowed tokens; PAD and BOS are never written.
    allowed = greedy_logits.copy()
    allowed[..., [tokenizer.PAD, tokenizer.BOS]] = -np.inf
    assert np.array_equal(greedy[live], allowed.argmax(-1)[live])
    # A nucleus smaller than the top token's mass is greedy decoding.
    nucleus = generate(params, prompts, key, top_p=1e-6)
    np.testing.assert_array_equal(np.asarray(nucleus), greedy)
    # After EOS only PAD; before it never PAD or BOS.
    samples = np.asarray(generate(params, jnp.tile(prompts, (8, 1)), key))
    mask = np.asarray(model.answer_mask(jnp.asarray(samples))) > 0
    ended = mask & (samples == tokenizer.EOS)
    assert ended.any()
    assert np.all(samples[~mask] == tokenizer.PAD)
    assert not np.isin(samples[mask], [tokenizer.PAD, tokenizer.BOS]).any()


def test_top_p_keeps_the_smallest_nucleus():
    logits = jnp.log(jnp.array([[0.0, 0.0, 0.5, 0.3, 0.15, 0.05]]))  # ids 0, 1 are PAD, BOS
    keys = jax.random.split(jax.random.PRNGKey(0), 2000)
    draw = jax.vmap(lambda k: sampling.choose_tokens(logits, k, top_p=0.75))(keys)
    counts = np.bincount(np.asarray(draw).ravel(), minlength=6)
    assert counts[4] == counts[5] == 0                 # outside the 0.8 nucleus {2, 3}
    assert abs(counts[2] / 2000 - 0.5 / 0.8) < 0.05   # renormalised inside it


def test_accelerator_preset_builds_a_few_hundred_million_parameters():
    config = llm_config.preset("gpu")
    llm_config.validate(config)
    m = config.model
    shapes = jax.eval_shape(lambda: model.init_params(m, jax.random.PRNGKey(0)))
    n = model.num_params(shapes)
    assert 1e8 <= n <= 5e8, n
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(shapes))   # params stay f32
    L = config.task.prompt_len + config.task.answer_len
    tokens = jax.ShapeDtypeStruct((2, L), jnp.int32)
    logits, _ = jax.eval_shape(
        lambda p, t: model.Transformer(m).apply(p, t, t, t > 0), shapes, tokens)
    assert logits.shape == (2, L, m.vocab_size) and logits.dtype == jnp.float32
    cache = jax.eval_shape(lambda: model.init_cache(m, 2, L))
    assert cache["layers"][0]["k"].shape == (2, L, m.num_heads, m.head_dim)
    assert cache["layers"][0]["k"].dtype == jnp.bfloat16


def test_bfloat16_compute_is_close_to_float32(params, prompts):
    bf16 = dataclasses.replace(CONFIG, dtype="bfloat16")
    tokens = prompts
    valid = tokens != tokenizer.PAD
    positions = model.positions_of(valid)
    small = jax.tree.map(lambda x: x / 4.0, params)   # ordinary init scale
    def forward(config):
        return jax.jit(model.Transformer(config).apply, compiler_options=FAST_COMPILE)(
            small, tokens, positions, valid)[0]
    f32_logits, bf_logits = forward(CONFIG), forward(bf16)
    assert bf_logits.dtype == jnp.float32
    err = np.abs(np.asarray(bf_logits) - np.asarray(f32_logits))[np.asarray(valid)]
    assert err.max() < 0.05 * max(1.0, float(np.abs(f32_logits).max()))


def test_bad_config_fields_are_named():
    with pytest.raises(ValueError, match="model.num_heads"):
        dataclasses.replace(CONFIG, num_heads=3).validate()
    with pytest.raises(ValueError, match="even"):
        dataclasses.replace(CONFIG, d_model=36, num_heads=4).validate()
    base = llm_config.preset("tiny")
    cases = {"grpo.num_minibatches": dict(grpo=dict(num_minibatches=5)),
             "grpo.objective": dict(grpo=dict(objective="ppo")),
             "grpo.group_size": dict(grpo=dict(group_size=1)),
             "grpo.capacity": dict(grpo=dict(capacity=3, max_capacity=2)),
             "model.max_len": dict(model=dict(max_len=20)),
             "model.dtype": dict(model=dict(dtype="float16")),
             "grpo.eval_every": dict(grpo=dict(eval_every=3)),
             "task.direct_fraction": dict(task=dict(direct_fraction=1.5))}
    for field, change in cases.items():
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            llm_config.validate(llm_config.replace(base, **change))


def test_sampling_and_behaviour_log_probs_use_one_nucleus():
    logits = jnp.log(jnp.array([[0.0, 0.0, 0.5, 0.3, 0.15, 0.05]]))  # ids 0, 1 are PAD, BOS
    truncated = np.exp(np.asarray(model.policy_log_probs(logits, top_p=0.75)[0]))
    np.testing.assert_allclose(truncated, [0, 0, 0.5 / 0.8, 0.3 / 0.8, 0, 0], atol=1e-6)
    full = np.exp(np.asarray(model.policy_log_probs(logits)[0]))
    np.testing.assert_allclose(full, [0, 0, 0.5, 0.3, 0.15, 0.05], atol=1e-6)
    keys = jax.random.split(jax.random.PRNGKey(1), 4000)
    draw = jax.vmap(lambda k: sampling.choose_tokens(logits, k, top_p=0.75))(keys)
    frequencies = np.bincount(np.asarray(draw).ravel(), minlength=6) / 4000
    np.testing.assert_allclose(frequencies, truncated, atol=0.03)


@pytest.mark.parametrize("top_p", [1.0, 0.999, 0.9])
def test_the_sampler_returns_the_log_probs_the_learner_computes(params, prompts, top_p):
    # log β is read from the logits each token was drawn with, by the learner's own definition
    # (`token_log_probs`: the model's tempered distribution, whatever top_p restricted the draw
    # to), so π_θ/β from the same logits is 1 — up to the last bit or two, as XLA fuses the same
    # arithmetic differently in different programs. The learner's teacher-forced pass differs from
    # the cached decode by float32 round-off only.
    key, prompts = jax.random.PRNGKey(3), jnp.tile(prompts, (8, 1))   # some answers end early
    answers, log_behavior, logits = generate(params, prompts, key, top_p=top_p,
                                             return_log_probs=True, return_logits=True)
    live = np.asarray(model.answer_mask(answers)) > 0
    assert (~live).any() and live.sum() > 10
    same_logits = np.asarray(model.token_log_probs(logits, answers) - log_behavior)[live]
    np.testing.assert_allclose(same_logits, 0.0, rtol=0, atol=1e-6)
    teacher = jax.jit(lambda p, x, a: model.sequence_log_probs(APPLY, p, x, a),
                      compiler_options=FAST_COMPILE)(params, prompts, answers)
    assert np.abs(np.asarray(teacher - log_behavior)[live]).max() < 1e-5
    # After EOS the sampler writes PAD with probability 1.
    np.testing.assert_array_equal(np.asarray(log_behavior)[~live], 0.0)
