"""What the suite trains, built once per run and shared by every test and xdist worker that asks.

:func:`built_once` returns the directory of an artifact named by a name and keyed by the
configuration it is built from: the first process that asks builds it under a file lock and
marks it done; every other one (another module, the other xdist worker) waits on the lock and
reads it. Under xdist the directory sits in the workers' shared temporary directory (the parent
of each worker's ``basetemp``), else in the run's own. A build that raises leaves no mark, so
the next asker builds again (and fails the same way, in its own test). The key is the
configuration the build depends on: two tests that ask for differently configured artifacts
never share one. Whoever reads a shared artifact must not write into it (copy it first).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

__all__ = ["built_once", "shared_root"]


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's temporary directory every xdist worker sees (the run's own without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    config: object,
    build: Callable[[Path], object],
) -> Path:
    """The directory ``build(directory)`` filled, built by the first process that asks for
    ``name`` with this ``config`` (anything ``json.dumps`` writes, ``str`` for the rest)."""
    from filelock import FileLock

    text = json.dumps(config, sort_keys=True, default=str)
    root = (
        shared_root(tmp_path_factory) / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    )
    done = root / ".built"
    with FileLock(f"{root}.lock"):
        if not done.is_file():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            build(root)
            done.write_text(text)
    return root
