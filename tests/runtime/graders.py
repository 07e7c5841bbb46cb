"""A grader for the tests of grader-error counting: it raises on every odd answer."""

from __future__ import annotations

GRADER = "tests.runtime.graders:raises_on_odd_answers"


def raises_on_odd_answers(response: str, answer: object) -> bool:
    """Raise for an odd integer answer; else the response is right iff it is the answer."""
    if int(str(answer)) % 2:
        raise RuntimeError(f"cannot grade answer {answer}")
    return response.strip() == str(answer)
