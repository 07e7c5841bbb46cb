"""Named model presets: a model built from scratch with its tokenizer (``brisk train base``
without ``init``), by name (:class:`NamedModel`, a training config's ``[model]`` table).

A preset registers a build function of its settings returning ``(model, tokenizer)``, a
tokenizer function, its settings class (a :class:`~brisk.runtime.configs.Config` with a
``max_positions`` field: the longest sequence the model takes) and named settings. Worlds
register their presets (:mod:`brisk.runtime.registry`): the arithmetic world's tiny Qwen3 is
``tiny``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from brisk.runtime.configs import Config, Registered
from brisk.runtime.registry import Registry

__all__ = [
    "NamedModel",
    "Preset",
    "build_preset",
    "preset_names",
    "preset_tokenizer",
    "register_preset",
]


@dataclass(frozen=True)
class Preset:
    """A registered model preset."""

    build: Callable[[Any], tuple[Any, Any]]  # settings -> (model, tokenizer)
    tokenizer: Callable[[], Any]
    settings: type[Config]
    presets: Mapping[str, Callable[[], Config]] = field(default_factory=dict)


PRESETS: Registry[Preset] = Registry("model")


def register_preset(
    name: str,
    build: Callable[[Any], tuple[Any, Any]],
    tokenizer: Callable[[], Any],
    settings: type[Config],
    presets: Mapping[str, Callable[[], Config]] | None = None,
) -> None:
    """Make ``build(settings) -> (model, tokenizer)`` available as the preset ``name``,
    ``tokenizer()`` its tokenizer alone, ``settings`` the class of its settings and
    ``presets`` named settings (e.g. ``micro`` for tests)."""
    PRESETS.register(name, Preset(build, tokenizer, settings, dict(presets or {})))


def preset_names() -> list[str]:
    return PRESETS.names()


def build_preset(name: str, settings: Config | None = None) -> tuple[Any, Any]:
    """A fresh model of preset ``name`` (seed torch first for reproducibility) and its
    tokenizer; ``settings`` None: the preset's defaults."""
    preset = PRESETS.get(name)
    return preset.build(settings if settings is not None else preset.settings())


def preset_tokenizer(name: str) -> Any:
    """The tokenizer of preset ``name``."""
    return PRESETS.get(name).tokenizer()


@dataclass(frozen=True)
class NamedModel(Registered):
    """A model preset by name with its settings (``[model]``: ``name = "tiny"`` beside the
    settings' keys, e.g. ``hidden_size``)."""

    kind: ClassVar[str] = "model"

    @classmethod
    def entry(cls, name: str) -> tuple[type[Config], dict[str, Any]]:
        preset = PRESETS.get(name)
        return preset.settings, dict(preset.presets)

    def build(self) -> tuple[Any, Any]:
        """A fresh model of these settings and its tokenizer."""
        return build_preset(self.name, self.settings)

    def tokenizer(self) -> Any:
        return preset_tokenizer(self.name)

    @property
    def max_positions(self) -> int:
        return int(self.settings.max_positions)  # type: ignore[attr-defined]
