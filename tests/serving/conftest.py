"""The serving tests run in ``.venv-serving`` (``make test-serving``): SGLang 0.5.23 installed
light (no CUDA dependency set) beside brisk. Elsewhere this directory is not collected (see
``tests/conftest.py``); it is never skipped where SGLang is present.

SGLang's vision configs import torchvision, whose wheels here need CUDA torch: when it cannot
be imported, ``stubs/`` provides an import-only stand-in. Every test brings its own plugin state
(:func:`plugins`), since ``load_plugins()`` runs once per process.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

try:
    import torchvision  # noqa: F401
except Exception:
    sys.modules.pop("torchvision", None)
    sys.path.insert(0, str(Path(__file__).parent / "stubs"))

assert importlib.util.find_spec("sglang") is not None, "tests/serving runs in .venv-serving"

collect_ignore = ["stubs"]


@pytest.fixture(scope="session")
def plugins() -> None:
    """SGLang's own plugin loading, as its launcher and schedulers run it (once per process)."""
    import sglang.srt.plugins as sp

    sp.load_plugins()
