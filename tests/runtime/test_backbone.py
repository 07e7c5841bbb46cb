"""HFBackbone: cached block forwards, trimming, embeddings, loading and the MASK id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from brisk.runtime.backbone import Backbone, HFBackbone
from brisk.worlds.arithmetic.model import TinyModelConfig, build_model
from brisk.worlds.arithmetic.tokenizer import char_tokenizer

TOK = char_tokenizer()


@pytest.fixture
def backbone() -> HFBackbone:
    torch.manual_seed(0)
    return HFBackbone(build_model(TinyModelConfig.micro(), TOK), TOK.mask_token_id)


def test_satisfies_the_protocol(backbone: HFBackbone) -> None:
    assert isinstance(backbone, Backbone)
    assert backbone.mask_token_id == TOK.mask_token_id
    assert backbone.vocab_size == len(TOK)
    assert backbone.hidden_size == 64


def test_block_forwards_on_a_cache_match_one_full_forward(backbone: HFBackbone) -> None:
    ids = torch.randint(5, 100, (2, 12))
    full = backbone.model(input_ids=ids).logits
    cache = backbone.new_cache()
    parts = [backbone.forward(ids[:, a:b], cache).logits for a, b in ((0, 5), (5, 6), (6, 12))]
    assert backbone.cache_length(cache) == 12
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("keep", [pytest.param(k, id=f"keep{k}") for k in (0, 7, 10, 13)])
def test_trimming_leaves_logits_identical_to_a_fresh_forward(
    backbone: HFBackbone, keep: int, dtype: torch.dtype
) -> None:
    """Speculate 6 slots past a 7-token prefix, trim to ``keep``, continue: the continuation's
    logits and hidden states equal those of a fresh cache fed only the kept tokens.

    At chunk boundaries (keep = 0, 7, 13) both caches hold keys/values computed by identical
    kernel calls, so equality is exact. At keep = 10 the fresh run computes slots 7..9 in a
    chunk of 3 instead of 6; matmul blocking then changes float rounding (≈1e-7 in float32),
    which is why that case uses per-dtype tolerances.
    """
    backbone.model.to(dtype)
    prefix, spec, nxt = (torch.randint(5, 100, (3, n)) for n in (7, 6, 4))
    seq = torch.cat([prefix, spec], 1)

    trimmed = backbone.new_cache()
    backbone.forward(prefix, trimmed)
    backbone.forward(spec, trimmed)
    backbone.trim(trimmed, keep)
    assert backbone.cache_length(trimmed) == keep
    after_trim = backbone.forward(nxt, trimmed)

    fresh = backbone.new_cache()
    if 0 < keep <= 7:
        backbone.forward(seq[:, :keep], fresh)
    elif keep > 7:
        backbone.forward(prefix, fresh)
        backbone.forward(seq[:, 7:keep], fresh)
    reference = backbone.forward(nxt, fresh)
    tol = 0.0 if keep in (0, 7, 13) else {torch.float32: 1e-5, torch.float64: 1e-12}[dtype]
    torch.testing.assert_close(after_trim.logits, reference.logits, rtol=tol, atol=tol)
    torch.testing.assert_close(after_trim.hidden, reference.hidden, rtol=tol, atol=tol)


def test_trim_rejects_lengths_outside_the_cache(backbone: HFBackbone) -> None:
    cache = backbone.new_cache()
    backbone.forward(torch.randint(5, 100, (1, 4)), cache)
    with pytest.raises(ValueError, match="keep"):
        backbone.trim(cache, 5)


def test_embeddings_and_lm_head_rows_give_the_logits(backbone: HFBackbone) -> None:
    ids = torch.randint(5, 100, (2, 5))
    out = backbone.forward(ids, backbone.new_cache())
    rows = backbone.lm_head_rows(torch.arange(backbone.vocab_size))  # [V, H]
    torch.testing.assert_close(out.hidden @ rows.T, out.logits, rtol=1e-5, atol=1e-5)
    assert backbone.embed(ids).shape == (2, 5, 64)
    assert backbone.lm_head_rows(ids).shape == (2, 5, 64)


def test_from_pretrained_reads_the_mask_id_from_the_config(tmp_path: Path) -> None:
    model = build_model(TinyModelConfig.micro(), TOK)
    model.save_pretrained(tmp_path)
    loaded = HFBackbone.from_pretrained(tmp_path)
    assert loaded.mask_token_id == TOK.mask_token_id
    ids = torch.randint(5, 100, (1, 6))
    torch.testing.assert_close(
        loaded.forward(ids, loaded.new_cache()).logits, model.eval()(input_ids=ids).logits
    )
    assert HFBackbone.from_pretrained(tmp_path, mask_token_id=7).mask_token_id == 7


def _drop_config_mask_id(path: Path) -> None:
    config = json.loads((path / "config.json").read_text())
    config.pop("mask_token_id")
    (path / "config.json").write_text(json.dumps(config))


def test_from_pretrained_falls_back_to_the_tokenizer(tmp_path: Path) -> None:
    build_model(TinyModelConfig.micro(), TOK).save_pretrained(tmp_path)
    _drop_config_mask_id(tmp_path)
    TOK.save_pretrained(tmp_path)
    assert HFBackbone.from_pretrained(tmp_path).mask_token_id == TOK.convert_tokens_to_ids(
        "<|MASK|>"
    )


def test_from_pretrained_without_a_mask_id_is_a_clear_error(tmp_path: Path) -> None:
    build_model(TinyModelConfig.micro(), TOK).save_pretrained(tmp_path)
    _drop_config_mask_id(tmp_path)
    with pytest.raises(ValueError, match=r"^mask_token_id: .* defines no MASK token"):
        HFBackbone.from_pretrained(tmp_path)


def test_forward_leaves_mode_and_gradients_to_the_caller(backbone: HFBackbone) -> None:
    backbone.model.train()
    out = backbone.forward(torch.randint(5, 100, (2, 6)), backbone.new_cache())
    assert backbone.model.training  # the adapter never calls eval()
    out.logits.logsumexp(-1).sum().backward()  # usable for training: grads reach the weights
    assert backbone.model.get_output_embeddings().weight.grad is not None
    assert out.hidden.shape == (2, 6, 64)  # the last hidden state only
    with torch.no_grad():
        assert not backbone.forward(torch.tensor([[5]]), backbone.new_cache()).logits.requires_grad


def test_gather_keeps_rows_and_slots_like_a_fresh_forward(backbone: HFBackbone) -> None:
    """Rows 0..1 feed 2 tokens, then 2 drafts that are rejected, then 2 tokens that do not
    attend to the drafts (ISD's masks). Gathering row 1's owned slots (dropping the drafts and
    row 0) leaves the cache a plain forward of row 1's kept tokens builds."""
    backbone.model.eval()
    g = torch.Generator().manual_seed(1)
    kept, drafts = (
        torch.randint(5, 100, (2, 4), generator=g),
        torch.randint(5, 100, (2, 2), generator=g),
    )
    cache = backbone.new_cache()
    with torch.no_grad():
        backbone.forward(kept[:, :2], cache)
        backbone.forward(drafts, cache, position_ids=torch.tensor([[2, 3]] * 2))
        mask = torch.ones(2, 1, 2, 6, dtype=torch.bool)
        mask[..., 2:4] = False  # the rejected drafts
        mask[..., 4:] = torch.ones(2, 2, dtype=torch.bool).tril()
        backbone.forward(
            kept[:, 2:], cache, position_ids=torch.tensor([[2, 3]] * 2), attention_mask=mask
        )
        backbone.gather(cache, torch.tensor([1]), torch.tensor([[0, 1, 4, 5]]))
        assert backbone.cache_length(cache) == 4
        nxt = torch.tensor([[7]])
        got = backbone.forward(nxt, cache).logits
        fresh = backbone.new_cache()
        backbone.forward(kept[1:], fresh)
        want = backbone.forward(nxt, fresh).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"^slots: expected \[1, T'\]"):
        backbone.gather(cache, torch.tensor([0]), torch.tensor([0, 1]))


def test_missing_checkpoint_is_an_error_not_a_hub_lookup(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^path: .*nope is not a checkpoint directory"):
        HFBackbone.from_pretrained(tmp_path / "nope")
