"""Memory at the users' vocabulary (V = 151,936) on a narrow model, with generous bounds:
``benchmarks/memory_bench.py``'s measurements at a smaller shape, each in its own process.

Before logits were computed only where they are read, the decode below held its
``[4, 256, V]`` float32 prefill logits (0.62 GB, ratio ≥ 1) and the training step its
``[1, 1024, V]`` logits with their float32 CE copies and gradient (ratio ≥ 3 against the bf16
logits); now they measure ≈ 0.17 and ≈ 1.7."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import memory_bench

pytestmark = pytest.mark.slow


def test_decode_peak_is_far_below_the_prefill_logits() -> None:
    row = memory_bench.run_child(
        "decode_peak", vocab=memory_bench.V, prompts=4, length=256, new_tokens=16
    )
    assert row["ratio"] < 0.5, row


def test_a_training_step_holds_no_full_or_float64_vocabulary_tensor() -> None:
    row = memory_bench.run_child("training_peak", vocab=memory_bench.V, L=512)
    assert row["ratio"] < 2.5, row
    assert not row["vocab_float64"], row
    assert row["largest_vocab_rows"] < 2 * 512 // 2, row  # a chunk, not the micro-batch
