"""LLM task (SPEC §6): tokenizer, problem generator, GSM8K loader, answer verifier."""

import json
from pathlib import Path

import numpy as np
import pytest

from vaco_jax.llm import dataset, problems, tokenizer, verifier

SAMPLE = Path(problems.__file__).parent / "data" / "gsm8k_sample.jsonl"
HARD = problems.Difficulty(1, 3, 20, ("add", "sub", "mul", "pack"))


# --- tokenizer ----------------------------------------------------------------------------------
def test_tokenizer_round_trip_and_specials():
    text = "Ann has 7 eggs.\nHow many? #### -3 ~{}"
    ids = tokenizer.encode(text)
    assert min(ids) >= 4 and max(ids) < tokenizer.VOCAB_SIZE == 100
    assert tokenizer.decode(ids) == text
    # PAD and BOS are not text; decoding stops at EOS; unknown characters become UNK.
    assert tokenizer.decode([tokenizer.PAD, tokenizer.BOS] + ids + [tokenizer.EOS] + ids) == text
    assert tokenizer.encode("é") == [tokenizer.UNK]
    assert tokenizer.pad_left([5, 6], 4).tolist() == [0, 0, 5, 6]
    assert tokenizer.pad_right([5, 6], 4).tolist() == [5, 6, 0, 0]
    with pytest.raises(ValueError):
        tokenizer.pad_left([5] * 5, 4)


# --- generator ----------------------------------------------------------------------------------
def test_generator_is_deterministic_and_seeds_differ():
    a = problems.generate("train", 200, seed=3, difficulty=HARD)
    b = problems.generate("train", 200, seed=3, difficulty=HARD)
    c = problems.generate("train", 200, seed=4, difficulty=HARD)
    assert a == b
    assert [p.question for p in a] != [p.question for p in c]
    assert len({p.question for p in a}) == 200          # distinct within a set


def test_generated_solutions_are_correct_arithmetic():
    for p in problems.generate("test", 300, seed=0, difficulty=HARD):
        # Every worked step "x op y=z." is true, the chain ends at the answer, and the target
        # verifies: the warm-start data is exactly what the verifier rewards.
        steps = [s for s in p.solution.split(". ") if s]
        for step in steps:
            lhs, rhs = step.rstrip(".").split("=")
            assert eval(lhs) == int(rhs), step   # noqa: S307 (our own generated arithmetic)
        assert int(steps[-1].rstrip(".").split("=")[1]) == p.answer
        assert verifier.reward(p.target, p.answer) == 1.0
        assert 0 <= p.answer <= problems.MAX_TOTAL


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_train_and_test_splits_cannot_overlap(seed):
    train = problems.generate("train", 2000, seed=seed, difficulty=problems.Difficulty())
    test = problems.generate("test", 500, seed=seed + 10, difficulty=problems.Difficulty())
    assert not {p.question for p in train} & {p.question for p in test}
    # The split is decided by the arithmetic alone, so not even the calculation repeats:
    # re-deriving the split from each problem's skeleton gives its own split.
    assert not {p.solution + str(p.answer) for p in train} & {p.solution + str(p.answer)
                                                               for p in test}
    ratio = len(test) / (len(train) + len(test))
    assert 0.1 < ratio < 0.3


def test_difficulty_controls_steps_and_values():
    easy = problems.generate("train", 100, 0, problems.Difficulty(1, 1, 9, ("add",)))
    assert all(p.solution.count("=") == 1 and "+" in p.solution for p in easy)
    assert all(p.answer <= 18 for p in easy)
    hard = problems.generate("train", 100, 0, problems.Difficulty(3, 3, 20, ("add", "sub", "mul")))
    assert all(p.solution.count("=") == 3 for p in hard)
    with pytest.raises(ValueError, match="ops"):
        problems.generate("train", 1, 0, problems.Difficulty(ops=("divide",)))
    with pytest.raises(ValueError, match="min_steps"):
        problems.generate("train", 1, 0, problems.Difficulty(min_steps=3, max_steps=2))
    with pytest.raises(ValueError, match="split"):
        problems.generate("valid", 1, 0)


# --- GSM8K loader -------------------------------------------------------------------------------
def test_a_direct_fraction_of_demonstrations_keeps_only_the_answer():
    train = problems.generate("train", 200, 0)
    mixed = problems.without_working(train, 0.3, 0)
    direct = [m for m in mixed if not m.solution]
    assert len(direct) == 60 and all(m.target == f"#### {m.answer}" for m in direct)
    assert all(verifier.reward(m.target, m.answer) == 1.0 for m in mixed)
    # Same questions and answers; the rest keep their worked steps; the subset is seeded.
    assert [(m.question, m.answer) for m in mixed] == [(p.question, p.answer) for p in train]
    assert all(m == p for m, p in zip(mixed, train) if m.solution)
    assert problems.without_working(train, 0.3, 0) == mixed != problems.without_working(train, 0.3, 1)
    assert problems.without_working(train, 0.0, 0) == train


def test_gsm8k_loader_on_our_sample_file():
    loaded = problems.load_gsm8k_jsonl(SAMPLE)
    assert [p.answer for p in loaded] == [15, 16, 45, 1000, -5, 8]   # blank line skipped
    assert loaded[0].solution.startswith("Mia has 12 - 5 = <<12-5=7>>7 stickers")
    assert "\n" not in loaded[0].solution                           # steps joined on one line
    assert all(verifier.reward(p.target, p.answer) == 1.0 for p in loaded)
    encoded = dataset.encode(loaded, prompt_len=128, answer_len=192)
    assert encoded.prompts.shape == (6, 128) and encoded.answers.tolist()[3] == 1000


def test_gsm8k_loader_names_the_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"question": "q", "answer": "1+1=2\n#### 2"})
    for bad in ['{"question": "q", "answer": "no final answer"}', '{"answer": "#### 1"}',
                '{"question": "q", "answer": "#### two"}', "not json"]:
        path.write_text(good + "\n" + bad + "\n")
        with pytest.raises(ValueError, match=r"bad.jsonl:2"):
            problems.load_gsm8k_jsonl(path)


def test_encode_names_the_length_field_that_is_too_short():
    p = problems.generate("train", 1, 0)[0]
    with pytest.raises(ValueError, match="task.prompt_len"):
        dataset.encode([p], prompt_len=5, answer_len=64)
    with pytest.raises(ValueError, match="task.answer_len"):
        dataset.encode([p], prompt_len=128, answer_len=3)


# --- verifier -----------------------------------------------------------------------------------
EDGE_CASES = {
    "#### 5": 5, "7+5=12. 12-3=9. #### 9": 9, "####12 ": 12, "#### -3": -3, "####  007": 7,
    "#### -0": 0, "#####5": 5, "####5####7": 7, "###a#### 4": 4, "#### 123456789": 123456789,
    "#### - 3": None, "####": None, "#### ": None, "## 5": None, "####5#": None,
    "#### 1234567890": None, "#### 5 6": None, "#### 5a": None, "abc": None, "": None,
    "#### 1,000": None, "#### -": None, "####--5": None, "5 ####": None, "#### 3.5": None,
    "#### ５": None,   # a full-width digit is not an ASCII digit
}


def test_verifier_edge_cases():
    for text, expected in EDGE_CASES.items():
        assert verifier.extract_answer(text) == expected, text
        assert verifier.reward(text, 5) == float(expected == 5)
    assert verifier.extract_answer(None) is None and verifier.reward(b"#### 5", 5) == 0.0
    # Token form: no EOS means the answer ran out of room, and scores 0.
    assert verifier.score_tokens(tokenizer.encode("#### 5") + [tokenizer.EOS], 5) == 1.0
    assert verifier.score_tokens(tokenizer.encode("#### 5"), 5) == 0.0


def _python_reference(row):
    if tokenizer.EOS not in row.tolist():
        return None
    return verifier.extract_answer(tokenizer.decode(row))


def test_jax_verifier_equals_python_on_edge_cases_and_random_strings():
    texts = list(EDGE_CASES)
    rows = [tokenizer.pad_right(tokenizer.encode(t) + [tokenizer.EOS], 24) for t in texts]
    rng = np.random.default_rng(0)
    alphabet = [tokenizer.token_id(c) for c in "#- 0123456789x"] + [
        tokenizer.EOS, tokenizer.PAD, tokenizer.BOS, tokenizer.UNK]
    random_rows = rng.choice(alphabet, size=(4000, 24))
    random_rows[:2000, :4] = tokenizer.token_id("#")   # many start with a marker
    ids = np.concatenate([np.stack(rows), random_rows])
    answers, valid = verifier.extract_answer_tokens(ids)
    answers, valid = np.asarray(answers), np.asarray(valid)
    expected = [_python_reference(row) for row in ids]
    got = [int(a) if v else None for a, v in zip(answers, valid)]
    assert got == expected
    assert 0.05 < valid.mean() < 0.95          # the random strings exercise both outcomes
    targets = np.array([e if e is not None else 0 for e in expected])
    rewards = np.asarray(verifier.reward_tokens(ids, targets))
    np.testing.assert_array_equal(rewards, valid.astype(np.float32))
