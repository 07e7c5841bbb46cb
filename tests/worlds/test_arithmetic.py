"""The arithmetic world: task splits, grader robustness, tokenizer round trip."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoTokenizer

from brisk.worlds.arithmetic.grader import extract_answer, grade, normalize_answer
from brisk.worlds.arithmetic.task import (
    STYLES,
    VERBS,
    TaskConfig,
    generate,
    make_split,
    sample_response,
    solutions,
)
from brisk.worlds.arithmetic.tokenizer import CHARS, MASK, char_tokenizer


def test_solutions_are_gsm8k_shaped_and_correct() -> None:
    for problem in make_split(TaskConfig.tiny(), "train", 300, seed=0):
        lines = problem.response.split("\n")
        assert len(lines) == len(problem.operands)  # one step per operation + the answer line
        assert lines[-1] == f"#### {problem.answer}"
        assert problem.answer == eval(problem.expression)  # left-to-right ± chains
        assert grade(problem.text, problem.answer)
        assert all(int(x) >= 0 for line in lines[:-1] for x in line.split("=")[1:])


def test_every_style_is_a_valid_solution() -> None:
    """Each style, swapped or not, writes the same chain and the grader accepts it; swaps only
    reorder additions; ``solutions`` keeps generate()'s problems whatever the corpus."""
    cfg = TaskConfig.paper()
    for problem in make_split(cfg, "train", 200, seed=0):
        for style in STYLES:
            for swaps in ((False,) * len(problem.ops), (True,) * len(problem.ops)):
                for verb in VERBS:
                    text = problem.write(style, swaps, (verb,) * len(problem.ops))
                    assert grade(text, problem.answer)
                    assert text.count("\n") == len(problem.ops)
                    assert (f" {verb} " in text) == (style == "words")
        plain = problem.write_steps("compact", (False,) * len(problem.ops))
        swapped = problem.write_steps("compact", (True,) * len(problem.ops))
        for a, b, op in zip(plain, swapped, problem.ops, strict=True):
            left, result = a.split("=")
            if op == "+":
                x, y = left.split("+")
                assert b == f"{y}+{x}={result}"
            else:
                assert b == a  # a subtraction has one order
        assert all(x <= 9 for x in problem.operands[1:])  # step_max_digits = 1
    base = [p for p, _ in itertools.islice(solutions(cfg, "train", 3), 50)]
    ref = [p for p, _ in itertools.islice(solutions(cfg, "train", 3, "reference"), 50)]
    assert base == ref == list(itertools.islice(generate(cfg, "train", 3), 50))


def test_styles_drawn_per_line() -> None:
    """With ``style_per_line`` each line has its own style (numbered lines keep their index) and
    the response still grades correct; without it one style serves the whole solution."""
    cfg = dataclasses.replace(TaskConfig.paper(), style_per_line=True)
    rng = random.Random(0)
    mixed = 0
    for problem in make_split(cfg, "train", 300, seed=0):
        text = sample_response(problem, cfg, rng)
        assert grade(text, problem.answer)
        lines = text.split("\n")[:-1]
        for k, line in enumerate(lines):
            assert not line.startswith("Step") or line.startswith(f"Step {k + 1}: ")
        mixed += len({line[:4] == "Step" for line in lines}) > 1
    assert mixed > 50
    one = dataclasses.replace(cfg, style_per_line=False)
    for problem in make_split(one, "train", 100, seed=0):
        lines = sample_response(problem, one, rng).split("\n")[:-1]
        assert len({line.startswith("Step") for line in lines}) == 1


def test_corpora_follow_their_style_mixtures() -> None:
    """Line style shares (the paper preset draws a style per line) within 5σ of the configured
    weights, σ = √(w(1 − w)/n) over n ≈ 4000 × 3.5 lines."""
    cfg = TaskConfig.paper()
    for corpus, weights in (("base", cfg.style_weights), ("reference", cfg.reference_weights)):
        rng = random.Random(0)
        counts = dict.fromkeys(STYLES, 0)
        for problem in make_split(cfg, "train", 4000, seed=0):
            text = sample_response(problem, cfg, rng, corpus)  # type: ignore[arg-type]
            for line in text.split("\n")[:-1]:
                in_words = " plus " in line or " minus " in line
                style = (
                    "steps"
                    if line.startswith("Step")
                    else "words"
                    if in_words
                    else "spaced"
                    if " = " in line
                    else "compact"
                )
                counts[style] += 1
        n = sum(counts.values())
        for s, w in zip(STYLES, weights, strict=True):
            share = w / sum(weights)
            assert abs(counts[s] / n - share) <= 5 * math.sqrt(share * (1 - share) / n) + 1e-9


def test_difficulty_knobs_are_respected() -> None:
    cfg = TaskConfig(min_operands=3, max_operands=4, min_digits=2, max_digits=2, ops="+")
    for problem in make_split(cfg, "train", 100, seed=1):
        assert 3 <= len(problem.operands) <= 4
        assert all(10 <= x <= 99 for x in problem.operands)
        assert set(problem.ops) == {"+"}


def test_splits_never_share_a_problem_and_are_seeded() -> None:
    cfg = TaskConfig.tiny()
    train = {p.expression for p in make_split(cfg, "train", 1000, seed=0)}
    test = {p.expression for p in make_split(cfg, "test", 200, seed=1)}
    assert not train & test
    assert make_split(cfg, "test", 50, seed=1) == make_split(cfg, "test", 50, seed=1)
    assert make_split(cfg, "test", 50, seed=1) != make_split(cfg, "test", 50, seed=2)
    stream = generate(cfg, "train", 0)
    assert all(next(stream).expression not in test for _ in range(2000))


def test_too_small_a_split_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="fewer than"):
        make_split(TaskConfig.trivial(), "test", 500, seed=0)


@pytest.mark.parametrize(
    ("output", "reference", "expected"),
    [
        pytest.param("3+4=7\n#### 7", 7, True, id="plain"),
        pytest.param("#### 7.0", "7", True, id="decimal-zero"),
        pytest.param("####  +007 .", 7, True, id="sign-zeros-stop"),
        pytest.param("#### 1,234", 1234, True, id="thousands"),
        pytest.param("#### 5\n#### 7", 7, True, id="last-marker-wins"),
        pytest.param("#### 7\ntrailing junk", 7, True, id="answer-line-only"),
        pytest.param("#### 8", 7, False, id="wrong"),
        pytest.param("the answer is 7", 7, False, id="no-marker"),
        pytest.param("####", 7, False, id="empty-answer"),
        pytest.param("#### \n7", 7, False, id="answer-on-next-line"),
        pytest.param("", 7, False, id="empty"),
        pytest.param(None, 7, False, id="none"),
        pytest.param(b"#### 7", 7, False, id="bytes"),
        pytest.param("#### 7", None, False, id="bad-reference"),
        pytest.param("#### -0", 0, True, id="negative-zero"),
        pytest.param("#### seven", "Seven", True, id="text-answer"),
        pytest.param("#### 1e400", 7, False, id="not-a-plain-number"),
        pytest.param("\x00\xff####\ud800 7", 7, False, id="binary-junk"),
        pytest.param("\x00\xff\n#### 7", 7, True, id="junk-before-marker"),
    ],
)
def test_grader(output: object, reference: object, expected: bool) -> None:
    assert grade(output, reference) is expected


@given(st.text())
def test_grader_never_raises(text: str) -> None:
    grade(text, 7)
    grade(text, text)
    answer = extract_answer(text)
    if answer is not None:
        normalize_answer(answer)


def test_tokenizer_specials() -> None:
    tok = char_tokenizer()
    assert [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.mask_token_id] == [0, 1, 2, 3]
    assert tok.convert_tokens_to_ids(MASK) == 3
    assert len(tok) == 5 + len(CHARS)


TOKENIZER = char_tokenizer()


@given(st.text(alphabet=st.sampled_from(list(CHARS)), max_size=200))
def test_tokenizer_round_trip(text: str) -> None:
    tok = TOKENIZER
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)  # one token per character, no specials added
    assert tok.decode(ids) == text


def test_tokenizer_saves_and_loads(tmp_path: Path) -> None:
    tok = char_tokenizer()
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "Q: 17+5-8=?\n17+5=22\n22-8=14\n#### 14"
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.decode(loaded.encode(text, add_special_tokens=False)) == text
    # special tokens asked for: BOS first, as the model was trained (any consumer encodes so)
    assert loaded.encode(text) == [
        loaded.bos_token_id,
        *loaded.encode(text, add_special_tokens=False),
    ]
    wrapped = [*loaded.encode(text), loaded.eos_token_id]
    assert loaded.decode(wrapped, skip_special_tokens=True) == text
    assert loaded.mask_token_id == tok.mask_token_id


def test_the_broad_corpus_is_a_task_of_its_target_world() -> None:
    """``broad`` streams the mixture and asks the target world's problems, by name as by a
    description of itself."""
    from brisk.runtime.tasks import get_task
    from brisk.runtime.tasks.spec import TaskSpec, task_from_description
    from brisk.worlds.arithmetic.broad import BroadConfig, broad_corpus
    from brisk.worlds.arithmetic.tasks import ArithmeticTask

    broad = get_task("broad", split="test", n=5, seed=1)
    target = ArithmeticTask(BroadConfig().target, "test", 5, 1)
    assert [p.prompt for p in broad.problems()] == [p.prompt for p in target.problems()]
    pairs = broad.corpus(seed=3)
    stream = broad_corpus(BroadConfig(), seed=3)
    assert [next(pairs)[1] for _ in range(20)] == [next(stream).response for _ in range(20)]
    resolved = TaskSpec(name="broad").resolve(n=5, seed=1, split="test")
    again = task_from_description(resolved.describe())
    assert [p.answer for p in again.problems()] == [p.answer for p in target.problems()]
    with pytest.raises(ValueError, match="preset: the broad corpus has no presets"):
        TaskSpec(name="broad", preset="paper").resolve(n=5, seed=1)
