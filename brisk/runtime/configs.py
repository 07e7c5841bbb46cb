"""One configuration system: :class:`Config`, the base of every config dataclass.

A config is a frozen dataclass whose fields are declared once, with a trailing comment that is
their documentation. The base gives every config the same behaviour:

- :meth:`Config.from_dict` / :meth:`Config.load` read parsed or ``.toml`` / ``.json`` settings,
  checking every key and value against the fields (nested configs are tables); an unknown key or
  a value of the wrong type is an error naming the key (``model.layers``) and the file, so a typo
  never silently trains the default;
- :meth:`Config.to_dict` and :meth:`Config.replace` (the field's own checks run again);
- :func:`field_docs` reads the fields' comments, which the command line turns into flags and
  their help (``brisk.cli._common.add_config_arguments``): a field is declared once.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import textwrap
import tomllib
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Self, Union, get_args, get_origin, get_type_hints

__all__ = ["Config", "field_docs", "load_config", "parse_config"]


class Config:
    """The base of the config dataclasses (module docstring)."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """A config from parsed TOML/JSON: every key must be a field and every value of the
        field's type (an error names the key, e.g. ``model.layers``); lists become tuples and
        integers become floats where the field wants them."""
        config = parse_config(cls, data)
        assert isinstance(config, cls)
        return config

    @classmethod
    def load(cls, path: str | Path) -> Self:
        """Read a ``.toml`` or ``.json`` config; errors start with the file's path."""
        config = load_config(cls, path)
        assert isinstance(config, cls)
        return config

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload, no-any-return]

    def replace(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var, no-any-return]


def parse_config(cls: type, data: object, prefix: str = "") -> object:
    """``cls`` (a config dataclass) from parsed settings, every key and value checked."""
    return _parse(cls, data, prefix)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The trailing ``# comment`` of each field declared in ``cls`` or its bases (a field's
    documentation; empty where there is none or the source cannot be read)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        lines = source.splitlines()
        tree = ast.parse(source)
        for node in tree.body[0].body:  # type: ignore[attr-defined]
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                line = lines[node.end_lineno - 1] if node.end_lineno else ""
                _, hash_, comment = line.partition("  # ")
                if hash_ and not comment.startswith(("fmt:", "noqa", "type:")):
                    docs[node.target.id] = comment.strip()
                    continue
                above = []  # else the comment lines right above the field
                for prev in reversed(lines[: node.lineno - 1]):
                    if not prev.strip().startswith("#"):
                        break
                    above.insert(0, prev.strip().lstrip("#").strip())
                if above:
                    docs[node.target.id] = " ".join(above)
    return docs


def load_config(cls: type, path: str | Path) -> object:
    """``cls`` (a config dataclass) from a ``.toml`` or ``.json`` file, every key and value
    checked against its fields; errors start with the file's path."""
    path = Path(path)
    if path.suffix not in (".toml", ".json"):
        raise ValueError(f"{path}: expected a .toml or .json file")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"{path}: cannot read ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start})") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: invalid TOML: {err}") from None
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path}: invalid JSON: {err.msg} (at line {err.lineno}, column {err.colno})"
        ) from None
    try:
        return _parse(cls, data, "")
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def _parse(cls: type, data: object, prefix: str) -> object:
    """``cls(**data)`` after checking every key and value against ``cls``'s field types."""
    if not isinstance(data, dict):
        raise ValueError(f"{prefix.rstrip('.') or 'config'}: expected a table of settings")
    types = get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    values = {}
    for key, value in data.items():
        if key not in known:
            raise ValueError(f"{prefix}{key}: unknown setting (known: {', '.join(sorted(known))})")
        values[key] = _value(value, types[key], f"{prefix}{key}")
    try:
        return cls(**values)
    except ValueError as err:
        raise ValueError(f"{prefix}{err}") from None  # the nested config's own checks


class _Mismatch(Exception):
    """A value that is not of the wanted type (turned into an error naming the key)."""


def _value(value: object, tp: Any, key: str) -> object:
    if dataclasses.is_dataclass(tp):
        return _parse(tp, value, f"{key}.")  # type: ignore[arg-type]
    try:
        return _convert(value, tp)
    except _Mismatch:
        raise ValueError(f"{key}: expected {_describe(tp)}, got {value!r}") from None


def _convert(value: object, tp: Any) -> object:
    """``value`` as type ``tp`` (bool, int, float, str, Literal, X | Y, tuple[X, ...])."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, UnionType):
        for arm in args:
            try:
                return _convert(value, arm)
            except _Mismatch:
                pass
        raise _Mismatch
    if origin is Literal:
        if any(type(value) is type(a) and value == a for a in args):
            return value
        raise _Mismatch
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        if not isinstance(value, list | tuple):
            raise _Mismatch
        return tuple(_convert(v, args[0]) for v in value)
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp in (bool, int, str) and type(value) is tp:
        return value
    if tp is type(None) and value is None:  # JSON null (TOML has none: a key left out)
        return None
    if tp in (bool, int, float, str):
        raise _Mismatch
    raise TypeError(f"config fields of type {tp!r} are not supported")  # a programming error


def _describe(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is Literal:
        return " or ".join(repr(a) for a in args)
    if origin is tuple:
        return f"a list of {_describe(args[0]).removeprefix('an ').removeprefix('a ')}s"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
             type(None): "null"}  # fmt: skip
    return names.get(tp, str(tp))
