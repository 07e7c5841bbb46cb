"""The DFlash hook inside SGLang 0.5.23 (CPU): the corrector, not DFlash's argmax, drafts; and
:class:`~brisk.runtime.backbone.ModelHeads`, the served model's E / E_out that the
corrector reads (in the DFlash hook and in ``BRISK_ISD``'s worker)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from brisk.runtime.backbone import ModelHeads
from brisk.runtime.corrector import Corrector, CorrectorInputs
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
        inputs = CorrectorInputs(
            torch.zeros(bs, H), anchors[:, 0], mask_hidden, cand_logits, cand_ids
        )
        expected = head.select(ModelHeads(model), inputs, 0.0).tokens.reshape(-1)
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


def test_a_head_trained_on_brisks_speculative_loop_drafts_alike_in_the_dflash_hook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One head for both loops: a corrector trained on the events of brisk's speculative loop
    (``brisk train corrector collect --drafter`` in the library), loaded by the hook from
    ``$BRISK_DFLASH_CORRECTOR`` as a server loads it, picks from the drafter's MASK-slot hidden
    states exactly the drafts the head picked in brisk's loop, round for round; so does a head
    with random weights, which drafts off the drafter's argmax."""
    from brisk.runtime.drafter import SDOptions
    from brisk.runtime.train.corrector.config import CorrectorTrainConfig
    from brisk.runtime.train.corrector.events import collect_draft_events
    from brisk.runtime.train.corrector.recipe import train_corrector
    from tests.runtime.test_drafter import tiny_drafter, tiny_target
    from tests.runtime.test_drafter_corrector import random_head

    target = tiny_target(6, scale=3.0)
    drafter = tiny_drafter(target, 4)
    prompts = [[i % 6, (3 * i) % 6, (i + 2) % 6] for i in range(24)]
    options = SDOptions(temperature=1.0, draft="top-k", top_k=4, max_new_tokens=24)
    store = collect_draft_events(target, drafter, prompts, options, tmp_path / "ev")
    cfg = CorrectorTrainConfig(
        events=str(store.path),
        out_dir=str(tmp_path / "head"),
        head="small",
        K=4,
        epochs=2,
        only_correct=False,
    )
    trained = train_corrector(cfg, False, ModelHeads(target), store).checkpoint  # type: ignore[arg-type]
    drafts, own = _loop_and_hook(target, drafter, prompts[:4], trained, monkeypatch)
    assert len(drafts) > 8
    random_head(3, 4, 6).save_pretrained(tmp_path / "random")
    drafts, own = _loop_and_hook(target, drafter, prompts[:4], tmp_path / "random", monkeypatch)
    assert not torch.equal(drafts, own)  # the head, not the drafter's argmax, drafted


def _loop_and_hook(
    target: torch.nn.Module,
    drafter: torch.nn.Module,
    prompts: list[list[int]],
    head_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy speculative decoding with the head at ``head_dir`` in brisk's loop, every round's
    MASK-slot hidden states and anchor recorded; then DFlash's sampler, hooked, on those rounds
    as one batch with ``$BRISK_DFLASH_CORRECTOR`` naming the head. Asserts that both drafted
    alike; returns the drafts and the drafter's argmax."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    import brisk.runtime.drafter.speculative as sd
    from brisk.runtime.drafter import SDOptions, speculative_decode
    from brisk.runtime.serving import dflash

    rounds: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    propose = sd.propose

    def recorded(logits, hidden, anchor_hidden, anchor, offset, u, ctx):  # type: ignore[no-untyped-def]
        draft = propose(logits, hidden, anchor_hidden, anchor, offset, u, ctx)
        rounds.append((hidden.clone(), anchor.clone(), draft.tokens.clone()))
        return draft

    with monkeypatch.context() as patch:
        patch.setattr(sd, "propose", recorded)
        head = Corrector.from_pretrained(head_dir)
        speculative_decode(target, drafter, prompts, SDOptions(max_new_tokens=30), corrector=head)
    M = drafter.spec.M  # type: ignore[union-attr]
    hidden = torch.cat([h for h, _, _ in rounds])  # [rounds, M, H]: one batch of the hook
    buf = torch.full((len(rounds), M + 1), drafter.spec.mask_token_id)  # type: ignore[union-attr]
    buf[:, 0] = torch.cat([a for _, a, _ in rounds])
    worker = SimpleNamespace(
        block_size=M + 1,
        _draft_block_ids_buf=buf,
        target_worker=SimpleNamespace(model_runner=SimpleNamespace(model=target)),
    )
    monkeypatch.setenv(dflash.ENV, str(head_dir))
    monkeypatch.setattr(dflash, "_loaded", {})
    sample = DFlashWorkerV2._greedy_sample_from_vocab_parallel_head
    with torch.no_grad():
        hooked = sample(
            worker, hidden_states=hidden.reshape(-1, hidden.shape[-1]), lm_head=target.lm_head
        )
        own = (hidden @ target.lm_head.weight.T).argmax(-1)  # type: ignore[union-attr,operator]
    drafts = torch.cat([t for _, _, t in rounds])
    assert torch.equal(hooked.view(-1, M), drafts)
    return drafts, own
