"""Configuration of base-model training: one frozen dataclass, loadable from TOML or JSON.

A config file mirrors the dataclass; ``[task]`` and ``[model]`` sections fill the nested configs::

    steps = 2000
    strides = [2, 4, 8]
    [task]
    max_operands = 3
    [model]
    hidden_size = 128

Unknown keys are an error naming the key, so a typo never silently trains the default.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from brisk.runtime.tasks.spec import TaskSpec
from brisk.runtime.tiny.model import TinyModelConfig
from brisk.runtime.tiny.task import TaskConfig

__all__ = ["BaseTrainConfig", "load_config"]


@dataclass(frozen=True)
class BaseTrainConfig:
    """I-DLM training of a base model: by default the preset tiny model on the arithmetic
    world; with ``init`` a user's causal LM (the I-DLM conversion recipe), with ``data`` a
    user's prompts and responses."""

    out_dir: str = "runs/tiny/base"
    init: str = ""  # a causal LM checkpoint to convert (empty: build `model` from scratch)
    add_mask_token: bool = False  # give `init` a MASK token if it has none (embeddings grow)
    # training pairs: empty, the world's base corpus; else a task with prompt and response fields
    data: TaskSpec = field(default_factory=TaskSpec)
    seed: int = 0
    task: TaskConfig = field(default_factory=TaskConfig.tiny)
    model: TinyModelConfig = field(default_factory=TinyModelConfig.tiny)
    steps: int = 2000
    batch_size: int = 32
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    alpha: float | Literal["auto"] = "auto"
    # Stride curriculum (I-DLM: 2 → 3 → 4): equal shares of the steps, in this order.
    strides: tuple[int, ...] = (2, 4, 8)
    # Shift block starts at random each step so every response position acts as an ISD anchor.
    random_block_offset: bool = True
    log_every: int = 25
    eval_every: int = 0
    eval_problems: int = 100
    final_eval_problems: int = 200
    eval_seed: int = 1
    save_every: int = 500
    # One thread: on a shared 2-core machine two OpenMP threads oversubscribe and run slower.
    threads: int = 1
    max_minutes: float = 14.0  # wall-clock budget; training stops early and saves when exceeded

    def __post_init__(self) -> None:
        # Types are checked where configs are parsed (from_dict); these are the value ranges.
        for name in ("steps", "batch_size", "log_every", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be ≥ 1, got {getattr(self, name)!r}")
        for name in ("warmup_steps", "eval_every", "eval_problems", "final_eval_problems",
                     "save_every", "weight_decay"):  # fmt: skip
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be ≥ 0, got {getattr(self, name)!r}")
        for name in ("lr", "grad_clip", "max_minutes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)!r}")
        if not 0 < self.min_lr <= self.lr:
            raise ValueError(f"min_lr: need 0 < min_lr ≤ lr ({self.lr!r}), got {self.min_lr!r}")
        if not self.strides or any(n < 2 for n in self.strides):
            raise ValueError(f"strides: need strides N ≥ 2, got {self.strides}")
        if self.alpha != "auto" and not (isinstance(self.alpha, int | float) and self.alpha >= 0):
            raise ValueError(f"alpha: expected a number ≥ 0 or 'auto', got {self.alpha!r}")
        if self.add_mask_token and not self.init:
            raise ValueError("add_mask_token: only a checkpoint given as init gets one added")
        if self.data.name:
            raise ValueError("data: a data file (path) with prompt and response fields")

    @classmethod
    def tiny(cls) -> BaseTrainConfig:
        """The preset behind ``configs/tiny_base.toml``."""
        return cls()

    @classmethod
    def paper(cls) -> BaseTrainConfig:
        """The preset behind ``configs/paper_base.toml``: the paper-regime world (≤ 20 min on
        the 2-core CPU, both threads)."""
        return cls(
            out_dir="runs/paper/base",
            task=TaskConfig.paper(),
            model=TinyModelConfig(max_positions=256),
            steps=1650,
            eval_problems=200,
            threads=2,
            max_minutes=19.5,
        )

    @classmethod
    def smoke(cls, out_dir: str = "runs/smoke") -> BaseTrainConfig:
        """A few seconds on the trivial task with the micro model (the test suite's budget)."""
        return cls(
            out_dir=out_dir,
            task=TaskConfig.trivial(),
            model=TinyModelConfig.micro(),
            steps=200,
            batch_size=32,
            warmup_steps=10,
            strides=(2, 4),
            log_every=10,
            eval_every=0,
            eval_problems=0,
            final_eval_problems=0,
            save_every=0,
        )

    def stride_at(self, step: int) -> int:
        """The curriculum's stride N at ``step`` (0-based)."""
        phase = min(step * len(self.strides) // self.steps, len(self.strides) - 1)
        return self.strides[phase]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BaseTrainConfig:
        """A config from parsed TOML/JSON: every key must be a field and every value of the
        field's type (an error names the key, e.g. ``model.layers``); lists become tuples and
        integers become floats where the field wants them."""
        config = _parse(cls, data, "")
        assert isinstance(config, BaseTrainConfig)
        return config

    @classmethod
    def load(cls, path: str | Path) -> BaseTrainConfig:
        """Read a ``.toml`` or ``.json`` config; errors start with the file's path."""
        config = load_config(cls, path)
        assert isinstance(config, BaseTrainConfig)
        return config

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> BaseTrainConfig:
        return dataclasses.replace(self, **changes)


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
