"""Registries of named things (tasks, model presets) and the worlds that fill them.

A *world* is a package that registers what it brings when it is imported: tasks (problems, a
grader, a corpus to train on) and model presets (a model built from scratch with its
tokenizer). brisk's own, :mod:`brisk.worlds.arithmetic`, registers the task ``arithmetic``, the
pre-training corpus ``broad`` and the model preset ``tiny``.

The runtime never imports a world: the first lookup in any registry loads every world once
(:func:`load_worlds`), each package inside ``brisk/worlds/`` found on disk, so nothing in the
runtime names one and a new world is a new folder there. A user's own tasks and presets need no
world: :func:`brisk.runtime.tasks.task.register_task` and
:func:`brisk.runtime.presets.register_preset` register them from anywhere.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from typing import Generic, TypeVar

__all__ = ["WORLDS", "Registry", "load_worlds"]

WORLDS = "brisk.worlds"  # the package whose subpackages are the worlds

T = TypeVar("T")

_loaded = False


def load_worlds() -> None:
    """Import every world package under :data:`WORLDS` (once; each registers itself)."""
    global _loaded
    if _loaded:
        return
    _loaded = True  # before importing: a world that looks something up while loading is fine
    spec = importlib.util.find_spec(WORLDS)
    if spec is None or spec.submodule_search_locations is None:
        return
    for info in pkgutil.iter_modules(spec.submodule_search_locations, f"{WORLDS}."):
        if info.ispkg:
            importlib.import_module(info.name)


class Registry(Generic[T]):
    """Entries by name; a lookup loads the worlds first and an unknown name is a
    ``ValueError`` that names the ``kind`` and the registered names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T) -> None:
        self._entries[name] = entry

    def get(self, name: str) -> T:
        load_worlds()
        if name not in self._entries:
            known = ", ".join(sorted(self._entries)) or "none"
            raise ValueError(f"{self.kind}: no {self.kind} {name!r} (registered: {known})")
        return self._entries[name]

    def names(self) -> list[str]:
        load_worlds()
        return sorted(self._entries)
