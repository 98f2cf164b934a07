"""GRPO under backward and forward lag (SPEC §6), one pure function per step, composed like the
MuJoCo trainer.

One iteration:

1. behaviour policy: the current learner π_T, or (backward lag, `capacity > 1`) a stale snapshot
   drawn from the policy ring buffer (`vaco_jax.ring_buffer`, SPEC §2): with `snapshot_sampling =
   "oldest"` and `capacity = k + 1`, the learner's parameters at the start of the iteration k
   before (or, in the first k iterations, the warm start); with `"profile"`, an age drawn from
   `lag_profile`;
2. draw `num_prompts` train problems, sample G answers each with the behaviour policy (KV cache);
3. verifiable rewards, group-normalised advantages (one per answer, shared by its tokens);
4. log β of every answer token as the sampler drew it (from its own logits: the stale snapshot's
   own log-probability), and, with a stale behaviour policy, log π_T, the learner's at the start of
   the iteration, by one teacher-forced pass (without gradient): the proximal policy of the
   objectives that have one (decoupled PPO, IcePop, M2PO, GePPO);
5. **N minibatch updates** on the batch (× `num_epochs`): the forward-lag knob. Objective on token
   ratios `w = π_θ/β`: `ppo_clip`, `vaco` (the TV filter of SPEC §3.2), `pg` (`−E[wÂ]`),
   `decoupled_ppo` (clipping `π_θ/π_T`, tokens weighted by `min(π_T/β, C)`), or any other of
   `OBJECTIVES` (`spo`, `impala`, and the stale-data objectives of other systems);
6. push the new parameters into the ring buffer.

**What w means under top-p sampling.** π_θ and β are both the model's own tempered softmax
(`model.token_log_probs`), at the current and at the behaviour parameters; the top-p nucleus is part
of the sampler only: it decides which tokens get drawn, not the probabilities the ratio compares.
So `w = 1` on-policy at any `top_p` (the same function of the same logits; up to the KV cache's
float32 round-off), and `log π_θ` is finite with a gradient at every token the sampler may write.
The alternative, π_θ truncated to its own current nucleus like β, also gives `w = 1` on-policy, but
a token's gradient is then 0 wherever its nucleus holds that token alone (a confident mistake could
never be unlearned) and undefined (log π_θ = −inf) once the updates move a sampled token out of the
nucleus. The cost of this choice: w corrects for policy lag, not for the truncation, so the update is
the policy gradient of the untruncated policy estimated on nucleus samples, a bias that vanishes as
`top_p` → 1 (as in RL trainers that sample with top-p and compute old log-probabilities from the
full softmax).

`GRPO(config, train_set, test_set).train(key, params, hparams)` runs all iterations with an
evaluation every `eval_every` (held-out greedy and sampled accuracy, greedy accuracy on a fixed
sample of training problems); vmap it over keys for seeds.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from vaco_jax import algorithms, cache, diagnostics, objectives, ring_buffer
from vaco_jax.objectives import sg
from vaco_jax.llm import sampling, verifier
from vaco_jax.llm.config import (OBJECTIVES, LLMConfig, hparams as make_hparams,
                                 program_objectives, resolve)
from vaco_jax.llm.hparams import GRPOHParams
from vaco_jax.llm.dataset import ProblemSet
from vaco_jax.llm.evaluation import greedy_accuracy, sampled_accuracy
from vaco_jax.llm.model import Transformer, answer_mask, sequence_log_probs

STEP_METRICS = ("tv_estimate", "clip_fraction", "filtered_fraction", "masked_fraction",
                "truncated_fraction", "approx_kl", "max_ratio", "policy_loss", "grad_norm",
                "tv_forward", "intervened_fraction")
# The fractions of tokens an objective intervened on that it reports itself (0 where it reports
# none); `clip_fraction` is always the diagnostic `mean(|w − 1| > ε)`, the same for every objective.
OBJECTIVE_FRACTIONS = ("filtered_fraction", "masked_fraction", "truncated_fraction")


def group_advantages(rewards, scale: bool = True, eps: float = 1e-6):
    """GRPO advantages `(r − mean_group(r)) / (std_group(r) + eps)`. `rewards [P, G]` → `[P, G]`.

    `std` is the population standard deviation of the G rewards; a group whose answers all score
    the same gets advantage 0. `scale=False` only centres (Dr. GRPO).
    """
    centred = rewards - jnp.mean(rewards, axis=-1, keepdims=True)
    if not scale:
        return centred
    return centred / (jnp.std(rewards, axis=-1, keepdims=True) + eps)


@struct.dataclass
class Batch:
    """One generated batch, `[B, ...]` with B = num_prompts × group_size."""

    prompts: jax.Array            # [B, P]
    answers: jax.Array            # [B, A] sampled tokens, PAD after EOS
    mask: jax.Array               # [B, A] 1 up to and including EOS
    advantages: jax.Array         # [B, A] the answer's advantage on each of its tokens
    log_behavior: jax.Array       # [B, A] log β(token), as the sampler drew it (0 after EOS)
    log_learner_start: jax.Array  # [B, A] log π_T(token) (is log β without backward lag)


@struct.dataclass
class Data:
    """The problems, passed to the compiled programs as arguments (not baked-in constants, which
    XLA would constant-fold at length and recompile for every data set)."""

    train: ProblemSet
    test: ProblemSet


@struct.dataclass
class GRPOState:
    params: Any
    opt_state: Any
    buffer: Any                   # PolicyRingBuffer of params, or None when capacity is 1
    key: jax.Array
    iteration: jax.Array
    hparams: GRPOHParams


def policy_loss(log_prob, batch: Batch, hp: GRPOHParams, tv_reference: str = "behavior",
                program: tuple[str, ...] = OBJECTIVES):
    """The objective `program[hp.objective]` on token ratios (`program`, static: the
    built-in `OBJECTIVES` and any user objectives, `vaco_jax.llm.config.program_objectives`).

    The objectives are the shared ones of `vaco_jax.algorithms` (`vaco` → `tv_filter`, `ppo_clip`
    → `ppo_clip`, `pg` → `pg`, `impala` → `impala_pg`, and the others by their own name; π_T is
    the proximal policy), called with the shared signature and each with its own hyper-parameters
    (`hp.objective_hparams`); a user objective likewise. The choice is a traced leaf, taken by
    `lax.switch`, so one compiled program can run all of them side by side under `vmap`. Every objective logs the same
    diagnostics of `w = π_θ/β` (`tv_estimate`, `clip_fraction = mean(|w − 1| > ε)`, `approx_kl`,
    `max_ratio`), the fractions of `OBJECTIVE_FRACTIONS` it reports (0 for the others),
    `intervened_fraction` (the objective's own clipped, masked, truncated or filtered share,
    `vaco_jax.diagnostics`; 0 for an objective that reports none) and `tv_forward`.
    """
    inputs = algorithms.PolicyInputs(
        log_prob, batch.log_behavior, batch.advantages, mask=batch.mask,
        log_reference=batch.log_learner_start if tv_reference == "learner" else None,
        log_proximal=batch.log_learner_start)
    params = algorithms.ObjectiveParams(clip_eps=hp.clip_eps, delta=hp.delta,
                                        decoupled_is_max=hp.decoupled_is_max,
                                        own=hp.objective_hparams)

    def branch(objective):
        def run():
            loss, metrics = objective(inputs, params)
            intervened = diagnostics.intervened_fraction(metrics).get("intervened_fraction", 0.0)
            fractions = {k: jnp.asarray(metrics.get(k, 0.0), jnp.float32) for k in OBJECTIVE_FRACTIONS}
            return loss, {**fractions, "intervened_fraction": jnp.asarray(intervened, jnp.float32)}
        return run

    loss, fractions = jax.lax.switch(
        hp.objective, [branch(resolve(name, tv_reference=tv_reference)) for name in program])
    ratio_metrics = objectives.ratio_diagnostics(log_prob, batch.log_behavior,
                                                 clip_eps=hp.clip_eps, mask=batch.mask)
    return loss, {**ratio_metrics, **fractions, "policy_loss": loss,
                  "tv_forward": diagnostics.tv_forward(log_prob, batch.log_learner_start,
                                                       batch.log_behavior, mask=batch.mask)}


class GRPO:
    """`reward_fn(answers [B, A], targets [B]) -> [B]` scores sampled answers; the default is the
    verifiable reward (`verifier.reward_tokens`: 1 for a correct final answer). `objectives`: the
    objectives the program can run (`hparams.objective` indexes them; default
    `program_objectives((config.grpo.objective,))`: the built-ins, and the configured one if it is
    a user objective)."""

    def __init__(self, config: LLMConfig, train_set: ProblemSet, test_set: ProblemSet,
                 reward_fn=verifier.reward_tokens, objectives: tuple[str, ...] | None = None):
        cache.default_compile_cache()   # the per-user compilation cache, unless turned off
        self.config, self.data, self.reward_fn = config, Data(train_set, test_set), reward_fn
        self.objectives = (program_objectives((config.grpo.objective,)) if objectives is None
                           else tuple(objectives))
        self.apply = Transformer(config.model).apply
        g = config.grpo
        direction = optax.scale_by_adam(eps=g.adam_eps) if g.optimizer == "adam" else optax.identity()
        self.optimizer = optax.chain(optax.clip_by_global_norm(g.max_grad_norm), direction)

    # --- state ----------------------------------------------------------------------------
    def init(self, key, params, hparams: GRPOHParams | None = None) -> GRPOState:
        hp = hparams if hparams is not None else make_hparams(self.config.grpo, self.objectives)
        slots = self.config.grpo.slots
        buffer = ring_buffer.init(params, slots, hp.capacity) if slots > 1 else None
        return GRPOState(params, self.optimizer.init(params), buffer, key, jnp.int32(0), hp)

    # --- one iteration ----------------------------------------------------------------------
    def generate_batch(self, state: GRPOState, key, data: Data | None = None):
        """Steps 1–4: a batch sampled by the behaviour policy, scored and annotated."""
        g, t = self.config.grpo, self.config.task
        train = (self.data if data is None else data).train
        snapshot_key, prompt_key, sample_key = jax.random.split(key, 3)
        if state.buffer is None:
            behavior, age = state.params, jnp.int32(0)
        else:
            snapshots, ages = ring_buffer.sample(state.buffer, snapshot_key, 1, g.snapshot_sampling,
                                                 state.hparams.lag_profile)
            behavior, age = jax.tree.map(lambda x: x[0], snapshots), ages[0]
        idx = jax.random.randint(prompt_key, (g.num_prompts,), 0, len(train))
        idx = jnp.repeat(idx, g.group_size)                    # G answers per prompt, adjacent
        prompts, targets = train.prompts[idx], train.answers[idx]
        answers, log_behavior = sampling.generate(
            self.apply, behavior, prompts, sample_key, model_config=self.config.model,
            max_new_tokens=t.answer_len, temperature=state.hparams.temperature, top_p=g.top_p,
            return_log_probs=True)
        log_behavior = sg(log_behavior)
        rewards = self.reward_fn(answers, targets)
        advantages = group_advantages(rewards.reshape(g.num_prompts, g.group_size),
                                      g.scale_advantages).reshape(-1)
        mask = answer_mask(answers)
        # Without backward lag β is π_T, and log β is already its log-probability. So it is for a
        # snapshot of age 0, which holds π_T's very parameters (the teacher-forced pass would
        # differ by the KV cache's round-off only): k = 0 in a program with a buffer is the run
        # of the program without one.
        if state.buffer is None:
            log_learner_start = log_behavior
        else:
            log_learner_start = jnp.where(age == 0, log_behavior, sg(sequence_log_probs(
                self.apply, state.params, prompts, answers, state.hparams.temperature)))
        batch = Batch(prompts, answers, mask, advantages[:, None] * mask, log_behavior,
                      log_learner_start)
        info = {"reward": jnp.mean(rewards), "answer_length": jnp.mean(jnp.sum(mask, -1)),
                "solved_groups": jnp.mean(jnp.any(rewards.reshape(g.num_prompts, -1) > 0, -1)),
                "snapshot_age": age.astype(jnp.float32),
                # The lag split's backward part, and each answer's age in optimiser steps.
                "tv_backward": diagnostics.tv_backward(log_learner_start, log_behavior, mask),
                **diagnostics.update_age_metrics(age[None], g.num_epochs, g.num_minibatches,
                                                 g.slots),
                # A run that replays a lag profile logs the ages it drew, to compare with it.
                **(diagnostics.snapshot_age_histogram(age[None], g.slots)
                   if g.snapshot_sampling == "profile" else {})}
        return batch, info

    def update(self, params, opt_state, batch: Batch, hp: GRPOHParams):
        """One minibatch step: gradient of the objective, Adam or SGD, learning rate from `hp`."""
        g = self.config.grpo

        def loss_fn(p):
            log_prob = sequence_log_probs(self.apply, p, batch.prompts, batch.answers,
                                          hp.temperature)
            return policy_loss(log_prob, batch, hp, g.tv_reference, self.objectives)

        grads, metrics = jax.grad(loss_fn, has_aux=True)(params)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, jax.tree.map(lambda u: -hp.learning_rate * u, updates))
        return params, opt_state, {**metrics, "grad_norm": optax.global_norm(grads)}

    def iteration(self, state: GRPOState, data: Data | None = None):
        """Generate one batch, then N minibatch updates per epoch on it. Step metrics `[K·N]`."""
        g = self.config.grpo
        key, batch_key, shuffle_key = jax.random.split(state.key, 3)
        batch, info = self.generate_batch(state, batch_key, data)

        def minibatches(key):
            order = jax.random.permutation(key, g.batch_size)
            return jax.tree.map(
                lambda x: x[order].reshape((g.num_minibatches, -1) + x.shape[1:]), batch)

        mbs = jax.vmap(minibatches)(jax.random.split(shuffle_key, g.num_epochs))
        mbs = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), mbs)  # [K·N, B/N, ...]

        def step(carry, mb):
            params, opt_state = carry
            params, opt_state, metrics = self.update(params, opt_state, mb, state.hparams)
            return (params, opt_state), metrics

        (params, opt_state), steps = jax.lax.scan(step, (state.params, state.opt_state), mbs)
        buffer = None if state.buffer is None else ring_buffer.push(state.buffer, params)
        state = state.replace(params=params, opt_state=opt_state, buffer=buffer, key=key,
                              iteration=state.iteration + 1)
        return state, {**info, "steps": {k: steps[k] for k in STEP_METRICS}}

    # --- whole run --------------------------------------------------------------------------
    def evaluate(self, params, data: Data | None = None):
        """Held-out greedy accuracy of `params` on the test problems."""
        test = (self.data if data is None else data).test
        return greedy_accuracy(params, test, self.config.model, self.config.task.answer_len)

    def evaluations(self, params, iteration, data: Data | None = None):
        """Everything an evaluation measures (`vaco_jax.llm.evaluation`): held-out greedy accuracy
        (`eval_accuracy`), held-out sampled accuracy at temperature 1 (`eval_sampled_accuracy`; the
        key depends on the iteration only, so every run draws with the same noise) and greedy
        accuracy on a fixed sample of `train_eval_size` training problems
        (`train_greedy_accuracy`; NaN when the size is 0)."""
        data = self.data if data is None else data
        m, answer_len = self.config.model, self.config.task.answer_len
        key = jax.random.fold_in(jax.random.PRNGKey(0), iteration)
        size = min(self.config.grpo.train_eval_size, len(data.train))
        train_sample = jax.tree.map(lambda x: x[:size], data.train)
        return {"eval_accuracy": self.evaluate(params, data),
                "eval_sampled_accuracy": sampled_accuracy(params, data.test, m, answer_len, key),
                "train_greedy_accuracy": (greedy_accuracy(params, train_sample, m, answer_len)
                                          if size else jnp.float32(jnp.nan))}

    def train(self, key, params, hparams: GRPOHParams | None = None, data: Data | None = None):
        """All iterations from warm-start `params`. Returns `(state, metrics)`: per-iteration
        metrics `[iterations]` (step metrics `[iterations, K·N]`) and the `evaluations`
        `[num_evals]` (after every `eval_every` iterations). Pass `data` (e.g. `self.data`) as an
        argument under `jit` for large problem sets."""
        g = self.config.grpo
        state = self.init(key, params, hparams)

        def chunk(state, _):
            state, metrics = jax.lax.scan(lambda s, _: self.iteration(s, data), state, None,
                                          length=g.eval_every)
            return state, (metrics, self.evaluations(state.params, state.iteration, data))

        state, (metrics, evaluations) = jax.lax.scan(chunk, state, None,
                                                     length=g.iterations // g.eval_every)
        metrics = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), metrics)
        return state, {**metrics, **evaluations}
