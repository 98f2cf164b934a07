"""Math word problems with verifiable integer answers (SPEC §6): a procedural generator and a loader.

* `generate(split, n, seed, difficulty)`: seeded GSM8K-style multi-step problems with worked
  solutions, e.g.

      question: "Ann has 7 eggs. Ann buys 5. Ann sells 3. How many eggs?"
      solution: "7+5=12. 12-3=9."        answer: 9

  The train/test split is a function of the problem's *arithmetic* (its operations and operands),
  hashed: a test problem's chain of calculations never occurs in the train split, whatever the seeds,
  names or items. The same `(split, n, seed, difficulty)` always gives the same problems.
* `load_gsm8k_jsonl(path)`: a local GSM8K-format file, one JSON object per line with `question` and
  `answer` (worked solution ending `#### N`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np

OPS = ("add", "sub", "mul", "pack")
SPLITS = ("train", "test")

NAMES = ("Ann", "Bob", "Cal", "Dan", "Eve", "Fay", "Gus", "Ivy", "Joe", "Kim", "Lea", "Max", "Ned",
         "Pam", "Ray", "Sue", "Tom", "Uma", "Val", "Zoe")
ITEMS = ("eggs", "pens", "cups", "hats", "toys", "figs", "nuts", "jars", "bags", "keys", "cards",
         "books", "coins", "balls", "beads", "shells")
ADD_VERBS = ("buys {b}", "finds {b}", "gets {b}", "wins {b}")
SUB_VERBS = ("sells {b}", "loses {b}", "drops {b}", "uses {b}")
MUL_VERBS = {2: "doubles them", 3: "triples them"}
MAX_TOTAL = 999  # keeps every intermediate result at most 3 digits


@dataclasses.dataclass(frozen=True)
class Problem:
    question: str
    solution: str   # the worked steps, without the final-answer line
    answer: int

    @property
    def target(self) -> str:
        """What the policy is trained to write: the worked steps and `#### answer`."""
        return f"{self.solution} #### {self.answer}" if self.solution else f"#### {self.answer}"


@dataclasses.dataclass(frozen=True)
class Difficulty:
    """How hard generated problems are."""

    min_steps: int = 1
    """Fewest operations after the opening quantity."""
    max_steps: int = 2
    """Most operations after the opening quantity."""
    max_value: int = 20
    """The opening quantity is drawn from 2..max_value, added/subtracted operands from 1..max_value,
    pack sizes from 2..max(2, max_value // 2)."""
    ops: tuple[str, ...] = ("add", "sub", "mul")
    """Allowed operations: add, sub, mul (doubles/triples), pack (buys b packs of c: two steps)."""

    def validate(self, prefix: str = "difficulty") -> None:
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError(f"config field '{prefix}.min_steps'/'{prefix}.max_steps' = "
                             f"{self.min_steps}/{self.max_steps} is invalid: need 1 <= min <= max")
        if self.max_value < 2:
            raise ValueError(f"config field '{prefix}.max_value' = {self.max_value} is invalid: "
                             f"must be >= 2")
        if not self.ops or any(op not in OPS for op in self.ops):
            raise ValueError(f"config field '{prefix}.ops' = {self.ops} is invalid: a non-empty "
                             f"subset of {OPS}")


def split_of(skeleton: tuple) -> str:
    """`train` or `test` from a hash of the arithmetic: about 1 problem skeleton in 5 is test."""
    digest = hashlib.sha256(repr(skeleton).encode()).digest()
    return "test" if digest[0] % 5 == 0 else "train"


def _step(rng: np.random.Generator, d: Difficulty, x: int):
    """One operation on the running total `x`: (new total, verb phrase, worked step, skeleton)."""
    op = d.ops[rng.integers(len(d.ops))]
    # Fall back to `add` where an operation would leave the range (keeps answers ≤ 3 digits, ≥ 0).
    if (op == "mul" and 3 * x > MAX_TOTAL) or (op == "sub" and x < 1) or \
            (op == "pack" and x + 5 * d.max_value > MAX_TOTAL):
        op = "add"
    if op == "add":
        b = int(rng.integers(1, d.max_value + 1))
        phrase = ADD_VERBS[rng.integers(len(ADD_VERBS))].format(b=b)
        return x + b, phrase, f"{x}+{b}={x + b}.", ("add", b)
    if op == "sub":
        b = int(rng.integers(1, min(x, d.max_value) + 1))
        phrase = SUB_VERBS[rng.integers(len(SUB_VERBS))].format(b=b)
        return x - b, phrase, f"{x}-{b}={x - b}.", ("sub", b)
    if op == "mul":
        b = int(rng.integers(2, 4))
        return x * b, MUL_VERBS[b], f"{x}*{b}={x * b}.", ("mul", b)
    b, c = int(rng.integers(2, 6)), int(rng.integers(2, max(2, d.max_value // 2) + 1))
    return (x + b * c, f"buys {b} packs of {c}", f"{b}*{c}={b * c}. {x}+{b * c}={x + b * c}.",
            ("pack", b, c))


def _one_problem(rng: np.random.Generator, d: Difficulty) -> tuple[Problem, tuple]:
    """A problem and its skeleton (the chain of operations and operands, which decides the split)."""
    name = NAMES[rng.integers(len(NAMES))]
    item = ITEMS[rng.integers(len(ITEMS))]
    x = int(rng.integers(2, d.max_value + 1))
    sentences, steps, skeleton = [f"{name} has {x} {item}."], [], [x]
    for _ in range(int(rng.integers(d.min_steps, d.max_steps + 1))):
        x, phrase, step, op = _step(rng, d, x)
        sentences.append(f"{name} {phrase}.")
        steps.append(step)
        skeleton.append(op)
    sentences.append(f"How many {item}?")
    return Problem(" ".join(sentences), " ".join(steps), x), tuple(skeleton)


def generate(split: str, n: int, seed: int, difficulty: Difficulty = Difficulty()) -> list[Problem]:
    """`n` distinct problems of `split`, deterministic in `(split, n, seed, difficulty)`."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    difficulty.validate()
    # Fold the split into the seed so train and test streams differ even for equal seeds.
    rng = np.random.default_rng([seed, SPLITS.index(split)])
    problems, seen = [], set()
    for _ in range(200 * n + 1000):
        if len(problems) == n:
            return problems
        problem, skeleton = _one_problem(rng, difficulty)
        if split_of(skeleton) == split and problem.question not in seen:
            seen.add(problem.question)
            problems.append(problem)
    raise ValueError(f"could not draw {n} distinct {split} problems at {difficulty}; "
                     f"raise max_steps or max_value")


def without_working(problems: list[Problem], fraction: float, seed: int) -> list[Problem]:
    """A copy in which a seeded `fraction` of the problems has no worked solution (target `#### N`)."""
    count = int(round(fraction * len(problems)))
    direct = set(np.random.default_rng([seed, 2]).permutation(len(problems))[:count].tolist())
    return [dataclasses.replace(p, solution="") if i in direct else p
            for i, p in enumerate(problems)]


def parse_gsm8k_answer(answer: str) -> tuple[str, int]:
    """Split a GSM8K `answer` field into (worked solution, integer after the last `####`)."""
    if "####" not in answer:
        raise ValueError("answer has no '#### N' final line")
    solution, final = answer.rsplit("####", 1)
    final = final.strip().replace(",", "")
    try:
        value = int(final)
    except ValueError:
        raise ValueError(f"final answer {final!r} is not an integer") from None
    return " ".join(solution.split()), value


def load_gsm8k_jsonl(path) -> list[Problem]:
    """Problems from a GSM8K-format JSONL file (`question`, `answer` ending `#### N`).

    Whitespace (including GSM8K's newlines between steps) is collapsed to single spaces, so a
    solution is one line. A malformed line raises `ValueError` naming the file and line number.
    """
    problems = []
    with open(Path(path)) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                question, answer = row["question"], row["answer"]
                solution, value = parse_gsm8k_answer(answer)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}:{lineno}: not a GSM8K problem ({e!r})") from None
            problems.append(Problem(" ".join(question.split()), solution, value))
    return problems
