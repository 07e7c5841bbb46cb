"""The mechanism report of a set of logs: :func:`analyze` reads them in one streaming pass
and summarizes them (:mod:`~brisk.mechanism.summary`); :func:`write_report` writes
summary.json, summary.md (:mod:`~brisk.mechanism.render`) and the plots
(:mod:`~brisk.mechanism.plots`). ``brisk mechanism report LOG... --out DIR`` does both.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from brisk.mechanism.columns import DEFAULT_BATCH_ROWS
from brisk.mechanism.discover import Paths, log_files
from brisk.mechanism.plots import save_plots
from brisk.mechanism.render import markdown
from brisk.mechanism.requests import read_requests
from brisk.mechanism.summary import MechanismSummary, summarize
from brisk.mechanism.tally import tally_blocks

__all__ = ["analyze", "write_report"]


def analyze(
    paths: Paths,
    ks: Sequence[int] | None = None,
    draws: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    progress: Callable[[int], None] | None = None,
) -> MechanismSummary:
    """Validate, tally and summarize logs (files or part directories) in one streaming pass;
    the request tables of the log directories, if any, give the run's TPFs."""
    logs = [paths] if isinstance(paths, str | os.PathLike) else list(paths)  # read twice
    files = tuple(str(f) for f in log_files(logs))
    tally = tally_blocks(files, batch_rows=batch_rows, progress=progress)
    requests = read_requests(logs, tally.shape.M, tally.decoder)
    return summarize(tally, ks, draws, seed, level, files, requests)


def write_report(s: MechanismSummary, out: str | os.PathLike[str]) -> list[Path]:
    """Write summary.json, summary.md and the PNG plots into ``out``; return the paths."""
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs = save_plots(s, out_dir)
    (out_dir / "summary.json").write_text(json.dumps(s.to_dict(), indent=1, allow_nan=False))
    (out_dir / "summary.md").write_text(markdown(s, [str(p) for p in pngs]))
    return [out_dir / "summary.json", out_dir / "summary.md", *pngs]
