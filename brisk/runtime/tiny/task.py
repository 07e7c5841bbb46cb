"""Alias of :mod:`brisk.worlds.arithmetic.task` (:mod:`brisk.runtime.tiny`)."""

import sys

from brisk.worlds.arithmetic import task

sys.modules[__name__] = task
