"""The serving tests run in ``.venv-serving`` (``make test-serving``): SGLang 0.5.23 installed
light (no CUDA dependency set) beside brisk. Elsewhere this directory is not collected (see
``tests/conftest.py``); it is never skipped where SGLang is present.

SGLang's vision configs import torchvision, whose wheels here need CUDA torch: when it cannot
be imported, brisk's CPU stand-in takes its place (:func:`ensure_torchvision`). Every test
brings its own plugin state (:func:`plugins`), since ``load_plugins()`` runs once per process.
One real SGLang server (:func:`real_server`) is shared by the whole session.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from brisk.runtime.serving.cpu import ensure_torchvision
from tests.serving.real_server import RealServer, start_real_server

ensure_torchvision()

assert importlib.util.find_spec("sglang") is not None, "tests/serving runs in .venv-serving"


@pytest.fixture(scope="session")
def plugins() -> None:
    """SGLang's own plugin loading, as its launcher and schedulers run it (once per process)."""
    import sglang.srt.plugins as sp

    sp.load_plugins()


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    """A real SGLang server on CPU, on a free loopback port, serving the micro model of
    :mod:`tests.serving.real_server`: started once (bounded by its start-up timeout) and always
    stopped by its own process group, whatever the tests do."""
    process, server = start_real_server(tmp_path_factory.mktemp("real_server"))
    try:
        yield server
    finally:
        process.stop()
