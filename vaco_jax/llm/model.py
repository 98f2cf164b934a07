"""A decoder-only transformer policy (SPEC §6): RoPE, causal attention, pre-norm, SwiGLU.

One module serves three uses with the same arithmetic:

* full forward on `[B, T]` tokens (training, teacher forcing, the no-cache sampler);
* prefill: the prompt written into a KV cache;
* decode: one token per sequence per step against the cache (`vaco_jax.llm.sampling`).

The cache is plain data passed in and returned (no mutable collections), so sampling is a pure
`lax.scan`. Padding is explicit: `valid [B, T]` marks real tokens; a query never attends to a
padded key or a later slot. Positions (for RoPE) count real tokens only, so left-padded prompts and
their continuations get the same positions with or without the cache.

`dtype` is the compute dtype (`bfloat16` for accelerators); parameters are kept in float32 and the
logits are always float32.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from vaco_jax.llm import tokenizer
from vaco_jax.llm.config import DTYPE_NAMES, ModelConfig

DTYPES = {name: getattr(jnp, name) for name in DTYPE_NAMES}   # float32, bfloat16


def apply_rope(x, positions, base: float):
    """Rotary position embedding. `x [B, T, H, D]`, `positions [B, T]` → `[B, T, H, D]`."""
    half = x.shape[-1] // 2
    freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = positions[..., None].astype(jnp.float32) * freq            # [B, T, D/2]
    sin, cos = jnp.sin(angle)[:, :, None, :], jnp.cos(angle)[:, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def _dense(features, config, name, axis=-1, scale=1.0):
    return nn.DenseGeneral(features, axis=axis, use_bias=False, dtype=DTYPES[config.dtype],
                           kernel_init=nn.initializers.normal(0.02 * scale), name=name)


class Attention(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x, positions, mask, kv=None, index=None):
        """`x [B, T, d]`; `mask [B, 1, T, S]`; `kv` = {"k", "v": [B, S, H, D]} written at `index`."""
        c = self.config
        heads = (c.num_heads, c.head_dim)
        q = apply_rope(_dense(heads, c, "query")(x), positions, c.rope_base)
        k = apply_rope(_dense(heads, c, "key")(x), positions, c.rope_base)
        v = _dense(heads, c, "value")(x)
        if kv is not None:
            k = jax.lax.dynamic_update_slice_in_dim(kv["k"], k.astype(kv["k"].dtype), index, axis=1)
            v = jax.lax.dynamic_update_slice_in_dim(kv["v"], v.astype(kv["v"].dtype), index, axis=1)
            kv = {"k": k, "v": v}
        out = jax.nn.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype), mask=mask)
        scale = 1.0 / (2 * c.num_layers) ** 0.5   # residual branches scaled at init (GPT-2)
        return _dense(c.d_model, c, "out", axis=(-2, -1), scale=scale)(out), kv


class Block(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x, positions, mask, kv=None, index=None):
        c = self.config
        dtype = DTYPES[c.dtype]
        h, kv = Attention(c, name="attention")(nn.RMSNorm(dtype=dtype, name="norm_attention")(x),
                                               positions, mask, kv, index)
        x = x + h
        h = nn.RMSNorm(dtype=dtype, name="norm_mlp")(x)
        h = nn.silu(_dense(c.d_ff, c, "gate")(h)) * _dense(c.d_ff, c, "up")(h)
        x = x + _dense(c.d_model, c, "down", scale=1.0 / (2 * c.num_layers) ** 0.5)(h)
        return x, kv


class Transformer(nn.Module):
    """`(tokens [B, T], positions [B, T], valid [B, T], cache=None, index=None) → (logits, cache)`.

    Without a cache, token t attends to valid tokens ≤ t. With a cache of `S` slots, the `T` tokens
    are written at slots `index .. index + T − 1` and attend to every valid slot up to their own.
    Logits are float32 `[B, T, vocab_size]`.
    """

    config: ModelConfig

    @nn.compact
    def __call__(self, tokens, positions, valid, cache=None, index=None):
        c = self.config
        dtype = DTYPES[c.dtype]
        embed = nn.Embed(c.vocab_size, c.d_model, embedding_init=nn.initializers.normal(0.02),
                         dtype=dtype, name="embed")
        x = embed(tokens)
        T = tokens.shape[1]
        if cache is None:
            causal = jnp.tril(jnp.ones((T, T), bool))
            mask = causal[None, None] & valid[:, None, None, :]
        else:
            key_valid = jax.lax.dynamic_update_slice_in_dim(cache["valid"], valid, index, axis=1)
            slots = jnp.arange(key_valid.shape[1])
            query_slots = index + jnp.arange(T)
            mask = (slots[None, :] <= query_slots[:, None])[None, None] \
                & key_valid[:, None, None, :]
        layers = []
        for i in range(c.num_layers):
            kv = None if cache is None else cache["layers"][i]
            x, kv = Block(c, name=f"block_{i}")(x, positions, mask, kv, index)
            layers.append(kv)
        x = nn.RMSNorm(dtype=dtype, name="norm_final")(x).astype(jnp.float32)
        if c.tie_embeddings:
            logits = x @ embed.embedding.astype(jnp.float32).T
        else:
            logits = nn.Dense(c.vocab_size, use_bias=False, dtype=jnp.float32,
                              kernel_init=nn.initializers.normal(0.02), name="unembed")(x)
        new_cache = None if cache is None else {"valid": key_valid, "layers": tuple(layers)}
        return logits, new_cache


def init_cache(config: ModelConfig, batch: int, length: int):
    """An empty KV cache of `length` slots: per layer k, v `[B, S, H, D]` in the compute dtype."""
    shape = (batch, length, config.num_heads, config.head_dim)
    dtype = DTYPES[config.dtype]
    layer = lambda: {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}  # noqa: E731
    return {"valid": jnp.zeros((batch, length), bool),
            "layers": tuple(layer() for _ in range(config.num_layers))}


def init_params(config: ModelConfig, key):
    """Parameters for `Transformer(config)` (float32)."""
    tokens = jnp.zeros((1, 8), jnp.int32)
    return Transformer(config).init(key, tokens, jnp.zeros_like(tokens), tokens == 0)


def num_params(params) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(params))


def positions_of(valid):
    """RoPE positions: the count of real tokens before each slot. `valid [B, T]` → `[B, T]` int32."""
    return jnp.maximum(jnp.cumsum(valid.astype(jnp.int32), axis=-1) - 1, 0)


def policy_log_probs(logits, temperature=1.0, top_p: float = 1.0):
    """The policy distribution over next tokens: PAD and BOS can never be written.

    Sampling, the warm start and every GRPO ratio use this one definition, so `π_θ/β` compares like
    with like. `top_p` < 1 is what the sampler draws from (and only the sampler): the smallest set
    of tokens whose probability reaches `top_p` (always at least the most likely one),
    renormalised; the others get log-probability −inf. `logits [..., V]` → log-probabilities
    `[..., V]` (float32).
    """
    banned = jnp.zeros(logits.shape[-1], bool).at[jnp.array([tokenizer.PAD, tokenizer.BOS])].set(True)
    logits = jnp.where(banned, -1e9, logits.astype(jnp.float32) / temperature)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    if top_p >= 1.0:
        return log_probs
    sorted_lp = jnp.flip(jnp.sort(log_probs, axis=-1), axis=-1)
    mass_before = jnp.cumsum(jnp.exp(sorted_lp), axis=-1) - jnp.exp(sorted_lp)
    cutoff = jnp.min(jnp.where(mass_before < top_p, sorted_lp, jnp.inf), axis=-1, keepdims=True)
    return jax.nn.log_softmax(jnp.where(log_probs >= cutoff, log_probs, -jnp.inf), axis=-1)


def token_log_probs(logits, tokens, temperature=1.0):
    """`log π(token)` under the model's tempered distribution `policy_log_probs(logits,
    temperature)`: logits `[..., V]`, tokens `[...]` → `[...]` float32. The one definition of a
    token's log-probability shared by the sampler (log β) and the learner (log π_θ)."""
    log_probs = policy_log_probs(logits, temperature)
    return jnp.take_along_axis(log_probs, tokens[..., None], axis=-1)[..., 0]


def sequence_log_probs(apply_fn, params, prompts, answers, temperature=1.0):
    """Log-probability of each answer token given everything before it (teacher forcing), under
    the model's tempered distribution `policy_log_probs(·, temperature)` (never truncated: the
    learner's log π_θ, the same function of the logits as the sampler's log β).

    `prompts [B, P]` (left-padded), `answers [B, A]` → `[B, A]` float32. One full forward pass.
    """
    tokens = jnp.concatenate([prompts, answers], axis=1)
    valid = tokens != tokenizer.PAD
    logits, _ = apply_fn(params, tokens, positions_of(valid), valid)
    P = prompts.shape[1]
    return token_log_probs(logits[:, P - 1:-1], answers, temperature)


def answer_mask(answers):
    """1 for answer tokens up to and including the first EOS. `[B, A]` int → `[B, A]` float32."""
    eos = answers == tokenizer.EOS
    before = jnp.cumsum(eos, axis=-1) - eos   # EOS tokens strictly before each slot
    return (before == 0).astype(jnp.float32)
