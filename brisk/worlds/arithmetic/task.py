"""A seeded arithmetic reasoning task in the style of GSM8K: prompt, chain of steps, ``#### <int>``.

A problem is a left-to-right chain of integer operations, e.g. ``17+5-8``. Its solution writes one
step per line, carrying the running value, and ends with the answer line::

    Q: 17+5-8=?
    17+5=22
    22-8=14
    #### 14

The prompt is ``"Q: 17+5-8=?\\n"`` and the response is everything after it. Running values never go
negative (subtractions that would are redrawn), so every number is a plain digit string.

A solution can be written in several valid ways (:data:`STYLES`): compact ``17+5=22``, spaced
``17 + 5 = 22``, in words ``17 plus 5 is 22`` (each line's verb drawn from :data:`VERBS`:
``is``, ``gives``, ``makes``), or numbered ``Step 1: 17+5=22``; and an addition may name the new
operand first (``5+17=22``). A corpus is a mixture of these: the base corpus a
model learns from has the weights ``style_weights`` / ``swap_prob``, the "open-source" reference
corpus has ``reference_weights`` / ``reference_swap_prob``. The canonical :attr:`Problem.response`
is compact and unswapped (the tiny preset's only style).

Train and test never share a problem: a problem belongs to the test split iff a hash of its
canonical text falls in the held-out bucket, so the splits are disjoint whatever the seeds.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from brisk.runtime.configs import Config

__all__ = [
    "STYLES",
    "VERBS",
    "Problem",
    "TaskConfig",
    "generate",
    "make_split",
    "sample_response",
    "solutions",
]

Split = Literal["train", "test"]
Corpus = Literal["base", "reference"]
STYLES = ("compact", "spaced", "words", "steps")
VERBS = ("is", "gives", "makes")  # how a line in words states its result
_WORDS = {"+": "plus", "-": "minus", "*": "times"}


@dataclass(frozen=True)
class TaskConfig(Config):
    """Difficulty knobs: how many operands, how many digits each, which operators."""

    min_operands: int = 2
    max_operands: int = 3
    min_digits: int = 1
    max_digits: int = 1
    ops: str = "+-"
    test_fraction: float = 0.1
    # Digits of the operands after the first (None: min_digits..max_digits like the first).
    step_max_digits: int | None = None
    # Corpus mixtures over STYLES (weights, normalized) and the chance an addition is swapped.
    style_weights: tuple[float, ...] = (1.0, 0.0, 0.0, 0.0)
    swap_prob: float = 0.0
    reference_weights: tuple[float, ...] = (1.0, 0.0, 0.0, 0.0)
    reference_swap_prob: float = 0.0
    # Words style: each line draws its verb from VERBS with these weights (both corpora).
    verb_weights: tuple[float, ...] = (1.0, 0.0, 0.0)
    # Draw the style of every line, not once per solution (every line start is a choice).
    style_per_line: bool = False

    def __post_init__(self) -> None:
        if self.step_max_digits is not None and self.step_max_digits < 1:
            raise ValueError(f"step_max_digits: must be ≥ 1, got {self.step_max_digits!r}")
        for name, names in (
            ("style_weights", STYLES),
            ("reference_weights", STYLES),
            ("verb_weights", VERBS),
        ):
            w = getattr(self, name)
            if len(w) != len(names) or min(w) < 0 or not sum(w) > 0:
                raise ValueError(
                    f"{name}: need {len(names)} weights ≥ 0 (for {', '.join(names)}) with a "
                    f"positive sum, got {w!r}"
                )
        for name in ("swap_prob", "reference_swap_prob"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name}: must lie in [0, 1], got {getattr(self, name)!r}")
        if not 2 <= self.min_operands <= self.max_operands:
            raise ValueError("min_operands/max_operands: need 2 ≤ min_operands ≤ max_operands")
        if not 1 <= self.min_digits <= self.max_digits:
            raise ValueError("min_digits/max_digits: need 1 ≤ min_digits ≤ max_digits")
        if not self.ops or set(self.ops) - set("+-*"):
            raise ValueError(f"ops: expected a non-empty subset of '+-*', got {self.ops!r}")
        if not 0 < self.test_fraction < 1:
            raise ValueError("test_fraction: must lie strictly between 0 and 1")
        super().__post_init__()

    @classmethod
    def tiny(cls) -> TaskConfig:
        """The preset the tiny base model is trained on."""
        return cls()

    @classmethod
    def paper(cls) -> TaskConfig:
        """The paper-regime world: chains of 3–5 steps on a running value with carries and
        borrows (a one- or two-digit start, one-digit operands), each line in a style drawn from
        a mixture, words lines with a verb drawn per line (the base corpus prefers words and
        never swaps; the reference corpus is mostly compact and numbered, with most additions
        swapped)."""
        return cls(
            min_operands=4,
            max_operands=6,
            min_digits=1,
            max_digits=2,
            ops="+-",
            step_max_digits=1,
            style_weights=(0.05, 0.15, 0.55, 0.25),
            swap_prob=0.0,
            reference_weights=(0.4, 0.25, 0.0, 0.35),
            reference_swap_prob=0.75,
            verb_weights=(0.6, 0.25, 0.15),
            style_per_line=True,
        )

    def corpus(self, corpus: Corpus) -> tuple[tuple[float, ...], float]:
        """Style weights and swap probability of ``corpus``."""
        if corpus == "base":
            return self.style_weights, self.swap_prob
        if corpus == "reference":
            return self.reference_weights, self.reference_swap_prob
        raise ValueError(f"corpus: expected 'base' or 'reference', got {corpus!r}")

    @classmethod
    def trivial(cls) -> TaskConfig:
        """One-digit sums of two operands: learnable in seconds (the test suite's task)."""
        return cls(
            min_operands=2, max_operands=2, min_digits=1, max_digits=1, ops="+", test_fraction=0.2
        )


@dataclass(frozen=True)
class Problem:
    operands: tuple[int, ...]
    ops: tuple[str, ...]

    @property
    def expression(self) -> str:
        parts = [str(self.operands[0])]
        for op, x in zip(self.ops, self.operands[1:], strict=True):
            parts += [op, str(x)]
        return "".join(parts)

    @property
    def prompt(self) -> str:
        return f"Q: {self.expression}=?\n"

    @property
    def steps(self) -> list[str]:
        return self.write_steps("compact", (False,) * len(self.ops))

    def write_steps(
        self,
        style: str | tuple[str, ...],
        swaps: tuple[bool, ...],
        verbs: tuple[str, ...] | None = None,
    ) -> list[str]:
        """One line per operation in ``style`` (one for all lines, or one per line);
        ``swaps[k]`` writes addition k as ``x+value``; ``verbs[k]`` states line k's result in
        the words style (default "is")."""
        value, lines = self.operands[0], []
        for k, (op, x) in enumerate(zip(self.ops, self.operands[1:], strict=True)):
            new = _apply(value, op, x)
            a, b = (x, value) if swaps[k] and op in "+*" else (value, x)
            line_style = style if isinstance(style, str) else style[k]
            if line_style == "compact":
                lines.append(f"{a}{op}{b}={new}")
            elif line_style == "spaced":
                lines.append(f"{a} {op} {b} = {new}")
            elif line_style == "words":
                lines.append(f"{a} {_WORDS[op]} {b} {verbs[k] if verbs else 'is'} {new}")
            elif line_style == "steps":
                lines.append(f"Step {k + 1}: {a}{op}{b}={new}")
            else:
                raise ValueError(f"style: expected one of {', '.join(STYLES)}, got {line_style!r}")
            value = new
        return lines

    def write(
        self,
        style: str | tuple[str, ...],
        swaps: tuple[bool, ...],
        verbs: tuple[str, ...] | None = None,
    ) -> str:
        """The whole response in ``style`` with ``swaps`` (and ``verbs``), answer included."""
        return "\n".join([*self.write_steps(style, swaps, verbs), f"#### {self.answer}"])

    @property
    def answer(self) -> int:
        value = self.operands[0]
        for op, x in zip(self.ops, self.operands[1:], strict=True):
            value = _apply(value, op, x)
        return value

    @property
    def response(self) -> str:
        return "\n".join([*self.steps, f"#### {self.answer}"])

    @property
    def text(self) -> str:
        return self.prompt + self.response


def _apply(value: int, op: str, x: int) -> int:
    return value + x if op == "+" else value - x if op == "-" else value * x


def _split_of(problem: Problem, test_fraction: float) -> Split:
    digest = hashlib.blake2b(problem.expression.encode(), digest_size=8).digest()
    return "test" if int.from_bytes(digest) / 2**64 < test_fraction else "train"


def _draw(cfg: TaskConfig, rng: random.Random) -> Problem:
    def number(low: int, high: int) -> int:
        d = rng.randint(low, high)
        return rng.randint(0 if d == 1 else 10 ** (d - 1), 10**d - 1)

    n = rng.randint(cfg.min_operands, cfg.max_operands)
    operands, ops = [number(cfg.min_digits, cfg.max_digits)], []
    step_low, step_high = (
        (cfg.min_digits, cfg.max_digits)
        if cfg.step_max_digits is None
        else (1, cfg.step_max_digits)
    )
    value = operands[0]
    while len(operands) < n:
        op, x = rng.choice(cfg.ops), number(step_low, step_high)
        if _apply(value, op, x) < 0:
            continue  # keep every running value a plain digit string
        operands.append(x)
        ops.append(op)
        value = _apply(value, op, x)
    return Problem(tuple(operands), tuple(ops))


def generate(cfg: TaskConfig, split: Split, seed: int) -> Iterator[Problem]:
    """An endless seeded stream of problems of one split (repeats possible within a split)."""
    rng = random.Random(f"{split}:{seed}")
    while True:
        problem = _draw(cfg, rng)
        if _split_of(problem, cfg.test_fraction) == split:
            yield problem


def sample_response(
    problem: Problem, cfg: TaskConfig, rng: random.Random, corpus: Corpus = "base"
) -> str:
    """A response to ``problem`` drawn from ``corpus``'s mixture of styles and swaps."""
    weights, swap_prob = cfg.corpus(corpus)
    first: str = rng.choices(STYLES, weights=weights)[0]
    style: str | tuple[str, ...] = first
    if cfg.style_per_line:  # the first line's style drawn above, then one per further line
        style = (first, *rng.choices(STYLES, weights=weights, k=len(problem.ops) - 1))
    swaps = tuple(rng.random() < swap_prob for _ in problem.ops)
    verbs = tuple(rng.choices(VERBS, weights=cfg.verb_weights)[0] for _ in problem.ops)
    return problem.write(style, swaps, verbs)


def solutions(
    cfg: TaskConfig, split: Split, seed: int, corpus: Corpus = "base"
) -> Iterator[tuple[Problem, str]]:
    """:func:`generate`'s problems, each with a response drawn from ``corpus``. Styles use their
    own generator, so the problems are those of ``generate(cfg, split, seed)`` whatever the
    corpus."""
    rng = random.Random(f"{split}:{seed}:{corpus}:style")
    for problem in generate(cfg, split, seed):
        yield problem, sample_response(problem, cfg, rng, corpus)


def make_split(
    cfg: TaskConfig, split: Split, n: int, seed: int, distinct: bool = True
) -> list[Problem]:
    """``n`` problems of ``split``; with ``distinct`` no problem appears twice."""
    out: list[Problem] = []
    seen: set[str] = set()
    repeats = 0
    for problem in generate(cfg, split, seed):
        if distinct and problem.expression in seen:
            # So many repeats in a row means the split is exhausted (a new one is near-certain
            # within a few hundred draws while any remain).
            repeats += 1
            if repeats > 20_000:
                raise ValueError(f"n: the {split} split has fewer than {n} distinct problems")
            continue
        repeats = 0
        seen.add(problem.expression)
        out.append(problem)
        if len(out) == n:
            return out
    raise AssertionError("unreachable: generate() is endless")
