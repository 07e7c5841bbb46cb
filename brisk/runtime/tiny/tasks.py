"""Alias of :mod:`brisk.worlds.arithmetic.tasks` (:mod:`brisk.runtime.tiny`)."""

import sys

from brisk.worlds.arithmetic import tasks

sys.modules[__name__] = tasks
