"""What a drafter is evaluated on at the end of ``brisk train drafter`` (and in the drafter
experiment): the prompts of the task its dataset was regenerated from, and greedy speculative
decoding of them with its target.

The prompts are held out from what the dataset was drawn from (:func:`task_prompts`): a
registered world's test split, or, for a user's file (``brisk train selfgen --task FILE``), the
rows of the file the dataset's selection left out (``--start``/``--stop``, or fewer
``--problems`` than rows). A file whose every row went into the dataset has none, which is one
line naming the flag that asked for them, before any training step; never an evaluation of
nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from brisk.runtime.drafter import DFlashDrafter, SDOptions, speculative_decode
from brisk.runtime.tasks.spec import TaskSpec, task_from_description
from brisk.runtime.train.selfgen import read_provenance

__all__ = ["evaluate_drafter", "task_prompts"]


def task_prompts(
    dataset: str | Path, n: int, tokenizer: Any, split: str = "test"
) -> list[list[int]]:
    """The token ids of ``n`` prompts of the task a regenerated dataset was drawn from: its
    ``split`` (test: held out; train: what training may see). For a user's file, test is the
    file's rows outside the dataset's selection (the first ``n`` in file order), train the
    selection itself. A ``ValueError`` (``dataset: ...``) where there are none."""
    from brisk.runtime.prompts import encode_prompt

    described = dict(read_provenance(dataset)["task"])
    if described.get("name") != "file":
        described.update(split=split, n=n)
        problems = task_from_description(described).problems(tokenizer)
    else:
        selection = task_from_description(described).problems(tokenizer)
        if split == "train":
            problems = selection[:n]
        else:
            problems = _held_out(described, {p.id for p in selection}, tokenizer)[:n]
    if not problems:
        raise ValueError(f"dataset: {dataset}'s task has no {split} problems")
    return [encode_prompt(tokenizer, p.prompt) for p in problems]


def _held_out(described: dict[str, Any], used: set[int], tokenizer: Any) -> list[Any]:
    """The rows of a described file task's whole file (its split) that are not ``used``; a
    ``ValueError`` naming the file where the dataset used every one."""
    recorded = dict(described["spec"])
    fields = tuple(recorded.get("fields", ()))
    spec = TaskSpec(**{**recorded, "fields": fields, "start": 0, "stop": -1})
    whole = spec.resolve(n=10**12, seed=0).problems(tokenizer)
    held = [p for p in whole if p.id not in used]
    if not held:
        raise ValueError(
            f"dataset: every row of {spec.path} ({len(whole)}) went into the dataset, none is "
            "held out to evaluate on (generate it from part of the file: --stop, or fewer "
            "--problems than rows)"
        )
    return held


def evaluate_drafter(
    prompts: list[list[int]],
    target: Any,
    tokenizer: Any,
    drafter: DFlashDrafter,
    max_new_tokens: int,
) -> dict[str, Any]:
    """Greedy speculative decoding of ``prompts``: tokens per target forward and E[L], with the
    token budget each prompt fits (at most ``max_new_tokens``)."""
    limit = target.config.max_position_embeddings - drafter.spec.block_size
    budget = max(1, min(max_new_tokens, limit - max(len(p) for p in prompts)))
    options = SDOptions(max_new_tokens=budget, eos_token_id=tokenizer.eos_token_id)
    result = speculative_decode(target, drafter, prompts, options)
    return {
        "problems": len(prompts),
        "max_new_tokens": budget,
        "tpf": result.tpf,
        "mean_accept": result.mean_accept,
        "draft_cost": result.draft_cost,
    }
