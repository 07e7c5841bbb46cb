"""Argument types shared by the layers' command lines."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def comma_separated(cast: Callable[[str], T], what: str) -> Callable[[str], list[T]]:
    """An argparse ``type`` reading ``"a,b,c"`` as a non-empty list of ``cast`` values."""

    def parse(text: str) -> list[T]:
        try:
            values = [cast(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {what}, got {text!r}"
            ) from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected at least one of the {what}")
        return values

    return parse
