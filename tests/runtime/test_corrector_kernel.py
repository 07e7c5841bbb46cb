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
from pathlib import Path

import pytest
import torch
from torch import Tensor

from brisk.runtime.corrector import CorrectorConfig
from brisk.runtime.kernels.corrector_step import StepWeights, corrector_select, select
from tests.runtime.test_corrector import TableBackbone, randomized

pytest.importorskip("triton")  # a dependency of brisk on Linux: present in make test

if os.environ.get("TRITON_INTERPRET", "0") != "1" and not torch.cuda.is_available():
    pytest.skip("needs TRITON_INTERPRET=1 or a GPU", allow_module_level=True)

# the interpreter evaluates σ(x) = 1 / (1 + e^−x) in numpy: e^−x overflows to inf for x ≪ 0,
# which gives the right 0, with a warning
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET", "0") != "1" else "cpu"
ATOL, RTOL, P_RTOL = 1e-4, 1e-5, 2e-4


def kernel_inputs(
    B: int,
    M: int,
    K: int,
    seed: int = 0,
    widths: tuple[int, ...] = (128, 64, 64, 16, 16, 64),
    V: int = 500,
    dtype: torch.dtype = torch.float32,
) -> tuple[tuple[Tensor, ...], StepWeights]:
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
    inputs = (
        torch.tanh(r(B, S)),
        r(B, M, Dh),
        r(B, De),
        r(B, M, K, De),
        r(B, M, K, R),
        cand_logits,
        cand_ids,
        anchor_ids,
    )
    inputs = tuple(
        t.to(dtype) if t.is_floating_point() and i < 6 else t for i, t in enumerate(inputs)
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
    return tuple(t.to(DEVICE) for t in inputs), StepWeights(
        **{k: v.to(DEVICE) for k, v in weights.__dict__.items()}
    )


def both(inputs: tuple[Tensor, ...], weights: StepWeights, T: float, seed: int = 0, **kw: object):  # type: ignore[no-untyped-def]
    B, M = inputs[5].shape[:2]
    u = torch.rand(B, M, generator=torch.Generator().manual_seed(seed)).to(DEVICE) if T else None
    as_float = tuple(t.float() if t.is_floating_point() else t for t in inputs)
    naive = corrector_select(*as_float, weights, T, u, **kw)  # type: ignore[arg-type]
    fused = select(*inputs, weights, T, u, impl="triton", **kw)  # type: ignore[arg-type]
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
    as_int32 = tuple(t.int() if i in (6, 7) else t for i, t in enumerate(inputs))
    naive = corrector_select(*inputs, weights, 0.0, None)
    fused = select(*as_int32, weights, 0.0, None, impl="triton")
    assert_same(naive, fused)


@pytest.mark.parametrize("T", [0.0, 1.0], ids=["greedy", "T1"])
def test_bfloat16_inputs(T: float) -> None:
    inputs, weights = kernel_inputs(8, 7, 16, seed=3, dtype=torch.bfloat16)
    assert inputs[0].dtype == torch.bfloat16
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
    s0, mask_x, anchor_e, cand_e, cand_c, logits, ids, anchor = inputs
    logits = logits.clone()
    logits[..., 1] = logits[..., 0]
    logits[..., 3] = logits[..., 2] = logits[..., 0] - 0.5
    cand_c = cand_c.clone()
    cand_c[..., 1, :] = cand_c[..., 0, :]
    cand_c[..., 3, :] = cand_c[..., 2, :]
    tied = (s0, mask_x, anchor_e, cand_e, cand_c, logits, ids, anchor)
    naive, fused = both(tied, weights, 0.0)
    assert_same(naive, fused)
    assert torch.equal(fused.refined[..., 0], fused.refined[..., 1])
    assert not (fused.ranks == 1).any()  # the second of a tied pair is never the argmax


def test_previous_token_outside_the_candidates() -> None:
    """x_0 and forced tokens drawn from ids no candidate list holds: φ's previous-token
    features take their 'absent' values in both."""
    inputs, weights = kernel_inputs(4, 5, 8, seed=7, V=40)
    s0, mask_x, anchor_e, cand_e, cand_c, logits, ids, _ = inputs
    outside = torch.full((4,), 1000, device=DEVICE)  # no candidate id is ≥ 40
    tied = (s0, mask_x, anchor_e, cand_e, cand_c, logits, ids, outside)
    assert_same(*both(tied, weights, 0.0))
    forced_ids = torch.full((4, 5), 2000, device=DEVICE)
    forced_e = torch.randn(4, 5, anchor_e.shape[-1]).to(DEVICE)
    for T in (0.0, 0.7):
        assert_same(*both(tied, weights, T, forced_prev=(forced_ids, forced_e)))


def test_teacher_forcing_and_the_no_feedback_ablation() -> None:
    inputs, weights = kernel_inputs(7, 7, 16, seed=8)
    forced_ids = inputs[6][:, :, 2].contiguous()  # the third candidate everywhere
    forced_e = inputs[3][:, :, 2].contiguous()
    assert_same(*both(inputs, weights, 0.0, forced_prev=(forced_ids, forced_e)))
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
    cpu_args = (
        torch.randn(B, H, generator=g),
        torch.randint(0, 300, (B,), generator=g),
        torch.randn(B, 7, H, generator=g),
        logits,
        ids,
    )
    args = tuple(t.to(DEVICE) for t in cpu_args)
    u = torch.rand(B, 7, generator=g).to(DEVICE)
    for T in (0.0, 1.0):
        a = head.select(backbone, *args, T, u=u if T else None, impl="naive")  # type: ignore[arg-type]
        b = head.select(backbone, *args, T, u=u if T else None, impl="triton")  # type: ignore[arg-type]
        assert torch.equal(a.tokens, b.tokens)
        # a randomized head at H = 4096 gives refined logits of magnitude ~600
        torch.testing.assert_close(b.refined, a.refined, atol=1e-4, rtol=1e-3)


# -- the dispatcher ---------------------------------------------------------------------------


def test_auto_on_cpu_is_the_naive_loop_and_unsupported_inputs_fall_back_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inputs, weights = kernel_inputs(2, 3, 4, seed=9)  # on the GPU when one runs the kernels
    naive = corrector_select(*inputs, weights, 0.0, None)
    cpu = tuple(t.cpu() for t in inputs)
    cpu_weights = StepWeights(**{k: v.cpu() for k, v in weights.__dict__.items()})
    auto = select(*cpu, cpu_weights, 0.0, None, impl="auto")
    assert auto.refined.device.type == "cpu"
    assert torch.equal(auto.refined, corrector_select(*cpu, cpu_weights, 0.0, None).refined)
    doubles = tuple(t.double() if t.is_floating_point() else t for t in inputs)
    weights = StepWeights(**{k: v.double() for k, v in weights.__dict__.items()})
    import brisk.runtime.kernels.corrector_step as dispatch

    monkeypatch.setattr(dispatch, "_warned", set())
    with pytest.warns(RuntimeWarning, match=r"s0 has dtype torch\.float64"):
        out = select(*doubles, weights, 0.0, None, impl="triton")
    torch.testing.assert_close(out.refined.float(), naive.refined, atol=ATOL, rtol=RTOL)
    assert out.refined.dtype == torch.float64  # the naive loop ran
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        select(*doubles, weights, 0.0, None, impl="triton")


def test_gradients_go_through_the_naive_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    import brisk.runtime.kernels.corrector_step as dispatch

    monkeypatch.setattr(dispatch, "_warned", set())
    inputs, weights = kernel_inputs(2, 3, 4, seed=10)
    mask_x = inputs[1].clone().requires_grad_(True)
    args = (inputs[0], mask_x, *inputs[2:])
    with pytest.warns(RuntimeWarning, match="gradients are required"):
        out = select(*args, weights, 0.0, None, impl="triton")
    out.refined.sum().backward()
    assert mask_x.grad is not None


def test_triton_without_cuda_or_interpreter_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inputs, weights = kernel_inputs(1, 2, 4, seed=11)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    cpu = tuple(t.cpu() for t in inputs)
    cpu_w = StepWeights(**{k: v.cpu() for k, v in weights.__dict__.items()})
    with pytest.raises(ValueError, match="impl: 'triton' cannot run: tensors are on cpu"):
        select(*cpu, cpu_w, 0.0, None, impl="triton")
    with pytest.raises(ValueError, match="impl: expected one of auto, naive, triton"):
        select(*cpu, cpu_w, 0.0, None, impl="cuda")


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
        cand_logits, cand_ids = x["base_logits"].topk(8, dim=-1)
        g = torch.Generator().manual_seed(seed)
        u = torch.rand(B, 3, generator=g).cuda() if T > 0 else None
        args = (
            backbone,
            x["anchor_hidden"],
            x["anchor_ids"],
            x["mask_hidden"],
            cand_logits,
            cand_ids,
            T,
            u,
        )
        want = head.select(*args, impl="naive")
        got = graphs.select(*args)
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
