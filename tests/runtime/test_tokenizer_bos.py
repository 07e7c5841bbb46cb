"""The char tokenizer puts BOS first when asked for special tokens, as its models were trained,
and nothing brisk encodes changes: training examples and decode prompts are the same ids with
the tokenizer brisk saves now and with the one older brisk saved (no BOS post-processor), never
a doubled BOS; a checkpoint saved by older brisk decodes as before."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from brisk.cli import main
from brisk.runtime.prompts import encode_prompt, encode_prompts
from brisk.runtime.train.evaluate import encode_example, encode_problem
from brisk.runtime.train.pretrain.recipe import encode as pretrain_encode
from brisk.worlds.arithmetic.model import TinyModelConfig, build_model
from brisk.worlds.arithmetic.task import TaskConfig, solutions
from brisk.worlds.arithmetic.tokenizer import (
    BOS,
    CHARS,
    EOS,
    MASK,
    PAD,
    SPECIALS,
    UNK,
    char_tokenizer,
)

TEXTS = ["Q: 17+5-8=?\n", "", "7", " leading space", "#### 14\n"]


def legacy_char_tokenizer() -> PreTrainedTokenizerFast:
    """The char tokenizer as brisk saved it before BOS was part of it: no post-processor that
    adds BOS, ``add_bos_token=False``."""
    vocab = {tok: i for i, tok in enumerate((*SPECIALS, *CHARS))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        mask_token=MASK,
        add_bos_token=False,
        add_eos_token=False,
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PreTrainedTokenizerFast]:
    """Both tokenizers after ``save_pretrained`` and ``AutoTokenizer.from_pretrained``."""
    loaded = {}
    for name, tokenizer in (("new", char_tokenizer()), ("legacy", legacy_char_tokenizer())):
        path = tmp_path_factory.mktemp(name)
        tokenizer.save_pretrained(path)
        loaded[name] = AutoTokenizer.from_pretrained(path)
    return loaded


@pytest.mark.parametrize("text", TEXTS, ids=repr)
def test_special_tokens_put_bos_first_and_only_then(text: str) -> None:
    tok = char_tokenizer()
    plain = [tok.convert_tokens_to_ids(c) for c in text]
    assert tok.encode(text, add_special_tokens=False) == plain
    assert tok.encode(text) == [tok.bos_token_id, *plain]
    assert tok(text)["input_ids"] == [tok.bos_token_id, *plain]
    assert tok([text, text])["input_ids"] == [[tok.bos_token_id, *plain]] * 2
    assert encode_prompt(tok, text) == tok.encode(text)
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == text


def test_the_saved_tokenizer_keeps_its_post_processor(
    saved: dict[str, PreTrainedTokenizerFast], tmp_path: Path
) -> None:
    """Every loader of the saved files adds BOS: transformers' AutoTokenizer and ``tokenizers``
    alone (what reads ``tokenizer.json`` without transformers' flags)."""
    char_tokenizer().save_pretrained(tmp_path)
    post = json.loads((tmp_path / "tokenizer.json").read_text())["post_processor"]
    assert post["type"] == "TemplateProcessing"
    assert [next(iter(p)) for p in post["single"]] == ["SpecialToken", "Sequence"]
    raw = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    loaded = saved["new"]
    for text in TEXTS:
        want = encode_prompt(loaded, text)
        assert want[0] == loaded.bos_token_id == 1
        assert loaded(text)["input_ids"] == loaded.encode(text) == want
        assert raw.encode(text).ids == want
        assert loaded.encode(text, add_special_tokens=False) == want[1:]


def test_training_and_decode_ids_are_those_of_older_brisk(
    saved: dict[str, PreTrainedTokenizerFast],
) -> None:
    """What training, evaluation, self-generation and ``brisk decode`` encode: the same ids with
    either tokenizer, BOS once at the start."""
    new, legacy = saved["new"], saved["legacy"]
    assert legacy.encode("ab") == legacy.encode("ab", add_special_tokens=False)  # truly legacy
    cfg = TaskConfig()  # every style of response, so spaces and words are encoded too
    rows = list(itertools.islice(solutions(cfg, "train", 0), 16))
    rows += list(itertools.islice(solutions(cfg, "test", 0), 16))
    for problem, response in rows:
        prompts = [problem.prompt]
        for tok_a, tok_b in ((new, legacy), (new, char_tokenizer())):
            a = encode_example(problem.prompt, response, tok_a)
            assert a == encode_example(problem.prompt, response, tok_b)
            assert encode_problem(problem, tok_a) == encode_problem(problem, tok_b)
            assert encode_prompts(tok_a, prompts) == encode_prompts(tok_b, prompts)
        seq, prompt_len = encode_example(problem.prompt, response, new)
        assert seq[0] == new.bos_token_id
        assert seq.count(new.bos_token_id) == 1
        assert seq[-1] == new.eos_token_id
        assert seq.count(new.eos_token_id) == 1
        assert seq[:prompt_len] == new(problem.prompt)["input_ids"]  # what a server encodes
    example = SimpleNamespace(prompt=rows[0][0].prompt, response=rows[0][1])
    assert pretrain_encode(example, new) == pretrain_encode(example, legacy)


def test_a_checkpoint_saved_by_older_brisk_decodes_as_before(tmp_path: Path) -> None:
    """``brisk decode`` on the same weights with the legacy and the new tokenizer: the same
    completions (``encode_prompt`` adds the BOS the legacy tokenizer does not)."""
    torch.manual_seed(0)
    model = build_model(TinyModelConfig.micro(), char_tokenizer())
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in TEXTS))
    rows = {}
    for name, tokenizer in (("new", char_tokenizer()), ("legacy", legacy_char_tokenizer())):
        path = tmp_path / name
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        out = tmp_path / f"{name}.jsonl"
        argv = (
            f"decode --model {path} --prompts {prompts} --stride 3 --max-new-tokens 12 "
            f"--device cpu --out {out}"
        ).split()
        assert main(argv) == 0
        rows[name] = [json.loads(line) for line in out.read_text().splitlines()]
    keys = ("completion", "tokens", "forwards", "accept_hist")
    assert [[r[k] for k in keys] for r in rows["new"]] == [
        [r[k] for k in keys] for r in rows["legacy"]
    ]
    assert any(r["completion"] for r in rows["new"])
