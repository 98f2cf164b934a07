"""Held-out greedy accuracy: the fraction of problems whose greedy answer verifies (SPEC §6)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vaco_jax.llm import sampling, verifier
from vaco_jax.llm.dataset import ProblemSet
from vaco_jax.llm.model import ModelConfig, Transformer


def greedy_answers(params, problem_set: ProblemSet, model_config: ModelConfig, answer_len: int):
    """Greedy answers `[N, A]` for every prompt of the set (pure; jit it)."""
    return sampling.generate(Transformer(model_config).apply, params, problem_set.prompts,
                             jax.random.PRNGKey(0), model_config=model_config,
                             max_new_tokens=answer_len, greedy=True)


def greedy_accuracy(params, problem_set: ProblemSet, model_config: ModelConfig, answer_len: int):
    """Mean reward of greedy answers over the set: a float32 scalar (pure; jit it)."""
    answers = greedy_answers(params, problem_set, model_config, answer_len)
    return jnp.mean(verifier.reward_tokens(answers, problem_set.answers))
