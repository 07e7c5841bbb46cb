"""The code world's tasks: the corpus ``stdlib`` and its problems ``heldout-functions``.

One task class, :class:`CodeTask`, registered under both names:

- its **corpus** (:meth:`CodeTask.corpus`, what ``brisk train ar`` trains on when a config says
  ``[corpus] name = "stdlib"``) is the training split's documents, endlessly, each epoch in an
  order drawn from the seed; a document is an example whose prompt is empty and whose response
  is its text (the trainer encodes ``[bos, text, eos]``);
- its **problems** are the documented top-level functions of the held-out files (split
  ``test``; ``train`` gives those of the training documents the corpus keeps, at most
  ``max_chars`` long, what self-generation and the corrector's events decode): the prompt is
  the function's imports, decorators, signature and docstring, the reference its body;
- its **graders** (:mod:`brisk.worlds.code.grader`): ``compiles`` (the default) and
  ``exact-body``, or any grader the runtime resolves.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from brisk.runtime.configs import Config
from brisk.runtime.tasks.graders import Grades, grade_all
from brisk.runtime.tasks.task import Problem, describe_draw, rebuild_draw
from brisk.worlds.code.corpus import CorpusConfig, Document, documented_function, documents

__all__ = ["PRESETS", "CodeTask", "CodeTaskConfig"]


@dataclass(frozen=True)
class CodeTaskConfig(Config):
    """The corpus a code task reads, and which documents its training stream keeps."""

    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    # documents longer than this many characters stay out of the training stream (0: none do)
    max_chars: int = 2048

    def __post_init__(self) -> None:
        if self.max_chars < 0:
            raise ValueError(f"max_chars: need ≥ 0 (0: no limit), got {self.max_chars!r}")
        super().__post_init__()

    @classmethod
    def stdlib(cls) -> CodeTaskConfig:
        """The whole standard library (the default)."""
        return cls()

    @classmethod
    def micro(cls) -> CodeTaskConfig:
        """The micro corpus (:meth:`CorpusConfig.micro`), for tests."""
        return cls(corpus=CorpusConfig.micro())


PRESETS = {"stdlib": CodeTaskConfig.stdlib, "micro": CodeTaskConfig.micro}
_SIDES = {"test": "heldout", "heldout": "heldout", "train": "train"}


@dataclass(frozen=True)
class CodeTask:
    """``n`` documented functions of ``split`` drawn with ``seed`` (kept in corpus order), the
    training documents as the corpus, graded by ``grader`` (module docstring).

    >>> task = CodeTask(CodeTaskConfig.micro(), n=2)
    >>> problems = task.problems()
    >>> [p.record["function"] for p in problems]
    ['email/__init__.py:message_from_bytes', 'email/__init__.py:message_from_file']
    >>> task.grade(problems, [problems[0].answer["body"], "    return (\\n"]).correct
    [True, False]
    """

    config: CodeTaskConfig = field(default_factory=CodeTaskConfig)
    split: str = "test"
    n: int = 200
    seed: int = 1
    grader: str = "compiles"
    name: str = "heldout-functions"

    def __post_init__(self) -> None:
        if self.split not in _SIDES:
            raise ValueError(f"split: need train or test, got {self.split!r}")
        if self.n < 1:
            raise ValueError(f"n: need ≥ 1 problems, got {self.n!r}")

    @classmethod
    def build(
        cls,
        preset: str = "",
        settings: CodeTaskConfig | None = None,
        *,
        name: str = "heldout-functions",
        **options: Any,
    ) -> CodeTask:
        """The task of a named corpus (``stdlib``, ``micro``), or of ``settings``."""
        if settings is None:
            if preset and preset not in PRESETS:
                raise ValueError(f"preset: need one of {', '.join(PRESETS)}, got {preset!r}")
            settings = PRESETS[preset or "stdlib"]()
        return cls(settings, name=name, **options)

    def corpus(self, seed: int) -> Iterator[tuple[Document, str]]:
        """Endless (document, text) pairs of the training split (module docstring)."""
        limit = self.config.max_chars
        docs = [
            d for d in documents(self.config.corpus, "train") if not limit or len(d.text) <= limit
        ]
        if not docs:
            raise ValueError(
                f"max_chars: no training document of {self.config.corpus.path} has at most "
                f"{limit} characters"
            )
        rng = random.Random(f"stdlib:{seed}")
        while True:
            order = list(range(len(docs)))
            rng.shuffle(order)
            for i in order:
                yield docs[i], docs[i].text

    def heldout_texts(self) -> list[str]:
        """Every document of the held-out files, in corpus order (what ``brisk train ar``
        measures its held-out loss on: none of it was trained on)."""
        return [d.text for d in documents(self.config.corpus, "heldout")]

    def problems(self, tokenizer: Any = None) -> list[Problem]:
        """The problems; each answer is ``{"prompt", "body"}``, each record holds the
        ``response`` (the body) and the ``function`` (``path:name``)."""
        side = _SIDES[self.split]
        # training problems come from the documents the corpus trains on (max_chars), so their
        # prompts fit where the training documents fit; the held-out ones are all kept
        limit = self.config.max_chars if side == "train" else 0
        found = [
            f
            for d in documents(self.config.corpus, side)  # type: ignore[arg-type]
            if (not limit or len(d.text) <= limit) and (f := documented_function(d)) is not None
        ]
        if not found:
            raise ValueError(
                f"split: the {side} files of {self.config.corpus.path} hold no documented "
                "function with a body"
            )
        chosen = range(len(found))
        if len(found) > self.n:
            chosen = sorted(random.Random(f"functions:{self.seed}").sample(chosen, self.n))
        out = []
        for i in chosen:
            f = found[i]
            answer = {"prompt": f.prompt, "body": f.body}
            record = {**answer, "response": f.body, "function": f"{f.path}:{f.name}"}
            out.append(Problem(i, f.prompt, answer, record))
        return out

    def references(self, problems: list[Problem], samples: int) -> list[list[str]]:
        """Each problem's reference body, ``samples`` times."""
        return [[str(p.record["response"])] * samples for p in problems]

    def grade(
        self, problems: list[Problem], responses: list[str], workers: int | None = None
    ) -> Grades:
        """Grade here by default: both graders take microseconds a response."""
        answers = [p.answer for p in problems]
        return grade_all(self.grader, responses, answers, 1 if workers is None else workers)

    def describe(self) -> dict[str, Any]:
        """What rebuilds this task (:meth:`from_description`)."""
        return describe_draw(self.name, self.config.to_dict(), self)

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> CodeTask:
        return rebuild_draw(cls, CodeTaskConfig, description, extra=("name",))
