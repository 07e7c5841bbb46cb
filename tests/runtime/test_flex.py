"""The FlexAttention twin of the I-DLM mask, and packed rows, against the dense reference.

Three levels: (1) exact boolean parity of the dense ``[2L, 2L]`` mask with the mask
materialized from the ``mask_mod`` and of the tiled ``BlockMask`` with torch's
``create_block_mask``; (2) float parity of logits and gradients of a tiny random Qwen3 (2
layers, hidden 32, GQA 4/2 heads of 16), dense ``sdpa`` + additive mask vs flex + ``BlockMask``, for
several M and offsets, with and without packing; (3) a packed batch gives every example the
losses (total, per stream, per proposal slot, BRISK-weighted) the unpacked batch gives it.

Tolerance (float32): ``atol = 1e-5, rtol = 1e-4`` on logits and gradients. Both paths compute
softmax(QKᵀ/√d + mask)·V in float32 and a masked score underflows to exactly 0 in both (−inf in
flex, ``finfo.min`` added in sdpa), so they differ only by summation order: observed ≈ 1e-7 on
logits of size O(1); the bound leaves two orders of magnitude and still catches one wrongly
(un)masked key, which moves logits by ≈ 1e-2.

What runs on this CPU: flex forward, eager and compiled (inductor's C++ template, ≈ 45 s of
compilation per shape on 2 cores: one slow test). torch's public ``flex_attention`` refuses
backward on CPU in every mode, so CPU gradients go through the flex higher-order op's eager
autograd (torch's dense math forward and backward with the same BlockMask and mask_mod; see
:mod:`brisk.runtime.train.flex`). The fused (compiled Triton) forward and backward are checked
by the ``cuda`` cases, which skip without a GPU.

(4) Compiled flex at varying (L, M, offset): the padding to a compiled length is invisible
(exact mask parity; logits and gradients of the real positions, through eager flex), and dynamo
traces one graph per rung of the padded length, not one per batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention
from transformers import Qwen3Config, Qwen3ForCausalLM

from brisk.runtime.train import flex as flex_module
from brisk.runtime.train.flex import (
    COMPILED_FLEX,
    bucket,
    flex_idlm_forward,
    idlm_block_mask,
    idlm_mask_mod,
    pad_streams,
    padded_length,
    use_flex,
)
from brisk.runtime.train.forward import training_forward
from brisk.runtime.train.idlm import (
    IGNORE,
    IDLMBatch,
    block_diffusion_mask,
    build_batch,
    idlm_forward,
    idlm_loss,
)
from brisk.runtime.train.packing import (
    PackedBatch,
    pack_batch,
    packed_block_mask,
    packed_dense_mask,
    packed_forward,
    packed_logits,
    packed_loss,
    pad_rows,
    slot_weights,
)
from brisk.runtime.train.proposal.acceptance import slot_table
from brisk.runtime.train.proposal.recipe import weighted_loss

V, MASK_ID, PAD_ID = 24, 3, 0
ATOL, RTOL = 1e-5, 1e-4
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="fused flex needs CUDA"),
    ),
]


def tiny_qwen3(device: str = "cpu") -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        attn_implementation="sdpa",
    )
    return Qwen3ForCausalLM(config).to(device)


def random_examples(n: int, lo: int, hi: int, seed: int) -> tuple[list[list[int]], list[int]]:
    """``n`` sequences of ``lo..hi`` tokens (bos = 1, then non-special ids) and prompt lengths."""
    g = torch.Generator().manual_seed(seed)
    seqs, prompts = [], []
    for _ in range(n):
        length = int(torch.randint(lo, hi + 1, (1,), generator=g))
        seqs.append([1, *torch.randint(4, V, (length - 1,), generator=g).tolist()])
        prompts.append(int(torch.randint(1, max(2, length // 2), (1,), generator=g)))
    return seqs, prompts


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor) -> None:
    err = (out.float() - ref.float()).abs()
    bad = err > ATOL + RTOL * ref.float().abs()
    first = bad.nonzero()[0].tolist() if bad.any() else None
    assert first is None, f"{name}: max err {err.max():.3g}, first bad index {first}"


def grads_of(model: torch.nn.Module, loss_fn: Callable[[], torch.Tensor]) -> dict[str, Any]:
    model.zero_grad(set_to_none=True)
    loss_fn().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


# --- (1) exact parity of the masks ---------------------------------------------------------------

MASK_CASES = [
    pytest.param(7, 3, 0, 16, id="L7-M3"),
    pytest.param(6, 1, 0, 16, id="L6-M1"),
    pytest.param(9, 4, 2, 16, id="L9-M4-o2"),
    pytest.param(40, 7, 5, 16, id="L40-M7-o5"),
    pytest.param(70, 15, 3, 128, id="L70-M15-o3-B128"),
    pytest.param(160, 8, 0, 128, id="L160-M8-B128"),
]


@pytest.mark.parametrize(("L", "M", "offset", "block"), MASK_CASES)
def test_dense_mask_equals_mask_mod(L: int, M: int, offset: int, block: int) -> None:
    materialized = create_mask(idlm_mask_mod(L, M, offset), 1, 1, 2 * L, 2 * L, device="cpu")
    torch.testing.assert_close(
        materialized[0, 0], block_diffusion_mask(L, M, offset), rtol=0, atol=0
    )


@pytest.mark.parametrize(("L", "M", "offset", "block"), MASK_CASES)
def test_tiled_block_mask_equals_create_block_mask(L: int, M: int, offset: int, block: int) -> None:
    ours = idlm_block_mask(L, M, offset, block=block)
    ref = create_block_mask(
        idlm_mask_mod(L, M, offset), None, None, 2 * L, 2 * L, device="cpu", BLOCK_SIZE=block
    )
    for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
        torch.testing.assert_close(getattr(ours, name), getattr(ref, name), rtol=0, atol=0)
    torch.testing.assert_close(ours.to_dense(), ref.to_dense(), rtol=0, atol=0)
    dense = create_mask(ours.mask_mod, 1, 1, 2 * L, 2 * L, device="cpu")[0, 0]
    torch.testing.assert_close(dense, block_diffusion_mask(L, M, offset), rtol=0, atol=0)


def test_packed_mask_is_each_examples_mask_and_nothing_across() -> None:
    seqs, prompts = random_examples(5, 3, 12, seed=1)
    batch = pack_batch(
        seqs, prompts, M=3, mask_token_id=MASK_ID, pad_token_id=PAD_ID, budget=24, offset=1
    )
    dense = packed_dense_mask(batch)  # [R, 2L, 2L]
    L = batch.L
    materialized = create_mask(
        packed_block_mask(batch).mask_mod, batch.docs.shape[0], 1, 2 * L, 2 * L, device="cpu"
    )[:, 0]
    torch.testing.assert_close(materialized, dense, rtol=0, atol=0)
    docs = torch.cat([batch.docs, batch.docs], 1)
    assert not bool((dense & (docs[:, :, None] != docs[:, None])).any())
    for e, seq in enumerate(seqs):
        r = int((batch.docs == e).any(1).nonzero()[0])
        idx = (docs[r] == e).nonzero()[:, 0]
        own = dense[r][idx[:, None], idx[None]]
        torch.testing.assert_close(own, block_diffusion_mask(len(seq), 3, 1), rtol=0, atol=0)


def test_packed_inputs_and_labels_are_each_examples() -> None:
    seqs, prompts = random_examples(6, 2, 10, seed=2)
    batch = pack_batch(
        seqs, prompts, M=4, mask_token_id=MASK_ID, pad_token_id=PAD_ID, budget=16, offset=2
    )
    assert int((batch.docs >= 0).sum()) == sum(len(s) for s in seqs)
    L = batch.L
    for e, (seq, p) in enumerate(zip(seqs, prompts, strict=True)):
        alone = build_batch([seq], [p], M=4, mask_token_id=MASK_ID, pad_token_id=PAD_ID, offset=2)
        r = int((batch.docs == e).any(1).nonzero()[0])
        span = (batch.docs[r] == e).nonzero()[:, 0]
        for name, packed, ref in [
            ("x_t", batch.input_ids[r, span], alone.input_ids[0, : len(seq)]),
            ("x_0", batch.input_ids[r, L + span], alone.input_ids[0, len(seq) :]),
            ("positions", batch.position_ids[r, span], alone.position_ids[0, : len(seq)]),
            ("noisy", batch.noisy_labels[r, span], alone.noisy_labels[0]),
            ("clean", batch.clean_labels[r, span], alone.clean_labels[0]),
            ("slot", batch.slot[r, span], alone.slot),
        ]:
            torch.testing.assert_close(packed, ref, rtol=0, atol=0, msg=f"example {e}: {name}")
    assert bool((batch.noisy_labels[batch.docs < 0] == IGNORE).all())


# --- (2) float parity of logits and gradients ----------------------------------------------------

FORWARD_CASES = [
    pytest.param(2, 0, id="M2-o0"),
    pytest.param(3, 1, id="M3-o1"),
    pytest.param(4, 3, id="M4-o3"),
    pytest.param(7, 0, id="M7-o0"),
    pytest.param(1, 0, id="M1"),
]


def unpacked(M: int, offset: int, device: str, seed: int = 0) -> IDLMBatch:
    seqs, prompts = random_examples(3, 6, 40, seed)
    return build_batch(seqs, prompts, M, MASK_ID, PAD_ID, offset=offset, device=device)


@pytest.mark.parametrize(("M", "offset"), FORWARD_CASES)
def test_flex_logits_match_dense(M: int, offset: int) -> None:
    model = tiny_qwen3().eval()
    batch = unpacked(M, offset, "cpu")
    with torch.no_grad():
        dense = idlm_forward(model, batch)
        flex = flex_idlm_forward(model, batch)
    assert_close("noisy", dense[0], flex[0])
    assert_close("clean", dense[1], flex[1])
    assert model.config._attn_implementation == "sdpa"  # restored after the flex forward


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("M", "offset"), [pytest.param(3, 1, id="M3-o1"), pytest.param(4, 0, id="M4-o0")]
)
def test_flex_gradients_match_dense(M: int, offset: int, device: str) -> None:
    model = tiny_qwen3(device).train()
    batch = unpacked(M, offset, device)
    compile = device == "cuda"

    def dense() -> torch.Tensor:
        return idlm_loss(*idlm_forward(model, batch), batch).loss

    def flex() -> torch.Tensor:
        return idlm_loss(*flex_idlm_forward(model, batch, compile=compile), batch).loss

    ref, out = grads_of(model, dense), grads_of(model, flex)
    assert len(ref) > 0
    assert ref.keys() == out.keys()
    for name in ref:
        assert_close(name, ref[name], out[name])


# --- (3) packed rows give every example its unpacked losses --------------------------------------


def packed_and_unpacked(device: str) -> tuple[PackedBatch, IDLMBatch, list[IDLMBatch]]:
    seqs, prompts = random_examples(7, 4, 30, seed=3)
    args = dict(M=4, mask_token_id=MASK_ID, pad_token_id=PAD_ID, offset=1, device=device)
    packed = pack_batch(seqs, prompts, budget=48, **args)  # type: ignore[arg-type]
    assert packed.input_ids.shape[0] < len(seqs)  # several examples share a row
    padded = build_batch(seqs, prompts, **args)  # type: ignore[arg-type]
    alone = [build_batch([s], [p], **args) for s, p in zip(seqs, prompts, strict=True)]  # type: ignore[arg-type]
    return packed, padded, alone


def test_packed_losses_match_unpacked() -> None:
    model = tiny_qwen3().eval()
    packed, padded, alone = packed_and_unpacked("cpu")
    with torch.no_grad():
        out = packed_loss(*packed_forward(model, packed), packed)
        for e, batch in enumerate(alone):
            ref = idlm_loss(*idlm_forward(model, batch), batch)
            assert_close(f"ce_noisy[{e}]", ref.ce_noisy, out.example_ce_noisy[e])
            assert_close(f"ce_clean[{e}]", ref.ce_clean, out.example_ce_clean[e])
            assert_close(f"slot_ce[{e}]", ref.slot_ce[0], out.slot_ce[e])
            torch.testing.assert_close(out.slot_count[e], ref.slot_count[0], rtol=0, atol=0)
        whole = idlm_loss(*idlm_forward(model, padded), padded)
    assert_close("loss", whole.loss, out.loss)
    assert abs(whole.alpha - out.alpha) <= RTOL * whole.alpha


def test_packed_brisk_weighting_matches_proposal_loss() -> None:
    """``slot_weights`` on packed rows = the proposal loop's token weights on padded rows."""
    model = tiny_qwen3().eval()
    packed, padded, _ = packed_and_unpacked("cpu")
    w = torch.tensor([[1.6, 1.1, 0.8, 0.5]])  # [1, M], as position_weights gives
    table = slot_table(padded)
    token_w = torch.zeros(padded.noisy_labels.shape)
    valid = table.index >= 0
    token_w.scatter_(
        1,
        table.index.clamp(min=0).flatten(1),
        torch.where(valid, w.expand(*table.index.shape), 0.0).flatten(1),
    )
    token_w = torch.where(padded.noisy_labels != IGNORE, token_w, 0.0)
    with torch.no_grad():
        ref = weighted_loss(*idlm_forward(model, padded), padded, token_w, alpha=0.2)
        out = packed_loss(
            *packed_forward(model, packed), packed, alpha=0.2, token_weights=slot_weights(packed, w)
        )
    assert isinstance(ref["loss"], torch.Tensor)
    assert_close("weighted loss", ref["loss"], out.loss)


@pytest.mark.parametrize("device", DEVICES)
def test_packed_flex_matches_dense_logits_and_gradients(device: str) -> None:
    """Packed rows, flex vs dense (additive ``packed_dense_mask``): same logits, and the
    gradients of the packed loss equal those of the unpacked dense loss."""
    model = tiny_qwen3(device).train()
    packed, padded, _ = packed_and_unpacked(device)
    compile = device == "cuda"
    additive = torch.zeros(packed_dense_mask(packed).shape, device=device)
    additive = additive.masked_fill(~packed_dense_mask(packed), torch.finfo(torch.float32).min)
    with torch.no_grad():
        dense = model(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            attention_mask=additive[:, None],
            use_cache=False,
        ).logits
        flex = torch.cat(packed_forward(model, packed, compile=compile), 1)
    real = torch.cat([packed.docs, packed.docs], 1) >= 0  # padding rows are not compared
    assert_close("packed logits", dense[real], flex[real])

    ref = grads_of(model, lambda: idlm_loss(*idlm_forward(model, padded), padded, 0.2).loss)
    out = grads_of(
        model,
        lambda: packed_loss(*packed_forward(model, packed, compile=compile), packed, 0.2).loss,
    )
    assert ref.keys() == out.keys()
    for name in ref:
        assert_close(name, ref[name], out[name])


# --- (4) compiled flex: one graph per padded shape, padding invisible ----------------------------


def test_bucket_is_the_smallest_rung_and_wastes_under_a_third() -> None:
    rungs = sorted({1 << k for k in range(16)} | {3 << k for k in range(15)})
    for n in range(1, 5000):
        b = bucket(n)
        assert b == next(r for r in rungs if r >= n), n
        assert 3 * (b - n) < b, n  # the padding is under a third of the padded size
    assert [padded_length(L) for L in (1, 128, 129, 385, 1000)] == [128, 128, 256, 512, 1024]


PADDED_CASES = [
    pytest.param(40, 3, 1, id="L40-M3-o1"),
    pytest.param(129, 4, 0, id="L129-M4"),
    pytest.param(7, 1, 0, id="L7-M1"),
]


@pytest.mark.parametrize(("L", "M", "offset"), PADDED_CASES)
def test_padding_keys_are_invisible_to_real_queries(L: int, M: int, offset: int) -> None:
    """The rule table at the padded length, on the real queries: exactly the unpadded mask
    over the real keys, and no padding key (stream layout ``[x_t, pad | x_0, pad]``)."""
    Lp = padded_length(L)
    padded = block_diffusion_mask(Lp, M, offset)
    real = torch.cat([torch.arange(L), Lp + torch.arange(L)])
    pad = torch.cat([torch.arange(L, Lp), Lp + torch.arange(L, Lp)])
    unpadded = block_diffusion_mask(L, M, offset)
    torch.testing.assert_close(padded[real[:, None], real[None]], unpadded, rtol=0, atol=0)
    assert not bool(padded[real[:, None], pad[None]].any())
    assert bool(padded[pad, pad].all())  # a padding query sees itself: no empty row
    ids = torch.arange(2 * L)[None]
    p_ids, p_pos = pad_streams(ids, torch.cat([torch.arange(L), torch.arange(L)])[None], Lp)
    torch.testing.assert_close(p_ids[0, real], ids[0], rtol=0, atol=0)
    torch.testing.assert_close(p_pos[0, pad], torch.cat([torch.arange(L, Lp)] * 2), rtol=0, atol=0)


@pytest.mark.parametrize(("M", "offset"), [(3, 1), (4, 0)], ids=["M3-o1", "M4-o0"])
def test_padded_flex_equals_unpadded(M: int, offset: int) -> None:
    """The padded forward (what compiled flex runs), here through eager flex: logits and
    gradients of the real positions are the unpadded dense ones."""
    model = tiny_qwen3().train()
    batch = unpacked(M, offset, "cpu")
    assert padded_length(batch.L) > batch.L

    def dense() -> torch.Tensor:
        return idlm_loss(*idlm_forward(model, batch), batch).loss

    def padded() -> torch.Tensor:
        return idlm_loss(*flex_idlm_forward(model, batch, pad=True), batch).loss

    with torch.no_grad():
        ref, out = idlm_forward(model, batch), flex_idlm_forward(model, batch, pad=True)
    for name, r, o in zip(("noisy", "clean"), ref, out, strict=True):
        assert r.shape == o.shape
        assert_close(name, r, o)
    grads, padded_grads = grads_of(model, dense), grads_of(model, padded)
    assert grads.keys() == padded_grads.keys()
    for name in grads:
        assert_close(name, grads[name], padded_grads[name])


def test_padded_packed_rows_equal_unpadded() -> None:
    """Packed rows whose count is not a rung, padded with rows of padding: same logits."""
    model = tiny_qwen3().eval()
    packed, _, _ = packed_and_unpacked("cpu")
    rows = next(n for n in itertools.count(packed.docs.shape[0]) if bucket(n) > n)
    batch = pad_rows(packed, rows)  # rows that are not a rung (some of them padding)
    with torch.no_grad(), use_flex(model):
        ref = packed_logits(model, batch)
        out = packed_logits(model, batch, pad=True)
    for name, r, o in zip(("noisy", "clean"), ref, out, strict=True):
        assert r.shape == o.shape == (rows, packed.L, V)
        assert_close(name, r, o)


def batch_of_length(L: int, M: int, offset: int, device: str = "cpu") -> IDLMBatch:
    """Two rows of random tokens, the longer exactly ``L`` long."""
    g = torch.Generator().manual_seed(L)
    seqs = [[1, *torch.randint(4, V, (n - 1,), generator=g).tolist()] for n in (L, L // 2 + 1)]
    prompts = [max(1, L // 4), 1]
    return build_batch(seqs, prompts, M, MASK_ID, PAD_ID, offset=offset, device=device)


# (L, M, offset) of six batches over two rungs (128, 256) of the compiled length
VARYING = [(40, 3, 0), (100, 4, 2), (128, 3, 1), (200, 3, 2), (250, 4, 3), (129, 2, 1)]


def test_compiled_flex_traces_once_per_rung(monkeypatch: pytest.MonkeyPatch) -> None:
    """Six (L, M, offset) batches over two rungs through ``training_forward``'s flex-compiled
    path make dynamo trace flex twice (counted by a compile-counting backend; with ``L``, ``M``
    or the offset as Python constants it traces once per batch); packed batches trace once
    per rung of their row count."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(flex_attention, dynamic=False, backend=counter)
    monkeypatch.setattr(flex_module, "_compiled_flex", lambda: compiled)
    model = tiny_qwen3().eval()
    model.set_attn_implementation(COMPILED_FLEX)
    with torch.no_grad():
        for L, M, offset in VARYING:
            noisy, clean = training_forward(model, batch_of_length(L, M, offset), "flex-compiled")
            assert noisy.shape == clean.shape == (2, L, V)
        assert counter.frame_count == len({padded_length(L) for L, _, _ in VARYING}) == 2

        seqs, prompts = random_examples(20, 4, 20, seed=5)
        packed = [
            pack_batch(seqs[:n], prompts[:n], 3, MASK_ID, PAD_ID, budget=32, offset=n % 3)
            for n in (9, 12, 14, 16, 20)
        ]
        rows = [b.docs.shape[0] for b in packed]
        assert rows == [5, 7, 8, 9, 11]  # on the rungs 6, 8, 8, 12, 12
        for batch in packed:
            noisy, _ = training_forward(model, batch, "flex-compiled")
            assert noisy.shape == (batch.docs.shape[0], 32, V)
    assert counter.frame_count == 2 + 3
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_flex_compiles_once_per_rung(device: str) -> None:
    """The real compiled flex (inductor: the fused Triton kernels on CUDA, with backward; the
    C++ template on CPU, forward only): six (L, M, offset) batches over two rungs compile two
    graphs, and every batch's logits are the dense ones. ≈ 2 × 45 s of compilation on 2 CPU
    cores."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = tiny_qwen3(device).train(device == "cuda")
    batches = [batch_of_length(L, M, offset, device) for L, M, offset in VARYING]
    with torch.no_grad():
        refs = [idlm_forward(model, batch) for batch in batches]
    before = counters["stats"]["unique_graphs"]
    model.set_attn_implementation(COMPILED_FLEX)
    with torch.set_grad_enabled(device == "cuda"):
        for batch, ref in zip(batches, refs, strict=True):
            out = training_forward(model, batch, "flex-compiled")
            if device == "cuda":
                idlm_loss(*out, batch).loss.backward()
            for name, r, o in zip(("noisy", "clean"), ref, out, strict=True):
                assert_close(f"{name} L{batch.L}", r, o.detach())
    assert counters["stats"]["unique_graphs"] - before == 2
    torch._dynamo.reset()
