"""A broad corpus for pre-training the tiny model as an ordinary causal LM (issue 23).

I-DLM-8B is a Qwen3 AR model pre-trained on general text and then *converted* to a DLM with a
short budget. The tiny analogue: the arithmetic world's target task is one family among several
that the character tokenizer can already write, so a model pre-trained on the mixture has seen
more than the target task, and a short conversion on the same mixture leaves its MASK stream
behind its causal stream. Every example is a (prompt, response) pair; the families:

- ``chains``: the target world's own base corpus (:func:`~brisk.worlds.arithmetic.task.solutions`,
  train split), e.g. ``Q: 17+5-8=?\\n`` → ``17 plus 5 is 22\\n...\\n#### 14``;
- ``variants``: other arithmetic the target never asks: wider digit ranges, multiplication,
  swapped additions and the reference corpus's styles, prompted ``Calc: 23*4+17=?\\n``;
- ``copy`` / ``reverse``: ``Copy: k3b a\\n`` → ``k3b a``; ``Reverse: k3b a\\n`` → ``a b3k``;
- ``count``: ``Count 17 to 23 by 2:\\n`` → ``17 19 21 23`` (up or down);
- ``sort``: ``Sort: 52 7 31\\n`` → ``7 31 52\\n#### 3`` (the answer line: how many numbers);
- ``digits``: ``Digit sum of 4821:\\n`` → ``4+8+2+1=15\\n#### 15``.

Held-out problems of the target world never appear: a ``chains`` or ``variants`` problem is kept
only in the train split of the target's hash split (``_split_of`` with the target's
``test_fraction``), which depends on the expression alone.

Registered as the task ``broad`` (:class:`BroadTask`): its corpus is the mixture, its problems
and grader are the target world's, so ``brisk train ar`` names it like any task
(``[corpus]`` of its config) and evaluates on the target's held-out problems.
"""

from __future__ import annotations

import dataclasses
import json
import random
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import Any

from brisk._atomic import atomic_write_text
from brisk.runtime.configs import Config
from brisk.runtime.tasks.graders import Grades
from brisk.runtime.tasks.task import Problem, describe_draw, rebuild_draw
from brisk.worlds.arithmetic.task import (
    TaskConfig,
    _split_of,
    generate,
    sample_response,
    solutions,
)
from brisk.worlds.arithmetic.tasks import ArithmeticTask, Draw

__all__ = ["FAMILIES", "BroadConfig", "BroadTask", "Example", "broad_corpus", "export_corpus"]

FAMILIES = ("chains", "variants", "copy", "reverse", "count", "sort", "digits")
_ALPHABET = string.ascii_lowercase + string.digits


@dataclass(frozen=True)
class Example:
    """One (prompt, response) pair; ``answer`` is the final answer where the family has one."""

    family: str
    prompt: str
    response: str
    answer: str = ""


@dataclass(frozen=True)
class BroadConfig(Config):
    """The mixture: the target world and one weight per family of :data:`FAMILIES`."""

    # the target task (its train split is the chains family; its test split stays held out)
    target: TaskConfig = field(default_factory=TaskConfig.paper)
    # weights of chains, variants, copy, reverse, count, sort, digits (normalized)
    weights: tuple[float, ...] = (0.7, 0.1, 0.04, 0.04, 0.04, 0.04, 0.04)
    max_chars: int = 40  # longest string of the copy / reverse families

    def __post_init__(self) -> None:
        w = self.weights
        if len(w) != len(FAMILIES) or min(w) < 0 or not sum(w) > 0:
            raise ValueError(
                f"weights: need {len(FAMILIES)} weights ≥ 0 (for {', '.join(FAMILIES)}) with a "
                f"positive sum, got {w!r}"
            )
        if self.max_chars < 1:
            raise ValueError(f"max_chars: must be ≥ 1, got {self.max_chars!r}")
        super().__post_init__()

    def variants(self) -> TaskConfig:
        """The other arithmetic: up to three-digit operands and steps, multiplication, half the
        additions swapped, every style (the reference corpus's mixture for the base one)."""
        return replace(
            self.target,
            min_operands=2,
            max_operands=5,
            min_digits=1,
            max_digits=3,
            step_max_digits=2,
            ops="+-*",
            style_weights=(0.35, 0.2, 0.15, 0.3),
            swap_prob=0.5,
        )


def _word(rng: random.Random, max_chars: int) -> str:
    """Random lowercase letters, digits and single spaces, 1..max_chars characters."""
    n = rng.randint(1, max_chars)
    chars = [rng.choice(_ALPHABET + " ") for _ in range(n)]
    return " ".join("".join(chars).split()) or rng.choice(_ALPHABET)


def _count(rng: random.Random) -> Example:
    step, n = rng.randint(1, 5), rng.randint(3, 12)
    start = rng.randint(0, 99)
    down = rng.random() < 0.3 and start >= step * (n - 1)
    seq = [start - k * step if down else start + k * step for k in range(n)]
    by = f" by {step}" if step > 1 else ""
    return Example("count", f"Count {seq[0]} to {seq[-1]}{by}:\n", " ".join(map(str, seq)))


def _sort(rng: random.Random) -> Example:
    xs = [rng.randint(0, 99) for _ in range(rng.randint(2, 8))]
    body = " ".join(map(str, sorted(xs)))
    return Example(
        "sort", f"Sort: {' '.join(map(str, xs))}\n", f"{body}\n#### {len(xs)}", str(len(xs))
    )


def _digits(rng: random.Random) -> Example:
    n = rng.randint(10, 10**6 - 1)
    ds = [int(c) for c in str(n)]
    total = sum(ds)
    response = f"{'+'.join(map(str, ds))}={total}\n#### {total}"
    return Example("digits", f"Digit sum of {n}:\n", response, str(total))


def broad_corpus(cfg: BroadConfig, seed: int) -> Iterator[Example]:
    """An endless seeded stream of examples drawn from the mixture (module docstring). Each
    family has its own generator, so a family's examples do not depend on the weights.

    >>> stream = broad_corpus(BroadConfig(), seed=0)
    >>> [next(stream).family for _ in range(5)]
    ['chains', 'chains', 'chains', 'chains', 'copy']
    >>> example = next(broad_corpus(BroadConfig(weights=(0, 0, 0, 1, 0, 0, 0)), seed=0))
    >>> example.prompt, example.response
    ('Reverse: 09zsoctwo31y6\\n', '6y13owtcosz90')
    """
    rng = random.Random(f"broad:{seed}")
    chains = solutions(cfg.target, "train", seed)
    var_cfg = cfg.variants()
    var_problems = generate(var_cfg, "train", seed)
    var_rng = random.Random(f"broad:{seed}:variants")
    own = {name: random.Random(f"broad:{seed}:{name}") for name in FAMILIES}

    def chain() -> Example:
        problem, response = next(chains)
        return Example("chains", problem.prompt, response, str(problem.answer))

    def variant() -> Example:
        for problem in var_problems:
            if _split_of(problem, cfg.target.test_fraction) == "train":
                corpus = "reference" if var_rng.random() < 0.5 else "base"
                response = sample_response(problem, var_cfg, var_rng, corpus)
                prompt = f"Calc: {problem.expression}=?\n"
                return Example("variants", prompt, response, str(problem.answer))
        raise AssertionError("unreachable: generate() is endless")

    def copy() -> Example:
        text = _word(own["copy"], cfg.max_chars)
        return Example("copy", f"Copy: {text}\n", text)

    def reverse() -> Example:
        text = _word(own["reverse"], cfg.max_chars)
        return Example("reverse", f"Reverse: {text}\n", text[::-1])

    draw: dict[str, Callable[[], Example]] = {
        "chains": chain,
        "variants": variant,
        "copy": copy,
        "reverse": reverse,
        "count": lambda: _count(own["count"]),
        "sort": lambda: _sort(own["sort"]),
        "digits": lambda: _digits(own["digits"]),
    }
    while True:
        yield draw[rng.choices(FAMILIES, weights=cfg.weights)[0]]()


def export_corpus(cfg: BroadConfig, path: str | Path, n: int, seed: int) -> Path:
    """The first ``n`` examples of ``broad_corpus(cfg, seed)`` as JSON Lines ``{"prompt",
    "response", "answer", "family"}``: a data file ``brisk train base`` converts on (``[data]``
    with ``fields = ["prompt=prompt", "response=response"]``)."""
    rows = (json.dumps(dataclasses.asdict(e)) for e in islice(broad_corpus(cfg, seed), n))
    atomic_write_text(Path(path), "".join(r + "\n" for r in rows))
    return Path(path)


@dataclass(frozen=True)
class BroadTask(Draw):
    """The broad corpus as a task: :meth:`corpus` streams the mixture, the problems, references
    and grader are those of the target world (``n`` of its ``split`` drawn with ``seed``)."""

    config: BroadConfig = field(default_factory=BroadConfig)

    @classmethod
    def build(
        cls, preset: str = "", settings: BroadConfig | None = None, **options: Any
    ) -> BroadTask:
        """The mixture of ``settings`` (default: :class:`BroadConfig`'s); it has no presets."""
        if preset:
            raise ValueError(f"preset: the broad corpus has no presets, got {preset!r}")
        return cls(settings if settings is not None else BroadConfig(), **options)

    @property
    def target(self) -> ArithmeticTask:
        return ArithmeticTask(self.config.target, self.split, self.n, self.seed, self.grader)

    def corpus(self, seed: int) -> Iterator[tuple[Example, str]]:
        """Endless (example, response) pairs of the mixture (:func:`broad_corpus`)."""
        return ((example, example.response) for example in broad_corpus(self.config, seed))

    def problems(self, tokenizer: Any = None) -> list[Problem]:
        return self.target.problems(tokenizer)

    def references(self, problems: list[Problem], samples: int) -> list[list[str]]:
        return self.target.references(problems, samples)

    def grade(
        self, problems: list[Problem], responses: list[str], workers: int | None = None
    ) -> Grades:
        return self.target.grade(problems, responses, workers)

    def describe(self) -> dict[str, Any]:
        """What rebuilds this task (:meth:`from_description`): the mixture's settings."""
        return describe_draw("broad", self.config.to_dict(), self)

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> BroadTask:
        return rebuild_draw(cls, BroadConfig, description)
