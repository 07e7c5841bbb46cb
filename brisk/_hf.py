"""transformers settings brisk's commands share (transformers is imported on call)."""

from __future__ import annotations

__all__ = ["quiet_transformers"]


def quiet_transformers() -> None:
    """Silence transformers' own tqdm bars (loading and writing weights) for the rest of the
    process: commands and experiment workers draw their own progress, and a stderr holding only
    brisk's lines is what a one-line error or interruption promises."""
    from transformers.utils import logging

    logging.disable_progress_bar()  # type: ignore[no-untyped-call]
