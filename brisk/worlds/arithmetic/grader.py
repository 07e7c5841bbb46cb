"""Normalized answer matching (the paper's grader) for the arithmetic world: the answer after the
last ``####``, normalized (:func:`brisk.runtime.tasks.graders.normalize_answer`), against the
problem's integer answer. Malformed output (no marker, empty answer, binary junk) is simply
incorrect; the grader never raises.
"""

from __future__ import annotations

from brisk.runtime.tasks.graders import extract_answer, normalize_answer

__all__ = ["extract_answer", "grade", "normalize_answer"]


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
