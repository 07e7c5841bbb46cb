"""Doctest collection of the package: the modules that subclass SGLang's classes
(``DllmAlgorithm``, the speculative worker) import SGLang at module level, so they are collected
only where SGLang is installed (``.venv-serving``); their behaviour is tested in
``tests/serving``."""

from __future__ import annotations

import importlib.util

collect_ignore = (
    []
    if importlib.util.find_spec("sglang")
    else ["brisk/runtime/serving/algorithm.py", "brisk/runtime/serving/worker.py"]
)
