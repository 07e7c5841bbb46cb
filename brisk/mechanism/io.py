"""Former home of the block-log reader and writer, now split by job: which files make up a log
(:mod:`~brisk.mechanism.discover`), blocks as arrays (:mod:`~brisk.mechanism.columns`),
reading and validating (:mod:`~brisk.mechanism.reader`) and writing
(:mod:`~brisk.mechanism.writer`). Every public name is exported by :mod:`brisk.mechanism`;
import it from there. This module only keeps the callers outside the mechanism layer that still
import from here working until they move, and then goes.
"""

from __future__ import annotations

from brisk.mechanism.columns import DEFAULT_BATCH_ROWS, BlockBatch, block_table
from brisk.mechanism.discover import PART_PATTERN, log_files, log_folders
from brisk.mechanism.reader import (
    count_blocks,
    log_info,
    log_shape,
    log_verification,
    read_blocks,
    validate,
)
from brisk.mechanism.writer import BlockLogWriter

__all__ = [
    "DEFAULT_BATCH_ROWS",
    "PART_PATTERN",
    "BlockBatch",
    "BlockLogWriter",
    "block_table",
    "count_blocks",
    "log_files",
    "log_folders",
    "log_info",
    "log_shape",
    "log_verification",
    "read_blocks",
    "validate",
]
