"""One configuration system: :class:`Config`, the base of every config dataclass.

A config is a frozen dataclass whose fields are declared once, with a trailing comment that is
their documentation. The base gives every config the same behaviour:

- :meth:`Config.from_dict` / :meth:`Config.load` read parsed or ``.toml`` / ``.json`` settings,
  checking every key and value against the fields (nested configs are tables); an unknown key or
  a value of the wrong type is an error naming the key (``model.layers``) and the file, so a typo
  never silently trains the default;
- :meth:`Config.to_dict` and :meth:`Config.replace` (the field's own checks run again);
- :func:`field_docs` reads the fields' comments, which the command line turns into flags and
  their help (``brisk.cli._common.add_config_arguments``): a field is declared once;
- fields shared by several configs live in a base dataclass of their own, which checks them in
  its ``__post_init__`` and calls ``super().__post_init__()``: every config's checks run, each
  written once (:class:`Config` ends the chain);
- a :class:`Registered` field names something a registry holds (a task, a model preset) and
  carries its settings, whose class is the one registered under that name.
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
from typing import Any, ClassVar, Literal, Self, Union, get_args, get_origin, get_type_hints

__all__ = ["Config", "NoSettings", "Registered", "field_docs", "load_config", "parse_config"]


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

    def __post_init__(self) -> None:
        """The end of the chain of checks (module docstring): nothing left to check."""

    def to_dict(self) -> dict[str, Any]:
        """The settings as :meth:`from_dict` reads them (a :class:`Registered` field as one
        table: its name beside its settings)."""
        data = _as_dict(self)
        assert isinstance(data, dict)
        return data

    def replace(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var, no-any-return]


@dataclasses.dataclass(frozen=True)
class NoSettings(Config):
    """The settings of a registered thing that has none."""


@dataclasses.dataclass(frozen=True)
class Registered:
    """Something a registry holds by name (a task, a model preset) with its settings; in TOML
    and JSON one table, ``name`` beside the settings' own keys::

        [task]
        name = "arithmetic"
        max_operands = 6

    The settings' class is the one registered under the name (:meth:`entry`, which a subclass
    answers from its registry), so every key is checked against it as any config's are. A table
    without ``name`` names what the field's default names: tables written before names were
    recorded read as they were meant. Attributes the class lacks are read from the settings
    (``cfg.model.max_positions``).
    """

    name: str
    settings: Config

    kind: ClassVar[str] = "thing"  # what the registry holds, for errors ("task", "model")

    @classmethod
    def entry(cls, name: str) -> tuple[type[Config], dict[str, Any]]:
        """The settings class registered as ``name`` and its named presets (settings
        factories); a ``ValueError`` naming the registered ones for an unknown name."""
        raise NotImplementedError

    @classmethod
    def named(cls, name: str, preset: str = "", **changes: Any) -> Self:
        """``name`` with the settings of its ``preset`` (empty: the settings' defaults), then
        ``changes``."""
        settings_class, presets = cls.entry(name)
        if preset and preset not in presets:
            known = ", ".join(presets) or "none"
            raise ValueError(f"{cls.kind}: {name} has no preset {preset!r} (presets: {known})")
        settings = presets[preset]() if preset else settings_class()
        return cls(name, settings.replace(**changes) if changes else settings)

    @classmethod
    def parse(cls, data: object, prefix: str, default: str) -> Self:
        """From a table (``name`` defaulting to ``default``), every settings key checked."""
        if not isinstance(data, dict):
            raise ValueError(f"{prefix.rstrip('.')}: expected a table of settings")
        settings = dict(data)
        name = settings.pop("name", default)
        if not isinstance(name, str) or not name:
            raise ValueError(f"{prefix}name: expected the name of a {cls.kind}, got {name!r}")
        settings_class, _ = cls.entry(name)
        parsed = _parse(settings_class, settings, prefix)
        assert isinstance(parsed, Config)
        return cls(name, parsed)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.settings.to_dict()}

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr == "settings":  # copy and pickle probe before init
            raise AttributeError(attr)
        return getattr(self.settings, attr)


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
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for key, value in data.items():
        if key not in fields:
            raise ValueError(f"{prefix}{key}: unknown setting (known: {', '.join(sorted(fields))})")
        tp = types[key]
        if isinstance(tp, type) and issubclass(tp, Registered):
            default = _default(fields[key])
            name = default.name if isinstance(default, Registered) else ""
            values[key] = tp.parse(value, f"{prefix}{key}.", name)
        else:
            values[key] = _value(value, tp, f"{prefix}{key}")
    try:
        return cls(**values)
    except ValueError as err:
        raise ValueError(f"{prefix}{err}") from None  # the nested config's own checks


def _default(field: dataclasses.Field[Any]) -> object:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _as_dict(value: object) -> object:
    """``dataclasses.asdict``, a :class:`Registered` value flattened into one table."""
    if isinstance(value, Registered):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _as_dict(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return type(value)(_as_dict(v) for v in value)
    if isinstance(value, dict):
        return {k: _as_dict(v) for k, v in value.items()}
    return value


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
    if tp is type(None):  # JSON null (TOML has none: a key left out)
        if value is None:
            return None
        raise _Mismatch
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
    names = {
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "a string",
        type(None): "null",
    }
    return names.get(tp, str(tp))
