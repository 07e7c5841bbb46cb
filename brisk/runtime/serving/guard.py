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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any

__all__ = ["Limits", "check_inputs", "request_problem", "validate_request"]


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


def check_inputs(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """``GenerateReqInput.normalize_batch_and_arguments`` refusing ``input_embeds`` it would
    index out of range (AROUND hook): ``[]``, ``[[]]`` or a non-list are a ``ValueError`` (a
    400) instead of an ``IndexError`` (a 500). Their sizes are :func:`validate_request`'s."""
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


def _has_media(obj: Any) -> bool:
    contains = getattr(obj, "contains_mm_input", None)
    return bool(contains()) if callable(contains) else False
