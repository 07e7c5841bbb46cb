"""The machine a benchmark ran on, as its summary records it (imported by the scripts beside it,
which run as ``python benchmarks/NAME.py``)."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def machine(threads: int | None = None) -> dict[str, Any]:
    """CPU model (``/proc/cpuinfo``'s, else the platform's), cores, Python, and the torch
    threads the benchmark ran with when it fixed them."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        named = [line for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        if named:
            cpu = named[0].split(":", 1)[1].strip()
    found: dict[str, Any] = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
    }
    if threads is not None:
        found["threads"] = threads
    return found
