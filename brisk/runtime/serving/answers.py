"""A server's answers to a prompts file, one request at a time, as rows ``brisk bench speed``
reads (:mod:`brisk.runtime.speed`) beside ``brisk decode``'s.

Each prompt is encoded as ``brisk decode`` encodes it (:func:`~brisk.runtime.prompts.encode_prompt`:
the tokenizer's BOS in front, no other special token) and sent as ``input_ids`` to ``POST
/generate``, so a server and brisk's loop decode the same tokens. A request's ``wall_s`` is the
client's time from send to answer (one request in flight: the server decodes it alone);
``forwards`` is SGLang's ``spec_verify_ct + 1`` (the verify forwards and the prefill) for a
speculative server and the completion's length for plain decoding. Nothing here imports SGLang:
the client speaks HTTP.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from brisk.runtime.decode_options import LoopOptions
from brisk.runtime.prompts import encode_prompt

__all__ = ["server_answers"]


def server_answers(
    url: str,
    requests: Sequence[dict[str, Any]],
    tokenizer: Any,
    ask: LoopOptions,
    *,
    seed: int = 0,
    timeout_s: float = 600.0,
    on_answer: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per request (``requests``: ``{"prompt", "id"?, "category"?}``, as ``brisk
    decode --prompts`` reads them), in order, each asked for ``ask.max_new_tokens`` tokens at
    ``ask.temperature`` (request r sampled with the seed ``seed + r``). A server that cannot be
    reached, refuses a request or answers without token ids is a ``ValueError`` naming
    ``--url`` and the request."""
    rows = []
    T = ask.temperature
    for r, request in enumerate(requests):
        prompt_ids = encode_prompt(tokenizer, request["prompt"])
        sampling: dict[str, Any] = {"max_new_tokens": ask.max_new_tokens, "temperature": T}
        body: dict[str, Any] = {"input_ids": prompt_ids, "sampling_params": sampling}
        if T > 0:
            body["sampling_params"]["sampling_seed"] = seed + r
        start = time.perf_counter()
        answer = _post(url, body, f"--url: {url}: request {request.get('id', r)}", timeout_s)
        wall = time.perf_counter() - start
        meta = answer.get("meta_info", {})
        output = answer.get("output_ids")
        if not isinstance(output, list):
            raise ValueError(f"--url: {url} answered request {r} without output_ids")
        verify = meta.get("spec_verify_ct")  # absent on a server without speculative decoding
        reason = (meta.get("finish_reason") or {}).get("type")
        eos = tokenizer.eos_token_id
        finished = (
            "eos" if output and output[-1] == eos else ("length" if reason == "length" else reason)
        )
        row: dict[str, Any] = {
            "id": request.get("id", r),
            "sample": 0,
            "decoder": "server",
            "prompt": request["prompt"],
            "prompt_ids": prompt_ids,
            "output_ids": [int(t) for t in output],
            "tokens": len(output),
            "forwards": int(verify) + 1 if verify is not None else len(output),
            "wall_s": wall,
            "finished": finished,  # as brisk decode names it: "eos", "length" (or SGLang's word)
        }
        if "category" in request:
            row["category"] = request["category"]
        rows.append(row)
        if on_answer is not None:
            on_answer(row)
    return rows


def _post(url: str, body: dict[str, Any], where: str, timeout_s: float) -> Any:
    request = urllib.request.Request(
        f"{url.rstrip('/')}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:200]
        raise ValueError(f"{where}: the server answered {err.code}: {detail}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise ValueError(f"{where}: no answer ({reason})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: the answer is not JSON ({err.msg})") from None
