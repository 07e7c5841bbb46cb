"""A Griffe extension that lets brisk's docstrings read as Markdown on the API pages.

brisk's docstrings are written for ``help()`` and doctest: examples as bare ``>>>`` lines and
cross-references as Sphinx roles (``:func:`decode```). Markdown would render the first as nested
block quotes and the second as a literal role, so before mkdocstrings renders a docstring this
fences each doctest run as ``pycon`` and writes each role as the code span of its target. The
docstrings themselves stay as they are: doctest still runs them (``pytest --doctest-modules``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:mod|func|class|meth|attr|data|obj|exc):`(?P<short>~?)(?P<target>[^`]+)`")
_PROMPT = (">>> ", "... ")


def _code_span(match: re.Match[str]) -> str:
    # ``~a.b.c`` shows its last part, as Sphinx does.
    target = match["target"]
    return f"``{target.rsplit('.', 1)[-1] if match['short'] else target}``"


def fence_doctests(text: str) -> str:
    """``text`` with every doctest run (prompts and the output up to a blank line) fenced."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if not stripped.startswith(">>>"):
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(stripped)]
        out.append(f"{indent}```pycon")
        while i < len(lines) and lines[i].strip():
            out.append(lines[i])
            i += 1
        out.append(f"{indent}```")
    return "\n".join(out)


def to_markdown(text: str) -> str:
    return fence_doctests(_ROLE.sub(_code_span, text))


class MarkdownDocstrings(griffe.Extension):
    """Rewrite every docstring once the object tree is complete."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
