"""The chunked stream losses against the full-vocabulary computation they replace: the same
per-position CE (float64: to 1e-12), the same gradients of the hidden states and the LM head,
the same acceptance probabilities β; and chunks of any size."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from brisk.runtime.train.idlm import IGNORE, build_batch
from brisk.runtime.train.vocab import acceptance_probability, stream_losses


def toy(seed: int, V: int = 37, H: int = 8, dtype: torch.dtype = torch.float64):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(5, V, (n,), generator=g).tolist() for n in (9, 14, 6)]
    batch = build_batch(seqs, [3, 5, 2], 3, mask_token_id=4, pad_token_id=0, offset=1)
    B, L = batch.noisy_labels.shape
    h_n = torch.randn(B, L, H, generator=g, dtype=dtype, requires_grad=True)
    h_c = torch.randn(B, L, H, generator=g, dtype=dtype, requires_grad=True)
    w = (3 * torch.randn(V, H, generator=g, dtype=dtype)).requires_grad_()
    return batch, h_n, h_c, w


def naive(batch, h_n, h_c, w, T: float, K: int):  # type: ignore[no-untyped-def]
    """The full [B, L, V] logits, float64 β as the acceptance module wrote it before."""
    z_q, z_p = h_n @ w.T, h_c @ w.T
    ce_n = F.cross_entropy(
        z_q.transpose(1, 2), batch.noisy_labels, ignore_index=IGNORE, reduction="none"
    )
    ce_c = F.cross_entropy(
        z_p.transpose(1, 2), batch.clean_labels, ignore_index=IGNORE, reduction="none"
    )
    q = z_q.detach().double()
    kth = q.topk(K, dim=-1).values[..., -1:]
    q = torch.softmax(q.masked_fill(q < kth, -torch.inf) / T, -1)
    p = torch.softmax(z_p.detach().double() / T, -1)
    beta = torch.minimum(p, q).sum(-1) * (batch.noisy_labels != IGNORE)
    return ce_n, ce_c, beta


@pytest.mark.parametrize("chunk", [1, 5, 10_000], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("T", [1.0, 0.7])
def test_chunked_losses_and_gradients_equal_the_full_vocabulary(chunk: int, T: float) -> None:
    batch, h_n, h_c, w = toy(0)
    ref = naive(batch, h_n, h_c, w, T, K=4)
    got = stream_losses(h_n, h_c, w, batch, temperature=T, top_k=4, chunk_elements=chunk * 37)
    torch.testing.assert_close(got.noisy.double(), ref[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(got.clean.double(), ref[1], rtol=0, atol=1e-12)
    torch.testing.assert_close(got.beta.double(), ref[2], rtol=0, atol=1e-12)
    weights = torch.rand(batch.noisy_labels.shape, dtype=torch.float64)
    loss_ref = (weights * ref[0]).sum() + 0.3 * ref[1].sum()
    grads_ref = torch.autograd.grad(loss_ref, (h_n, h_c, w))
    loss = (weights * got.noisy).sum() + 0.3 * got.clean.sum()
    grads = torch.autograd.grad(loss, (h_n, h_c, w))
    for a, b in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_greedy_beta_is_argmax_agreement() -> None:
    g = torch.Generator().manual_seed(1)
    q, p = torch.randn(50, 11, generator=g), torch.randn(50, 11, generator=g)
    p[:25] = q[:25] + 0.01 * torch.randn(25, 11, generator=g)  # half agree
    beta = acceptance_probability(q, p, 0.0, 16)
    assert torch.equal(beta, (q.argmax(-1) == p.argmax(-1)).float())
    assert 0 < beta.mean() < 1


def test_no_vocabulary_sized_tensor_beyond_one_chunk() -> None:
    """The head's peak memory is one chunk of logits: with a V = 5,000 head and 4-position
    chunks, no logits block the forward computes has more than 4 · V elements."""
    batch, h_n, h_c, _ = toy(2, dtype=torch.float32)
    w = torch.randn(5000, 8, requires_grad=True)
    biggest = 0

    def watch(t: torch.Tensor) -> torch.Tensor:
        nonlocal biggest
        biggest = max(biggest, t.numel())
        return t

    from brisk.runtime.train import vocab

    real = vocab._logits
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vocab, "_logits", lambda h, weight: watch(real(h, weight)))
        out = stream_losses(h_n, h_c, w, batch, chunk_elements=4 * 5000)
    out.noisy.sum().backward()
    n = int((batch.clean_labels != IGNORE).sum())
    assert n > 4
    assert biggest == 4 * 5000
