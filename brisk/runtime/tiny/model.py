"""Alias of :mod:`brisk.worlds.arithmetic.model` (:mod:`brisk.runtime.tiny`)."""

import sys

from brisk.worlds.arithmetic import model

sys.modules[__name__] = model
