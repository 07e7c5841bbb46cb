"""Seed every test; one hypothesis profile for the whole suite (derandomized for CI); Triton
kernels run in its interpreter on CPU tensors unless the environment says otherwise (a GPU run
sets ``TRITON_INTERPRET=0``). Triton reads the variable when a kernel module is imported, so it
is set here, before any test module imports one.

Under xdist (``make test``: ``-n 2`` on 2 cores) each worker runs torch on its share of the cores,
and so do the processes it starts (``OMP_NUM_THREADS``, unless the environment sets it; brisk's
commands still set their ``--threads``). torch's default, a thread per core in every worker, has
the workers' threads spin against each other: a loop of small forwards ran several times
slower (tests/runtime/test_drafter.py with tests/theory/test_horizon_decoder.py and
tests/runtime/test_memory.py: 100 s → 65 s at -n 2; benchmarks/gpu_check.py --smoke: 50 → 7
CPU-seconds). The share is set again before each test, as a brisk command run in-process leaves
its own ``--threads`` behind."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util
import random
import signal
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from hypothesis import settings

WORKER_THREADS = 0  # torch's intra-op threads per xdist worker (0: not under xdist, its default)
if os.environ.get("PYTEST_XDIST_WORKER"):
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (_cores or 1) // _workers)))
    WORKER_THREADS = int(os.environ["OMP_NUM_THREADS"])

# The SGLang contract tests and the serving benchmark's tests need SGLang, which lives in its own
# virtualenv (`make test-serving`, run by `make test`): they are collected only where it is.
collect_ignore = [] if importlib.util.find_spec("sglang") else ["serving"]

# A suite started in the background by a shell without job control (`nohup make test &`) begins
# with SIGINT ignored, and every process it starts inherits that; the interrupt tests need Ctrl-C
# delivered, as it is to a command run in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

settings.register_profile(
    "brisk", max_examples=200, derandomize=True, deadline=None, database=None, print_blob=True
)
settings.load_profile("brisk")


@pytest.fixture(autouse=True)
def _seed_everything() -> None:
    random.seed(0)
    np.random.seed(0)  # noqa: NPY002 — seeds code that still uses the legacy global RNG
    torch.manual_seed(0)


def _share_threads() -> None:
    if WORKER_THREADS and torch.get_num_threads() != WORKER_THREADS:
        torch.set_num_threads(WORKER_THREADS)


_share_threads()  # before any module or session fixture runs


@pytest.fixture(autouse=True)
def _worker_threads() -> Iterator[None]:
    _share_threads()
    yield
    _share_threads()  # for the next module's fixtures, which run before its first test
