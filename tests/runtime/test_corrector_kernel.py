"""The fused corrector kernel against its naive twin (Triton's interpreter on CPU here; compiled
on a GPU when ``TRITON_INTERPRET=0`` and CUDA is present), the dispatcher, and greedy ISD with
the kernel token for token.

Tolerance: refined logits (magnitudes up to ~100 with these random weights) agree to atol 1e-4 +
rtol 1e-5 — float32 ε ≈ 1.2e-7 times the largest term, times the ~64-term dot products summed in
another order — and probabilities to rtol 2e-4 (|Δp_k| ≤ 2 p_k max|Δℓ| for a softmax); ranks,
the integer output, must be identical. The kernel's outputs are allocated NaN / −1 poisoned, so
an element it fails to write cannot pass.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch
from torch import Tensor

from brisk.runtime.corrector import CorrectorConfig, CorrectorInputs
from brisk.runtime.kernels.corrector_step import (
    SelectOutput,
    StepInputs,
    StepWeights,
    corrector_select,
    select,
)
from tests.runtime.test_corrector import TableBackbone, candidates, randomized

pytest.importorskip("triton")  # a dependency of brisk on Linux: present in make test

if os.environ.get("TRITON_INTERPRET", "0") != "1" and not torch.cuda.is_available():
    pytest.skip("needs TRITON_INTERPRET=1 or a GPU", allow_module_level=True)

# the interpreter evaluates σ(x) = 1 / (1 + e^−x) in numpy: e^−x overflows to inf for x ≪ 0,
# which gives the right 0, with a warning
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET", "0") != "1" else "cpu"
ATOL, RTOL, P_RTOL = 1e-4, 1e-5, 2e-4


def each(inputs: StepInputs, fn: Callable[[Tensor], Tensor]) -> StepInputs:
    """``inputs`` with ``fn`` applied to every tensor (the uniforms and a forced trajectory too)."""

    def apply(value: object) -> object:
        if isinstance(value, tuple):
            return tuple(fn(t) for t in value)
        return fn(value) if isinstance(value, Tensor) else value

    return StepInputs(**{f.name: apply(getattr(inputs, f.name)) for f in fields(inputs)})


def floating(fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """``fn`` on floating-point tensors, the identity on token ids."""
    return lambda t: fn(t) if t.is_floating_point() else t


def kernel_inputs(
    B: int,
    M: int,
    K: int,
    seed: int = 0,
    widths: tuple[int, ...] = (128, 64, 64, 16, 16, 64),
    V: int = 500,
    dtype: torch.dtype = torch.float32,
) -> tuple[StepInputs, StepWeights]:
    """Random inputs of corrector_select (everything after the parallel projections) and
    weights large enough that the residual reorders candidates."""
    S, Dh, De, Dp, Df, R = widths
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int, scale: float = 1.0) -> Tensor:
        return scale * torch.randn(*shape, generator=g)

    cand_logits = (3 * torch.randn(B, M, K, generator=g)).sort(-1, descending=True).values
    cand_ids = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(B * M)]).reshape(
        B, M, K
    )
    anchor_ids = torch.randint(0, V, (B,), generator=g)
    inputs = StepInputs(
        s0=torch.tanh(r(B, S)),
        mask_x=r(B, M, Dh),
        anchor_e=r(B, De),
        cand_e=r(B, M, K, De),
        cand_c=r(B, M, K, R),
        cand_logits=cand_logits,
        cand_ids=cand_ids,
        anchor_ids=anchor_ids,
    )
    D_in = Dh + De + Dp + Df
    weights = StepWeights(
        pos_emb=r(M, Dp),
        feat_w=r(Df, 5, scale=0.5),
        feat_b=r(Df, scale=0.1),
        w_z=r(S, D_in, scale=0.2),
        w_h=r(S, D_in, scale=0.2),
        w_s=r(R, S, scale=0.2),
        gate_w=r(S + 5, scale=0.3),
        gate_b=r(()),
        alpha=torch.tensor(2.0),
    )
    inputs = each(inputs, floating(lambda t: t.to(dtype)))
    return each(inputs, lambda t: t.to(DEVICE)), StepWeights(
        **{k: v.to(DEVICE) for k, v in weights.__dict__.items()}
    )


def both(
    inputs: StepInputs, weights: StepWeights, T: float, seed: int = 0, feedback: bool = True
) -> tuple[SelectOutput, SelectOutput]:
    """The naive loop (in float32) and the fused kernel on the same inputs, uniforms from
    ``seed`` when T > 0."""
    B, M = inputs.cand_logits.shape[:2]
    u = torch.rand(B, M, generator=torch.Generator().manual_seed(seed)).to(DEVICE) if T else None
    inputs = replace(inputs, u=u)
    naive = corrector_select(each(inputs, floating(Tensor.float)), weights, T, feedback)
    fused = select(inputs, weights, T, feedback, impl="triton")
    return naive, fused


def assert_same(naive, fused) -> None:  # type: ignore[no-untyped-def]
    assert not torch.isnan(fused.refined).any()
    assert not torch.isnan(fused.probs).any()
    assert (fused.ranks >= 0).all()
    assert torch.equal(fused.ranks.cpu(), naive.ranks.cpu())
    torch.testing.assert_close(
        fused.refined.cpu(), naive.refined.float().cpu(), atol=ATOL, rtol=RTOL
    )
    torch.testing.assert_close(fused.probs.cpu(), naive.probs.float().cpu(), atol=1e-7, rtol=P_RTOL)


@pytest.mark.parametrize("B", [1, 3, 16])  # one program per row: 16 rows run what 32 do
@pytest.mark.parametrize("M", [1, 3, 7])
@pytest.mark.parametrize("K", [4, 16, 32])
@pytest.mark.parametrize("T", [0.0, 0.8], ids=["greedy", "T0.8"])
def test_fused_equals_naive(B: int, M: int, K: int, T: float) -> None:
    inputs, weights = kernel_inputs(B, M, K, seed=B * 100 + M * 10 + K)
    naive, fused = both(inputs, weights, T, seed=K)
    assert_same(naive, fused)
    if M > 1:  # the recurrence really fed choices forward: ranks other than 0 occur
        assert (naive.ranks != 0).any() or B * M < 8


@pytest.mark.parametrize("K", [1, 2, 3])
def test_fewer_than_four_candidates(K: int) -> None:
    """top2 / top4 and 'previous token in the top 4' clamp to the K candidates there are."""
    inputs, weights = kernel_inputs(5, 4, K, seed=20 + K)
    assert_same(*both(inputs, weights, 0.0))
    assert_same(*both(inputs, weights, 0.9, seed=K))


def test_int32_token_ids() -> None:
    inputs, weights = kernel_inputs(4, 3, 8, seed=30)
    as_int32 = replace(inputs, cand_ids=inputs.cand_ids.int(), anchor_ids=inputs.anchor_ids.int())
    naive = corrector_select(inputs, weights, 0.0)
    fused = select(as_int32, weights, 0.0, impl="triton")
    assert_same(naive, fused)


@pytest.mark.parametrize("T", [0.0, 1.0], ids=["greedy", "T1"])
def test_bfloat16_inputs(T: float) -> None:
    inputs, weights = kernel_inputs(8, 7, 16, seed=3, dtype=torch.bfloat16)
    assert inputs.s0.dtype == torch.bfloat16
    assert_same(*both(inputs, weights, T, seed=4))


@pytest.mark.parametrize(
    "widths", [(32, 16, 16, 8, 8, 16), (100, 40, 24, 12, 10, 48)], ids=["small-head", "odd-widths"]
)
def test_other_head_widths(widths: tuple[int, ...]) -> None:
    inputs, weights = kernel_inputs(5, 7, 16, seed=5, widths=widths)
    assert_same(*both(inputs, weights, 0.0))
    assert_same(*both(inputs, weights, 0.9, seed=1))


def test_ties_take_the_first_candidate() -> None:
    """Equal base logits and equal residual rows give equal refined logits; both pick the first."""
    inputs, weights = kernel_inputs(6, 4, 8, seed=6)
    logits = inputs.cand_logits.clone()
    logits[..., 1] = logits[..., 0]
    logits[..., 3] = logits[..., 2] = logits[..., 0] - 0.5
    cand_c = inputs.cand_c.clone()
    cand_c[..., 1, :] = cand_c[..., 0, :]
    cand_c[..., 3, :] = cand_c[..., 2, :]
    tied = replace(inputs, cand_logits=logits, cand_c=cand_c)
    naive, fused = both(tied, weights, 0.0)
    assert_same(naive, fused)
    assert torch.equal(fused.refined[..., 0], fused.refined[..., 1])
    assert not (fused.ranks == 1).any()  # the second of a tied pair is never the argmax


def test_previous_token_outside_the_candidates() -> None:
    """x_0 and forced tokens drawn from ids no candidate list holds: φ's previous-token
    features take their 'absent' values in both."""
    inputs, weights = kernel_inputs(4, 5, 8, seed=7, V=40)
    outside = torch.full((4,), 1000, device=DEVICE)  # no candidate id is ≥ 40
    tied = replace(inputs, anchor_ids=outside)
    assert_same(*both(tied, weights, 0.0))
    forced_ids = torch.full((4, 5), 2000, device=DEVICE)
    forced_e = torch.randn(4, 5, inputs.anchor_e.shape[-1]).to(DEVICE)
    forced = replace(tied, forced_prev=(forced_ids, forced_e))
    for T in (0.0, 0.7):
        assert_same(*both(forced, weights, T))


def test_teacher_forcing_and_the_no_feedback_ablation() -> None:
    inputs, weights = kernel_inputs(7, 7, 16, seed=8)
    forced_ids = inputs.cand_ids[:, :, 2].contiguous()  # the third candidate everywhere
    forced_e = inputs.cand_e[:, :, 2].contiguous()
    assert_same(*both(replace(inputs, forced_prev=(forced_ids, forced_e)), weights, 0.0))
    assert_same(*both(inputs, weights, 0.5, seed=2, feedback=False))
    with_fb, _ = both(inputs, weights, 0.0)
    no_fb, _ = both(inputs, weights, 0.0, feedback=False)
    assert not torch.equal(with_fb.refined, no_fb.refined)


@pytest.mark.parametrize("H", [64, 4096])
def test_through_the_head_at_hidden_sizes_up_to_4096(H: int) -> None:
    """Corrector.select with impl 'triton' vs 'naive' (folded tables feed both)."""
    backbone = TableBackbone(300, H, seed=H)
    backbone.E, backbone.E_out = backbone.E.to(DEVICE), backbone.E_out.to(DEVICE)
    head = randomized(CorrectorConfig.paper(hidden_size=H, vocab_size=300, M=7), seed=1)
    head = head.to(DEVICE)
    g = torch.Generator().manual_seed(H)
    B = 3
    logits, ids = (3 * torch.randn(B, 7, 300, generator=g)).topk(16, dim=-1)
    block = CorrectorInputs(
        anchor_hidden=torch.randn(B, H, generator=g).to(DEVICE),
        anchor_ids=torch.randint(0, 300, (B,), generator=g).to(DEVICE),
        mask_hidden=torch.randn(B, 7, H, generator=g).to(DEVICE),
        cand_logits=logits.to(DEVICE),
        cand_ids=ids.to(DEVICE),
    )
    u = torch.rand(B, 7, generator=g).to(DEVICE)
    for T in (0.0, 1.0):
        x = replace(block, u=u if T else None)
        a = head.select(backbone, x, T, impl="naive")  # type: ignore[arg-type]
        b = head.select(backbone, x, T, impl="triton")  # type: ignore[arg-type]
        assert torch.equal(a.tokens, b.tokens)
        # a randomized head at H = 4096 gives refined logits of magnitude ~600
        torch.testing.assert_close(b.refined, a.refined, atol=1e-4, rtol=1e-3)


# -- the dispatcher ---------------------------------------------------------------------------


def test_auto_on_cpu_is_the_naive_loop_and_unsupported_inputs_fall_back_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inputs, weights = kernel_inputs(2, 3, 4, seed=9)  # on the GPU when one runs the kernels
    naive = corrector_select(inputs, weights, 0.0)
    cpu = each(inputs, Tensor.cpu)
    cpu_weights = StepWeights(**{k: v.cpu() for k, v in weights.__dict__.items()})
    auto = select(cpu, cpu_weights, 0.0, impl="auto")
    assert auto.refined.device.type == "cpu"
    assert torch.equal(auto.refined, corrector_select(cpu, cpu_weights, 0.0).refined)
    doubles = each(inputs, floating(Tensor.double))
    weights = StepWeights(**{k: v.double() for k, v in weights.__dict__.items()})
    import brisk.runtime.kernels.corrector_step as dispatch

    monkeypatch.setattr(dispatch, "_warned", set())
    with pytest.warns(RuntimeWarning, match=r"s0 has dtype torch\.float64"):
        out = select(doubles, weights, 0.0, impl="triton")
    torch.testing.assert_close(out.refined.float(), naive.refined, atol=ATOL, rtol=RTOL)
    assert out.refined.dtype == torch.float64  # the naive loop ran
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        select(doubles, weights, 0.0, impl="triton")


def test_gradients_go_through_the_naive_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    import brisk.runtime.kernels.corrector_step as dispatch

    monkeypatch.setattr(dispatch, "_warned", set())
    inputs, weights = kernel_inputs(2, 3, 4, seed=10)
    mask_x = inputs.mask_x.clone().requires_grad_(True)
    with pytest.warns(RuntimeWarning, match="gradients are required"):
        out = select(replace(inputs, mask_x=mask_x), weights, 0.0, impl="triton")
    out.refined.sum().backward()
    assert mask_x.grad is not None


def test_triton_without_cuda_or_interpreter_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inputs, weights = kernel_inputs(1, 2, 4, seed=11)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    cpu = each(inputs, Tensor.cpu)
    cpu_w = StepWeights(**{k: v.cpu() for k, v in weights.__dict__.items()})
    with pytest.raises(ValueError, match="impl: 'triton' cannot run: tensors are on cpu"):
        select(cpu, cpu_w, 0.0, impl="triton")
    with pytest.raises(ValueError, match="impl: expected one of auto, naive, triton"):
        select(cpu, cpu_w, 0.0, impl="cuda")


# -- ISD with the kernel ----------------------------------------------------------------------


@pytest.mark.parametrize("T", [0.0, 1.0], ids=["greedy", "T1"])
def test_isd_with_the_kernel_equals_isd_with_the_naive_head(micro_base: Path, T: float) -> None:
    """The tiny world's micro base, a randomized head: every token of every request equal."""
    from transformers import AutoTokenizer

    from brisk.runtime.backbone import HFBackbone
    from brisk.runtime.isd import decode
    from brisk.runtime.prompts import encode_prompts, isd_options
    from brisk.runtime.train.base.config import BaseTrainConfig
    from brisk.worlds.arithmetic.task import make_split

    backbone = HFBackbone.from_pretrained(micro_base, device=DEVICE)
    tokenizer = AutoTokenizer.from_pretrained(micro_base)
    task = BaseTrainConfig.load(micro_base / "train_config.json").task
    prompts = encode_prompts(tokenizer, [p.prompt for p in make_split(task, "test", 8, 1)])
    head = randomized(
        CorrectorConfig.small(backbone.hidden_size, backbone.vocab_size, M=3, K=8), seed=2
    ).to(DEVICE)
    options = isd_options(tokenizer, stride=4, temperature=T, max_new_tokens=24)
    outs = {}
    for impl in ("naive", "triton"):
        head.impl = impl
        outs[impl] = decode(backbone, prompts, options, corrector=head, batch_size=8)
    assert outs["triton"].tokens == outs["naive"].tokens
    assert [r.accept_lengths for r in outs["triton"].requests] == [
        r.accept_lengths for r in outs["naive"].requests
    ]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("T", [0.0, 0.8], ids=["greedy", "T0.8"])
def test_cuda_graph_replay_equals_the_naive_head(T: float) -> None:
    """Replay from a captured bucket (B padded up to it) gives the naive head's selection: ranks
    and tokens identical, refined logits within the kernel's tolerance; a second replay with
    new inputs in the same buffers gives the new answer (the graph reads its inputs)."""
    from brisk.runtime.kernels.corrector_step.graph import CorrectorGraphs
    from tests.runtime.test_corrector import block_inputs

    head = randomized(CorrectorConfig.small(64, 300, M=3, K=8), seed=4).cuda()
    backbone = TableBackbone(300, 64)
    backbone.E, backbone.E_out = backbone.E.cuda(), backbone.E_out.cuda()
    graphs = CorrectorGraphs(head, backbone, buckets=(1, 4, 8))
    for B, seed in [(1, 1), (3, 2), (3, 3), (8, 4), (11, 5)]:  # 11: beyond the buckets, eager
        x = {k: v.cuda() for k, v in block_inputs(backbone, B, 3, seed=seed).items()}
        g = torch.Generator().manual_seed(seed)
        u = torch.rand(B, 3, generator=g).cuda() if T > 0 else None
        block = candidates(x, 8, u)
        want = head.select(backbone, block, T, impl="naive")  # type: ignore[arg-type]
        got = graphs.select(backbone, block, T)  # type: ignore[arg-type]
        assert torch.equal(got.ranks, want.ranks), (B, seed)
        assert torch.equal(got.tokens, want.tokens), (B, seed)
        torch.testing.assert_close(got.refined, want.refined, atol=ATOL, rtol=RTOL)


def test_cuda_graphs_need_cuda() -> None:
    from brisk.runtime.kernels.corrector_step.graph import CorrectorGraphs

    head = randomized(CorrectorConfig.small(16, 40, M=3, K=4))
    if torch.cuda.is_available():
        pytest.skip("the CPU error path; the GPU path runs in the benchmark")
    with pytest.raises(
        ValueError, match="device: CUDA graphs need a CUDA device, the head is on cpu"
    ):
        CorrectorGraphs(head, TableBackbone(40, 16))
