"""CPU stand-ins for SGLang's CUDA-only imports, in one place, loaded only for ``--device cpu``.

SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``) imports a few ops from ``sgl_kernel`` at module
level, and its vision configs import ``torchvision``; the PyPI ``sglang-kernel`` wheel holds CUDA
ops only, and the registry's torchvision wheels fail against CPU torch (``operator
torchvision::nms does not exist``). ``standins/`` holds an import-only ``sgl_kernel`` whose few
called ops are plain torch (:mod:`~brisk.runtime.serving.cpu.ops`) and an import-only
``torchvision``.

Nothing here is imported by ``import brisk``: a CPU server gets the stand-ins through
:func:`activate` on the environment it is launched with, and a process that imports SGLang
itself (the serving tests, ``brisk bench serve``) calls :func:`ensure_torchvision`. On a CPU
server the stand-ins shadow any installed ``sgl_kernel`` or ``torchvision``: it serves text
models, with SGLang's plain-torch paths.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["STANDINS", "activate", "ensure_torchvision"]

STANDINS = Path(__file__).parent / "standins"
"""The directory whose ``sgl_kernel`` and ``torchvision`` packages shadow the installed ones."""


def activate(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``env`` (default: this process's) with :data:`STANDINS` first on ``PYTHONPATH``.

    SGLang's scheduler and detokenizer are child processes that inherit the environment, so the
    server's whole process tree imports the stand-ins. Idempotent.

    >>> env = activate({"PYTHONPATH": "/x"})
    >>> env["PYTHONPATH"].split(os.pathsep) == [str(STANDINS), "/x"]
    True
    >>> activate(env) == env
    True
    """
    env = dict(os.environ if env is None else env)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(STANDINS), *(p for p in paths if p != str(STANDINS))])
    return env


def ensure_torchvision() -> bool:
    """Import torchvision, or install the stand-in as ``torchvision`` when it cannot be imported.

    For a process that imports SGLang in-process: unlike :func:`activate`, this leaves a working
    torchvision alone and never exposes the ``sgl_kernel`` stand-in. Returns True when the
    stand-in was installed.
    """
    try:
        import torchvision  # noqa: F401
    except Exception:  # a broken wheel raises RuntimeError, not only ImportError
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
    else:
        return False
    init = STANDINS / "torchvision" / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        "torchvision", init, submodule_search_locations=[]
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["torchvision"] = module
    spec.loader.exec_module(module)
    return True
