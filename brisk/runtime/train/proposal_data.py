"""The examples proposal training reads: self-generated responses or the reference corpus.

- ``selfgen-correct`` / ``selfgen-all``: the rows of a self-generated dataset
  (:mod:`brisk.runtime.train.selfgen`), correct ones only or all of them;
- ``reference``: the same problems, each with as many responses as the dataset has samples,
  from the task's references: the arithmetic world writes them from its "open-source"
  reference corpus (a style mixture unlike the base corpus the model learned its own preference
  from); a data file gives each problem's ``response`` field (e.g. MATH's ``solution``).

:class:`ExampleStream` walks the examples in a seeded order, reshuffled each epoch; its cursor
(epoch, position) is all a checkpoint needs to resume it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from brisk.runtime.train.proposal_config import ProposalTrainConfig
from brisk.runtime.train.selfgen import (
    provenance_task,
    read_dataset,
    read_provenance,
    tokenizer_hash,
)

__all__ = ["Example", "ExampleStream", "load_examples"]


@dataclass(frozen=True)
class Example:
    prompt: str
    response: str


def load_examples(cfg: ProposalTrainConfig) -> list[Example]:
    """The training examples of ``cfg.data``; every problem is checked against the checkpoint."""
    if not cfg.dataset:
        raise ValueError("--dataset: proposal training needs a self-generated dataset")
    provenance = read_provenance(cfg.dataset)
    init = Path(cfg.init)
    if not (init / "config.json").is_file():
        raise ValueError(f"--init: {init} is not a checkpoint (no config.json)")
    if provenance["tokenizer_hash"] != tokenizer_hash(init):
        raise ValueError(
            f"--dataset: {cfg.dataset} was made with another tokenizer than --init {init}"
        )
    if provenance["decoder"]["stride"] != cfg.stride:
        raise ValueError(
            f"--dataset: {cfg.dataset} was decoded at stride {provenance['decoder']['stride']}, "
            f"training uses stride {cfg.stride}"
        )
    if cfg.data == "reference":
        from transformers import AutoTokenizer

        task = provenance_task(provenance)
        problems = task.problems(AutoTokenizer.from_pretrained(init, local_files_only=True))
        references = task.references(problems, provenance["options"]["samples"])
        return [Example(p.prompt, r) for p, rs in zip(problems, references, strict=True)
                for r in rs]  # fmt: skip
    table = read_dataset(cfg.dataset)
    prompts, responses = table["prompt"].to_pylist(), table["response"].to_pylist()
    correct = table["correct"].to_pylist()
    keep = [i for i in range(len(prompts)) if cfg.data == "selfgen-all" or correct[i]]
    if not prompts:
        raise ValueError(f"--dataset: {cfg.dataset} is empty")
    if not keep:
        raise ValueError(f"--dataset: {cfg.dataset} has no correct response to train on")
    return [Example(prompts[i], responses[i]) for i in keep]


class ExampleStream:
    """Examples in a seeded order, reshuffled every epoch; ``take(n)`` returns (id, example)
    pairs, the id unique across epochs (it keys the acceptance draws)."""

    def __init__(self, examples: list[Example], seed: int, epoch: int = 0, pos: int = 0) -> None:
        if not examples:
            raise ValueError("examples: need at least one example")
        self.examples, self.seed, self.epoch, self.pos = examples, seed, epoch, pos
        self._order = self._shuffle(epoch)

    def _shuffle(self, epoch: int) -> list[int]:
        order = list(range(len(self.examples)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def take(self, n: int) -> list[tuple[int, Example]]:
        out = []
        for _ in range(n):
            if self.pos == len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._shuffle(self.epoch)
            i = self._order[self.pos]
            out.append((self.epoch * len(self.examples) + i, self.examples[i]))
            self.pos += 1
        return out

    @property
    def cursor(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}
