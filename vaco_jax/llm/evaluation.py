"""Accuracy: the fraction of problems whose answer verifies (SPEC §6), greedy or sampled.

Greedy accuracy is that of the policy's most likely answers; sampled accuracy (one answer per
problem, drawn as the policy acts in training) is what the training reward measures, on other
problems. On held-out problems the two tell apart a policy that is sharp but wrong from one that is
right only on average; greedy accuracy on training problems beside held-out tells an optimisation
failure (both low) from a generalisation gap (training high, held-out low).
"""

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


def sampled_accuracy(params, problem_set: ProblemSet, model_config: ModelConfig, answer_len: int,
                     key, temperature=1.0):
    """Mean reward of one answer per problem drawn at `temperature` (the model's own distribution,
    no top-p): a float32 scalar (pure; jit it)."""
    answers = sampling.generate(Transformer(model_config).apply, params, problem_set.prompts, key,
                                model_config=model_config, max_new_tokens=answer_len,
                                temperature=temperature)
    return jnp.mean(verifier.reward_tokens(answers, problem_set.answers))
