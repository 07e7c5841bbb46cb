"""Graders of the held-out functions task. The answer is a mapping with the problem's ``prompt``
(imports, signature and docstring) and the reference ``body``; the response is the completion
of the prompt.

- :func:`compiles` — the prompt followed by the completion parses and compiles
  (``compile(..., "exec")``; nothing is run);
- :func:`exact_body` — the completion equals the reference body, trailing whitespace of each
  line and trailing blank lines aside.

Both are named to the runtime's graders as ``module:function`` (:data:`GRADERS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["GRADERS", "compiles", "exact_body", "normalize_body"]


def _field(answer: Any, key: str) -> str:
    if not isinstance(answer, Mapping) or not isinstance(answer.get(key), str):
        raise ValueError(f"answer: a held-out function needs a {key!r} string")
    return str(answer[key])


def compiles(response: str, answer: Any) -> bool:
    """Whether ``answer["prompt"] + response`` compiles as a module.

    >>> compiles("    return x\\n", {"prompt": "def f(x):\\n    '''x.'''\\n"})
    True
    >>> compiles("    return (x\\n", {"prompt": "def f(x):\\n    '''x.'''\\n"})
    False
    """
    program = _field(answer, "prompt") + response
    try:
        compile(program, "<completion>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError):
        return False
    return True


def normalize_body(text: str) -> str:
    """``text`` with each line's trailing whitespace and the trailing blank lines dropped.

    >>> normalize_body("    return x  \\n\\n  \\n")
    '    return x'
    """
    return "\n".join(line.rstrip() for line in text.split("\n")).rstrip("\n")


def exact_body(response: str, answer: Any) -> bool:
    """Whether the completion is the reference body (:func:`normalize_body` of both).

    >>> exact_body("    return x \\n", {"body": "    return x\\n"})
    True
    >>> exact_body("  return x\\n", {"body": "    return x\\n"})
    False
    """
    return normalize_body(response) == normalize_body(_field(answer, "body"))


GRADERS = {
    "compiles": "brisk.worlds.code.grader:compiles",
    "exact-body": "brisk.worlds.code.grader:exact_body",
}
