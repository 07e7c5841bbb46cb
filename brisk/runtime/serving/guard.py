"""What a request may put into a forward: checked in SGLang's HTTP server, refused with a 400.

SGLang 0.5.23 checks a request's lengths against the context (prompt, and prompt +
``max_new_tokens``), its sampling parameters, ``logit_bias`` keys and ``token_ids_logprob``, but
not what the forward indexes with. Measured on its CPU server, each of these ended the scheduler
(an exception in the forward) and with it every server process and every request in flight:

- a token id outside the vocabulary: the embedding lookup (ids past the padded table, or
  negative; ids between the vocabulary and the padding read rows no token has);
- a prompt with no tokens (text that tokenizes to nothing, ``""`` without a BOS): the logits of
  a last position that does not exist;
- ``input_embeds`` rows that are not the model's hidden size, or ragged;
- ``input_embeds`` of any shape on a server that does not compute in bfloat16 (the CPU's
  float32): SGLang hands them to the model in bfloat16 (``ModelRunner._extend_forward_kwargs``)
  and the first matrix product fails on the mixed dtypes;
- ``top_logprobs_num`` above the vocabulary: top-k over more entries than there are.

:func:`request_problem` says what is wrong with one request (None when nothing is), in one line
naming the field. The plugin's hooks run it where SGLang validates requests, in the process that
serves HTTP, so the message comes back as the 400's error and the scheduler never sees the
request: :func:`validate_request` around ``TokenizerManager._validate_one_request`` (every
request of ``/generate``, ``/v1/completions`` and ``/v1/chat/completions``, after tokenization,
one by one in a batch), and :func:`check_inputs` around ``GenerateReqInput``'s normalization,
which indexes ``input_embeds`` before anything validates it (an empty one was a 500).

What a request asks of the sampler and the batch is checked there too, before SGLang expands it
(:func:`request_shape_problem`, :func:`sampling_problem`), because some of it SGLang checks
only after the scheduler has built the batch, or never (found by a fuzzer, issue 40):

- ``top_k`` past ``int32`` (``2147483648``; ``9223372036854775808`` on ``/v1/completions``)
  ended the scheduler while it built the sampling tensors: every server process died;
- ``n`` of 100,000 or 1,000,000 expanded the request into that many copies in the HTTP process:
  no answer, ``/health`` timed out, the server grew ~1 GiB every 10 s;
- ``sampling_params`` as a list for one prompt, ``rid`` as a list, a batch with ``n: 0``, an
  invalid ``stop_regex`` (``"("``: a 500 from ``re.error``; streamed, a 200 whose stream broke)
  and a JSON body that is not an object on the OpenAI routes were 500s.

Each is now a 400 whose message names the field (a streamed request's error arrives as the
stream's error event, SGLang's way).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any

__all__ = [
    "MAX_COMPLETIONS",
    "MAX_TOP_K",
    "Limits",
    "check_body",
    "check_inputs",
    "generate_contract",
    "request_problem",
    "request_shape_problem",
    "sampling_problem",
    "validate_request",
]

MAX_COMPLETIONS = 1024  # completions one request may ask for: prompts × n
MAX_TOP_K = 1 << 30  # SGLang's TOP_K_ALL: what -1 (every token) becomes; int32 beyond
_INTS = ("n", "top_k", "max_new_tokens", "min_new_tokens", "sampling_seed")
_I64 = (-(2**63), 2**63 - 1)
_FLOATS = (
    "temperature",
    "top_p",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)
_BOOLS = ("ignore_eos", "skip_special_tokens", "no_stop_trim", "spaces_between_special_tokens")
_GENERATION_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")


@dataclass(frozen=True)
class Limits:
    """What the served model admits: its vocabulary (unpadded), hidden size and the dtype it
    computes in (``"bfloat16"``, as SGLang's ``--dtype`` spells it)."""

    vocab_size: int
    hidden_size: int
    dtype: str = "bfloat16"


def request_problem(
    input_ids: Sequence[Any] | None,
    input_embeds: Sequence[Any] | None,
    limits: Limits,
    top_logprobs_num: int | None = None,
    continues_session: bool = False,
) -> str | None:
    """Why one request (its tokenized prompt ``input_ids``, or ``input_embeds`` rows) cannot go
    into a forward of the model with ``limits``, or None. A request that ``continues_session``
    may bring no tokens of its own (the session's history is its prompt).

    >>> lim = Limits(vocab_size=101, hidden_size=4)
    >>> request_problem([1, 5], None, lim) is None
    True
    >>> request_problem([1, 500], None, lim)
    'input_ids: token id 500 at position 1 is outside the vocabulary [0, 101)'
    >>> request_problem([], None, lim)
    'input_ids: the prompt has no tokens'
    >>> request_problem(None, [[0.0, 0.0]], lim)
    'input_embeds: row 0 has 2 values; the model takes rows of its hidden size, 4'
    >>> request_problem(None, [[0.0] * 4], Limits(101, 4, "float32"))[:48]
    'input_embeds: this server computes in float32 an'
    """
    if input_embeds is not None:
        if limits.dtype != "bfloat16":
            return (
                f"input_embeds: this server computes in {limits.dtype} and SGLang passes "
                "input_embeds to the model in bfloat16; send input_ids or text"
            )
        problem = _embeds_problem(input_embeds, limits.hidden_size)
        if problem is not None:
            return problem
    elif input_ids is not None:
        if len(input_ids) == 0 and not continues_session:
            return "input_ids: the prompt has no tokens"
        for position, token in enumerate(input_ids):
            if isinstance(token, bool) or not isinstance(token, int):
                return f"input_ids: position {position} holds {token!r}, not a token id"
            if not 0 <= token < limits.vocab_size:
                return (
                    f"input_ids: token id {token} at position {position} is outside the "
                    f"vocabulary [0, {limits.vocab_size})"
                )
    if top_logprobs_num is not None and top_logprobs_num > limits.vocab_size:
        return f"top_logprobs_num: {top_logprobs_num} exceeds the vocabulary of {limits.vocab_size}"
    return None


def _embeds_problem(rows: Any, hidden_size: int) -> str | None:
    """Why ``rows`` are not ``[tokens, hidden_size]`` numbers, or None."""
    if not isinstance(rows, list) or not rows:
        return "input_embeds: the prompt has no rows (expected [tokens, hidden size])"
    for i, row in enumerate(rows):
        if not isinstance(row, list):
            return f"input_embeds: row {i} is not a list of numbers"
        if len(row) != hidden_size:
            return (
                f"input_embeds: row {i} has {len(row)} values; the model takes rows of its "
                f"hidden size, {hidden_size}"
            )
        if not all(isinstance(x, Real) and not isinstance(x, bool) for x in row):
            return f"input_embeds: row {i} holds something other than numbers"
    return None


def validate_request(original: Any, self: Any, obj: Any, input_ids: Any) -> Any:
    """``TokenizerManager._validate_one_request`` with :func:`request_problem` first (AROUND
    hook): a problem is the ``ValueError`` SGLang's HTTP server answers with a 400.

    A multimodal model's requests with media are left to SGLang: its processors put
    placeholder ids past the vocabulary into the prompt on purpose."""
    if not (getattr(self, "mm_processor", None) is not None and _has_media(obj)):
        config = self.model_config
        dtype = str(getattr(config, "dtype", "bfloat16")).removeprefix("torch.")
        limits = Limits(int(config.vocab_size), int(config.hidden_size), dtype)
        top = getattr(obj, "top_logprobs_num", None)
        asked = top if getattr(obj, "return_logprob", False) and isinstance(top, int) else None
        session = getattr(obj, "session_params", None)
        continues = isinstance(session, dict) and bool(session.get("id"))
        embeds = getattr(obj, "input_embeds", None)
        problem = request_problem(input_ids, embeds, limits, asked, continues)
        if problem is not None:
            raise ValueError(problem)
    return original(self, obj, input_ids)


def _prompts(obj: Any) -> int | None:
    """How many prompts a request holds (None: one, not a batch)."""
    text, ids = getattr(obj, "text", None), getattr(obj, "input_ids", None)
    if isinstance(text, list):
        return len(text)
    if text is None and isinstance(ids, list) and ids and isinstance(ids[0], list):
        return len(ids)
    embeds = getattr(obj, "input_embeds", None)
    if text is None and ids is None and isinstance(embeds, list) and embeds:
        first = embeds[0]
        if isinstance(first, list) and first and isinstance(first[0], list):
            return len(embeds)
    return None


def request_shape_problem(obj: Any) -> str | None:
    """Why a ``GenerateReqInput``'s ``sampling_params``, ``rid`` or completion count do not fit
    its prompts (one, or a batch), or None; then :func:`sampling_problem` of each parameter set.

    >>> from types import SimpleNamespace as R
    >>> request_shape_problem(R(text="7+5=", sampling_params=[{}], rid=None))
    'sampling_params: one prompt takes one object of parameters, got a list'
    >>> request_shape_problem(R(text=["a", "b"], sampling_params={"n": 600}, rid=None))
    'n: 2 prompts × n = 600 ask for 1200 completions; one request may ask for at most 1024'
    >>> request_shape_problem(R(text="a", sampling_params=None, rid=["x"]))
    'rid: one prompt takes one request id (a string), got a list'
    """
    prompts = _prompts(obj)
    params = getattr(obj, "sampling_params", None)
    rid = getattr(obj, "rid", None)
    if params is None:
        sets: list[Any] = []
    elif isinstance(params, dict):
        sets = [params]
    elif isinstance(params, list) and prompts is not None:
        if len(params) != prompts:
            return (
                f"sampling_params: {len(params)} objects of parameters for {prompts} prompts "
                "(one object, or one per prompt)"
            )
        sets = params
    elif isinstance(params, list):
        return "sampling_params: one prompt takes one object of parameters, got a list"
    else:
        return f"sampling_params: expected an object of parameters, got {_kind(params)}"
    for i, one in enumerate(sets):
        if not isinstance(one, dict):
            return f"sampling_params: entry {i} is {_kind(one)}, not an object of parameters"
        problem = sampling_problem(one)
        if problem is not None:
            return problem
    if rid is not None:
        if prompts is None and not isinstance(rid, str):
            return f"rid: one prompt takes one request id (a string), got {_kind(rid)}"
        if prompts is not None and not isinstance(rid, str):
            if not isinstance(rid, list) or not all(isinstance(r, str) for r in rid):
                return f"rid: expected a string or a list of strings, got {_kind(rid)}"
            if len(rid) != prompts:
                return f"rid: {len(rid)} request ids for {prompts} prompts"
    n = sets[0].get("n", 1) if sets else 1
    if prompts is not None and prompts * n > MAX_COMPLETIONS:
        return (
            f"n: {prompts} prompts × n = {n} ask for {prompts * n} completions; one request "
            f"may ask for at most {MAX_COMPLETIONS}"
        )
    return None


def sampling_problem(params: dict[str, Any]) -> str | None:
    """Why one object of sampling parameters cannot be served, or None: the counts are
    integers (within 64 bits), the rates numbers, the switches booleans, ``n`` in
    [1, :data:`MAX_COMPLETIONS`], ``top_k`` −1 or in [1, :data:`MAX_TOP_K`],
    ``stop`` and ``stop_regex`` strings (or lists of them) and every ``stop_regex`` a regular
    expression. SGLang's own checks (ranges of temperature, top_p, penalties, …) follow.

    >>> sampling_problem({"top_k": 2147483648})
    'top_k: 2147483648 is past 1073741824 (every token; -1 says so)'
    >>> sampling_problem({"n": 100000})
    'n: 100000 completions; one request may ask for at most 1024'
    >>> sampling_problem({"stop_regex": "("})
    "stop_regex: '(' is not a regular expression (missing ), unterminated subpattern at position 0)"
    """
    for name in _INTS:
        value = params.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return f"{name}: expected an integer, got {value!r}"
        if value is not None and not _I64[0] <= value <= _I64[1]:
            return f"{name}: {value} is outside the 64-bit integers"
    for name in _FLOATS:
        value = params.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, Real)):
            return f"{name}: expected a number, got {value!r}"
    for name in _BOOLS:
        value = params.get(name)
        if value is not None and not isinstance(value, bool):
            return f"{name}: expected true or false, got {value!r}"
    bias = params.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            return f"logit_bias: expected an object of token id → bias, got {_kind(bias)}"
        for key, value in bias.items():
            if not re.fullmatch(r"-?\d+", str(key)):
                return f"logit_bias: key {key!r} is not a token id"
            if isinstance(value, bool) or not isinstance(value, Real):
                return f"logit_bias: the bias of token {key} is {value!r}, not a number"
    n = params.get("n")
    if n is not None and not 1 <= n <= MAX_COMPLETIONS:
        if n < 1:
            return f"n: {n} completions; ask for at least 1"
        return f"n: {n} completions; one request may ask for at most {MAX_COMPLETIONS}"
    top_k = params.get("top_k")
    if top_k is not None and top_k != -1 and not 1 <= top_k <= MAX_TOP_K:
        if top_k > MAX_TOP_K:
            return f"top_k: {top_k} is past {MAX_TOP_K} (every token; -1 says so)"
        return f"top_k: must be -1 (every token) or at least 1, got {top_k}"
    for name in ("stop", "stop_regex"):
        value = params.get(name)
        if value is None:
            continue
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            return f"{name}: expected a string or a list of strings, got {_kind(value)}"
        if name == "stop_regex":
            for pattern in items:
                try:
                    re.compile(pattern)
                except re.error as err:
                    return f"stop_regex: {pattern!r} is not a regular expression ({err})"
    return None


def _kind(value: Any) -> str:
    """A JSON value's kind, for a message."""
    names = {bool: "a boolean", str: "a string", list: "a list", dict: "an object"}
    for t, name in names.items():
        if isinstance(value, t):
            return name
    if value is None:
        return "null"
    return "a number" if isinstance(value, Real) else type(value).__name__


def check_inputs(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """``GenerateReqInput.normalize_batch_and_arguments`` refusing what it would expand or index
    wrongly (AROUND hook): :func:`request_shape_problem`, and ``input_embeds`` of ``[]``,
    ``[[]]`` or a non-list, each a ``ValueError`` (a 400) instead of a hang or a 500. The
    embeddings' sizes are :func:`validate_request`'s."""
    problem = request_shape_problem(self)
    if problem is not None:
        raise ValueError(problem)
    embeds = getattr(self, "input_embeds", None)
    if (
        embeds is not None
        and getattr(self, "text", None) is None
        and (getattr(self, "input_ids", None) is None)
    ):
        first = embeds
        for _ in range(2):  # [tokens, hidden] or [batch, tokens, hidden]: two levels to look at
            if not isinstance(first, list) or not first:
                raise ValueError(
                    "input_embeds: expected non-empty [tokens, hidden size] rows of numbers "
                    "(or a batch of them)"
                )
            first = first[0]
    return original(self, *args, **kwargs)


def generate_contract(original: Any, body: Any) -> Any:
    """SGLang's ``/generate`` body contract (``generate_contract_error``, AROUND hook) with
    :func:`request_shape_problem` first, on the parsed body: its schema check answers a
    ``max_new_tokens`` of ``true`` with "invalid type: boolean `true`, expected i64", which names
    no field; brisk's message names it (and the checks SGLang makes later come first)."""
    if isinstance(body, dict):
        from types import SimpleNamespace

        fields = ("text", "input_ids", "input_embeds", "sampling_params", "rid")
        problem = request_shape_problem(SimpleNamespace(**{k: body.get(k) for k in fields}))
        if problem is not None:
            return problem
    return original(body)


async def check_body(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """SGLang's request body parser (``ORJSONRequest.json``, AROUND hook) refusing a body that
    is not a JSON object on the generation routes: a 400 naming the body, where the OpenAI
    models' validators raised ``AttributeError`` (a 500) on ``true``, a list or a number."""
    body = await original(self, *args, **kwargs)
    path = str(getattr(getattr(self, "url", None), "path", ""))
    if path in _GENERATION_PATHS and not isinstance(body, dict):
        from fastapi import HTTPException

        raise HTTPException(
            status_code=400, detail=f"body: expected a JSON object, got {_kind(body)}"
        )
    return body


def _has_media(obj: Any) -> bool:
    contains = getattr(obj, "contains_mm_input", None)
    return bool(contains()) if callable(contains) else False
