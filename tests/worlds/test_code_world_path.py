"""The code world's whole path at micro scale, through the command line as a user runs it:
``brisk train ar`` → ``brisk train base --init`` → ``brisk decode problems`` → ``brisk decode
--stride 4`` (greedy and T = 1, block logs) → ``brisk mechanism report``, and the ``compiles``
grader on what came out.

The world (:mod:`tests.code_micro`) and its two decodes are built once per run (≈ 30 s; under
xdist by the first worker that asks, the other reads them: :mod:`tests.session_cache`), and the
tests write only to their own ``tmp_path``. Its AR model, trained once per run too, is
test_drafter_bpe's target (:func:`tests.code_micro.code_ar_once`). The prompt file holds the
held-out functions (the micro model's drafts miss there: rejections), every fourth training
function (memorized: whole blocks accepted) and one prompt of non-ASCII text.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.code_micro import (
    BASE,
    STRIDE,
    accept_totals,
    brisk,
    brisk_decode,
    build_code_world,
    code_ar_once,
    problem_rows,
    read_jsonl,
    write_jsonl,
)
from tests.session_cache import built_once

MAX_NEW_TOKENS = 64
# not from the corpus: multi-byte characters (2, 3 and 4 UTF-8 bytes) and runs of spaces
NON_ASCII = 'def température(t: float) -> float:\n    """°C → K, «exact»  😀."""'


@dataclass(frozen=True)
class World:
    root: Path
    checkpoint: Path  # the I-DLM base's final/
    heldout: list[dict[str, Any]]  # decode problems rows, split test
    train: list[dict[str, Any]]  # decode problems rows, split train
    prompts: Path  # the prompt file brisk decode reads
    rows: list[dict[str, Any]]  # its rows, in order


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    ar = code_ar_once(tmp_path_factory)  # test_drafter_bpe's target

    def build(root: Path) -> None:
        checkpoint = build_code_world(root, ar=ar)
        heldout = problem_rows(root, checkpoint, "test")  # problems-test.jsonl
        train = problem_rows(root, checkpoint, "train")  # problems-train.jsonl
        write_jsonl(root / "prompts.jsonl", [*heldout, *train[::4], {"prompt": NON_ASCII}])

    key = {"ar": str(ar), "base": BASE, "non_ascii": NON_ASCII}
    root = built_once(tmp_path_factory, "code-world", key, build)
    return World(
        root,
        root / "base" / "final",
        read_jsonl(root / "problems-test.jsonl"),
        read_jsonl(root / "problems-train.jsonl"),
        root / "prompts.jsonl",
        read_jsonl(root / "prompts.jsonl"),
    )


@dataclass(frozen=True)
class Decoded:
    temperature: float
    rows: list[dict[str, Any]]
    blocks: Path


def _decode(tmp_path_factory: pytest.TempPathFactory, world: World, temperature: float) -> Decoded:
    """``brisk decode`` of the prompt file at ``temperature`` with its block log, once per run."""

    def build(out: Path) -> None:
        brisk_decode(
            world.root,
            world.checkpoint,
            world.prompts,
            out / "rows.jsonl",
            "--temperature",
            temperature,
            "--max-new-tokens",
            MAX_NEW_TOKENS,
            "--log-blocks",
            out / "blocks",
        )

    key = {"world": str(world.root), "temperature": temperature, "max_new": MAX_NEW_TOKENS}
    out = built_once(tmp_path_factory, f"code-world-t{temperature:g}", key, build)
    return Decoded(temperature, read_jsonl(out / "rows.jsonl"), out / "blocks")


@pytest.fixture(scope="module")
def greedy(tmp_path_factory: pytest.TempPathFactory, world: World) -> Decoded:
    return _decode(tmp_path_factory, world, 0.0)


@pytest.fixture(scope="module")
def sampled(tmp_path_factory: pytest.TempPathFactory, world: World) -> Decoded:
    return _decode(tmp_path_factory, world, 1.0)


@pytest.fixture(params=["greedy", "sampled"])
def decoded(request: pytest.FixtureRequest) -> Decoded:
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


def test_both_runs_log_finite_losses_that_fall(world: World) -> None:
    for run in ("ar", "base"):
        events = read_jsonl(world.root / run / "metrics.jsonl")
        losses = [e["loss"] for e in events if e["event"] == "train"]
        assert len(losses) > 10, run
        assert all(math.isfinite(x) for x in losses), run
        # single batches are noisy (the base's loss is CE_noisy + α·CE_clean): compare the
        # first and last five logged steps
        assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), f"{run}: {losses}"
        assert events[-1]["event"] == "end", run
    config = json.loads((world.checkpoint / "config.json").read_text())
    tokenizer = json.loads((world.checkpoint / "tokenizer.json").read_text())
    mask = next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == "<|MASK|>")
    assert config["mask_token_id"] == mask
    assert config["vocab_size"] == 512


def test_problems_are_the_held_out_functions_with_their_grader(world: World) -> None:
    assert len(world.heldout) == 12
    assert len(world.train) > 40
    assert not {r["prompt"] for r in world.heldout} & {r["prompt"] for r in world.train}
    for row in world.heldout + world.train:
        assert row["grader"] == "compiles"
        assert row["answer"]["prompt"] == row["prompt"]
        assert row["prompt"].rstrip().endswith(('"', "'"))  # the docstring's closing quote
        assert not row["prompt"].endswith("\n")
        assert row["answer"]["body"].strip()
    email = [r for r in world.heldout if r["prompt"].startswith("def message_from_")]
    assert len(email) == 4  # email/__init__.py's, one of the held-out files


def test_completions_are_text_the_tokenizer_round_trips(world: World, decoded: Decoded) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(world.checkpoint)
    assert [r["prompt"] for r in decoded.rows] == [r["prompt"] for r in world.rows]
    assert decoded.rows[-1]["prompt"] == NON_ASCII
    for row in decoded.rows:
        for text in (row["completion"], row["prompt"] + row["completion"]):
            assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
        assert 1 <= row["tokens"] <= MAX_NEW_TOKENS
        assert row["finished"] in {"eos", "length"}
        assert row["finished"] == "eos" or row["tokens"] == MAX_NEW_TOKENS
    assert sum(bool(r["completion"].strip()) for r in decoded.rows) > len(decoded.rows) // 2


def test_tokens_per_forward_and_accept_lengths(world: World, decoded: Decoded) -> None:
    rows = decoded.rows
    for row in rows:
        # forwards: the prefill, the cold starts and the verify rounds (one per accept length)
        rounds = sum(row["accept_hist"])
        assert len(row["accept_hist"]) == STRIDE
        assert rounds + 1 <= row["forwards"] <= 2 * rounds + 2
        assert row["tpf"] == pytest.approx(row["tokens"] / row["forwards"])
        assert row["tpf"] >= 1
    hist = accept_totals(rows)
    assert hist[0] > 0, f"rounds that reject the first draft: {hist}"
    assert sum(hist[1 : STRIDE - 1]) > 0, f"rounds that accept part of a block: {hist}"
    assert hist[STRIDE - 1] > 0, f"rounds that accept the whole block: {hist}"
    memorized = rows[len(world.heldout) : -1]
    assert sum(r["tokens"] for r in memorized) > 1.5 * sum(r["forwards"] for r in memorized)


def test_greedy_isd_is_greedy_ar(world: World, greedy: Decoded) -> None:
    """ISD is exact: at T = 0 its completions are the base's greedy autoregressive ones."""
    import torch

    from brisk.runtime.loader import load_model
    from brisk.runtime.prompts import completion_text, encode_prompts
    from brisk.runtime.train.evaluate import greedy_decode

    loaded = load_model(world.checkpoint, device="cpu", dtype="float32", announce=False)
    eos = loaded.tokenizer.eos_token_id
    texts = [r["prompt"] for r in world.rows]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 0.6 s; two threads beside the rest of the suite: 30 s
    try:
        outputs = greedy_decode(
            loaded.backbone, encode_prompts(loaded.tokenizer, texts), MAX_NEW_TOKENS, eos
        )
    finally:
        torch.set_num_threads(threads)
    want = [
        (completion_text(loaded.tokenizer, out), len(out) + (len(out) < MAX_NEW_TOKENS))
        for out in outputs
    ]
    assert [(r["completion"], r["tokens"]) for r in greedy.rows] == want


def test_block_logs_read_back_and_report(world: World, decoded: Decoded, tmp_path: Path) -> None:
    from brisk.mechanism.reader import count_blocks, log_shape, read_blocks
    from brisk.mechanism.requests import read_requests

    hist = accept_totals(decoded.rows)
    shape = log_shape(decoded.blocks)
    assert shape.M == STRIDE - 1
    assert count_blocks(decoded.blocks) == sum(hist)
    lengths = np.concatenate([b.columns["accept_len"] for b in read_blocks(decoded.blocks)])
    assert np.bincount(lengths, minlength=STRIDE).tolist() == hist
    requests = read_requests(decoded.blocks, shape.M)
    assert requests is not None
    order = np.argsort(requests.request_id)
    assert requests.output_tokens[order].tolist() == [r["tokens"] for r in decoded.rows]
    assert requests.forwards[order].tolist() == [r["forwards"] for r in decoded.rows]

    out = tmp_path / f"report-t{decoded.temperature:g}"
    brisk(world.root, "mechanism", "report", decoded.blocks, "--out", out, "--bootstrap", 50)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["blocks"] == sum(hist)
    assert summary["requests"] == len(decoded.rows)
    assert (out / "summary.md").read_text().strip()
    assert list(out.glob("*.png"))


def test_compiles_grades_the_completions(world: World, greedy: Decoded) -> None:
    from brisk.runtime.tasks.graders import grade_all

    graded = [(r, g) for r, g in zip(greedy.rows, world.rows, strict=True) if "answer" in g]
    grades = grade_all(
        "compiles", [r["completion"] for r, _ in graded], [g["answer"] for _, g in graded], 1
    )
    assert len(grades.correct) == len(graded) == len(world.rows) - 1
    assert grades.errors == 0
    assert 0 <= grades.accuracy <= 1
    assert grades.correct == [r["correct"] for r, _ in graded]  # as brisk decode graded them
    memorized = grades.correct[len(world.heldout) :]
    assert sum(memorized) > len(memorized) // 2  # the bodies it learned by heart compile


def test_problem_prompts_as_written_get_a_body(world: World, tmp_path: Path) -> None:
    """The problems' prompts end at the docstring's closing quotes: the body's first token,
    newline and indentation as one BPE token, is the model's to write. (Ending them with the
    docstring's line break, a lone newline token the corpus shows only before top-level code or
    a document's end, made the model answer EOS at once, even on functions it knew by heart.)"""
    rows = brisk_decode(
        world.root,
        world.checkpoint,
        write_jsonl(tmp_path / "as-written.jsonl", world.train[::8]),
        tmp_path / "as-written-out.jsonl",
        "--temperature",
        0,
        "--max-new-tokens",
        16,
    )
    assert all(r["completion"].strip() for r in rows), [r["completion"] for r in rows]
