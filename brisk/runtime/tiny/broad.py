"""Alias of :mod:`brisk.worlds.arithmetic.broad` (:mod:`brisk.runtime.tiny`)."""

import sys

from brisk.worlds.arithmetic import broad

sys.modules[__name__] = broad
