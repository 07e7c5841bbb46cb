"""Doctest collection of the package: the SGLang speculative workers
(``brisk/runtime/serving/chain_worker.py``, ``worker.py`` and ``drafter_worker.py``: their
``ChainWorker`` subclasses SGLang's classes, ``BriskISDWorker`` and ``BriskDrafterWorker`` it)
import SGLang at module level, so they are collected
only where SGLang is installed (``.venv-serving``); their behaviour is tested in
``tests/serving``. Every other serving module imports SGLang only when called."""

from __future__ import annotations

import importlib.util

_WORKERS = [
    "brisk/runtime/serving/chain_worker.py",
    "brisk/runtime/serving/worker.py",
    "brisk/runtime/serving/drafter_worker.py",
]
collect_ignore = [] if importlib.util.find_spec("sglang") else _WORKERS
