"""Alias of :mod:`brisk.worlds.arithmetic.grader` (:mod:`brisk.runtime.tiny`)."""

import sys

from brisk.worlds.arithmetic import grader

sys.modules[__name__] = grader
