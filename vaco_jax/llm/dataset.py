"""Problems as arrays for the compiled programs: left-padded prompts, right-padded targets, answers.

Prompt: `BOS question '\\n'`; target (what the policy writes): `solution #### answer EOS`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from vaco_jax.llm import problems as problems_lib
from vaco_jax.llm import tokenizer


@struct.dataclass
class ProblemSet:
    prompts: jax.Array   # [N, P] int32, left-padded
    targets: jax.Array   # [N, A] int32, right-padded worked solution + EOS (for the warm start)
    answers: jax.Array   # [N] int32, the verifiable final answer

    def __len__(self) -> int:
        return int(self.answers.shape[0])


def prompt_ids(question: str) -> list[int]:
    return [tokenizer.BOS] + tokenizer.encode(question + "\n")


def encode(problems: list[problems_lib.Problem], prompt_len: int, answer_len: int) -> ProblemSet:
    """Encode problems; raise naming `task.prompt_len` / `task.answer_len` if one does not fit."""
    prompts, targets = [], []
    for p in problems:
        prompt, target = prompt_ids(p.question), tokenizer.encode(p.target) + [tokenizer.EOS]
        if len(prompt) > prompt_len:
            raise ValueError(f"config field 'task.prompt_len' = {prompt_len} is invalid: the prompt "
                             f"of {p.question!r} needs {len(prompt)} tokens")
        if len(target) > answer_len:
            raise ValueError(f"config field 'task.answer_len' = {answer_len} is invalid: the "
                             f"solution {p.target!r} needs {len(target)} tokens (with EOS)")
        prompts.append(tokenizer.pad_left(prompt, prompt_len))
        targets.append(tokenizer.pad_right(target, answer_len))
    if any(abs(p.answer) >= 10 ** 9 for p in problems):
        raise ValueError("an answer has more than 9 digits; the verifier cannot score it")
    return ProblemSet(jnp.asarray(np.stack(prompts)), jnp.asarray(np.stack(targets)),
                      jnp.asarray([p.answer for p in problems], jnp.int32))
