"""Graders of the held-out functions task. The answer is a mapping with the problem's ``prompt``
(imports, signature and docstring) and the reference ``body``; the response is the completion
of the prompt.

- :func:`compiles` — the prompt followed by the completion parses and compiles
  (``compile(..., "exec")``; nothing is run), and the function has a statement after its
  docstring;
- :func:`exact_body` — the completion equals the reference body, trailing whitespace of each
  line and trailing blank lines aside.

The world registers both with the runtime by these names
(:func:`~brisk.runtime.tasks.graders.register_grader`), so a prompt file or ``--grader`` names
them like the built-in ones.
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["GRADERS", "compiles", "exact_body", "normalize_body"]


def _field(answer: Any, key: str) -> str:
    if not isinstance(answer, Mapping) or not isinstance(answer.get(key), str):
        raise ValueError(f"answer: a held-out function needs a {key!r} string")
    return str(answer[key])


def compiles(response: str, answer: Any) -> bool:
    """Whether ``answer["prompt"] + response`` compiles as a module and the completion gave the
    prompt's function a body: a statement after its docstring. The prompt (signature and
    docstring) compiles by itself, so an empty completion must not count.

    >>> prompt = {"prompt": "def f(x):\\n    '''x.'''\\n"}
    >>> compiles("    return x\\n", prompt)
    True
    >>> compiles("    return (x\\n", prompt)
    False
    >>> compiles("", prompt)
    False
    """
    prompt = _field(answer, "prompt")
    try:
        with warnings.catch_warnings():  # code that compiles with a warning is not news
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)  # "\d" in a string, before 3.12
            tree = ast.parse(prompt + response)
            compile(tree, "<completion>", "exec", dont_inherit=True)
            head = ast.parse(prompt).body
    except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError):
        return False
    if not head or len(tree.body) < len(head):
        return False
    function = tree.body[len(head) - 1]
    if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    has_docstring = ast.get_docstring(function, clean=False) is not None
    return len(function.body) > (1 if has_docstring else 0)


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


GRADERS = {"compiles": compiles, "exact-body": exact_body}  # registered by the world
