"""``brisk decode --drafter``: text prompts decoded by a DFlash drafter proposing and an AR target
verifying, through ``brisk.cli.main`` as a user runs it.

The target is :func:`tests.llama_micro.llama_without_mask` (a micro Llama with a byte-level BPE
tokenizer, ChatML specials and no MASK token, as SmolLM2); the drafter an untrained one for it
(block 4, its MASK id any id of the vocabulary: the target never reads it). The prompts are
code, multi-byte UTF-8, an empty one (the BOS alone) and a ChatML-rendered chat turn.

- Greedy parity from the command line: every row's ``output_ids`` equal the target's own greedy
  decoding of its ``prompt_ids`` (a plain full-recompute argmax loop over the transformers
  model, no brisk code), token for token, with the corrector drafting too; ISD's rows carry the
  same ids (tests/runtime/test_decode_cli.py).
- The block log is a speculative log that ``brisk mechanism report`` reads, whose TPFs are the
  ones ``brisk decode`` printed.
- A damaged or mismatched drafter and the flags that mean nothing with one: one line on stderr
  naming the flag (and file), exit 2, nothing written.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from brisk.cli import main
from brisk.mechanism import validate
from brisk.mechanism.runs import COMPLETE_CYCLES, WHOLE_RUN
from tests.llama_micro import llama_without_mask

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BLOCK, MAX_NEW = 4, 24
PROMPTS = [
    "def add(a, b):\n    return",
    "température °C → K, «exact» 😀 数字 日本語",
    "",
    "<|im_start|>user\nWrite a list of numbers.<|im_end|>\n<|im_start|>assistant\n",
]


def make_drafter(
    target_config: Any, out: Path, mask_token_id: int = 7, constant: bool = False, **changes: Any
) -> Path:
    """A drafter (block 4, layers 1 and 2, untrained) for a target of ``target_config`` (with
    ``changes``), saved as a DFlash checkpoint. ``constant``: its layers add nothing to the
    residual stream, so every draft is the tied LM head's argmax at the MASK's own embedding,
    the MASK token itself: a drafter the target agrees with wherever it outputs that token."""
    from brisk.runtime.drafter import DFlashDrafter, drafter_config, save_drafter

    config = type(target_config)(**{**target_config.to_dict(), **changes})
    torch.manual_seed(1)
    draft = DFlashDrafter(
        drafter_config(
            config,
            block_size=BLOCK,
            mask_token_id=mask_token_id,
            target_layer_ids=[1, 2],
            intermediate_size=64,
        )
    )
    if constant:
        with torch.no_grad():
            for layer in draft.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
    return save_drafter(draft, out)


Greedy = Callable[[list[int], int, int], list[int]]


def greedy_reference(target: Path) -> Greedy:
    """The target's greedy decoding: each token the argmax of a forward over the whole
    sequence, up to and including the EOS."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target).eval()

    def greedy(prompt: list[int], n: int, eos: int) -> list[int]:
        out: list[int] = []
        with torch.no_grad():
            while len(out) < n and eos not in out:
                logits = model(torch.tensor([prompt + out])).logits
                out.append(int(logits[0, -1].argmax()))
        return out

    return greedy


def prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """The ids a row must hold: the text's tokens behind one BOS (none added to a chat turn
    that opens with ``<|im_start|>``, the BOS)."""
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids if ids[:1] == [tokenizer.bos_token_id] else [tokenizer.bos_token_id, *ids]


@dataclass(frozen=True)
class Pair:
    target: Path
    drafter: Path  # drafts the target's most frequent greedy output token (``constant``)
    greedy: Greedy
    tokenizer: Any


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    """The target, its greedy decoding and a drafter for it whose drafts are accepted in
    some rounds and rejected in others."""
    from transformers import AutoConfig, AutoTokenizer

    root = tmp_path_factory.mktemp("decode-drafter")
    target = llama_without_mask(root / "target")
    tokenizer = AutoTokenizer.from_pretrained(target)
    greedy = greedy_reference(target)
    outputs = [greedy(prompt_ids(tokenizer, t), MAX_NEW, tokenizer.eos_token_id) for t in PROMPTS]
    common = Counter(t for out in outputs for t in out[1:]).most_common(1)[0][0]
    config = AutoConfig.from_pretrained(target)
    drafter = make_drafter(config, root / "drafter", mask_token_id=common, constant=True)
    return Pair(target, drafter, greedy, tokenizer)


def write_prompts(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    return path


def decode(pair: Pair, tmp_path: Path, *extra: str) -> list[dict[str, Any]]:
    """``brisk decode --drafter`` of :data:`PROMPTS`: its rows."""
    target, drafter = pair.target, pair.drafter
    prompts, out = write_prompts(tmp_path / "prompts.jsonl", PROMPTS), tmp_path / "out.jsonl"
    argv = ["decode", "--model", str(target), "--drafter", str(drafter), "--prompts", str(prompts)]
    argv += ["--max-new-tokens", str(MAX_NEW), "--out", str(out), *extra]
    assert main(argv) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_greedy_rows_are_the_targets_greedy_decoding(
    pair: Pair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Row for row, token for token, with rounds that accept (the cache cut back after a
    partial block, several tokens committed at once) and rounds that reject; the same with an
    (untrained) corrector drafting over the drafter's Top-K."""
    from brisk.runtime.corrector import Corrector, CorrectorConfig

    tokenizer = pair.tokenizer
    eos, bos = tokenizer.eos_token_id, tokenizer.bos_token_id
    rows = decode(pair, tmp_path)
    printed = " ".join(capsys.readouterr().out.split())
    assert f"drafter {pair.drafter} (block {BLOCK})" in printed
    assert "corrector: none (the drafter drafts)" in printed
    assert [r["prompt"] for r in rows] == PROMPTS
    assert rows[2]["prompt_ids"] == [bos]  # the empty prompt: its BOS alone
    assert rows[3]["prompt_ids"].count(bos) == 2  # the chat's own <|im_start|>s, none added
    assert len(rows[1]["prompt_ids"]) > len(PROMPTS[1].split())  # multi-byte: several tokens
    hist = [0] * BLOCK
    for row in rows:
        assert row["decoder"] == "speculative"
        assert row["prompt_ids"] == prompt_ids(tokenizer, row["prompt"])
        assert row["output_ids"] == pair.greedy(row["prompt_ids"], MAX_NEW, eos)
        assert row["tokens"] == len(row["output_ids"])
        assert row["completion"] == tokenizer.decode([t for t in row["output_ids"] if t != eos])
        assert row["finished"] == ("eos" if row["output_ids"][-1] == eos else "length")
        assert row["forwards"] == 1 + sum(row["accept_hist"])
        assert len(row["accept_hist"]) == BLOCK
        hist = [a + b for a, b in zip(hist, row["accept_hist"], strict=True)]
    assert hist[0] > 0, hist  # rounds that rejected every draft
    assert sum(hist[1:]) > 0, hist  # and rounds that accepted some
    head = tmp_path / "head"
    Corrector(CorrectorConfig.small(64, len(tokenizer), M=BLOCK - 1, K=8)).save_pretrained(head)
    with_head = decode(pair, tmp_path, "--corrector", str(head))
    assert [r["output_ids"] for r in with_head] == [r["output_ids"] for r in rows]
    assert f"corrector: {head} (on: the head drafts over the drafter's Top-K)" in " ".join(
        capsys.readouterr().out.split()
    )


@pytest.mark.parametrize("temperature", ["0", "1"])
def test_the_block_log_is_a_speculative_log_the_report_reads(
    pair: Pair,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    temperature: str,
) -> None:
    log, report = tmp_path / "log", tmp_path / "report"
    rows = decode(
        pair, tmp_path, "--log-blocks", str(log), "--temperature", temperature, "--top-k", "5"
    )
    printed = " ".join(capsys.readouterr().out.split())
    blocks = validate(log)
    assert blocks == sum(sum(r["accept_hist"]) for r in rows) > 0
    assert main(["mechanism", "report", str(log), "--out", str(report), "--bootstrap", "20"]) == 0
    summary = json.loads((report / "summary.json").read_text())
    assert summary["decoder"] == "speculative"
    assert summary["blocks"] == blocks
    assert summary["verification"]["rule"] == ("greedy" if temperature == "0" else "sampled")
    assert summary["verification"]["contradictions"] == 0
    tpf = summary["tpf"]
    assert tpf["output_tokens"] == sum(r["tokens"] for r in rows)
    assert tpf["forwards"] == sum(r["forwards"] for r in rows)
    for name, value in ((WHOLE_RUN, tpf["whole_run"]), (COMPLETE_CYCLES, tpf["complete_cycles"])):
        assert f"{name}: {value:.3f} (" in printed


def truncate(drafter: Path) -> None:
    weights = drafter / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])


def garble(drafter: Path) -> None:
    (drafter / "model.safetensors").write_bytes(b"not safetensors at all" * 8)


def bad_json(drafter: Path) -> None:
    (drafter / "config.json").write_text('{"block_size": 4,\n "hidden_size": }')


def no_block_size(drafter: Path) -> None:
    config = json.loads((drafter / "config.json").read_text())
    del config["block_size"]
    (drafter / "config.json").write_text(json.dumps(config))


BROKEN: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (truncate, "model.safetensors: not a readable safetensors file"),
    "garbage": (garble, "model.safetensors: not a readable safetensors file"),
    "invalid-json": (bad_json, "config.json: invalid JSON at line 2, column 17"),
    "missing-field": (no_block_size, 'config.json: no "block_size" field'),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_drafter_is_one_line_and_exit_2(
    pair: Pair, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    import shutil

    drafter = Path(shutil.copytree(pair.drafter, tmp_path / "drafter"))
    damage, message = BROKEN[case]
    damage(drafter)
    error = failed_decode(pair.target, drafter, tmp_path, capsys)
    assert error.startswith(f"brisk: error: --drafter: {drafter}/"), error
    assert message in error


MISMATCHED = {
    "vocabulary": ({"vocab_size": 400}, "vocabulary 400, the target's is 384"),
    "hidden-size": ({"hidden_size": 32, "head_dim": 8}, "hidden size 32, the target's is 64"),
    "layers": ({"num_hidden_layers": 6}, "built for a target of 6 layers, the target has 4"),
    "mask-id": (  # a MASK id past the target's rows: the vocabularies disagree first
        {"vocab_size": 400, "mask_token_id": 390},
        "vocabulary 400, the target's is 384",
    ),
}


@pytest.mark.parametrize("case", list(MISMATCHED))
def test_a_drafter_for_another_target_is_one_line_and_exit_2(
    pair: Pair, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    from transformers import AutoConfig

    changes, message = MISMATCHED[case]
    drafter = make_drafter(AutoConfig.from_pretrained(pair.target), tmp_path / "other", **changes)
    error = failed_decode(pair.target, drafter, tmp_path, capsys)
    assert error.startswith(f"brisk: error: --drafter: {drafter / 'config.json'}: "), error
    assert message in error


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--stride", "4"], "--stride: not with --drafter (the block size is the drafter's)"),
        (["--mask-token-id", "3"], "--mask-token-id: not with a drafter"),
        (["--shadow"], "--shadow: not with a drafter"),
        (["--score-blocks"], "--score-blocks: not with a drafter"),
        (["--dtype", "bfloat16"], "--dtype: a drafter's loop runs in float32, got bfloat16"),
    ],
    ids=["stride", "mask", "shadow", "score-blocks", "dtype"],
)
def test_flags_without_meaning_for_a_drafter_are_refused(
    pair: Pair,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    message: str,
) -> None:
    error = failed_decode(pair.target, pair.drafter, tmp_path, capsys, *flags)
    assert error.startswith(f"brisk: error: {message}"), error


def failed_decode(
    target: Path, drafter: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> str:
    """Run a decode that must fail: exit 2, one stderr line (returned), nothing written."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", PROMPTS[:1])
    out, log = tmp_path / "out.jsonl", tmp_path / "log"
    argv = ["decode", "--model", str(target), "--drafter", str(drafter), "--prompts", str(prompts)]
    argv += ["--out", str(out), "--log-blocks", str(log), *extra]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert not out.exists()
    assert not log.exists()
    assert not (tmp_path / ".out.jsonl.partial").exists()
    return err.strip()
