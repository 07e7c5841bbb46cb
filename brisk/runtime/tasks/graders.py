"""Graders: did a response answer its problem? ``grader(response, answer) -> bool``.

Built in (:data:`GRADERS`):

- ``exact`` — the whole response equals the answer after normalization (whitespace collapsed,
  case folded, a trailing full stop dropped);
- ``gsm8k`` — the final answer after the last ``####`` equals the reference's (GSM8K's format and
  the paper's "normalized answer matching"; numbers compared as decimals: ``1,000.0`` = ``1000``);
  a response without the marker is wrong;
- ``numeric`` — as ``gsm8k``, but a response without ``####`` is graded by its last number;
- ``math`` — equivalence by the ``math-verify`` package: LaTeX, ``\\boxed{}``, fractions,
  radicals, sets and intervals (``\\boxed{\\frac{1}{2}}`` = ``0.5``,
  ``2\\sqrt{2}`` = ``\\sqrt{8}``);
- ``code`` — execution (:mod:`brisk.runtime.tasks.code`): the answer is a mapping with the
  problem's ``prompt``, ``test`` and ``entry_point`` (HumanEval's fields), and the response is the
  completion of the prompt.

A world registers its own graders by name (:func:`register_grader`: the code world's
``compiles`` and ``exact-body``), and any importable ``module:function`` with that signature is
a grader too. :func:`grade_all` grades
many responses in parallel processes; a grader that raises on a response is counted and
reported, never allowed to stop the run.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from multiprocessing import get_context
from typing import Any

from brisk.runtime.registry import Registry

__all__ = [
    "GRADERS",
    "Grades",
    "extract_answer",
    "grade_all",
    "grader_names",
    "normalize_answer",
    "register_grader",
    "resolve_grader",
]

Grader = Callable[[str, Any], bool]
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")
_MARKER = "####"
_DECIMAL = re.compile(r"[-+]?\d+(?:\.\d+)?")


def extract_answer(text: object) -> str | None:
    """The raw answer after the last ``####`` (to the end of its line), or None when there is
    none."""
    if not isinstance(text, str) or _MARKER not in text:
        return None
    tail = text.rsplit(_MARKER, 1)[1].split("\n", 1)[0].strip()
    return tail or None


def normalize_answer(answer: str) -> str:
    """Canonical form of an answer: whitespace, thousands separators, a leading ``+``, a trailing
    full stop and redundant zeros dropped (``007`` → ``7``, ``4.0`` → ``4``); anything that is
    not a number after that collapsed and lower-cased.

    >>> normalize_answer(" 1,000.50 "), normalize_answer("+007."), normalize_answer(" Yes  Sir ")
    ('1000.5', '7', 'yes sir')
    """
    s = answer.strip().replace(",", "").rstrip(".").strip()
    if _DECIMAL.fullmatch(s):
        value = Decimal(s)
        value = value.quantize(Decimal(1)) if value == value.to_integral_value() else value
        text = format(value.normalize(), "f")
        return "0" if text in ("-0", "+0") else text
    return " ".join(s.lower().split())


def exact(response: str, answer: Any) -> bool:
    """Whole-response match after normalization.

    >>> exact("  Paris. ", "paris"), exact("Paris, France", "Paris")
    (True, False)
    """
    return _normal(response) == _normal(str(answer))


def _normal(text: str) -> str:
    return " ".join(text.split()).casefold().rstrip(".").strip()


def gsm8k(response: str, answer: Any) -> bool:
    """The answer after the last ``####`` of both sides (a bare reference is its own answer).

    >>> gsm8k("4 + 4 = 8\\n#### 8", "She has 8.\\n#### 8"), gsm8k("the answer is 8", "8")
    (True, False)
    """
    got = extract_answer(response)
    return got is not None and _same_number(got, _reference(answer))


def numeric(response: str, answer: Any) -> bool:
    """As :func:`gsm8k`, with the last number of a response that has no ``####``.

    >>> numeric("so she pays $1,250.", "#### 1250"), numeric("#### 7", "7.0")
    (True, True)
    """
    got = extract_answer(response)
    if got is None:
        numbers = _NUMBER.findall(response)
        if not numbers:
            return False
        got = numbers[-1]
    return _same_number(got, _reference(answer))


def _reference(answer: Any) -> str:
    text = str(answer)
    return extract_answer(text) or text


def _same_number(a: str, b: str) -> bool:
    return normalize_answer(a) == normalize_answer(b)


def math(response: str, answer: Any) -> bool:
    """Mathematical equivalence by ``math-verify`` (a reference without ``$`` delimiters or
    ``\\boxed`` is read as LaTeX math).

    >>> math("so \\\\boxed{\\\\frac{1}{2}}", "0.5"), math("$2\\\\sqrt{2}$", "\\\\sqrt{8}")
    (True, True)
    """
    from math_verify import parse, verify  # type: ignore[import-untyped]

    gold = parse(str(answer))
    if not gold or "$" not in str(answer):
        gold = parse(f"${answer}$") or gold
    target = parse(response)
    return bool(gold and target and verify(gold, target))


def code(response: str, answer: Any) -> bool:
    """The completion runs the problem's tests (:func:`brisk.runtime.tasks.code.passes`)."""
    from brisk.runtime.tasks.code import passes

    return passes(response, answer)


CHEAP = frozenset({"exact", "gsm8k", "numeric"})  # graded in-process by default

GRADERS: dict[str, Grader] = {
    "exact": exact,
    "gsm8k": gsm8k,
    "numeric": numeric,
    "math": math,
    "code": code,
}


_REGISTERED: Registry[Grader] = Registry("grader")


def register_grader(name: str, grader: Grader) -> None:
    """Make ``grader`` resolvable as ``name`` everywhere a grader is named (a task, a prompt
    file's ``"grader"``, ``--grader``); a built-in name cannot be taken."""
    if name in GRADERS or ":" in name:
        raise ValueError(f"grader: {name!r} is a built-in grader or not a plain name")
    _REGISTERED.register(name, grader)


def grader_names() -> list[str]:
    """The built-in graders, then the registered ones."""
    return [*GRADERS, *(n for n in _REGISTERED.names() if n not in GRADERS)]


def resolve_grader(name: str) -> Grader:
    """A built-in or registered grader by name, or ``module:function``; a ``ValueError`` naming
    it if none of these."""
    if name in GRADERS:
        return GRADERS[name]
    module, sep, attr = name.partition(":")
    if not (sep and module and attr):
        if name in grader_names():
            return _REGISTERED.get(name)
        raise ValueError(
            f"grader: {name!r} is not one of {', '.join(grader_names())} nor a module:function"
        )
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"grader: cannot import {name} ({err})") from None
    if not callable(found):
        raise ValueError(f"grader: {name} is not callable")
    return found  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Grades:
    """Per response: True / False, or None where the grader raised (counted as wrong in
    :attr:`accuracy`); ``errors`` counts those, ``first_error`` says what the first was."""

    correct: list[bool | None]
    errors: int
    first_error: str | None

    @property
    def accuracy(self) -> float:
        return sum(c is True for c in self.correct) / len(self.correct) if self.correct else 0.0


def _grade_one(name: str, response: str, answer: Any) -> tuple[bool | None, str | None]:
    try:
        return bool(resolve_grader(name)(response, answer)), None
    except Exception as err:  # a grader's failure on one response is data, not a crash
        return None, f"{type(err).__name__}: {' '.join(str(err).split())}"


def _grade_chunk(name: str, items: list[tuple[str, Any]]) -> list[tuple[bool | None, str | None]]:
    return [_grade_one(name, r, a) for r, a in items]


def grade_all(
    grader: str, responses: Sequence[str], answers: Sequence[Any], workers: int | None = None
) -> Grades:
    """Grade ``responses[i]`` against ``answers[i]`` with the grader named ``grader``, in
    ``workers`` processes (1 grades here). The default grades the string graders (``exact``,
    ``gsm8k``, ``numeric``: microseconds a response) here, and ``math``, ``code`` and a user's
    function in as many processes as there are CPUs, at most one per 8 responses. Processes
    are spawned, so a script that grades in parallel needs ``if __name__ == "__main__":``."""
    resolve_grader(grader)  # a bad name fails here, once, not in every worker
    if len(responses) != len(answers):
        raise ValueError(f"answers: {len(answers)} for {len(responses)} responses")
    items = list(zip(responses, answers, strict=True))
    if workers is None:
        workers = 1 if grader in CHEAP else min(os.cpu_count() or 1, max(1, len(items) // 8))
    n = workers
    if n <= 1 or len(items) < 2:
        results = _grade_chunk(grader, items)
    else:
        size = -(-len(items) // (4 * n))  # a few chunks per worker: balance without overhead
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        with ProcessPoolExecutor(n, mp_context=get_context("spawn")) as pool:
            results = [
                r for part in pool.map(_grade_chunk, [grader] * len(chunks), chunks) for r in part
            ]
    errors = [e for _, e in results if e is not None]
    return Grades([c for c, _ in results], len(errors), errors[0] if errors else None)
