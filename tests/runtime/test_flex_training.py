"""Training with ``attention = "flex"`` (the FlexAttention ``BlockMask`` twin of the dense mask)
against the dense mask, through the real training loops.

Both runs see the same batches, uniforms and weights; only the attention kernel differs, so the
losses and the trained parameters differ only by float32 summation order, amplified through a
few AdamW steps. Stated tolerance: every logged loss within rtol 1e-4 and every parameter within
atol 1e-4 after the run (measured differences are ~1e-6); the acceptance counts, integers decided
by the same logits, must be equal.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from brisk.runtime.train.base.config import BaseTrainConfig
from brisk.runtime.train.base.recipe import train_base
from brisk.runtime.train.proposal.recipe import train_proposal
from tests.runtime.test_proposal import config


def _records(out: Path, event: str | None = None) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if event is None or r.get("event") == event]


def _close_params(a: Path, b: Path) -> None:
    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert x.keys() == y.keys()
    for k in x:
        torch.testing.assert_close(x[k], y[k], atol=1e-4, rtol=0, msg=k)


def test_proposal_training_with_flex_equals_dense(
    micro_base: Path, micro_dataset: Path, tmp_path: Path
) -> None:
    runs = {}
    for attention in ("dense", "flex"):
        cfg = config(
            micro_base, micro_dataset, tmp_path / attention, token_budget=600, attention=attention
        )
        runs[attention] = train_proposal(cfg, show_progress=False)
    dense, flex = ([r for r in runs[a].history if r["event"] == "train"] for a in runs)
    assert len(dense) == len(flex) >= 3
    for d, f in zip(dense, flex, strict=True):
        assert d["batch_reached"] == f["batch_reached"]
        assert d["batch_accepted"] == f["batch_accepted"]
        assert f["loss"] == pytest.approx(d["loss"], rel=1e-4)
    _close_params(runs["dense"].checkpoint, runs["flex"].checkpoint)
    saved = json.loads((runs["flex"].checkpoint / "config.json").read_text())
    assert "flex" not in json.dumps(saved)  # the checkpoint loads with the model's own attention


def test_base_training_with_flex_equals_dense_and_evaluates_with_dense(tmp_path: Path) -> None:
    runs = {}
    for attention in ("dense", "flex"):
        cfg = BaseTrainConfig.smoke(str(tmp_path / attention)).replace(
            steps=12, log_every=3, eval_every=6, eval_problems=8, attention=attention
        )
        runs[attention] = train_base(cfg, show_progress=False)
    dense, flex = (_records(tmp_path / a, "train") for a in ("dense", "flex"))
    assert len(dense) == len(flex) >= 4
    for d, f in zip(dense, flex, strict=True):
        assert f["loss"] == pytest.approx(d["loss"], rel=1e-4)
    evals = [_records(tmp_path / a, "eval") for a in ("dense", "flex")]
    assert [e["accuracy"] for e in evals[0]] == [e["accuracy"] for e in evals[1]]
    _close_params(runs["dense"].checkpoint, runs["flex"].checkpoint)


def test_compiled_flex_needs_cuda(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("the CPU error path")
    cfg = BaseTrainConfig.smoke(str(tmp_path / "x")).replace(steps=2, attention="flex-compiled")
    with pytest.raises(ValueError, match="attention: flex-compiled needs a CUDA device"):
        train_base(cfg, show_progress=False)


def test_packed_base_training_equals_unpacked(tmp_path: Path) -> None:
    """``pack_tokens``: the same examples end to end in rows of 64 tokens instead of one per
    row. The loss is a token mean over the batch, so every step's loss (rtol 1e-5) and the
    trained parameters (atol 1e-4) are the unpacked flex run's; the packed run has fewer rows."""
    runs = {}
    for pack in (0, 64):
        cfg = BaseTrainConfig.smoke(str(tmp_path / f"pack{pack}")).replace(
            steps=12, log_every=1, attention="flex", pack_tokens=pack
        )
        runs[pack] = train_base(cfg, show_progress=False)
    plain, packed = (_records(tmp_path / f"pack{p}", "train") for p in (0, 64))
    assert len(plain) == len(packed) == 12
    for d, f in zip(plain, packed, strict=True):
        assert f["loss"] == pytest.approx(d["loss"], rel=1e-5)
        assert f["slot_ce"] == pytest.approx(d["slot_ce"], rel=1e-5)
    _close_params(runs[0].checkpoint, runs[64].checkpoint)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pack_tokens": 64}, "pack_tokens: packed rows need attention = flex"),
        (
            {"pack_tokens": 4096, "attention": "flex"},
            "pack_tokens: 4096 is longer than the model's 128 positions",
        ),
        ({"pack_tokens": 8, "attention": "flex"}, "pack_tokens: step 0 drew a"),
    ],
)
def test_packing_bad_input(change: dict[str, object], message: str, tmp_path: Path) -> None:
    def run() -> None:
        cfg = BaseTrainConfig.smoke(str(tmp_path / "x")).replace(steps=2, **change)
        train_base(cfg, show_progress=False)

    with pytest.raises(ValueError, match=message):
        run()
