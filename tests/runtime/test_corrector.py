"""The corrector head: size at paper scale, persistence, selection laws, teacher forcing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from brisk.runtime.corrector import Corrector, CorrectorConfig, CorrectorInputs, CorrectorSelection
from brisk.runtime.kernels.corrector_step import confidence_features


class TableBackbone:
    """Just the frozen tables the head reads: input embeddings and LM-head rows."""

    mask_token_id = 0

    def __init__(self, vocab_size: int, hidden_size: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.E = torch.randn(vocab_size, hidden_size, generator=g)
        self.E_out = torch.randn(vocab_size, hidden_size, generator=g)

    def embed(self, ids: Tensor) -> Tensor:
        return self.E[ids]

    def lm_head_rows(self, ids: Tensor) -> Tensor:
        return self.E_out[ids]


def block_inputs(backbone: TableBackbone, B: int, M: int, seed: int = 1) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "anchor_hidden": torch.randn(B, backbone.hidden_size, generator=g),
        "anchor_ids": torch.randint(0, backbone.vocab_size, (B,), generator=g),
        "mask_hidden": torch.randn(B, M, backbone.hidden_size, generator=g),
        "base_logits": 3 * torch.randn(B, M, backbone.vocab_size, generator=g),
    }


def candidates(inputs: dict[str, Tensor], K: int, u: Tensor | None = None) -> CorrectorInputs:
    """The head's inputs on the Top-K of the inputs' base logits, as ISD builds them."""
    cand_logits, cand_ids = inputs["base_logits"].topk(K, dim=-1)
    hidden = (inputs["anchor_hidden"], inputs["anchor_ids"], inputs["mask_hidden"])
    return CorrectorInputs(*hidden, cand_logits, cand_ids, u=u)


def select(
    head: Corrector,
    backbone: TableBackbone,
    inputs: dict[str, Tensor],
    temperature: float = 0.0,
    u: Tensor | None = None,
) -> CorrectorSelection:
    """``head.select`` on the Top-K of the inputs' base logits, as ISD calls it."""
    block = candidates(inputs, head.config.K, u)
    return head.select(backbone, block, temperature)  # type: ignore[arg-type]


def randomized(config: CorrectorConfig, seed: int = 0) -> Corrector:
    torch.manual_seed(seed)
    head = Corrector(config)
    for p in head.parameters():
        nn.init.normal_(p, std=0.5)
    return head


def test_paper_sized_head_has_1_89M_parameters() -> None:
    head = Corrector(CorrectorConfig.paper(hidden_size=4096, vocab_size=151936, M=7))
    n = head.num_trainable_parameters()
    assert abs(n - 1.89e6) <= 0.01 * 1.89e6, n
    assert head.config.K == 16
    assert head.config.input_dim == 160


def test_save_load_round_trip_is_bit_exact(tmp_path: Path) -> None:
    backbone = TableBackbone(50, 24)
    config = CorrectorConfig.small(24, 50, M=3, K=6)
    head = randomized(config)
    head.save_pretrained(tmp_path / "head")
    loaded = Corrector.from_pretrained(tmp_path / "head", backbone=backbone)
    assert loaded.config == config
    for (name, a), (_, b) in zip(
        head.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    inputs = block_inputs(backbone, B=4, M=3)
    assert torch.equal(
        select(head, backbone, inputs).refined, select(loaded, backbone, inputs).refined
    )
    assert sorted(p.name for p in (tmp_path / "head").iterdir()) == [
        "config.json",
        "model.safetensors",
    ]


@pytest.mark.parametrize(
    ("hidden", "vocab"), [(32, 50), (24, 60)], ids=["other-hidden", "other-vocab"]
)
def test_loading_into_a_mismatched_backbone_fails_clearly(
    tmp_path: Path, hidden: int, vocab: int
) -> None:
    Corrector(CorrectorConfig.small(24, 50, M=3)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"^backbone: corrector at .* hidden 24 / vocab 50"):
        Corrector.from_pretrained(tmp_path, backbone=TableBackbone(vocab, hidden))
    with pytest.raises(ValueError, match=r"^path: .* not found"):
        Corrector.from_pretrained(tmp_path / "missing")


def test_untrained_head_keeps_the_base_ranking() -> None:
    backbone = TableBackbone(40, 16)
    head = Corrector(CorrectorConfig.small(16, 40, M=4, K=5))
    inputs = block_inputs(backbone, B=6, M=4)
    sel = select(head, backbone, inputs)
    torch.testing.assert_close(sel.tokens, inputs["base_logits"].argmax(-1), rtol=0, atol=0)
    torch.testing.assert_close(sel.refined, sel.cand_logits)
    torch.testing.assert_close(sel.probs, torch.softmax(sel.cand_logits, -1))


def test_teacher_forcing_on_own_choices_reproduces_selection() -> None:
    backbone = TableBackbone(40, 16)
    head = randomized(CorrectorConfig.small(16, 40, M=5, K=6))
    block = candidates(block_inputs(backbone, B=8, M=5), K=6)
    sel = head.select(backbone, block)  # type: ignore[arg-type]
    assert not torch.equal(sel.tokens, block.cand_ids[..., 0])  # the head intervenes
    forced = head(backbone, block, sel.tokens)
    torch.testing.assert_close(forced, sel.refined, rtol=1e-6, atol=1e-6)


def test_selection_feeds_back_the_chosen_token() -> None:
    # Changing the token chosen at position 1 must change the refined logits at position 2.
    backbone = TableBackbone(40, 16)
    head = randomized(CorrectorConfig.small(16, 40, M=2, K=6))
    block = candidates(block_inputs(backbone, B=1, M=2), K=6)
    sel = head.select(backbone, block)  # type: ignore[arg-type]
    other = sel.tokens.clone()
    other[0, 0] = sel.cand_ids[0, 0, (sel.ranks[0, 0] + 1) % 6]
    a = head(backbone, block, sel.tokens)
    b = head(backbone, block, other)
    torch.testing.assert_close(a[:, 0], b[:, 0])  # position 1 does not see its own choice
    assert not torch.allclose(a[:, 1], b[:, 1])


def test_sampling_follows_the_refined_softmax() -> None:
    # 40,000 draws of position 1 from one state: each rank's frequency within 5 sigma of π.
    backbone = TableBackbone(30, 16)
    head = randomized(CorrectorConfig.small(16, 30, M=1, K=5))
    inputs = block_inputs(backbone, B=1, M=1)
    n = 40_000
    batch = {k: v.expand(n, *v.shape[1:]) for k, v in inputs.items()}
    u = torch.rand(n, 1, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    sel = select(head, backbone, batch, temperature=0.7, u=u)
    pi = sel.probs[0, 0]
    torch.testing.assert_close(sel.probs[:, 0], pi.expand(n, -1))
    torch.testing.assert_close(pi, torch.softmax(sel.refined[0, 0] / 0.7, -1))
    freq = torch.bincount(sel.ranks[:, 0], minlength=5).double() / n
    sigma = (pi.double() * (1 - pi.double()) / n).sqrt()
    assert ((freq - pi.double()).abs() <= 5 * sigma + 1e-12).all(), (freq, pi)


def test_gradients_reach_every_parameter() -> None:
    backbone = TableBackbone(40, 16)
    head = randomized(CorrectorConfig.small(16, 40, M=3, K=6))
    block = candidates(block_inputs(backbone, B=4, M=3), K=6)
    sel = head.select(backbone, block)  # type: ignore[arg-type]
    refined = head(backbone, block, sel.tokens)
    torch.log_softmax(refined, -1)[..., 0].sum().backward()
    missing = [n for n, p in head.named_parameters() if p.grad is None or not p.grad.abs().sum()]
    assert not missing


def test_select_checks_candidates_and_uniforms() -> None:
    backbone = TableBackbone(40, 16)
    head = Corrector(CorrectorConfig.small(16, 40, M=3, K=5))
    inputs = block_inputs(backbone, B=2, M=3)
    with pytest.raises(ValueError, match=r"^u: uniforms"):
        select(head, backbone, inputs, temperature=1.0)
    four = candidates(inputs, K=4)  # the head wants 5
    with pytest.raises(ValueError, match=r"^cand_ids: expected \[B, 3, 5\]"):
        head.select(backbone, four)  # type: ignore[arg-type]


def test_confidence_features_by_hand() -> None:
    logits = torch.tensor([[5.0, 4.0, 2.0, 1.5, 0.0]])
    ids = torch.tensor([[7, 3, 9, 1, 4]])
    torch.testing.assert_close(
        confidence_features(logits, ids, torch.tensor([7])),
        torch.tensor([[1.0, 3.5, 1.0, 1.0, 0.0]]),
    )
    torch.testing.assert_close(  # previous token at rank 4: in the top 4, gap 3.5
        confidence_features(logits, ids, torch.tensor([1])),
        torch.tensor([[1.0, 3.5, 0.0, 1.0, 3.5]]),
    )
    torch.testing.assert_close(  # not a candidate: gap saturates at top-1 − top-K
        confidence_features(logits, ids, torch.tensor([2])),
        torch.tensor([[1.0, 3.5, 0.0, 0.0, 5.0]]),
    )
