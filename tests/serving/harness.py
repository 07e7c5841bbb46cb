"""SGLang's side of the ``BriskISD`` contract, on CPU, over a brisk backbone.

:class:`ContractRunner` is the model runner: ``forward(forward_batch)`` runs each row's block on
that request's own KV cache (the backbone's, batch 1: the same arithmetic as brisk's reference
ISD) and returns what SGLang's runner returns (``logits_output.full_logits`` and
``hidden_states`` flattened over the batch, ``can_run_graph``). :func:`serve` is the scheduler:
prefill of each prompt but its last token, a batch per forward (requests join at different
forwards, so batches mix fresh and carried rows), the algorithm's committed tokens appended,
the KV cut to ``accept_length`` of the block's slots, the request stopped at its token budget.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from brisk.runtime.backbone import HFBackbone


class ContractRunner:
    def __init__(self, backbone: HFBackbone) -> None:
        self.backbone = backbone
        self.model = backbone.model
        self.caches: dict[int, Any] = {}
        self.rows: list[int] = []  # request of each batch row, set by the scheduler
        self.forwards = 0

    def prefill(self, request: int, prompt: Sequence[int]) -> None:
        cache = self.backbone.new_cache()
        if len(prompt) > 1:
            self.backbone.forward(torch.tensor([list(prompt[:-1])]), cache)
        self.caches[request] = cache

    def length(self, request: int) -> int:
        return self.backbone.cache_length(self.caches[request])

    def keep(self, request: int, before: int, slots: int) -> None:
        self.backbone.trim(self.caches[request], before + slots)

    @torch.inference_mode()
    def forward(self, forward_batch: Any, pp_proxy_tensors: Any = None) -> Any:
        B = forward_batch.batch_size
        ids = forward_batch.input_ids.view(B, -1)
        logits, hidden = [], []
        for i, request in enumerate(self.rows):
            out = self.backbone.forward(ids[i : i + 1].clone(), self.caches[request])
            logits.append(out.logits[0])
            hidden.append(out.hidden[0])
        self.forwards += 1
        full = torch.stack(logits).flatten(0, 1)
        states = torch.stack(hidden).flatten(0, 1)
        return SimpleNamespace(
            logits_output=SimpleNamespace(full_logits=full, hidden_states=states),
            can_run_graph=False,
        )


def serve(
    algorithm: Any,
    backbone: HFBackbone,
    prompts: Sequence[Sequence[int]],
    seeds: Sequence[int],
    keys: Sequence[int],
    max_new_tokens: int,
    shuffle: bool = False,
) -> list[list[int]]:
    """Every prompt's output through ``algorithm.run``; request r joins at forward r. With
    ``shuffle`` the running requests come in a new seeded order at every forward."""
    rng = random.Random(0)
    runner = ContractRunner(backbone)
    outputs: list[list[int]] = [[] for _ in prompts]
    states: dict[int, Any] = {}
    active: list[int] = []
    waiting = list(range(len(prompts)))
    S = algorithm.block_size
    while active or waiting:
        if waiting:  # one new request per forward
            r = waiting.pop(0)
            runner.prefill(r, prompts[r])
            states[r] = None
            active.append(r)
        if shuffle:
            rng.shuffle(active)
        runner.rows = list(active)
        ids = torch.full((len(active), S), algorithm.mask_id, dtype=torch.long)
        for i, r in enumerate(active):
            if states[r] is None:
                ids[i, 0] = prompts[r][-1]
        fb = SimpleNamespace(
            batch_size=len(active),
            input_ids=ids.flatten(),
            sampling_info=SimpleNamespace(sampling_seed=torch.tensor([seeds[r] for r in active])),
            rids=[f"req-{keys[r]}" for r in active],
            req_pool_indices=torch.arange(len(active)),  # pool slots: not the requests' keys
            extend_prefix_lens=torch.tensor([runner.length(r) for r in active]),
            dllm_prompt_mask=None,
        )
        before = {r: runner.length(r) for r in active}
        _, committed, keep, rows, _ = algorithm.run(runner, fb, [states[r] for r in active])
        assert len(committed) == len(keep) == len(rows) == len(active)
        for i, r in enumerate(list(active)):
            runner.keep(r, before[r], keep[i])
            outputs[r].extend(committed[i])
            states[r] = rows[i]
            if len(outputs[r]) >= max_new_tokens:
                outputs[r] = outputs[r][:max_new_tokens]
                active.remove(r)
    return outputs
