"""The converted-base path in micro (issue 23): AR pre-training on the broad corpus, conversion
with the I-DLM objective, ISD decoding and the headroom measurement, in seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from brisk.runtime.tasks.task import NamedTask
from brisk.worlds.arithmetic.broad import FAMILIES, BroadConfig, broad_corpus, export_corpus
from brisk.worlds.arithmetic.task import TaskConfig, make_split
from brisk.worlds.arithmetic.tokenizer import char_tokenizer

TRIVIAL = BroadConfig(target=TaskConfig.trivial(), weights=(0.6, 0.1, 0.06, 0.06, 0.06, 0.06, 0.06))
CORPUS = NamedTask("broad", TRIVIAL)  # brisk train ar's [corpus]: the broad task, these settings


def test_broad_corpus_families_tokenize_and_hold_out_the_target() -> None:
    """Every family appears, every character is in the tiny vocabulary, and no chains or
    variants problem lies in the target's test split."""
    cfg = BroadConfig()
    stream = broad_corpus(cfg, seed=3)
    examples = [next(stream) for _ in range(3000)]
    assert {e.family for e in examples} == set(FAMILIES)
    tok = char_tokenizer()
    for e in examples[:500]:
        assert tok.unk_token_id not in tok.encode(e.prompt + e.response)
    test = {p.expression for p in make_split(cfg.target, "test", 300, seed=1)}
    for e in examples:
        if e.family in ("chains", "variants"):
            expression = e.prompt.split(": ", 1)[1].removesuffix("=?\n")
            assert expression not in test
    for e in examples:
        if e.family == "sort":
            numbers = [int(x) for x in e.prompt.removeprefix("Sort: ").split()]
            assert e.response.splitlines()[0] == " ".join(map(str, sorted(numbers)))
        if e.family == "reverse":
            assert e.response == e.prompt.removeprefix("Reverse: ").removesuffix("\n")[::-1]


def test_broad_corpus_is_seeded() -> None:
    a, b = broad_corpus(BroadConfig(), 0), broad_corpus(BroadConfig(), 0)
    assert [next(a) for _ in range(50)] == [next(b) for _ in range(50)]
    with pytest.raises(ValueError, match="weights"):
        BroadConfig(weights=(1.0, 0.0))


def test_converted_base_micro(tmp_path: Path) -> None:
    """AR pre-training lowers the LM loss; the conversion keeps the MASK token and trains the
    MASK stream; ISD decodes the converted model (greedy ISD = greedy decoding of its causal
    stream, the verifier); the headroom measurement reads both streams."""
    from brisk.runtime.backbone import HFBackbone
    from brisk.runtime.isd import ISDOptions, decode
    from brisk.runtime.prompts import encode_prompt
    from brisk.runtime.train.base.config import BaseTrainConfig
    from brisk.runtime.train.base.recipe import train_base
    from brisk.runtime.train.evaluate import greedy_decode
    from brisk.runtime.train.headroom import measure_headroom, read_samples
    from brisk.runtime.train.pretrain.config import PretrainConfig
    from brisk.runtime.train.pretrain.recipe import train_ar

    # Stage 1: AR pre-training on the broad corpus around the trivial world.
    ar_cfg = PretrainConfig.smoke(str(tmp_path / "ar")).replace(corpus=CORPUS, steps=80)
    ar = train_ar(ar_cfg, show_progress=False, resume=False)
    losses = [r["loss"] for r in ar.history if r["event"] == "train"]
    assert sum(losses[-3:]) / 3 < 0.6 * losses[0], losses

    # Stage 2: conversion with the I-DLM objective on an exported draw of the same corpus.
    data = export_corpus(TRIVIAL, tmp_path / "broad.jsonl", 2000, seed=1)
    assert len(data.read_text().splitlines()) == 2000
    conv_cfg = BaseTrainConfig.smoke(str(tmp_path / "base")).replace(
        init=str(ar.checkpoint),
        data=BaseTrainConfig().data.replace(
            path=str(data), fields=("prompt=prompt", "response=response")
        ),
        steps=60,
        lr=1e-3,
        min_lr=1e-4,
    )
    conv = train_base(conv_cfg, show_progress=False, resume=False)
    noisy = [r["ce_noisy"] for r in conv.history if r["event"] == "train"]
    assert noisy[-1] < noisy[0], noisy
    saved = json.loads((conv.checkpoint / "config.json").read_text())
    tokenizer = char_tokenizer()
    assert saved["mask_token_id"] == tokenizer.mask_token_id
    assert BaseTrainConfig.load(conv.checkpoint / "train_config.json").init == str(ar.checkpoint)

    # Decode a few held-out problems of the target world: greedy ISD is lossless.
    backbone = HFBackbone.from_pretrained(conv.checkpoint)
    problems = make_split(TRIVIAL.target, "test", 6, seed=1)
    prompts = [encode_prompt(tokenizer, p.prompt) for p in problems]
    options = ISDOptions(
        stride=4, temperature=0.0, max_new_tokens=16, eos_token_id=tokenizer.eos_token_id
    )
    result = decode(backbone, prompts, options)
    greedy = greedy_decode(backbone, prompts, 16, tokenizer.eos_token_id)
    assert [t[: len(g)] for t, g in zip(result.tokens, greedy, strict=True)] == greedy
    assert result.forwards > 0
    assert sum(map(len, result.tokens)) >= result.forwards

    # Headroom on those samples: finite CEs, β a probability, every position counted.
    samples = tmp_path / "out.jsonl"
    rows = [
        {"prompt": p.prompt, "completion": tokenizer.decode(g), "correct": True}
        for p, g in zip(problems, greedy, strict=True)
    ]
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    room = measure_headroom(backbone, tokenizer, read_samples(samples), stride=4)
    assert min(room.count) > 0
    assert len(room.ce_mask) == 3
    assert all(torch.isfinite(torch.tensor(room.ce_mask + room.ce_causal)))
    assert all(0 <= b <= 1 for b in room.beta)
    assert 1 <= room.predicted_tpf <= 4


def test_ar_resume_is_exact(tmp_path: Path) -> None:
    """A run continued from its step-6 checkpoint ends bit-identical to the unbroken run."""
    import shutil

    from safetensors.torch import load_file

    from brisk.runtime.train.pretrain.config import PretrainConfig
    from brisk.runtime.train.pretrain.recipe import train_ar

    cfg = PretrainConfig.smoke(str(tmp_path / "a")).replace(corpus=CORPUS, steps=12, save_every=6)
    whole = train_ar(cfg, show_progress=False, resume=False)
    again = tmp_path / "b"
    again.mkdir()
    shutil.copytree(tmp_path / "a" / "checkpoint-000006", again / "checkpoint-000006")
    shutil.copy(tmp_path / "a" / "metrics.jsonl", again / "metrics.jsonl")
    resumed = train_ar(cfg.replace(out_dir=str(again)), show_progress=False, resume=True)
    a = load_file(whole.checkpoint / "model.safetensors")
    b = load_file(resumed.checkpoint / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)
    with pytest.raises(ValueError, match="finished run"):
        train_ar(cfg, show_progress=False, resume=True)


def test_causal_loss_of_a_uniform_model_is_log_v_per_scored_token() -> None:
    """Closed form: a model whose logits are all zero predicts every token with 1/V, so the
    held-out loss is log V whatever the texts, over Σ (len − 1) scored tokens, each text cut
    to its first max_positions tokens."""
    import math

    from brisk.runtime.presets import build_model
    from brisk.runtime.train.pretrain.recipe import causal_loss
    from brisk.worlds.arithmetic.model import TinyModelConfig

    tokenizer = char_tokenizer()
    torch.manual_seed(0)
    model = build_model(TinyModelConfig.micro(), tokenizer).eval()
    texts = ["1+2=3", "Q: 17+25=?\nA: 42", "7"]
    lengths = [len(tokenizer.encode(t)) + 1 for t in texts]  # [bos, text] + eos
    with torch.no_grad():
        model.lm_head.weight.zero_()
    loss, tokens = causal_loss(model, tokenizer, texts, max_positions=128, batch_size=2)
    assert tokens == sum(n - 1 for n in lengths)
    assert loss == pytest.approx(math.log(model.config.vocab_size), rel=1e-6)
    short, tokens = causal_loss(model, tokenizer, texts, max_positions=4)
    assert short == pytest.approx(math.log(model.config.vocab_size), rel=1e-6)
    assert tokens == sum(min(n, 4) - 1 for n in lengths)
    with pytest.raises(ValueError, match=r"^texts: need at least one"):
        causal_loss(model, tokenizer, [], max_positions=128)
