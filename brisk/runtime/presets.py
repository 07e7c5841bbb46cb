"""Named model presets: a model built from scratch with its tokenizer (``brisk train base``
without ``init``). The tiny world's model registers itself as ``tiny``; a preset is a function
of its config returning ``(model, tokenizer)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["build_preset", "preset_names", "preset_tokenizer", "register_preset"]

_PRESETS: dict[str, Callable[[Any], tuple[Any, Any]]] = {}
_TOKENIZERS: dict[str, Callable[[], Any]] = {}


def register_preset(
    name: str, build: Callable[[Any], tuple[Any, Any]], tokenizer: Callable[[], Any]
) -> None:
    """Make ``build(config) -> (model, tokenizer)`` available as the preset ``name``, and
    ``tokenizer()`` its tokenizer alone."""
    _PRESETS[name] = build
    _TOKENIZERS[name] = tokenizer


def preset_names() -> list[str]:
    _load_builtin()
    return sorted(_PRESETS)


def build_preset(name: str, config: Any) -> tuple[Any, Any]:
    """A fresh model of preset ``name`` (seed torch first for reproducibility) and its
    tokenizer."""
    _load_builtin()
    if name not in _PRESETS:
        raise ValueError(f"model: no preset {name!r} (presets: {', '.join(sorted(_PRESETS))})")
    return _PRESETS[name](config)


def preset_tokenizer(name: str) -> Any:
    """The tokenizer of preset ``name`` (built with the preset's default config)."""
    _load_builtin()
    if name not in _PRESETS:
        raise ValueError(f"model: no preset {name!r} (presets: {', '.join(sorted(_PRESETS))})")
    return _TOKENIZERS[name]()


def _load_builtin() -> None:
    import brisk.runtime.tiny.model  # noqa: F401  registers "tiny"
