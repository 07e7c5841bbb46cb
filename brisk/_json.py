"""Reading JSON brisk did not necessarily write: every failure is one ``ValueError`` naming
where the text came from (not UTF-8, not JSON, not the kind of value expected)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["parse_json_object", "read_json_object"]


def read_json_object(file: str | Path) -> dict[str, Any]:
    """The JSON object in ``file``, or a ``ValueError`` naming it.

    >>> import tempfile, os
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     bad = Path(tmp, "x.json")
    ...     _ = bad.write_bytes(b"[1]")
    ...     try:
    ...         read_json_object(bad)
    ...     except ValueError as err:
    ...         print(str(err).replace(tmp, "TMP"))
    TMP/x.json: expected a JSON object, got list
    """
    path = Path(file)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x})") from None
    return parse_json_object(text, str(path))


def parse_json_object(text: str, where: str) -> dict[str, Any]:
    """The JSON object ``text`` holds (a file, a line of one, a flag's value), or a
    ``ValueError`` that begins with ``where``.

    >>> parse_json_object('{"a": 1}', "--x")
    {'a': 1}
    >>> for bad in ("[1]", "[1,]"):
    ...     try:
    ...         parse_json_object(bad, "rows.jsonl line 3")
    ...     except ValueError as err:
    ...         print(err)
    rows.jsonl line 3: expected a JSON object, got list
    rows.jsonl line 3: not JSON (Expecting value at line 1, column 4)
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        at = f"line {err.lineno}, column {err.colno}"
        raise ValueError(f"{where}: not JSON ({err.msg} at {at})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value
