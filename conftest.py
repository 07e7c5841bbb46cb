"""Doctest collection of the package: the one module that subclasses SGLang's ``DllmAlgorithm``
imports SGLang at module level, so it is collected only where SGLang is installed
(``.venv-serving``); its behaviour is tested in ``tests/serving``."""

from __future__ import annotations

import importlib.util

collect_ignore = (
    [] if importlib.util.find_spec("sglang") else ["brisk/runtime/serving/algorithm.py"]
)
