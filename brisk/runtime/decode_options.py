"""What a decode is asked, declared once: the options of every decoder and its requests.

**Options**, one class per role. Each decoder's options extend the fields it shares with the
others, so a field has one name, type, default, check and documentation:

- :class:`SamplingOptions` — what every verified decode is asked: the temperature and K, the
  Top-K a draft is drawn from;
- :class:`DecodeOptions` — every ISD decode, wherever it runs: the stride N and ``shadow``; the
  step (:class:`~brisk.runtime.isd.batched.StepContext`) runs on these;
- :class:`LoopOptions` — brisk's own loops, which own their requests: the token budget and the
  EOS id;
- :class:`ISDOptions` (:func:`brisk.runtime.isd.decode`) — both, and the diagnostics' block
  scores;
- :class:`SDOptions` (:func:`brisk.runtime.drafter.speculative_decode`) — a loop's, and the
  drafter's draft law; its stride is the drafter's block (:meth:`SamplingOptions.at_stride`);
- the SGLang algorithms' (:mod:`brisk.runtime.serving.options`): ``BRISK_ISD``'s extend
  :class:`DecodeOptions`, ``BRISK_DRAFTER``'s :class:`SamplingOptions`, each with the server's
  own fields.

The flags of ``brisk decode`` and ``brisk serve`` are derived from the fields
(:func:`brisk.cli._common.add_config_arguments`), and so is the plugin config ``brisk serve``
hands SGLang. A bad value is one error naming the field (``stride: …``), never a flag: the
command line maps fields to its flags.

**Requests**, the same for every loop (ISD's, speculative decoding's, plain decoding's):
:meth:`Requests.check` takes a decode call's prompts, seeds, request ids and budgets,
:meth:`Requests.within` holds them against the model's positions, and :func:`fit_budget` fits a
budget not given to each prompt before anything decodes.

This module imports nothing heavy, so the command line builds its parsers without torch
(:class:`ISDOptions` is re-exported by :mod:`brisk.runtime.isd`, :class:`SDOptions` by
:mod:`brisk.runtime.drafter`).

>>> ISDOptions(stride=8).M, ISDOptions().greedy
(7, True)
>>> ISDOptions(stride=1)
Traceback (most recent call last):
ValueError: stride: need an integer N ≥ 2, got 1
>>> SDOptions(temperature=1.0, draft="top-k").at_stride(4).M
3
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, get_args

from brisk.runtime.configs import Config

__all__ = [
    "DRAFT_LAWS",
    "IMPLS",
    "Budgets",
    "DecodeOptions",
    "DraftLaw",
    "ISDOptions",
    "LoopOptions",
    "Requests",
    "SDOptions",
    "SamplingOptions",
    "fit_budget",
]

DraftLaw = Literal["greedy", "sample", "top-k"]
DRAFT_LAWS: tuple[DraftLaw, ...] = get_args(DraftLaw)
Impl = Literal["auto", "naive", "triton"]  # the corrector's step (auto: Triton on CUDA)
IMPLS: tuple[Impl, ...] = get_args(Impl)

_TOP_K_0 = (
    " (0 does not mean 'no limit' here: drafts at T > 0 are drawn from q restricted to its "
    "Top-K, so pass the vocabulary size for untruncated drafts)"
)


def is_int(value: object) -> bool:
    """Whether ``value`` is an integer (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingOptions(Config):
    """What every verified decode is asked (module docstring). A bad value is one error naming
    the field, of the class's ``error`` type; every class below checks its own fields after
    its bases' (``super().__post_init__()`` first)."""

    error: ClassVar[type[ValueError]] = ValueError

    temperature: float = 0.0  # 0: greedy; T > 0 samples from p at T, verified exactly
    top_k: int = 16  # K: candidates per MASK position when no corrector sets it

    def __post_init__(self) -> None:
        super().__post_init__()
        t = self.temperature
        number = isinstance(t, int | float) and not isinstance(t, bool)
        finite = not number or math.isfinite(t)
        self.need(
            number and finite and t >= 0,
            "temperature",
            "need a number ≥ 0" + ("" if finite else " and finite"),
        )
        self.need(
            is_int(self.top_k) and self.top_k >= 1,
            "top_k",
            "need an integer K ≥ 1 (candidates per MASK position)",
            _TOP_K_0 if self.top_k == 0 else "",
        )

    def need(self, ok: bool, name: str, what: str, why: str = "") -> None:
        """Raise ``error("name: what, got value why")`` unless ``ok``."""
        if not ok:
            raise self.error(f"{name}: {what}, got {getattr(self, name)!r}{why}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def at_stride(self, stride: int, top_k: int | None = None) -> DecodeOptions:
        """The step's options at stride ``stride`` with this temperature and K (``top_k``, a
        corrector's K, replaces it): how a decode whose stride is not an option of its own, a
        drafter's (its block), runs ISD's step."""
        return DecodeOptions(
            stride=stride,
            temperature=self.temperature,
            top_k=self.top_k if top_k is None else top_k,
        )


@dataclass(frozen=True)
class DecodeOptions(SamplingOptions):
    """What every ISD decode is asked (module docstring): the brisk loop's, the server's and
    the step's."""

    stride: int = 4  # ISD stride N: blocks of M = N − 1 proposals
    shadow: bool = False  # run the corrector beside the base for the block log; the base drafts

    def __post_init__(self) -> None:
        super().__post_init__()
        self.need(is_int(self.stride) and self.stride >= 2, "stride", "need an integer N ≥ 2")
        self.need(isinstance(self.shadow, bool), "shadow", "need true or false")

    @property
    def M(self) -> int:
        return self.stride - 1


@dataclass(frozen=True)
class LoopOptions(SamplingOptions):
    """What brisk's own loops are asked beside the sampling: each request's token budget and
    the EOS id (a server's requests carry their own)."""

    # token budget per request (brisk decode lowers the default to what fits the model's positions)
    max_new_tokens: int = 256
    eos_token_id: int | None = None  # stop after this token (None: at the budget only)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.need(
            is_int(self.max_new_tokens) and self.max_new_tokens >= 1,
            "max_new_tokens",
            "need an integer ≥ 1",
        )


@dataclass(frozen=True)
class ISDOptions(LoopOptions, DecodeOptions):
    """How brisk's loop decodes with ISD: :class:`DecodeOptions`, :class:`LoopOptions` and the
    diagnostics' block scores. ``temperature`` 0 is greedy."""

    # diagnostics: score the base and head blocks of every verify round under the verifier for
    # the log's base_logp / head_logp (eq:mech_block_logp); one extra forward per round, which
    # the statistics do not count
    score_blocks: bool = False


@dataclass(frozen=True)
class SDOptions(LoopOptions):
    """How the speculative loop decodes: :class:`LoopOptions` and the law of the drafter's
    drafts at T > 0 (T = 0 drafts its argmax). The stride is the drafter's block, and K the
    head's when a corrector drafts."""

    # at T > 0: greedy, the drafter's argmax as a point mass over its Top-K; sample, a draw from
    # its softmax; top-k, a draw from that softmax restricted to its Top-K (ISD's proposal law)
    draft: DraftLaw = "greedy"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.need(self.draft in DRAFT_LAWS, "draft", f"one of {', '.join(DRAFT_LAWS)}")

    @classmethod
    def deployed(cls, options: LoopOptions) -> SDOptions:
        """``options`` with the drafts a block log holds and a head drafts by: the drafter's
        argmax at T = 0, draws from its Top-K at T > 0 (``brisk decode --drafter``'s)."""
        return cls(
            temperature=options.temperature,
            top_k=options.top_k,
            max_new_tokens=options.max_new_tokens,
            eos_token_id=options.eos_token_id,
            draft="greedy" if options.greedy else "top-k",
        )


@dataclass(frozen=True)
class Requests:
    """A decode call's requests, checked against its options (:meth:`check`): the prompts
    (token ids), each one's seed and id, which key its uniforms, and its token budget."""

    prompts: list[Sequence[int]]
    seeds: list[int]
    request_ids: list[int]
    budgets: list[int]
    max_new_tokens: int  # the options': every budget is at most this

    @classmethod
    def check(
        cls,
        prompts: Sequence[Sequence[int]],
        options: LoopOptions,
        *,
        seeds: Sequence[int] | None = None,
        request_ids: Sequence[int] | None = None,
        budgets: Sequence[int] | None = None,
    ) -> Requests:
        """The requests of ``prompts`` (at least one, none empty): ``seeds[r]`` and
        ``request_ids[r]`` default to r, ``budgets[r]`` (each 1..``max_new_tokens``) to
        ``max_new_tokens``; a ``ValueError`` naming the argument that does not fit.

        >>> Requests.check([[1, 2], [3]], LoopOptions(max_new_tokens=8), budgets=[8, 9])
        Traceback (most recent call last):
        ValueError: budgets: request 1's must be an integer in 1..max_new_tokens (8), got 9
        """
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("prompts: need at least one prompt, each with at least one token")
        n, most = len(prompts), options.max_new_tokens
        given = {
            "seeds": list(range(n)) if seeds is None else list(seeds),
            "request_ids": list(range(n)) if request_ids is None else list(request_ids),
            "budgets": [most] * n if budgets is None else list(budgets),
        }
        for name, values in given.items():
            if len(values) != n:
                raise ValueError(f"{name}: need one per prompt ({n}), got {len(values)}")
        for r, b in enumerate(given["budgets"]):
            if not (is_int(b) and 1 <= b <= most):
                raise ValueError(
                    f"budgets: request {r}'s must be an integer in 1..max_new_tokens ({most}), "
                    f"got {b!r}"
                )
        return cls(list(prompts), **given, max_new_tokens=most)

    def within(
        self,
        positions: int | None,
        spare: int,
        what: str,
        *,
        fit: bool = False,
        holder: str = "the model",
    ) -> Requests:
        """These requests where ``positions`` (the model's; None: no limit) hold each prompt,
        its budget and ``spare`` slots after them (``what`` says which, for the error). With
        ``fit`` a budget that does not fit is lowered to what does (at least 1) instead of
        refused; what still does not fit is a ``ValueError`` naming the longest request and
        its budget (``max_new_tokens`` when it is the options', else ``budgets``)."""
        if positions is None:
            return self
        lengths = [len(p) for p in self.prompts]
        budgets = fitted(lengths, self.budgets, positions, spare) if fit else self.budgets
        need = [n + b + spare for n, b in zip(lengths, budgets, strict=True)]
        r = max(range(len(need)), key=need.__getitem__)
        if need[r] > positions:
            which = "max_new_tokens" if budgets[r] == self.max_new_tokens else "budgets"
            raise ValueError(
                f"{which}: prompt {r} ({lengths[r]} tokens) + {budgets[r]} new tokens + {what} "
                f"exceeds {holder}'s {positions} positions"
            )
        return dataclasses.replace(self, budgets=budgets)


def fitted(lengths: Sequence[int], budgets: Sequence[int], positions: int, spare: int) -> list[int]:
    """Each budget lowered to what ``positions`` hold after its prompt of ``lengths[r]`` tokens
    and ``spare`` slots (at least 1: what cannot hold one token is the caller's to refuse)."""
    return [max(1, min(b, positions - n - spare)) for n, b in zip(lengths, budgets, strict=True)]


@dataclass(frozen=True)
class Budgets:
    """The options fitted to a model (:func:`fit_budget`) and each prompt's token budget; the
    options' ``max_new_tokens`` is the largest budget."""

    options: ISDOptions
    per_prompt: list[int]
    asked: int  # the budget asked for, before any was lowered
    positions: int | None = None  # the model's
    longest: str = ""  # the longest prompt, where a budget was lowered: "its label: n tokens"
    fits: int = 0  # the new tokens that fit after it

    def note(self, budget_option: str = "max_new_tokens") -> str | None:
        """One line saying which prompts decode fewer tokens than asked, and why; None when
        none does. ``budget_option`` is what sets one budget for all, as the caller names it
        (a command line, its flag)."""
        lowered = sum(b < self.asked for b in self.per_prompt)
        if not lowered:
            return None
        return (
            f"{lowered} of {len(self.per_prompt)} prompts decode fewer than {self.asked} new "
            f"tokens, what fits the model's {self.positions} positions after each and 2M = "
            f"{2 * self.options.M} (the longest, {self.longest}, at most {self.fits}; "
            f"{budget_option} sets one budget for all)"
        )


def fit_budget(
    options: ISDOptions,
    max_positions: int | None,
    prompts: Sequence[Sequence[int]],
    *,
    budget_given: bool = True,
    stride_name: str = "stride",
    labels: Sequence[str] | None = None,
) -> Budgets:
    """The stride and the token budget against the model's ``max_positions``, before anything
    decodes: every prompt keeps ``options.max_new_tokens`` where it, that budget and the 2M
    slots of a verify round fit. Where they do not, a budget not given (``budget_given``) is
    lowered for that prompt alone to what fits after it (:meth:`Budgets.note` says so), so a
    long prompt does not cut the others' budgets; a budget given is a ``ValueError`` naming
    ``max_new_tokens`` and the longest prompt by its label in ``labels`` (where it came from,
    e.g. ``prompts.jsonl line 7``; default ``prompt i``, from 0), as is a prompt after which
    not even one token and 2M fit (naming ``stride_name``, what sets the stride)."""
    M, limit, budget = options.M, max_positions, options.max_new_tokens
    lengths = [len(p) for p in prompts]
    longest = max(lengths)
    if limit is None or longest + budget + 2 * M <= limit:
        return Budgets(options, [budget] * len(prompts), budget, limit)
    at = lengths.index(longest)
    which = labels[at] if labels is not None else f"prompt {at}"
    if longest + 1 + 2 * M > limit:
        raise ValueError(
            f"{stride_name}: N = {options.stride} needs 2M = {2 * M} positions after the longest "
            f"prompt ({which}: {longest} tokens); the model has {limit} positions"
        )
    fits = limit - longest - 2 * M
    if budget_given:
        raise ValueError(
            f"max_new_tokens: the longest prompt ({which}: {longest} tokens) + {budget} new "
            f"tokens + 2M = {2 * M} (stride {options.stride}) exceed the model's {limit} "
            f"positions; at most {fits} new tokens fit"
        )
    per_prompt = fitted(lengths, [budget] * len(prompts), limit, 2 * M)
    return Budgets(
        dataclasses.replace(options, max_new_tokens=max(per_prompt)),
        per_prompt,
        budget,
        limit,
        f"{which}: {longest} tokens",
        fits,
    )
