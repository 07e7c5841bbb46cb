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
from brisk.worlds.arithmetic.model import TinyModelConfig, build_model
from brisk.worlds.arithmetic.tokenizer import char_tokenizer
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
        "architectures": ["SDARForCausalLM"],
        "model_type": "sdar",
        "block_size": 4,
        "auto_map": {
            "AutoConfig": "configuration_sdar.SDARConfig",
            "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
        },
    }
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
        torch.testing.assert_close(
            b.model(input_ids=ids).logits, a.model(input_ids=ids).logits, rtol=0, atol=0
        )
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
        argv = (
            f"decode --model {model} --prompts {prompts} --max-new-tokens 16 --out {out}"
        ).split()
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


def test_brisk_train_base_converts_a_causal_lm_without_a_mask_token(tmp_path: Path) -> None:
    """The I-DLM conversion recipe on a user's model and data: a causal LM without a MASK token
    (--init, --add-mask-token) trained on a JSON-lines file of prompts and responses."""
    from brisk.runtime.train.base.config import BaseTrainConfig
    from brisk.worlds.arithmetic.tasks import ArithmeticTask

    tokenizer = tokenizer_without_mask()
    torch.manual_seed(0)
    ar = tmp_path / "ar"
    build_model(TinyModelConfig.micro(), tokenizer).save_pretrained(ar)
    tokenizer.save_pretrained(ar)
    data = tmp_path / "train.jsonl"
    problems = ArithmeticTask.build("trivial", split="train", n=40, seed=0).problems()
    data.write_text(
        "".join(json.dumps({"q": p.prompt, "a": p.record["response"]}) + "\n" for p in problems)
    )
    config = tmp_path / "convert.toml"
    config.write_text(
        # a random model, not a pretrained one: it learns at the from-scratch rate
        f"steps = 60\nbatch_size = 16\nstrides = [2, 4]\nwarmup_steps = 5\nlog_every = 5\n"
        "lr = 3e-3\nmin_lr = 3e-4\n"
        f"eval_problems = 0\nfinal_eval_problems = 0\nsave_every = 0\n"
        f'[data]\npath = "{data}"\nfields = ["prompt=q", "response=a"]\n'
    )
    out = tmp_path / "converted"
    argv = (
        f"train base --config {config} --init {ar} --add-mask-token --out {out} --no-progress"
    ).split()
    assert main(argv) == 0
    final = out / "final"
    saved = BaseTrainConfig.load(final / "train_config.json")
    assert (saved.init, saved.add_mask_token) == (str(ar), True)
    from transformers import AutoTokenizer

    converted = AutoTokenizer.from_pretrained(final)
    mask_id = converted.mask_token_id
    assert mask_id == len(tokenizer.get_vocab())  # one new token, recorded in both files
    assert json.loads((final / "config.json").read_text())["mask_token_id"] == mask_id
    losses = [
        json.loads(line)["loss"] for line in (out / "metrics.jsonl").open() if '"train"' in line
    ]
    assert losses[-1] < 0.8 * losses[0]  # it learns the data
    backbone = HFBackbone.from_pretrained(final)
    assert backbone.mask_token_id == mask_id
    no_mask = [
        "train",
        "base",
        "--config",
        str(config),
        "--init",
        str(ar),
        "--out",
        str(tmp_path / "no_mask"),
        "--no-progress",
    ]
    assert main(no_mask) == 2  # a model without a MASK token, not asked to add one
