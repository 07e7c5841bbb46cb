"""Block logs and the paper's mechanism diagnostics (paper, app:mechanism_analysis).

Write logs with :class:`BlockLogWriter`, check them with :func:`validate`, and get every
statistic with :func:`analyze` (or ``brisk mechanism report LOG... --out DIR``).
"""

from __future__ import annotations

from brisk.mechanism.columns import BlockBatch, block_table
from brisk.mechanism.coverage import CandidateCoverage, candidate_coverage
from brisk.mechanism.discover import log_files, log_folders
from brisk.mechanism.likelihood import BlockLikelihood, block_likelihood
from brisk.mechanism.reader import (
    count_blocks,
    log_decoder,
    log_shape,
    log_verification,
    read_blocks,
    validate,
)
from brisk.mechanism.repetition import Repetition, repeats, repetition
from brisk.mechanism.replay import BlockState, SameStateReplay, same_state_accept, same_state_replay
from brisk.mechanism.report import analyze, write_report
from brisk.mechanism.requests import RequestTable, read_requests
from brisk.mechanism.runs import RunTPF, run_tpf_of_log
from brisk.mechanism.schema import (
    FORMAT_VERSION,
    BlockLogError,
    CorruptBlockLogError,
    LogShape,
    Verification,
    block_schema,
)
from brisk.mechanism.stats import Bootstrap, Interval, Mean, Rate, RateArray
from brisk.mechanism.summary import MechanismSummary, summarize
from brisk.mechanism.synthetic import synthetic_blocks, synthetic_log, synthetic_requests
from brisk.mechanism.tally import RequestTally, block_features, tally_blocks
from brisk.mechanism.writer import BlockLogWriter

__all__ = [
    "FORMAT_VERSION",
    "BlockBatch",
    "BlockLikelihood",
    "BlockLogError",
    "BlockLogWriter",
    "BlockState",
    "Bootstrap",
    "CandidateCoverage",
    "CorruptBlockLogError",
    "Interval",
    "LogShape",
    "Mean",
    "MechanismSummary",
    "Rate",
    "RateArray",
    "Repetition",
    "RequestTable",
    "RequestTally",
    "RunTPF",
    "SameStateReplay",
    "Verification",
    "analyze",
    "block_features",
    "block_likelihood",
    "block_schema",
    "block_table",
    "candidate_coverage",
    "count_blocks",
    "log_decoder",
    "log_files",
    "log_folders",
    "log_shape",
    "log_verification",
    "read_blocks",
    "read_requests",
    "repeats",
    "repetition",
    "run_tpf_of_log",
    "same_state_accept",
    "same_state_replay",
    "summarize",
    "synthetic_blocks",
    "synthetic_log",
    "synthetic_requests",
    "tally_blocks",
    "validate",
    "write_report",
]
