"""The I-DLM objective: attention rules element by element, inputs, labels and the loss."""

from __future__ import annotations

import math

import pytest
import torch

from brisk.runtime.train.idlm import (
    IGNORE,
    block_diffusion_mask,
    build_batch,
    idlm_forward,
    idlm_loss,
)
from brisk.worlds.arithmetic.model import TinyModelConfig, build_model
from brisk.worlds.arithmetic.tokenizer import char_tokenizer

MASK_ID, PAD_ID = 3, 0


@pytest.mark.parametrize(
    ("L", "M", "offset"),
    [
        pytest.param(7, 3, 0, id="L7-M3"),
        pytest.param(6, 1, 0, id="L6-M1"),
        pytest.param(9, 4, 2, id="L9-M4-offset2"),
    ],
)
def test_mask_rules_element_by_element(L: int, M: int, offset: int) -> None:
    allowed = block_diffusion_mask(L, M, offset)
    assert allowed.shape == (2 * L, 2 * L)
    blk = [math.floor((j - offset) / M) for j in range(L)]
    for q in range(2 * L):
        for k in range(2 * L):
            qi, ki = q % L, k % L
            if q < L and k < L:  # noisy → noisy: same block and causal
                rule = blk[qi] == blk[ki] and qi >= ki
            elif q < L:  # noisy → clean: strictly earlier blocks
                rule = blk[ki] < blk[qi]
            elif k >= L:  # clean → clean: causal
                rule = qi >= ki
            else:  # clean → noisy: never
                rule = False
            assert bool(allowed[q, k]) == rule, (q, k)


def test_mask_by_hand_for_L4_M2() -> None:
    """Rows/columns: noisy 0..3 then clean 0..3; blocks {0,1}, {2,3}."""
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 0],
            [0, 0, 1, 0, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 1, 0, 0],
            [0, 0, 0, 0, 1, 0, 0, 0],
            [0, 0, 0, 0, 1, 1, 0, 0],
            [0, 0, 0, 0, 1, 1, 1, 0],
            [0, 0, 0, 0, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    torch.testing.assert_close(block_diffusion_mask(4, 2), expected, rtol=0, atol=0)


def test_batch_duplicates_input_masks_the_response_and_shifts_labels() -> None:
    seqs = [[1, 10, 11, 20, 21, 22, 2], [1, 10, 20, 2]]  # bos, prompt…, response…, eos
    batch = build_batch(seqs, [3, 2], M=2, mask_token_id=MASK_ID, pad_token_id=PAD_ID)
    L = 7
    x_t, x_0 = batch.input_ids[:, :L], batch.input_ids[:, L:]
    torch.testing.assert_close(x_0[0], torch.tensor(seqs[0]), rtol=0, atol=0)
    torch.testing.assert_close(x_0[1], torch.tensor([1, 10, 20, 2, 0, 0, 0]), rtol=0, atol=0)
    torch.testing.assert_close(x_t[0], torch.tensor([1, 10, 11, 3, 3, 3, 3]), rtol=0, atol=0)
    torch.testing.assert_close(x_t[1], torch.tensor([1, 10, 3, 3, 0, 0, 0]), rtol=0, atol=0)
    torch.testing.assert_close(batch.position_ids[0], torch.arange(L).repeat(2), rtol=0, atol=0)
    # clean: position j predicts x_0[j+1] at response targets (the first from the last prompt token)
    I = IGNORE  # noqa: E741
    torch.testing.assert_close(
        batch.clean_labels, torch.tensor([[I, I, 20, 21, 22, 2, I], [I, 20, 2, I, I, I, I]])
    )
    # noisy: MASK slots predict the next token; the last one has nothing to predict
    torch.testing.assert_close(
        batch.noisy_labels, torch.tensor([[I, I, I, 21, 22, 2, I], [I, I, 2, I, I, I, I]])
    )
    torch.testing.assert_close(batch.slot, torch.tensor([0, 1, 0, 1, 0, 1, 0]))
    additive = batch.attention_mask[0, 0]
    allowed = block_diffusion_mask(L, 2)
    assert bool((additive[allowed] == 0).all())
    assert bool((additive[~allowed] == torch.finfo(additive.dtype).min).all())


def test_bad_prompt_lengths_raise() -> None:
    with pytest.raises(ValueError, match="prompt_lens"):
        build_batch([[1, 2, 3]], [4], M=2, mask_token_id=MASK_ID, pad_token_id=PAD_ID)
    with pytest.raises(ValueError, match="M:"):
        build_batch([[1, 2, 3]], [1], M=0, mask_token_id=MASK_ID, pad_token_id=PAD_ID)


def test_clean_stream_is_blind_to_the_noisy_copy_and_noisy_to_its_own_block_future() -> None:
    """Changing a token changes exactly the logits the mask says may see it."""
    tok = char_tokenizer()
    model = build_model(TinyModelConfig.micro(), tok).eval()
    seqs = [[1, 40, 41, 42, 43, 44, 45, 46, 47, 2]]
    base = build_batch(seqs, [3], M=3, mask_token_id=tok.mask_token_id, pad_token_id=0)
    with torch.no_grad():
        n0, c0 = idlm_forward(model, base)
        changed = seqs[0].copy()
        changed[6] = 60  # a response token at position 6 (block {6,7,8} for M = 3)
        other = build_batch([changed], [3], M=3, mask_token_id=tok.mask_token_id, pad_token_id=0)
        n1, c1 = idlm_forward(model, other)
    moved_clean = (c0 - c1).abs().amax(-1)[0] > 0
    moved_noisy = (n0 - n1).abs().amax(-1)[0] > 0
    assert moved_clean.tolist() == [j >= 6 for j in range(10)]
    # noisy copy holds MASK at 6: only noisy positions of later blocks see clean token 6
    assert moved_noisy.tolist() == [j >= 9 for j in range(10)]


def test_loss_combines_streams_and_reports_per_slot_ce() -> None:
    tok = char_tokenizer()
    torch.manual_seed(0)
    model = build_model(TinyModelConfig.micro(), tok)
    seqs = [[1, 40, 41, 42, 43, 44, 45, 46, 2], [1, 40, 50, 51, 52, 2]]
    batch = build_batch(seqs, [2, 2], M=3, mask_token_id=tok.mask_token_id, pad_token_id=0)
    noisy, clean = idlm_forward(model, batch)
    fixed = idlm_loss(noisy, clean, batch, alpha=0.2)
    torch.testing.assert_close(fixed.loss, fixed.ce_noisy + 0.2 * fixed.ce_clean)
    auto = idlm_loss(noisy, clean, batch, alpha="auto")
    assert auto.alpha == pytest.approx(float((auto.ce_noisy / auto.ce_clean).detach()))
    torch.testing.assert_close(auto.loss, 2 * auto.ce_noisy)
    assert fixed.slot_ce.shape == fixed.slot_count.shape == (2, 3)
    # slot sums reproduce CE_noisy: Σ_b,i ce·count / Σ count
    total = (fixed.slot_ce * fixed.slot_count).sum() / fixed.slot_count.sum()
    torch.testing.assert_close(total, fixed.ce_noisy)
    assert fixed.slot_count.sum() == (batch.noisy_labels != IGNORE).sum()
    auto.loss.backward()  # the auto α is detached: gradients flow through both CEs only
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
