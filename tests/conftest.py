"""Seed every test; one hypothesis profile for the whole suite (derandomized for CI); Triton
kernels run in its interpreter on CPU tensors unless the environment says otherwise (a GPU run
sets ``TRITON_INTERPRET=0``). Triton reads the variable when a kernel module is imported, so it
is set here, before any test module imports one."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util
import random
import signal

import numpy as np
import pytest
import torch
from hypothesis import settings

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
