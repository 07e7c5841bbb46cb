"""Normalized answer matching (the paper's grader): extract the final answer, normalize, compare.

The answer is the text after the last ``####`` marker, up to the end of its line. Normalization
strips whitespace, thousands separators, a leading ``+``, a trailing full stop and redundant
zeros (``007`` → ``7``, ``4.0`` → ``4``). Anything that does not parse as a number after that is
compared as a whitespace-collapsed, lower-cased string. Malformed output (no marker, empty answer,
binary junk) is simply incorrect; the grader never raises.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["extract_answer", "grade", "normalize_answer"]

_MARKER = "####"
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def extract_answer(text: object) -> str | None:
    """The raw answer after the last ``####``, or None when there is none."""
    if not isinstance(text, str) or _MARKER not in text:
        return None
    tail = text.rsplit(_MARKER, 1)[1].split("\n", 1)[0].strip()
    return tail or None


def normalize_answer(answer: str) -> str:
    """Canonical form of an answer string (numbers in plain decimal, other text collapsed)."""
    s = answer.strip().replace(",", "").rstrip(".").strip()
    if _NUMBER.fullmatch(s):
        try:
            value = Decimal(s)
        except InvalidOperation:  # pragma: no cover - the regex admits only valid decimals
            return s
        value = value.quantize(Decimal(1)) if value == value.to_integral_value() else value
        text = format(value.normalize(), "f")
        return "0" if text in ("-0", "+0") else text
    return " ".join(s.lower().split())


def grade(output: object, reference: object) -> bool:
    """True iff ``output`` has a final answer equal to ``reference`` after normalization.

    ``reference`` may be an int or a string (a bare answer, or a full solution with ``####``).

    >>> grade("2+3=5\\n#### 5", 5), grade("#### 05.0", "5"), grade("no answer", 5)
    (True, True, False)
    """
    try:
        got = extract_answer(output)
        if got is None:
            return False
        if isinstance(reference, str):
            ref = extract_answer(reference) or reference
        elif isinstance(reference, int):
            ref = str(reference)
        else:
            return False
        return normalize_answer(got) == normalize_answer(ref)
    except Exception:  # never let a malformed generation crash an evaluation
        return False
