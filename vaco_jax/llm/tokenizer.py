"""Character-level tokenizer (offline, no vocabulary file): printable ASCII plus newline.

Ids: 0 PAD, 1 BOS (start of a prompt), 2 EOS (end of an answer), 3 UNK (any other character), then
'\\n' and the printable ASCII characters ' '..'~'. 100 ids in all, so real GSM8K text encodes too.
Prompts are left-padded (so every answer starts at the same slot) and answers right-padded.
"""

from __future__ import annotations

import numpy as np

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
VOCAB_SIZE = len(SPECIALS) + len(CHARS)  # 100

_CHAR_TO_ID = {c: i + len(SPECIALS) for i, c in enumerate(CHARS)}


def token_id(char: str) -> int:
    """The id of one character (used by the in-graph verifier for '#', '-', ' ', digits)."""
    return _CHAR_TO_ID[char]


def encode(text: str) -> list[int]:
    """Characters to ids; a character outside the vocabulary becomes UNK."""
    return [_CHAR_TO_ID.get(c, UNK) for c in text]


def decode(ids, stop_at_eos: bool = True) -> str:
    """Ids to text. PAD and BOS are skipped; decoding stops at the first EOS (when asked)."""
    out = []
    for i in np.asarray(ids).tolist():
        if i == EOS and stop_at_eos:
            break
        if i >= len(SPECIALS):
            out.append(CHARS[i - len(SPECIALS)])
        elif i == UNK:
            out.append("\ufffd")
    return "".join(out)


def pad_left(ids: list[int], length: int) -> np.ndarray:
    """`[length]` int32, ids right-aligned after PADs. Raises if `ids` is longer than `length`."""
    if len(ids) > length:
        raise ValueError(f"sequence of {len(ids)} tokens does not fit in {length}")
    return np.asarray([PAD] * (length - len(ids)) + list(ids), np.int32)


def pad_right(ids: list[int], length: int) -> np.ndarray:
    """`[length]` int32, ids followed by PADs. Raises if `ids` is longer than `length`."""
    if len(ids) > length:
        raise ValueError(f"sequence of {len(ids)} tokens does not fit in {length}")
    return np.asarray(list(ids) + [PAD] * (length - len(ids)), np.int32)
