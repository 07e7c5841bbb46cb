"""An import-only stand-in for torchvision, for SGLang on CPU torch.

``sglang.srt.configs`` imports torchvision (vision-language configs), and the torchvision wheels
the registry has for CPU torch fail to load (``operator torchvision::nms does not exist``).
Nothing a text model's server runs touches it: any attribute is a placeholder that fails if it
is called. Loaded as the top-level ``torchvision`` by :mod:`brisk.runtime.serving.cpu`, never
under this package's dotted name.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__version__ = "0.0.0+brisk.cpu.standin"


class _Missing(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"
        module = sys.modules.get(full) or _Missing(full)
        sys.modules[full] = module
        return module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.__name__}: torchvision is brisk's CPU stand-in (import only)")


# `torchvision.x` (an attribute of this module) is the placeholder `import torchvision.x` gives
__getattr__ = _Missing("torchvision").__getattr__


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import torchvision.x.y`` gives a placeholder module."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        return _Missing(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []  # type: ignore[attr-defined]


sys.meta_path.append(_Finder())
