"""The LLM variant (SPEC §6): a Flax transformer trained with GRPO under forward lag.

Modules: `tokenizer` (characters), `problems` (generator, GSM8K loader), `verifier` (rewards),
`dataset` (problems as arrays), `model` (the transformer), `sampling` (KV-cache generation),
`config` (configs, presets), `sft` (the cached warm start), `grpo` (the RL loop), `evaluation`,
`benchmark` (throughput), `experiment` (the forward-lag sweep behind `vaco-llm`).
"""

from vaco_jax.llm.config import GRPOConfig, LLMConfig, SFTConfig, TaskConfig, preset, validate
from vaco_jax.llm.model import ModelConfig, Transformer

__all__ = ["GRPOConfig", "LLMConfig", "ModelConfig", "SFTConfig", "TaskConfig", "Transformer",
           "preset", "validate"]
