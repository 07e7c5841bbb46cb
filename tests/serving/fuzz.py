"""A request fuzzer for a running server: Hypothesis draws bodies for ``/generate``,
``/v1/completions`` and ``/v1/chat/completions`` (text and token ids, one prompt or a batch,
every sampling parameter at and past its edges, stop strings and regexes, logprobs, streaming
with the stream dropped after its first chunk, ids and ``rid``s of every JSON kind) and
:func:`send` checks each answer: a 200 with a body that parses (a stream of ``data:`` events),
or a 4xx whose message names what is wrong. Never a 5xx, never a dropped connection, never a
hang (every request is bounded in time). :func:`fuzz` runs a bounded number of them and checks
``/health`` after every batch; ``tests/serving`` runs a short form against the ISD server and
the served drafter, ``benchmarks/fuzz_server.py`` a long one.
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
TIMEOUT_S = 60.0

# values at and past each parameter's edges (SGLang's ranges, int32, int64, wrong JSON kinds)
BIG = [2**31 - 1, 2**31, 2**63 - 1, 2**63, 10**6]
EDGES: dict[str, list[Any]] = {
    "max_new_tokens": [0, 1, 2, 4, -1, 1.5, "4", None, True, *BIG],
    "min_new_tokens": [0, 1, 3, -1, 100],
    "temperature": [0, 0.0, 1e-9, 0.7, 1.0, 2.0, -1, -1e-9, 1e30, "0", None],
    "top_k": [-1, 0, 1, 2, 2**30, *BIG, -(2**31), "1", 1.5],
    "top_p": [0, 1e-9, 0.5, 1, 1.0000001, -0.5, 2],
    "min_p": [0, 0.5, 1, -1, 2],
    "n": [0, 1, 2, 3, -1, True, 1.5, "2", 100, *BIG],
    "frequency_penalty": [0, 2, -2, 2.5, -3],
    "presence_penalty": [0, 2, -2.5],
    "repetition_penalty": [0, 1, 2, 2.1, -1],
    "stop": ["\n", "", "=", ["a", "b"], ["\xe9"], "\U0001f600", 5, [5], [""] * 3],
    "stop_regex": ["(", "[", "\\d", "a+", ["x", "("], "", 7],
    "ignore_eos": [True, False, "yes"],
    "skip_special_tokens": [True, False],
    "no_stop_trim": [True, False],
    "seed": [0, 1, -1, 2**64, "s"],
    "sampling_seed": [0, 2**63 - 1, 2**63, -(2**63) - 1, 1.5],
    "logit_bias": [{"5": 1.0}, {"-1": 1.0}, {"100000": 5.0}, {"x": 1}, []],
}
FAST = {"max_new_tokens": 4}  # the budget when a body leaves it out: the fuzzer stays quick


def texts() -> st.SearchStrategy[str]:
    alphabet = st.sampled_from([*"0123456789+-=?Q: \n", "é", "\U0001f600", "\x00", "<"])
    return st.text(alphabet, min_size=0, max_size=12)


def token_ids(vocab: int) -> st.SearchStrategy[list[int]]:
    edge = st.sampled_from([0, 1, vocab - 1, vocab, -1, 2**31, 2**63])
    return st.lists(st.one_of(st.integers(0, vocab - 1), edge), min_size=0, max_size=8)


def params() -> st.SearchStrategy[dict[str, Any]]:
    """Sampling parameters: a few of them, each at an edge value or a valid one."""
    names = sorted(EDGES)
    return st.dictionaries(st.sampled_from(names), st.none(), min_size=0, max_size=4).flatmap(
        lambda keys: st.fixed_dictionaries({k: st.sampled_from(EDGES[k]) for k in keys})
    )


@st.composite
def bodies(draw: st.DrawFn, vocab: int, model: str) -> tuple[str, dict[str, Any], bool]:
    """``(path, body, drop)``: a request and whether to drop its stream after one chunk."""
    path = draw(st.sampled_from(PATHS))
    sampling = {**FAST, **draw(params())}
    stream = draw(st.booleans())
    drop = stream and draw(st.booleans())
    batch = draw(st.integers(1, 3))
    if path == "/generate":
        if draw(st.booleans()):
            prompt: Any = draw(st.lists(texts(), min_size=batch, max_size=batch))
            key = "text"
        else:
            prompt = draw(st.lists(token_ids(vocab), min_size=batch, max_size=batch))
            key = "input_ids"
        if batch == 1 and draw(st.booleans()):
            prompt = prompt[0]
        body: dict[str, Any] = {key: prompt, "sampling_params": sampling, "stream": stream}
        if draw(st.booleans()):
            body["return_logprob"] = True
            body["top_logprobs_num"] = draw(st.sampled_from([0, 1, 5, vocab, vocab + 1, -1]))
        if draw(st.integers(0, 9)) == 0:
            body["rid"] = draw(st.sampled_from(["r", ["r"], ["r", "s"], 5, None, ["r", "r"]]))
        if draw(st.integers(0, 9)) == 0:
            body["sampling_params"] = draw(st.sampled_from([[sampling], [], "x", 5, [1, 2]]))
        return path, body, drop
    openai = _openai_params(sampling)
    if path == "/v1/completions":
        prompt = draw(st.one_of(texts(), token_ids(vocab), st.lists(texts(), min_size=1)))
        body = {"model": model, "prompt": prompt, **openai, "stream": stream}
        if draw(st.booleans()):
            body["logprobs"] = draw(st.sampled_from([0, 1, 5, 20, -1]))
        if draw(st.booleans()):
            body["echo"] = True
    else:
        content = draw(texts())
        role = draw(st.sampled_from(["user", "user", "system", "assistant", "tool", "x"]))
        body = {
            "model": model,
            "messages": [{"role": role, "content": content}],
            **openai,
            "stream": stream,
        }
        if draw(st.booleans()):
            body["logprobs"] = True
            body["top_logprobs"] = draw(st.sampled_from([0, 1, 5, 20, 21]))
    return path, body, drop


def _openai_params(sampling: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI spelling of sampling parameters (``max_tokens``; SGLang's extras as they are)."""
    out = dict(sampling)
    if "max_new_tokens" in out:
        out["max_tokens"] = out.pop("max_new_tokens")
    return out


@dataclass
class Tally:
    """What a fuzz run answered: counts by status, and the 4xx by the field they name."""

    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    dropped_streams: int = 0
    failures: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "refused_by_field": dict(self.refused.most_common()),
            "dropped_streams": self.dropped_streams,
            "failures": self.failures,
        }


_FIELD = re.compile(r"^([A-Za-z_][\w.\[\]]*)(?::| must| cannot| should| is| has| exceeds)")


def named_field(message: str) -> str | None:
    """The field a refusal's message starts with (``top_k: ...``, ``top_p must be ...``), or the
    one SGLang's known messages name; None when it names none."""
    found = _FIELD.match(message.strip())
    if found:
        return found.group(1)
    quoted = re.search(r"(?:unknown field|missing field|field) `(\w+)`", message)
    if quoted:  # SGLang's /generate schema check (serde): "unknown field `seed`, expected ..."
        return quoted.group(1)
    known = {
        "maximum context length": "max_new_tokens",
        "Input length": "prompt",
        "input_ids cannot be empty": "input_ids",
        "JSON decode error": "body",
        "chat_template": "messages",
        "Duplicate request IDs": "rid",
        "parallel_sample_num": "n",
        "validation error": "body",
        "Field required": "body",
        "Input should be": "body",
        "logprobs": "logprobs",
    }
    for needle, name in known.items():
        if needle in message:
            return name
    return None


def send(url: str, path: str, body: dict[str, Any], drop: bool, tally: Tally) -> None:
    """One request; what it answered goes into ``tally`` (a failure: a 5xx, a 4xx naming no
    field, a 200 whose body does not parse, a connection error or a timeout)."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(
        url + path, data=data, headers={"Content-Type": "application/json"}
    )
    tally.requests += 1
    shown = json.dumps(body)[:300]
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            tally.statuses[response.status] += 1
            if body.get("stream") is True:
                if drop:
                    response.readline()
                    tally.dropped_streams += 1
                    return  # closing the connection drops the stream
                _check_stream(response.read().decode(), path, shown, tally)
            else:
                json.loads(response.read())
    except urllib.error.HTTPError as err:
        tally.statuses[err.code] += 1
        text = err.read().decode(errors="replace")
        message = _message(text)
        if err.code >= 500:
            tally.failures.append(f"{path} {shown}: {err.code} {text[:300]}")
        elif err.code >= 400:
            name = named_field(message)
            if name is None:
                tally.failures.append(f"{path} {shown}: {err.code} names no field: {message}")
            tally.refused[name or "?"] += 1
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
        tally.failures.append(f"{path} {shown}: {type(err).__name__}: {err}")


def _message(text: str) -> str:
    try:
        answer = json.loads(text)
    except ValueError:
        return text
    if isinstance(answer, dict):
        error = answer.get("error")
        if isinstance(error, str):
            return error
        if isinstance(error, dict):
            return str(error.get("message", ""))
        if "message" in answer:
            return str(answer["message"])
        if "detail" in answer:
            return str(answer["detail"])
    return text


def _check_stream(text: str, path: str, shown: str, tally: Tally) -> None:
    """A stream's events: each ``data:`` line JSON or ``[DONE]``; an error event must name a
    field, as a refused request's message does."""
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        payload = line.removeprefix("data:").strip()
        if payload == "[DONE]":
            continue
        event = json.loads(payload)
        if isinstance(event, dict) and isinstance(event.get("error"), dict):
            message = str(event["error"].get("message", ""))
            code = int(event["error"].get("code", 400))
            if code >= 500 or named_field(message) is None:
                tally.failures.append(f"{path} {shown}: stream error {code}: {message}")
            else:
                tally.refused[named_field(message) or "?"] += 1


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=30) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def fuzz(
    url: str, vocab: int, model: str, *, requests: int, seed: int, budget_s: float, batch: int = 10
) -> Tally:
    """``requests`` fuzzed requests (fewer when ``budget_s`` runs out), drawn with ``seed``, one
    at a time; ``/health`` after every ``batch`` of them (a failure when it does not answer)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as seeded

    tally = Tally()
    start = time.monotonic()

    @seeded(seed)
    @settings(
        max_examples=requests,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(bodies(vocab, model))
    def one(drawn: tuple[str, dict[str, Any], bool]) -> None:
        if time.monotonic() - start > budget_s:
            return
        path, body, drop = drawn
        send(url, path, body, drop, tally)
        if tally.requests % batch == 0 and not healthy(url):
            tally.failures.append(f"/health did not answer after request {tally.requests}")

    one()
    if not healthy(url):
        tally.failures.append("/health did not answer at the end")
    return tally
