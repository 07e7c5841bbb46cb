"""An import-only stand-in for ``sgl_kernel`` on SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``).

The names are exactly those SGLang 0.5.23 imports from ``sgl_kernel`` at module level on the CPU
path (found by serving a model with an instrumented stand-in): the ops a server can call are
plain torch (:mod:`brisk.runtime.serving.cpu.ops`); the tree-speculation ops (EAGLE trees, which
brisk does not serve) raise ``NotImplementedError`` when called. Any other name is absent, so
SGLang's own ``try: from sgl_kernel... except ImportError`` fallbacks take their CPU branch.
"""

from __future__ import annotations

from typing import Any

from brisk.runtime.serving.cpu import ops
from brisk.runtime.serving.cpu.ops import *  # noqa: F403 (the ops, named once: ops.__all__)

__version__ = "0.0.0+brisk.cpu.standin"

IMPORT_ONLY = ("build_tree_kernel_efficient_cpu", "rotate_input_ids_cpu", "verify_tree_greedy_cpu")

__all__ = [*ops.__all__, *IMPORT_ONLY]


def _import_only(name: str) -> Any:
    def op(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"sgl_kernel.{name}: brisk's CPU stand-in only imports it")

    op.__name__ = op.__qualname__ = name
    return op


build_tree_kernel_efficient_cpu = _import_only("build_tree_kernel_efficient_cpu")
rotate_input_ids_cpu = _import_only("rotate_input_ids_cpu")
verify_tree_greedy_cpu = _import_only("verify_tree_greedy_cpu")
