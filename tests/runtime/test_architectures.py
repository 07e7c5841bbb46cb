"""Checkpoints beyond brisk's own: an I-DLM SDAR checkpoint loads as Qwen3 without remote code
and decodes exactly as the same weights saved as Qwen3; a causal LM without a MASK token gets one,
its other logits untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from brisk.cli import main
from brisk.runtime.architectures import add_mask_token, model_config
from brisk.runtime.backbone import HFBackbone
from brisk.runtime.isd import ISDOptions, decode
from brisk.runtime.tiny.model import TinyModelConfig, build_model
from brisk.runtime.tiny.tokenizer import char_tokenizer
from tests.runtime.conftest import tokenizer_without_mask


@pytest.fixture(scope="module")
def qwen3_and_sdar(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same weights saved as Qwen3 and as an I-DLM checkpoint would ship them: architecture
    SDARForCausalLM, model_type sdar, model code named by auto_map (and absent), block_size."""
    root = tmp_path_factory.mktemp("arch")
    tokenizer = char_tokenizer()
    torch.manual_seed(3)
    model = build_model(TinyModelConfig.micro(), tokenizer)
    for name in ("qwen3", "sdar"):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    config = json.loads((root / "sdar" / "config.json").read_text())
    config |= {
        "architectures": ["SDARForCausalLM"], "model_type": "sdar", "block_size": 4,
        "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig",
                     "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
    }  # fmt: skip
    (root / "sdar" / "config.json").write_text(json.dumps(config))
    return root / "qwen3", root / "sdar"


def test_an_sdar_checkpoint_loads_as_qwen3(qwen3_and_sdar: tuple[Path, Path]) -> None:
    qwen3, sdar = qwen3_and_sdar
    config = model_config(sdar)
    assert config.model_type == "qwen3"
    assert config.architectures == ["Qwen3ForCausalLM"]
    assert (config.block_size, config.mask_token_id) == (4, char_tokenizer().mask_token_id)
    a, b = HFBackbone.from_pretrained(qwen3), HFBackbone.from_pretrained(sdar)
    assert b.mask_token_id == a.mask_token_id
    ids = torch.randint(5, 60, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(b.model(input_ids=ids).logits, a.model(input_ids=ids).logits,
                                   rtol=0, atol=0)  # fmt: skip
    options = ISDOptions(stride=4, temperature=1.0, max_new_tokens=20)
    prompts = [[1, 20, 30], [1, 40]]
    assert decode(a, prompts, options).tokens == decode(b, prompts, options).tokens


def test_brisk_decode_takes_an_sdar_checkpoint(
    qwen3_and_sdar: tuple[Path, Path], tmp_path: Path
) -> None:
    qwen3, sdar = qwen3_and_sdar
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "Q: 1+2=?\n"}) + "\n")
    outs = []
    for model in (qwen3, sdar):
        out = tmp_path / f"{model.name}.jsonl"
        argv = ["decode", "--model", str(model), "--prompts", str(prompts), "--max-new-tokens",
                "16", "--out", str(out)]  # fmt: skip
        assert main(argv) == 0
        outs.append([json.loads(line)["completion"] for line in out.read_text().splitlines()])
    assert outs[0] == outs[1]


def test_a_model_without_a_mask_token_gets_one() -> None:
    tokenizer = tokenizer_without_mask()
    vocab = tokenizer.get_vocab()
    torch.manual_seed(0)
    model = build_model(TinyModelConfig.micro(), tokenizer)
    V = model.get_input_embeddings().weight.shape[0]
    ids = torch.randint(4, V, (1, 7))
    with torch.no_grad():
        before = model(input_ids=ids).logits
    mask_id = add_mask_token(model, tokenizer)
    assert mask_id == len(vocab) == V
    assert model.config.mask_token_id == mask_id
    emb = model.get_input_embeddings().weight
    assert emb.shape[0] == V + 1
    torch.testing.assert_close(emb[mask_id], emb[:V].mean(0))
    with torch.no_grad():
        after = model(input_ids=ids).logits
    torch.testing.assert_close(after[..., :V], before, rtol=0, atol=0)  # old logits untouched
    assert add_mask_token(model, tokenizer) == mask_id  # a second call changes nothing
    assert model.get_input_embeddings().weight.shape[0] == V + 1
    out = decode(HFBackbone(model, mask_id), [[1, 10, 11]], ISDOptions(stride=3, max_new_tokens=8))
    assert len(out.tokens[0]) == 8
