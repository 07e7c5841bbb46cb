"""Doctest collection of the package: the SGLang speculative worker
(``brisk/runtime/serving/worker.py``: ``BriskISDWorker`` subclasses SGLang's classes) imports
SGLang at module level, so it is collected only where SGLang is installed (``.venv-serving``);
its behaviour is tested in ``tests/serving``. Every other serving module imports SGLang only
when called."""

from __future__ import annotations

import importlib.util

collect_ignore = [] if importlib.util.find_spec("sglang") else ["brisk/runtime/serving/worker.py"]
