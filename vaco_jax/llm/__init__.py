"""The LLM variant (SPEC §6): a Flax transformer trained with GRPO under forward lag.

Modules: `tokenizer` (characters), `problems` (generator, GSM8K loader), `verifier` (rewards),
`dataset` (problems as arrays), `model` (the transformer), `sampling` (KV-cache generation),
`config` (configs, presets, the experiment's settings), `hparams` (GRPO's
vmappable leaves), `sft` (the cached warm start), `grpo` (the RL loop), `evaluation`,
`benchmark` (throughput), `experiment` (the forward-lag sweep behind `vaco-llm`).
"""

# The configs import no JAX (the command's --help reads them); the model, Flax.
from vaco_jax.llm.config import (GRPOConfig, LLMConfig, ModelConfig, SFTConfig, TaskConfig, preset,
                                 validate)

__all__ = ["GRPOConfig", "LLMConfig", "ModelConfig", "SFTConfig", "TaskConfig", "Transformer",
           "preset", "validate"]


def __getattr__(name: str):
    if name == "Transformer":
        from vaco_jax.llm.model import Transformer

        return Transformer
    raise AttributeError(f"module 'vaco_jax.llm' has no attribute {name!r}")
