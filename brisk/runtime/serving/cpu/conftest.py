"""The stand-ins are top-level ``sgl_kernel`` and ``torchvision`` in a server's process, not
modules of brisk: doctest collection must not import them under their dotted names (the
torchvision stand-in answers every attribute, ``pytestmark`` included)."""

from __future__ import annotations

collect_ignore = ["standins"]
