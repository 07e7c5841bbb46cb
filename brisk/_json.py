"""Reading a JSON file brisk did not necessarily write: every failure is one ``ValueError``
naming the file (not UTF-8, not JSON, not the kind of value expected)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["read_json_object"]


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
        value = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value
