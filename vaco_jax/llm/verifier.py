"""Answer extraction and the verifiable reward (SPEC §6): 1 if the final answer equals the target.

The rule, one definition with two implementations (Python for text, JAX for sampled tokens inside
the compiled GRPO loop; a test checks they agree on edge cases and random token strings):

* An answer is the text before the first EOS; an answer with no EOS (ran out of tokens) scores 0.
* The final answer is what follows the **last** `####`; it must be `[ ]*-?[0-9]{1,9}[ ]*` (spaces,
  an optional minus, 1 to 9 digits, spaces). Anything else — no marker, commas, text, 10+ digits,
  an empty answer — is malformed and scores 0. Nothing raises on malformed output.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp

from vaco_jax.llm import tokenizer

_FINAL = re.compile(r"[ ]*(-?[0-9]{1,9})[ ]*")
MAX_DIGITS = 9


def extract_answer(text) -> int | None:
    """The integer after the last `####`, or None when the text is malformed."""
    if not isinstance(text, str) or "####" not in text:
        return None
    match = _FINAL.fullmatch(text.rsplit("####", 1)[1])
    return int(match.group(1)) if match else None


def reward(text, target: int) -> float:
    """1.0 when the extracted answer equals `target`, else 0.0."""
    answer = extract_answer(text)
    return float(answer is not None and answer == target)


def score_tokens(ids, target: int) -> float:
    """Reward of a sampled answer given as token ids: 0 unless it contains EOS."""
    ids = [int(i) for i in ids]
    if tokenizer.EOS not in ids:
        return 0.0
    return reward(tokenizer.decode(ids), target)


# --- the same rule as a finite-state machine over tokens, for use under jit ----------------------
_NONE, _LEAD, _SIGN, _DIGITS, _TRAIL, _BAD = range(6)
_HASH, _MINUS, _SPACE = (tokenizer.token_id(c) for c in "#- ")
_ZERO = tokenizer.token_id("0")


def extract_answer_tokens(ids):
    """`ids [..., A]` int → `(answer [...] int32, valid [...] bool)`, the rule above, jit-able."""
    ids = jnp.moveaxis(jnp.asarray(ids, jnp.int32), -1, 0)
    shape = ids.shape[1:]
    zeros = jnp.zeros(shape, jnp.int32)
    init = dict(phase=zeros + _NONE, hashes=zeros, value=zeros, digits=zeros,
                negative=jnp.zeros(shape, bool), ended=jnp.zeros(shape, bool))

    def step(s, token):
        is_hash, is_minus, is_space = token == _HASH, token == _MINUS, token == _SPACE
        digit = token - _ZERO
        is_digit = (digit >= 0) & (digit <= 9)
        # After EOS nothing counts; PAD and BOS are not text (as in `tokenizer.decode`).
        skip = (s["ended"] | (token == tokenizer.EOS) | (token == tokenizer.PAD)
                | (token == tokenizer.BOS))
        hashes = jnp.where(is_hash, s["hashes"] + 1, 0)
        marker = is_hash & (hashes >= 4)        # the last 4 '#' of a run start a new final answer
        phase = s["phase"]
        after = phase != _NONE
        new_phase = jnp.select(
            [marker, ~after, is_space & (phase == _LEAD), is_space & (phase >= _DIGITS),
             is_minus & (phase == _LEAD), is_digit & (phase <= _DIGITS)],
            [_LEAD, _NONE, _LEAD, jnp.where(phase == _BAD, _BAD, _TRAIL), _SIGN, _DIGITS],
            _BAD)
        took_digit = ~marker & after & is_digit & (phase <= _DIGITS)
        new = dict(
            phase=new_phase,
            hashes=hashes,
            value=jnp.where(marker, 0, jnp.where(took_digit, s["value"] * 10 + digit, s["value"])),
            digits=jnp.where(marker, 0, s["digits"] + took_digit),
            negative=jnp.where(marker, False, s["negative"] | (is_minus & (phase == _LEAD))),
            ended=s["ended"] | (token == tokenizer.EOS),
        )
        new = jax.tree.map(lambda a, b: jnp.where(skip, a, b), s, new)
        new["ended"] = s["ended"] | (token == tokenizer.EOS)
        return new, None

    s, _ = jax.lax.scan(step, init, ids)
    valid = (s["ended"] & ((s["phase"] == _DIGITS) | (s["phase"] == _TRAIL))
             & (s["digits"] >= 1) & (s["digits"] <= MAX_DIGITS))
    answer = jnp.where(s["negative"], -s["value"], s["value"])
    return jnp.where(valid, answer, 0), valid


def reward_tokens(ids, targets):
    """`ids [..., A]`, `targets [...]` → rewards `[...]` float32 (1 for a correct final answer)."""
    answer, valid = extract_answer_tokens(ids)
    return (valid & (answer == targets)).astype(jnp.float32)
