"""Alias of :mod:`brisk.worlds.arithmetic.tokenizer` (:mod:`brisk.runtime.tiny`)."""

import sys

from brisk.worlds.arithmetic import tokenizer

sys.modules[__name__] = tokenizer
