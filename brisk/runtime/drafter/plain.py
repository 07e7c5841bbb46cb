"""Plain autoregressive decoding of a causal LM: one token per forward with its KV cache, one
request at a time. It is the baseline every speed-up is measured against (``brisk decode
--plain``, ``brisk bench speed``, the drafter experiment's tok/s ratio), and what greedy
speculative decoding must reproduce token for token.

At T = 0 each token is the argmax of the last position's logits; at T > 0 a draw from
softmax(logits / T) by the runtime's one sampler (:func:`~brisk.runtime.isd.batched.draw_next`)
with the stateless uniform of (seed, request, forward counter) (:mod:`brisk.runtime.sampling`),
so a request's tokens depend neither on the others nor on the device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from brisk.runtime.backbone import cache_keyword
from brisk.runtime.decode_options import LoopOptions, Requests
from brisk.runtime.drafter.result import SDOutput
from brisk.runtime.isd.batched import draw_next
from brisk.runtime.sampling import counter_uniforms

__all__ = ["plain_decode"]


def plain_decode(
    target: Any,
    prompts: Sequence[Sequence[int]],
    options: LoopOptions,
    *,
    seeds: Sequence[int] | None = None,
    budgets: Sequence[int] | None = None,
    on_finish: Callable[[int, SDOutput], None] | None = None,
) -> list[SDOutput]:
    """Every prompt decoded by ``target`` alone (module docstring), up to its budget
    (``budgets[r]``, default ``options.max_new_tokens``) or the EOS, which is kept; the
    requests are checked as every loop checks them
    (:class:`~brisk.runtime.decode_options.Requests`). Each output counts one target forward per
    token (the prefill commits the first) and no verify round; ``on_finish(r, output)`` runs as
    request r ends."""
    from transformers import DynamicCache

    requests = Requests.check(prompts, options, seeds=seeds, budgets=budgets)
    seeds, budgets = requests.seeds, requests.budgets
    outputs = []
    with torch.inference_mode():
        for r, prompt in enumerate(prompts):
            key = (torch.tensor([seeds[r]]), torch.tensor([requests.request_ids[r]]))
            cache = DynamicCache(config=target.config)
            kw = {cache_keyword(target): cache, "use_cache": True}
            ids = torch.tensor([list(prompt)], device=target.device)
            output = SDOutput(finished="length")
            while len(output.tokens) < budgets[r]:
                logits = target(input_ids=ids, logits_to_keep=1, **kw).logits[:, -1].float()
                counter = torch.tensor([output.target_forwards])
                u = counter_uniforms(*key, counter, 1)[:, 0].to(logits.device)
                output.target_forwards += 1
                token = draw_next(logits, options.temperature, u)
                output.tokens.append(int(token))
                if int(token) == options.eos_token_id:
                    output.finished = "eos"
                    break
                ids = token[:, None]
            outputs.append(output)
            if on_finish is not None:
                on_finish(r, output)
    return outputs
