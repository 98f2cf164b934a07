"""Throughput on the current device: sampling with vs without the KV cache, and training.

* sampling: `B = num_prompts × group_size` prompts, `answer_len` new tokens each, temperature 1;
  generated tokens/s counts every decoded slot (`B × A`), with the cache and with a full forward
  pass per step (the same tokens, so the ratio is the cache's speed-up);
* training: one GRPO minibatch update (forward + backward + Adam) on the whole batch;
  tokens/s counts every position of the sequences, prompt and answer (`B × (P + A)`);
* iteration: one whole GRPO iteration (sample, score, log β, N updates) at the configured N.
Times are medians of `repeats` calls after a compiling call. The two samplers are timed in
alternation and the speed-up is the median of the per-pair ratios, so a load change on a shared
machine affects both sides of each ratio alike.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from vaco_jax.llm import sampling
from vaco_jax.llm.config import LLMConfig
from vaco_jax.llm.dataset import ProblemSet
from vaco_jax.llm.grpo import GRPO
from vaco_jax.llm.model import Transformer


def _seconds(fn, *args):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def _median_seconds(fn, *args, repeats: int):
    jax.block_until_ready(fn(*args))             # compile and warm up
    return float(np.median([_seconds(fn, *args) for _ in range(repeats)]))


def measure(config: LLMConfig, params, problem_set: ProblemSet, repeats: int = 7, log=print):
    g, t = config.grpo, config.task
    B, P, A = g.batch_size, t.prompt_len, t.answer_len
    prompts = problem_set.prompts[np.arange(B) % len(problem_set)]
    apply = Transformer(config.model).apply

    def make_sampler(use_cache):
        return jax.jit(lambda p, k: sampling.generate(
            apply, p, prompts, k, model_config=config.model, max_new_tokens=A,
            use_cache=use_cache))

    key = jax.random.PRNGKey(0)
    samplers = [make_sampler(True), make_sampler(False)]
    for sampler in samplers:
        jax.block_until_ready(sampler(params, key))   # compile and warm up
    pairs = np.array([[_seconds(sampler, params, key) for sampler in samplers]
                      for _ in range(repeats)])
    cached, uncached = np.median(pairs, axis=0)

    trainer = GRPO(config, problem_set, problem_set)
    state = trainer.init(key, params)
    batch, _ = jax.jit(trainer.generate_batch)(state, key, trainer.data)
    update = jax.jit(trainer.update)
    train_s = _median_seconds(update, params, state.opt_state, batch, state.hparams,
                              repeats=repeats)
    iteration_s = _median_seconds(jax.jit(trainer.iteration), state, trainer.data,
                                  repeats=repeats)
    result = {
        "device": jax.devices()[0].device_kind, "batch_sequences": B, "prompt_len": P,
        "answer_len": A,
        "sampling_tokens_per_s_kv_cache": float(B * A / cached),
        "sampling_tokens_per_s_no_cache": float(B * A / uncached),
        "kv_cache_speedup": float(np.median(pairs[:, 1] / pairs[:, 0])),
        "kv_cache_speedup_range": [float(x) for x in np.quantile(pairs[:, 1] / pairs[:, 0],
                                                                 [0.0, 1.0])],
        "training_tokens_per_s": B * (P + A) / train_s,
        "training_answer_tokens_per_s": B * A / train_s,
        "iteration_seconds": iteration_s, "iteration_num_minibatches": g.num_minibatches,
        "seconds": {"sample_kv_cache": float(cached), "sample_no_cache": float(uncached),
                    "train_update": train_s}, "repeats": repeats,
    }
    log(f"throughput: sampling {result['sampling_tokens_per_s_kv_cache']:,.0f} tokens/s with the "
        f"KV cache vs {result['sampling_tokens_per_s_no_cache']:,.0f} without "
        f"({result['kv_cache_speedup']:.1f}x, median of {repeats} paired runs); training "
        f"{result['training_tokens_per_s']:,.0f} tokens/s; one GRPO iteration {iteration_s:.2f} s")
    return result
