"""Held-out evaluation of a base model: answer accuracy of the clean stream, MASK-stream accuracy.

* **Answer accuracy**: plain autoregressive greedy decoding through :class:`Backbone` (KV cache,
  one token per forward), graded by the task's grader (default: normalized answer matching,
  the ``gsm8k`` grader).
* **Proposal accuracy per position**: the MASK stream under the block-diffusion mask of stride
  ``N`` (block size ``M = N − 1``). A block that starts at ``t + 1`` holds MASKs at ``t+1..t+M``
  behind the clean prefix ``x_0[..t]``; slot ``i`` proposes ``x_0[t + i + 1]``, which is exactly
  what ISD's MASK slots propose after anchor ``t``. Shifting the block offset through ``0..M−1``
  makes every response position an anchor; only blocks lying inside the response count, so the
  context is always ``[clean prefix, MASK × M]``. Accuracy at slot ``i`` = share of argmax
  proposals equal to the reference token (teacher forcing, the reference prefix as context).

A problem is anything with ``prompt``, ``answer`` and a reference response: its ``response``
attribute (the arithmetic world's problems) or its record's ``response`` field (a task's
:class:`~brisk.runtime.tasks.task.Problem`, the role mapped with ``--fields response=COL``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from brisk.runtime.backbone import HFBackbone
from brisk.runtime.prompts import encode_prompt
from brisk.runtime.tasks.graders import grade_all
from brisk.runtime.train.idlm import response_blocks

__all__ = [
    "EvalReport",
    "encode_example",
    "encode_problem",
    "evaluate",
    "greedy_decode",
    "proposal_accuracy",
    "reference_response",
]

Problem = Any  # prompt, answer and a reference response (module docstring)


def reference_response(problem: Problem) -> str:
    """The problem's reference response (module docstring); a clear error when it has none."""
    response = getattr(problem, "response", None)
    if response is None:
        response = getattr(problem, "record", {}).get("response")
    if response is None:
        raise ValueError(
            "fields: the proposal accuracy needs each problem's reference response "
            "(map one with --fields response=COLUMN, or pass --strides with no value)"
        )
    return str(response)


def encode_problem(
    problem: Problem, tokenizer: PreTrainedTokenizerBase, response: str | None = None
) -> tuple[list[int], int]:
    """``[bos, prompt, response, eos]`` token ids and the prompt length (bos included); the
    response defaults to the problem's canonical one."""
    text = reference_response(problem) if response is None else response
    return encode_example(problem.prompt, text, tokenizer)


def encode_example(
    prompt: str, response: str, tokenizer: PreTrainedTokenizerBase
) -> tuple[list[int], int]:
    """``[bos, prompt, response, eos]`` token ids and the prompt length (bos included, when the
    tokenizer has one: :func:`~brisk.runtime.prompts.encode_prompt`)."""
    ids = encode_prompt(tokenizer, prompt)
    out = tokenizer.encode(response, add_special_tokens=False)
    return [*ids, *out, tokenizer.eos_token_id], len(ids)


@torch.no_grad()
def greedy_decode(
    backbone: HFBackbone, prompts: Sequence[Sequence[int]], max_new: int, eos_id: int
) -> list[list[int]]:
    """Greedy continuation of each prompt (up to and excluding eos). Prompts of equal length are
    decoded together, so no padding ever enters the cache; each forward computes the logits of
    its last position only."""
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        by_length[len(p)].append(i)
    out: list[list[int]] = [[] for _ in prompts]
    device = backbone.device
    for rows in by_length.values():
        ids = torch.tensor([list(prompts[i]) for i in rows], device=device)
        cache = backbone.new_cache()
        done = torch.zeros(len(rows), dtype=torch.bool, device=device)
        generated = []
        for _ in range(max_new):
            last = torch.full((len(rows), 1), ids.shape[1] - 1, device=device)
            nxt = backbone.forward(ids, cache, logits_at=last).logits[:, 0].argmax(-1)
            generated.append(nxt)
            done |= nxt == eos_id
            if bool(done.all()):
                break
            ids = nxt[:, None]
        tokens = torch.stack(generated, dim=1).tolist()
        for r, i in enumerate(rows):
            seq = tokens[r]
            out[i] = seq[: seq.index(eos_id)] if eos_id in seq else seq
    return out


@torch.no_grad()
def proposal_accuracy(
    backbone: HFBackbone,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    stride: int,
    batch_size: int = 100,
) -> list[float]:
    """Per-position accuracy ``[M]`` of the MASK stream's argmax proposals at stride ``N``."""
    M = stride - 1
    correct, total = torch.zeros(M), torch.zeros(M)
    encoded = [encode_problem(p, tokenizer) for p in problems]
    pad_id = tokenizer.pad_token_id
    for batch, noisy_logits, _, ok in response_blocks(backbone, pad_id, encoded, M, batch_size):
        labels = batch.noisy_labels
        hit = (noisy_logits.argmax(-1) == labels) & ok
        slot = batch.slot.expand_as(labels)
        correct += torch.zeros(M).index_add_(0, slot[ok].cpu(), hit[ok].float().cpu())
        total += torch.zeros(M).index_add_(0, slot[ok].cpu(), torch.ones(int(ok.sum())))
    return (correct / total.clamp(min=1)).tolist()


@dataclass(frozen=True)
class EvalReport:
    accuracy: float
    n_problems: int
    proposal_accuracy: dict[int, list[float]]  # stride N → per-position accuracy [M]
    samples: list[tuple[str, str]]  # (prompt, generated response) for a few problems
    grader_errors: int = 0  # answers whose grader raised (counted as wrong in accuracy)
    first_grader_error: str | None = None  # what the first of them said

    def to_dict(self) -> dict[str, object]:
        return {
            "accuracy": self.accuracy,
            "n_problems": self.n_problems,
            "proposal_accuracy": {str(k): v for k, v in self.proposal_accuracy.items()},
            "grader_errors": self.grader_errors,
            "first_grader_error": self.first_grader_error,
        }


def evaluate(
    backbone: HFBackbone,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    strides: Sequence[int] = (4, 8),
    max_new: int | None = None,
    task: Any = None,
) -> EvalReport:
    """Greedy answer accuracy and MASK-stream accuracy at each stride. ``max_new`` defaults to
    what the model's positions leave after the longest prompt (at most 256 tokens); ``task``
    (its ``grade``) grades the answers, by default the ``gsm8k`` grader. A grader that raises
    counts the answer wrong, and the report counts it (``grader_errors``)."""
    prompts = [encode_prompt(tokenizer, p.prompt) for p in problems]
    if max_new is None:
        room = (backbone.max_positions or 10**9) - max((len(p) for p in prompts), default=0)
        max_new = max(1, min(256, room))
    outputs = greedy_decode(backbone, prompts, max_new, tokenizer.eos_token_id)
    texts = [str(tokenizer.decode(o)) for o in outputs]
    if task is not None:
        grades = task.grade(list(problems), texts, workers=1)
    else:
        grades = grade_all("gsm8k", texts, [p.answer for p in problems], workers=1)
    correct = sum(g is True for g in grades.correct)
    return EvalReport(
        accuracy=correct / max(len(problems), 1),
        n_problems=len(problems),
        proposal_accuracy={N: proposal_accuracy(backbone, tokenizer, problems, N) for N in strides},
        samples=[(p.prompt, t) for p, t in zip(problems[:3], texts[:3], strict=False)],
        grader_errors=grades.errors,
        first_grader_error=grades.first_error,
    )
