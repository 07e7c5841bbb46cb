"""The DFlash hook inside SGLang 0.5.23 (CPU): the corrector, not DFlash's argmax, drafts; and
:class:`~brisk.runtime.serving.common.ModelHeads`, the served model's E / E_out that the
corrector reads (in the DFlash hook and in ``BRISK_ISD``'s worker)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from brisk.runtime.serving.common import ModelHeads
from tests.runtime.test_isd import MASK, micro_backbone, random_corrector

pytestmark = pytest.mark.usefixtures("plugins")


def test_the_dflash_hook_fires() -> None:
    """The patched sampler returns the corrector's block over the Top-K of the draft logits;
    without a corrector it is DFlash's own argmax."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    backbone = micro_backbone()
    head = random_corrector(3, 6)
    model = backbone.model
    bs, block, H = 5, 4, 32
    torch.manual_seed(3)
    hidden = torch.randn(bs * (block - 1), H)
    anchors = torch.randint(0, MASK, (bs, block))
    worker = SimpleNamespace(
        block_size=block,
        _draft_block_ids_buf=anchors,
        brisk_corrector=None,
        target_worker=SimpleNamespace(model_runner=SimpleNamespace(model=model)),
    )
    sample = DFlashWorkerV2._greedy_sample_from_vocab_parallel_head
    assert sample.__wrapped__ is not None
    with torch.no_grad():
        own = sample(worker, hidden_states=hidden, lm_head=model.lm_head)
        assert torch.equal(own, (hidden @ model.lm_head.weight.T).argmax(-1))
        worker.brisk_corrector = head
        reranked = sample(worker, hidden_states=hidden, lm_head=model.lm_head)
        mask_hidden = hidden.view(bs, block - 1, H)
        cand_logits, cand_ids = (mask_hidden @ model.lm_head.weight.T).topk(6, dim=-1)
        expected = head.select(
            ModelHeads(model),
            torch.zeros(bs, H),
            anchors[:, 0],
            mask_hidden,
            cand_logits,
            cand_ids,
            0.0,
        ).tokens.reshape(-1)
    assert torch.equal(reranked, expected)
    assert not torch.equal(reranked, own)  # the head changed some drafts
    assert DFlashWorkerV2._maybe_build_draft_sampler(worker) is None  # eager while reranking


def test_model_heads_read_a_qwen3_layout_model() -> None:
    model = micro_backbone().model
    ids = torch.tensor([[0, 5, MASK]])
    heads = ModelHeads(model)
    with torch.no_grad():
        assert torch.equal(heads.embed(ids), model.model.embed_tokens(ids))
    assert torch.equal(heads.lm_head_rows(ids), model.lm_head.weight[ids])
    assert (heads.hidden_size, heads.vocab_size) == (32, model.lm_head.weight.shape[0])
    assert heads.device == model.lm_head.weight.device
    # SGLang pads the head's rows: the vocabulary is the model config's, not the row count
    assert ModelHeads(model, vocab_size=MASK).vocab_size == MASK


def test_model_heads_refuse_what_the_corrector_cannot_read() -> None:
    with pytest.raises(RuntimeError, match=r"no model\.embed_tokens / lm_head\.weight .* Linear"):
        ModelHeads(torch.nn.Linear(4, 4))
    sharded = SimpleNamespace(
        model=SimpleNamespace(embed_tokens=torch.nn.Embedding(16, 4)),
        lm_head=SimpleNamespace(weight=torch.zeros(8, 4), shard_indices=object()),
    )
    with pytest.raises(RuntimeError, match="sharded across tensor-parallel ranks"):
        ModelHeads(sharded, vocab_size=16)  # type: ignore[arg-type]
