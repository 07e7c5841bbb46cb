"""An import-only stand-in for torchvision in the serving tests.

``sglang.srt.configs`` imports torchvision (vision-language configs), and the torchvision wheels
this CPU machine can install need a CUDA torch (``operator torchvision::nms does not exist``).
Nothing the tests run touches it: any attribute is a placeholder that fails if it is called.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__version__ = "0.0.0+brisk-stub"


class _Missing(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"
        module = sys.modules.get(full) or _Missing(full)
        sys.modules[full] = module
        return module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.__name__}: torchvision is a stand-in in brisk's serving tests")


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
