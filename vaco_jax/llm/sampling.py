"""Sampling answers from the policy: a jitted `lax.scan` over tokens, many sequences at once (SPEC §6).

With the KV cache (default) the prompt is prefilled once and each step runs the model on one token
per sequence; without it every step re-runs the full forward pass over the whole buffer (the
reference for the throughput ratio, and for the equality test). Both choose tokens the same way:
greedy (argmax) or a draw from `policy_log_probs(logits, temperature)`, optionally restricted to the
top-p nucleus. A sequence that has written EOS writes PAD from then on.

With `return_log_probs` the sampler also returns the behaviour log-probability of every token it
wrote, read from the very logits it drew with (no second pass that could round differently, e.g. in
bfloat16): the model's own tempered distribution, `policy_log_probs(logits, temperature)`, whatever
top-p restricted the draw to (why: `vaco_jax.llm.grpo`); 0 after EOS, where PAD is certain.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vaco_jax.llm import tokenizer
from vaco_jax.llm.model import init_cache, policy_log_probs, positions_of, token_log_probs


def choose_tokens(logits, key, *, temperature=1.0, top_p: float = 1.0, greedy: bool = False):
    """Next tokens `[B]` from logits `[B, V]`: the argmax, or a draw from `policy_log_probs(logits,
    temperature, top_p)` (the top-p nucleus of the tempered distribution, renormalised)."""
    if greedy:
        return jnp.argmax(policy_log_probs(logits), axis=-1).astype(jnp.int32)
    log_probs = policy_log_probs(logits, temperature, top_p)
    return jax.random.categorical(key, log_probs, axis=-1).astype(jnp.int32)


def generate(apply_fn, params, prompts, key, *, model_config, max_new_tokens: int,
             temperature=1.0, top_p: float = 1.0, greedy: bool = False, use_cache: bool = True,
             return_logits: bool = False, return_log_probs: bool = False):
    """Answers for left-padded `prompts [B, P]`.

    Returns `answers [B, A]` int32 (PAD after EOS), then with `return_log_probs` the behaviour
    log-probabilities `[B, A]` of the written tokens (`token_log_probs` of the logits they were
    drawn from; 0 after EOS), then with `return_logits` those logits `[B, A, V]`.
    `apply_fn` is `Transformer(model_config).apply`.
    """
    B, P = prompts.shape
    A = max_new_tokens
    valid = prompts != tokenizer.PAD
    lengths = valid.sum(axis=-1).astype(jnp.int32)   # real prompt tokens: the next position
    pick = lambda logits, k: choose_tokens(logits, k, temperature=temperature, top_p=top_p,  # noqa
                                           greedy=greedy)

    if use_cache:
        cache = init_cache(model_config, B, P + A)
        logits, cache = apply_fn(params, prompts, positions_of(valid), valid, cache=cache, index=0)
        state = (cache, logits[:, -1])

        def next_logits(state, tokens, written, t):
            cache, _ = state
            logits, cache = apply_fn(params, tokens[:, None], (lengths + t)[:, None],
                                     written[:, None], cache=cache, index=P + t)
            return cache, logits[:, 0]
    else:
        buffer = jnp.concatenate([prompts, jnp.full((B, A), tokenizer.PAD, jnp.int32)], axis=1)
        logits, _ = apply_fn(params, buffer, positions_of(buffer != tokenizer.PAD),
                             buffer != tokenizer.PAD)
        state = (buffer, logits[:, P - 1])

        def next_logits(state, tokens, written, t):
            buffer, _ = state
            buffer = jax.lax.dynamic_update_slice_in_dim(buffer, tokens[:, None], P + t, axis=1)
            tokens_valid = buffer != tokenizer.PAD
            logits, _ = apply_fn(params, buffer, positions_of(tokens_valid), tokens_valid)
            return buffer, jax.lax.dynamic_index_in_dim(logits, P + t, axis=1, keepdims=False)

    def step(carry, inputs):
        state, done = carry
        t, k = inputs
        logits = state[1]
        tokens = jnp.where(done, tokenizer.PAD, pick(logits, k))
        log_probs = (jnp.where(done, 0.0, token_log_probs(logits, tokens, temperature))
                     if return_log_probs else None)
        written = ~done
        state = next_logits(state, tokens, written, t)
        done = done | (tokens == tokenizer.EOS)
        return (state, done), (tokens, log_probs, logits if return_logits else None)

    keys = jax.random.split(key, A)
    (_, _), (answers, log_probs, logits) = jax.lax.scan(
        step, (state, jnp.zeros(B, bool)), (jnp.arange(A, dtype=jnp.int32), keys))
    outputs = (answers.T,)
    if return_log_probs:
        outputs += (log_probs.T,)
    if return_logits:
        outputs += (jnp.swapaxes(logits, 0, 1),)
    return outputs if len(outputs) > 1 else outputs[0]
