"""An I-DLM checkpoint served by ``brisk serve`` on this CPU, through the doors users use.

The checkpoint is shaped as I-DLM ships its own (:func:`sdar_checkpoint`: ``SDARForCausalLM``,
``model_type`` ``sdar``, its configuration and model code beside the weights, ``mask_token_id``,
``block_size``); the weights are a micro I-DLM base trained in the fixture, so ISD's drafts are
both accepted and rejected. Two servers, both started with ``brisk serve``:

- ``--stride 4`` (ISD, ``BRISK_ISD``), no remote code;
- no stride (SGLang's plain greedy decoding), with ``-- --trust-remote-code`` as a user passes it
  for I-DLM.

Text prompts sent to ``/generate``, ``/v1/completions`` and through the OpenAI client come back
as ``brisk decode`` decodes them (the ISD server: ``brisk decode --stride 4`` itself, text and
tokens, forwards included; the plain server: brisk's greedy AR decode of the same checkpoint):
the server reads the checkpoint as the causal Qwen3 it is and tokenizes with BOS first, as
``brisk decode`` does. Requests a forward cannot take, sent among good ones, get a 400 naming
the problem; the good ones still get their exact tokens and the server stays up.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from brisk.runtime.serving.process import ServerProcess
from tests.serving.real_server import (
    RealServer,
    post_json,
    sdar_checkpoint,
    start_brisk_serve,
    task_texts,
    train_micro_idlm,
)

STRIDE = 4
MAX_NEW_TOKENS = 32
PROMPTS = 8


@dataclass(frozen=True)
class Served:
    """A running server, the process that owns it, and what it must answer for ``texts``."""

    process: ServerProcess
    server: RealServer
    expected: list[dict[str, Any]]  # per prompt: completion (text) and tokens (count)


@pytest.fixture(scope="module")
def idlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = train_micro_idlm(tmp_path_factory.mktemp("micro_idlm"))
    return sdar_checkpoint(base, tmp_path_factory.mktemp("idlm") / "sdar")


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return task_texts(PROMPTS, seed=0)


@pytest.fixture(scope="module")
def brisk_decode(
    idlm: Path, texts: list[str], tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    """``brisk decode --stride 4`` of the text prompts (greedy, stopping at EOS): its rows."""
    work = tmp_path_factory.mktemp("decode")
    prompts, out = work / "prompts.jsonl", work / "out.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    flags = {
        "--model": idlm,
        "--prompts": prompts,
        "--stride": STRIDE,
        "--max-new-tokens": MAX_NEW_TOKENS,
        "--device": "cpu",
        "--out": out,
    }
    argv = [
        sys.executable,
        "-m",
        "brisk.cli",
        "decode",
        *(str(x) for f in flags.items() for x in f),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    hist = [sum(r["accept_hist"][i] for r in rows) for i in range(STRIDE)]
    assert sum(hist[: STRIDE - 1]) > 0, f"the test needs rounds that reject a draft: {hist}"
    assert hist[STRIDE - 1] > 0, f"the test needs rounds that accept the whole block: {hist}"
    assert any(r["completion"] for r in rows)
    return rows


def greedy_ar(model: Path, texts: list[str]) -> list[dict[str, Any]]:
    """brisk's greedy autoregressive decode of ``texts`` (``encode_prompt``, stopping at EOS,
    which counts as a token as the server counts it)."""
    from brisk.runtime.loader import load_model
    from brisk.runtime.prompts import completion_text, encode_prompts
    from brisk.runtime.train.evaluate import greedy_decode

    loaded = load_model(model, device="cpu", dtype="float32", announce=False)
    eos = loaded.tokenizer.eos_token_id
    outputs = greedy_decode(
        loaded.backbone, encode_prompts(loaded.tokenizer, texts), MAX_NEW_TOKENS, eos
    )
    return [
        {
            "completion": completion_text(loaded.tokenizer, out),
            "tokens": len(out) + (len(out) < MAX_NEW_TOKENS),
        }
        for out in outputs
    ]


def _serve(
    workdir: Path,
    model: Path,
    flags: list[str],
    sglang_args: list[str],
    expected: list[dict[str, Any]],
) -> Iterator[Served]:
    process, server = start_brisk_serve(workdir, model, ["--device", "cpu", *flags], sglang_args)
    try:
        yield Served(process, server, expected)
    finally:
        process.stop()


@pytest.fixture(scope="module")
def isd_server(
    idlm: Path, brisk_decode: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    yield from _serve(
        tmp_path_factory.mktemp("isd"),
        idlm,
        ["--stride", str(STRIDE)],
        ["--max-running-requests", "16"],
        brisk_decode,
    )


@pytest.fixture(scope="module")
def plain_server(
    idlm: Path,
    texts: list[str],
    brisk_decode: list[dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    expected = greedy_ar(idlm, texts)
    # ISD is exact: brisk decode's greedy ISD is greedy AR, so both references agree
    assert [(e["completion"], e["tokens"]) for e in expected] == [
        (r["completion"], r["tokens"]) for r in brisk_decode
    ]
    yield from _serve(tmp_path_factory.mktemp("plain"), idlm, [], ["--trust-remote-code"], expected)


SERVERS = ["isd_server", "plain_server"]


def served(request: pytest.FixtureRequest, name: str) -> Served:
    return request.getfixturevalue(name)  # type: ignore[no-any-return]


def model_name(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as response:
        return str(json.loads(response.read())["data"][0]["id"])


@pytest.mark.parametrize("name", SERVERS)
def test_text_prompts_come_back_as_brisk_decode_decodes_them(
    request: pytest.FixtureRequest, name: str, texts: list[str]
) -> None:
    from openai import OpenAI

    s = served(request, name)
    want = [(e["completion"], e["tokens"]) for e in s.expected]
    params = {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS}
    answers = post_json(s.server.url, "/generate", {"text": texts, "sampling_params": params})
    assert [(a["text"], a["meta_info"]["completion_tokens"]) for a in answers] == want
    model = model_name(s.server.url)
    body = {"model": model, "prompt": texts, "max_tokens": MAX_NEW_TOKENS, "temperature": 0}
    completions = post_json(s.server.url, "/v1/completions", body)
    choices = sorted(completions["choices"], key=lambda c: c["index"])
    assert [c["text"] for c in choices] == [text for text, _ in want]
    assert completions["usage"]["completion_tokens"] == sum(n for _, n in want)
    client = OpenAI(base_url=f"{s.server.url}/v1", api_key="unused", timeout=60)
    for text, (completion, tokens) in zip(texts, want, strict=True):
        got = client.completions.create(
            model=model, prompt=text, max_tokens=MAX_NEW_TOKENS, temperature=0
        )
        assert (got.choices[0].text, got.usage.completion_tokens) == (completion, tokens)


def test_isd_serves_the_forwards_brisk_decode_takes(isd_server: Served, texts: list[str]) -> None:
    """Not only the same tokens: the same verify rounds and accepted drafts per prompt, so the
    server runs ISD on the causal model as ``brisk decode`` does."""
    params = {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS}
    answers = post_json(
        isd_server.server.url, "/generate", {"text": texts, "sampling_params": params}
    )
    for i, (row, answer) in enumerate(zip(isd_server.expected, answers, strict=True)):
        meta = answer["meta_info"]
        assert meta["spec_verify_ct"] + 1 == row["forwards"], f"prompt {i}: forwards"
        accepted = sum(L * n for L, n in enumerate(row["accept_hist"]))
        assert meta["spec_num_correct_drafts"] == accepted, f"prompt {i}: accepted drafts"


PAD_ROW = [0.0] * 64  # the micro model's hidden size

# (path, body, the HTTP status, what the answer's message says)
BAD = [
    (
        "/generate",
        {"input_ids": [1, 500]},
        "input_ids: token id 500 at position 1 is outside the vocabulary [0, 101)",
    ),
    (
        "/generate",
        {"input_ids": [1, -5]},
        "input_ids: token id -5 at position 1 is outside the vocabulary [0, 101)",
    ),
    (
        "/generate",
        {"input_ids": [1, 23, 101]},  # a padding row of the embedding: no token's
        "input_ids: token id 101 at position 2 is outside the vocabulary [0, 101)",
    ),
    ("/generate", {"input_ids": [[1, 23], [1, 500]]}, "token id 500 at position 1"),
    ("/v1/completions", {"prompt": [1, 500]}, "token id 500 at position 1"),
    ("/generate", {"input_embeds": [[0.1, 0.2]]}, "input_embeds: "),
    ("/generate", {"input_embeds": [PAD_ROW, [0.3]]}, "input_embeds: "),
    ("/generate", {"input_embeds": []}, "input_embeds: expected non-empty"),
    (
        "/generate",
        {"input_embeds": [PAD_ROW]},
        "input_embeds: this server computes in float32 and SGLang passes input_embeds",
    ),
    (
        "/generate",
        {"input_ids": [1, 23], "return_logprob": True, "top_logprobs_num": 5000},
        "top_logprobs_num: 5000 exceeds the vocabulary of 101",
    ),
    # what killed, hung or broke the server (issue 40), each now a 400 naming the field
    (
        "/generate",
        {"text": "Q: 4+7=?\n", "sampling_params": {"max_new_tokens": 4, "top_k": 2147483648}},
        "top_k: 2147483648 is past 1073741824",
    ),
    ("/v1/completions", {"prompt": "Q: 4+7=?\n", "top_k": 2**63}, "top_k: 9223372036854775808"),
    (
        "/generate",
        {"text": "Q", "sampling_params": {"max_new_tokens": 4, "temperature": 0, "n": 10**6}},
        "n: 1000000 completions; one request may ask for at most 1024",
    ),
    ("/v1/completions", {"prompt": "Q", "n": 100000}, "n: 100000 completions"),
    ("/generate", {"text": "Q", "sampling_params": [{"max_new_tokens": 4}]}, "sampling_params: "),
    (
        "/generate",
        {"text": "Q", "sampling_params": {"temperature": 0, "stop_regex": "("}},
        "stop_regex: '(' is not a regular expression",
    ),
    ("/generate", {"text": ["a", "b"], "sampling_params": {"n": 0}}, "n: 0 completions"),
    ("/generate", {"text": "Q", "rid": ["x"]}, "rid: one prompt takes one request id"),
    ("/generate", {"text": "Q", "sampling_params": {"max_new_tokens": True}}, "max_new_tokens: "),
    # SGLang's own refusals, kept
    ("/generate", {"input_ids": []}, "input_ids cannot be empty"),
    ("/generate", {"input_ids": [1, 23], "max_new_tokens": 500}, "maximum context length"),
]


def post_bad(url: str, model: str, path: str, body: dict[str, Any]) -> tuple[int, str]:
    """``body`` sent greedy with a small budget; the HTTP status and the answer."""
    if path == "/v1/completions":
        body = {"model": model, "max_tokens": 4, "temperature": 0, **body}
    else:
        tokens = body.pop("max_new_tokens", 4)
        body = {"sampling_params": {"temperature": 0, "max_new_tokens": tokens}, **body}
    try:
        return 200, json.dumps(post_json(url, path, body))
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.mark.parametrize("name", SERVERS)
def test_requests_a_forward_cannot_take_are_refused_and_the_server_keeps_serving(
    request: pytest.FixtureRequest, name: str, texts: list[str]
) -> None:
    s = served(request, name)
    url, model = s.server.url, model_name(s.server.url)
    params = {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS}

    def good(i: int) -> tuple[str, int]:
        answer = post_json(url, "/generate", {"text": texts[i], "sampling_params": params})
        return answer["text"], answer["meta_info"]["completion_tokens"]

    with ThreadPoolExecutor(8) as pool:  # bad requests among good ones, all in flight together
        goods = [pool.submit(good, i) for i in range(len(texts))]
        bads = [pool.submit(post_bad, url, model, path, dict(body)) for path, body, _ in BAD]
        good_answers = [f.result() for f in goods]
        bad_answers = [f.result() for f in bads]
    for (path, body, message), (status, answer) in zip(BAD, bad_answers, strict=True):
        assert status == 400, f"{path} {body}: {status} {answer}"
        assert message in answer, f"{path} {body}: {answer}"
    assert good_answers == [(e["completion"], e["tokens"]) for e in s.expected]
    assert s.process.process is not None
    assert s.process.process.poll() is None, "the server exited"
    assert good(0) == (s.expected[0]["completion"], s.expected[0]["tokens"])
    assert "Scheduler hit an exception" not in s.server.log.read_text()


@pytest.mark.parametrize("raw", [b"true", b"[1, 2]", b"5", b'"text"'])
def test_a_body_that_is_not_a_json_object_is_a_400_naming_the_body(
    isd_server: Served, raw: bytes
) -> None:
    """A bare ``true`` to ``/v1/chat/completions`` was a 500 (the OpenAI model's validator
    called ``.get`` on it); every generation route now answers a non-object body with a 400."""
    import urllib.request

    for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
        request = urllib.request.Request(
            isd_server.server.url + path, data=raw, headers={"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 400, path
        assert "body: expected a JSON object" in refused.value.read().decode(), path


FUZZ_REQUESTS = 120  # the short form; benchmarks/fuzz_server.py runs the long one
FUZZ_BUDGET_S = 50.0


def test_fuzzed_requests_are_answered_or_refused_naming_the_field(
    isd_server: Served, texts: list[str]
) -> None:
    """Hypothesis-drawn bodies for the three generation routes (:mod:`tests.serving.fuzz`):
    every one a 200 that parses or a 4xx naming a field, ``/health`` after every ten, and a
    greedy request afterwards still ``brisk decode``'s answer; nothing in the scheduler raised."""
    from tests.serving.fuzz import fuzz

    url = isd_server.server.url
    tally = fuzz(url, 101, model_name(url), requests=FUZZ_REQUESTS, seed=0, budget_s=FUZZ_BUDGET_S)
    assert tally.failures == [], "\n".join(tally.failures[:10])
    assert tally.requests >= 30, tally.to_dict()
    assert tally.statuses[200] > 0, tally.to_dict()
    assert tally.statuses[400] > 0, tally.to_dict()
    params = {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS}
    answer = post_json(url, "/generate", {"text": texts[0], "sampling_params": params})
    want = isd_server.expected[0]
    assert (answer["text"], answer["meta_info"]["completion_tokens"]) == (
        want["completion"],
        want["tokens"],
    )
    assert "Scheduler hit an exception" not in isd_server.server.log.read_text()
