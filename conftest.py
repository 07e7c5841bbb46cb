"""Doctest collection of the package: the SGLang speculative workers
(``brisk/runtime/serving/worker.py`` and ``drafter_worker.py``: ``BriskISDWorker`` subclasses
SGLang's classes, ``BriskDrafterWorker`` it) import SGLang at module level, so they are collected
only where SGLang is installed (``.venv-serving``); their behaviour is tested in
``tests/serving``. Every other serving module imports SGLang only when called."""

from __future__ import annotations

import importlib.util

_WORKERS = ["brisk/runtime/serving/worker.py", "brisk/runtime/serving/drafter_worker.py"]
collect_ignore = [] if importlib.util.find_spec("sglang") else _WORKERS
