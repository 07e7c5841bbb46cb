"""Decoding a prompt file with ISD: what ``brisk decode`` runs, as library functions.

The prompt file is read by :func:`brisk.runtime.prompts.read_prompts` (JSON Lines, one request
per object, or plain text with one prompt per line). Then:

- :func:`prepare_decode` loads the checkpoint (:func:`brisk.runtime.loader.load_model`, the one
  loader) and the corrector, encodes the prompts (:mod:`brisk.runtime.prompts`), fits the
  options to the model's positions (:func:`brisk.runtime.decode_options.fit_budget`) and opens
  the block log: every check done before anything is decoded. With ``drafter`` (a DFlash
  drafter directory, :mod:`brisk.runtime.drafter`) the checkpoint is the AR target that
  verifies the drafter's blocks: the stride is the drafter's block, the MASK id its config's
  (the target needs none), the loop runs in float32, and the corrector, if any, drafts over the
  drafter's Top-K;
- :func:`decode_requests` decodes (ISD's batched loop, or speculative decoding one request at a
  time), and as each request finishes makes its row (the decoder, the prompt's and the
  output's token ids, completion text, forwards, tokens, TPF, accepted-length histogram and,
  with an answer, the grade by the row's grader), appends it to ``.<name>.partial`` beside
  ``out`` (a run killed outright keeps them) and, at the end, writes ``out`` atomically in
  prompt order. ``KeyboardInterrupt`` inside the
  decode stops it (Ctrl-C, or :meth:`brisk._interrupt.StopSignals.abortable`): the block log is
  closed and what finished is written;
- :func:`summarize` gives the figures ``brisk decode`` prints beside the run's TPF lines:
  mean output length, rejection and answer accuracy with the grader's error count.

Errors are one ``ValueError`` naming the argument or option that is wrong (``drafter: …``,
``max_new_tokens: …``; the loader's name its ``where``), which ``brisk decode`` names by its
flags.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from brisk._interrupt import StopSignals
from brisk.runtime.backbone import HFBackbone
from brisk.runtime.corrector import Corrector
from brisk.runtime.decode_options import Budgets, fit_budget
from brisk.runtime.drafter import (
    DFlashDrafter,
    SDOptions,
    SDOutput,
    SDResult,
    check_head,
    check_pair,
    load_drafter,
    plain_decode,
    speculative_decode,
)
from brisk.runtime.isd import DecodeResult, ISDOptions, RequestOutput, decode
from brisk.runtime.isd.blocklog import BlockLogger
from brisk.runtime.loader import LoadedModel, load_model, placement
from brisk.runtime.prompts import PartialRows, completion_text, encode_prompt, write_jsonl
from brisk.runtime.tasks.graders import grade_all
from brisk.theory.profile import AcceptanceProfile

__all__ = [
    "DEFAULT_GRADER",
    "DecodeJob",
    "DecodeSummary",
    "Decoded",
    "decode_requests",
    "prepare_decode",
    "rejection",
    "summarize",
]

DEFAULT_GRADER = "gsm8k"  # normalized answer matching: for rows with an answer and no grader


@dataclass(frozen=True)
class DecodeJob:
    """Requests ready to decode: the model, the corrector (or None), the drafter (or None: ISD),
    the options fitted to the model, the encoded prompts and the block log (or None)."""

    requests: list[dict[str, Any]]
    prompts: list[list[int]]
    options: ISDOptions
    tokenizer: PreTrainedTokenizerBase
    backbone: HFBackbone
    corrector: Corrector | None
    corrector_path: Path | None
    logger: BlockLogger | None
    fit: Budgets  # each prompt's token budget (options.max_new_tokens: the largest)
    drafter: DFlashDrafter | None = None  # proposes for the AR model ``backbone`` wraps
    drafter_path: Path | None = None
    plain: bool = False  # the model's own autoregressive decoding, the speed baseline

    @property
    def budgets(self) -> list[int]:
        """Each prompt's token budget."""
        return self.fit.per_prompt

    @property
    def decoder(self) -> str:
        """The decoder family, as block logs name it (``isd`` or ``speculative``), or
        ``plain``."""
        if self.plain:
            return "plain"
        return "isd" if self.drafter is None else "speculative"

    def one_at_a_time(self, batch_size: int) -> bool:
        """Whether each request decodes alone, so its own wall time is measured."""
        return self.plain or self.drafter is not None or batch_size == 1


def prepare_decode(
    model: Path,
    requests: Sequence[dict[str, Any]],
    options: ISDOptions,
    *,
    corrector: Path | None = None,
    log_blocks: Path | None = None,
    budget_given: bool = True,
    device: str | None = None,
    dtype: str | None = None,
    mask_token_id: int | None = None,
    trust_remote_code: bool = False,
    labels: Sequence[str] | None = None,
    drafter: Path | None = None,
    plain: bool = False,
) -> DecodeJob:
    """Load ``model`` and ``corrector`` (and ``drafter``: module docstring), encode the
    requests' prompts and check the options against them: the EOS becomes the tokenizer's, and
    a budget not given (``budget_given``) is lowered, prompt by prompt, to what fits the model's
    positions (``DecodeJob.fit.note()`` says so); a prompt too long is named by its label in
    ``labels`` (where each request came from). The block log opens last, so a failed check
    leaves no directory behind. ``plain``: the model's own autoregressive decoding, one token
    per forward, one request at a time (:func:`~brisk.runtime.drafter.plain_decode`): no MASK
    id, no block log, no corrector, no drafter."""
    draft = None
    if plain:
        given = (
            ("drafter", drafter is not None),
            ("corrector", corrector is not None),
            ("log_blocks", log_blocks is not None),
            ("shadow", options.shadow),
            ("score_blocks", options.score_blocks),
        )
        for name, on in given:
            if on:
                raise ValueError(f"{name}: not with plain decoding (it has no blocks)")
    if drafter is not None:
        refused = (
            ("shadow", options.shadow, "ISD's diagnostic; the corrector drafts over its Top-K"),
            ("score_blocks", options.score_blocks, "ISD's diagnostic"),
            ("mask_token_id", mask_token_id is not None, "the MASK id is the drafter's"),
        )
        for name, on, why in refused:
            if on:
                raise ValueError(f"{name}: not with a drafter ({why})")
    if options.shadow and corrector is None:
        raise ValueError("shadow: needs a corrector (the head to run beside the base)")
    if drafter is None:
        loaded = load_model(
            model,
            device=device,
            dtype=dtype,
            mask_token_id=mask_token_id,
            trust_remote_code=trust_remote_code,
            need_mask=not plain,
        )
    else:
        loaded, draft = _load_pair(model, drafter, device, dtype, trust_remote_code)
        options = options.replace(stride=draft.spec.block_size)
    head = None
    if corrector is not None:
        try:
            head = Corrector.from_pretrained(
                corrector, backbone=loaded.backbone, device=loaded.placement.device
            )
        except ValueError as err:
            raise _named("corrector", err) from None
        if draft is not None:
            try:
                check_head(loaded.model, draft, head, SDOptions.deployed(options))
            except ValueError as err:
                raise _named("corrector", err) from None
        elif head.config.M != options.M:
            raise ValueError(
                f"stride: the corrector at {corrector} was trained for stride N = "
                f"{head.config.M + 1} (M = {head.config.M}), got stride {options.stride}"
            )
    options = options.replace(eos_token_id=loaded.tokenizer.eos_token_id)
    prompts = [encode_prompt(loaded.tokenizer, r["prompt"]) for r in requests]
    fitted = fit_budget(
        # plain decoding spends no block: the smallest stride's 2 spare positions stand in
        options.replace(stride=2) if plain else options,
        loaded.backbone.max_positions,
        prompts,
        budget_given=budget_given,
        labels=labels,
        # its block: 2M spare; plain decoding's budget alone is what a long prompt leaves
        stride_name="drafter" if draft is not None else ("prompts" if plain else "stride"),
    )
    options = options.replace(max_new_tokens=fitted.options.max_new_tokens)
    logger = None
    if log_blocks is not None:
        K = head.config.K if head is not None else min(options.top_k, loaded.backbone.vocab_size)
        decoder = "isd" if draft is None else "speculative"
        try:
            logger = BlockLogger(log_blocks, options.M, K, decoder=decoder)
        except ValueError as err:
            raise _named("log_blocks", err) from None
    return DecodeJob(
        list(requests),
        prompts,
        options,
        loaded.tokenizer,
        loaded.backbone,
        head,
        corrector,
        logger,
        fitted,
        draft,
        drafter,
        plain,
    )


def _load_pair(
    model: Path, drafter: Path, device: str | None, dtype: str | None, trust_remote_code: bool
) -> tuple[LoadedModel, DFlashDrafter]:
    """The AR target (loaded without a MASK id: it never reads one) and the drafter, checked
    against each other, both in float32: the drafter first, so a broken drafter is named
    before the target loads."""
    if dtype not in (None, "", "auto", "float32", "fp32"):
        raise ValueError(f"dtype: a drafter's loop runs in float32, got {dtype}")
    try:
        draft = load_drafter(drafter, device=placement(device, "float32").device).eval()
    except ValueError as err:
        raise _named("drafter", err) from None
    config = drafter / "config.json"
    # The target never reads a MASK id (the drafter's is its own, checked against the target's
    # vocabulary by check_pair), so one it defines none of is loaded as it is, as SGLang's
    # drafter worker loads it.
    loaded = load_model(
        model,
        device=device,
        dtype="float32",
        trust_remote_code=trust_remote_code,
        need_mask=False,
    )
    try:
        check_pair(loaded.model, draft)
    except ValueError as err:
        detail = str(err).removeprefix("drafter: ")
        raise ValueError(f"drafter: {config}: {detail} (model {model})") from None
    draft.requires_grad_(False)
    return loaded, draft


def _named(name: str, err: ValueError) -> ValueError:
    """``err`` naming the argument ``name`` instead of the one the runtime named (``path:
    …``)."""
    head, sep, rest = str(err).partition(": ")
    return ValueError(f"{name}: {rest}" if sep and head.isidentifier() else f"{name}: {err}")


@dataclass(frozen=True)
class Decoded:
    """The decode's result (None when it was interrupted) and the finished requests' rows, in
    prompt order."""

    result: DecodeResult | SDResult | None
    rows: list[dict[str, Any]]


def decode_requests(
    job: DecodeJob,
    *,
    seed: int = 0,
    batch_size: int = 64,
    grader: str = "",
    out: Path | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    stop: StopSignals | None = None,
) -> Decoded:
    """Decode the job's requests (request r with seed ``seed + r``) and save the rows (module
    docstring). A row with an answer is graded by its own grader, else ``grader``, else
    :data:`DEFAULT_GRADER`; a grader that raises counts as wrong and the row keeps its
    ``grader_error``. With ``stop`` the decode runs inside ``stop.abortable()`` and the saving
    after it does not, so a second signal cannot cut it short."""
    done: dict[int, dict[str, Any]] = {}
    partial = PartialRows(out) if out is not None else None
    timed = job.one_at_a_time(batch_size)
    last = time.perf_counter()

    def on_finish(r: int, output: RequestOutput | SDOutput) -> None:
        nonlocal last
        wall = time.perf_counter() - last  # requests decode one after another when timed
        row = _row(job, r, output, grader)
        if timed:
            row["wall_s"] = wall
        done[r] = row
        if partial is not None:
            partial.add(row)
        if on_row is not None:
            on_row(row)
        last = time.perf_counter()  # the row's grading is not the next request's time

    result: DecodeResult | SDResult | None = None
    seeds = [seed + r for r in range(len(job.prompts))]
    try:
        with stop.abortable() if stop is not None else nullcontext():
            last = time.perf_counter()
            if job.plain:
                outputs = plain_decode(
                    job.backbone.model,
                    job.prompts,
                    job.options,
                    seeds=seeds,
                    budgets=job.budgets,
                    on_finish=on_finish,
                )
                result = SDResult(outputs, M=1)
            elif job.drafter is None:
                result = decode(
                    job.backbone,
                    job.prompts,
                    job.options,
                    corrector=job.corrector,
                    seeds=seeds,
                    logger=job.logger,
                    batch_size=batch_size,
                    on_finish=on_finish,
                    budgets=job.budgets,
                )
            else:  # one request at a time: batch_size has no say
                result = speculative_decode(
                    job.backbone.model,
                    job.drafter,
                    job.prompts,
                    SDOptions.deployed(job.options),
                    seeds=seeds,
                    logger=job.logger,
                    corrector=job.corrector,
                    on_finish=on_finish,
                    budgets=job.budgets,
                )
    except KeyboardInterrupt:
        pass  # save what finished
    finally:
        if job.logger is not None:
            job.logger.close()
        if partial is not None:
            partial.close()
    rows = [done[r] for r in sorted(done)]
    if out is not None and (result is not None or rows):
        write_jsonl(out, rows)
    if partial is not None:
        partial.remove()
    return Decoded(result, rows)


def _row(job: DecodeJob, r: int, output: RequestOutput | SDOutput, grader: str) -> dict[str, Any]:
    request = job.requests[r]
    row = {
        "id": request.get("id", r),
        "sample": request.get("sample", 0),
        "decoder": job.decoder,
        "prompt": request["prompt"],
        "prompt_ids": list(job.prompts[r]),  # BOS included, as the model saw it
        "output_ids": list(output.tokens),  # the EOS that ended it included
        "completion": completion_text(job.tokenizer, output.tokens),
        "forwards": output.forwards,
        "tokens": len(output.tokens),
        "finished": output.finished,  # "eos" or "length" (the request's budget)
        "tpf": output.tpf,
    }
    if not job.plain:
        row["accept_hist"] = output.histogram(job.options.M)
    if "category" in request:
        row["category"] = request["category"]
    if "answer" in request:
        name = request.get("grader") or grader or DEFAULT_GRADER
        graded = grade_all(name, [row["completion"]], [request["answer"]], workers=1)
        row["correct"] = graded.correct[0] is True
        if graded.errors:
            row["grader_error"] = graded.first_error
    return row


@dataclass(frozen=True)
class DecodeSummary:
    """The figures of a finished decode beside its TPF lines (``DecodeResult.run_tpf``)."""

    requests: int
    mean_length: float  # output tokens per request, EOS included
    rejection: float  # rejected ÷ reached proposal positions, pooled (the paper's Reject %)
    graded: int  # rows with an answer
    correct: int
    grader_errors: int  # graded rows whose grader raised (counted as wrong)
    first_grader_error: str | None

    @property
    def accuracy(self) -> float:
        return self.correct / self.graded if self.graded else math.nan


def summarize(result: DecodeResult | SDResult, rows: Sequence[dict[str, Any]]) -> DecodeSummary:
    """:class:`DecodeSummary` of a decode's result and its rows."""
    graded = [r for r in rows if "correct" in r]
    errors = [r["grader_error"] for r in graded if "grader_error" in r]
    lengths = result.lengths
    return DecodeSummary(
        requests=len(rows),
        mean_length=sum(lengths) / len(lengths) if lengths else math.nan,
        rejection=rejection(result.profile()),
        graded=len(graded),
        correct=sum(r["correct"] for r in graded),
        grader_errors=len(errors),
        first_grader_error=errors[0] if errors else None,
    )


def rejection(profile: AcceptanceProfile) -> float:
    """Rejected ÷ reached proposal positions, pooled over positions (the paper's Reject %)."""
    reached = int(profile.reached.sum())
    return (reached - int(profile.accepted.sum())) / reached if reached else math.nan
