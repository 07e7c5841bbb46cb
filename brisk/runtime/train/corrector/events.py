"""Corrector training events (``brisk train corrector collect``): policy-reached blocks of a frozen
backbone, with everything the head's forward needs and the verifier's targets.

An *event* is one verify round of the deployed decoder (ISD at stride N, temperature T, head
off, exact verification; or speculative decoding, a DFlash drafter proposing and its AR target
verifying: :func:`collect_draft_events`): the block the base proposed and what verification
made of it. The
events are written as an event store (:mod:`brisk.runtime.train.corrector.store`: its layout, the
writer and the reader).

Collection writes into a hidden directory beside the store, ``.<name>.partial``, one decode
batch at a time (memory stays bounded by one batch): a batch's rows go to a staging directory
and are appended when the batch is complete, and the whole is renamed into place at the end, so
a store is either whole or absent. SIGINT or SIGTERM discards the batch being decoded and keeps
the complete ones, which ``--resume`` continues after, to the store an uninterrupted
collection writes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from brisk._interrupt import stop_signals
from brisk.runtime.train.corrector.config import CollectOptions
from brisk.runtime.train.corrector.partial import PartialStore, refuse_complete
from brisk.runtime.train.corrector.store import FORMAT, EventStore, EventWriter

if TYPE_CHECKING:
    from collections.abc import Sequence

    from brisk.mechanism.schema import Decoder
    from brisk.runtime.backbone import Backbone
    from brisk.runtime.drafter import DFlashDrafter, SDOptions
    from brisk.runtime.isd.options import ISDOptions

__all__ = [
    "CollectArgs",
    "CollectOptions",
    "EventStore",
    "collect_draft_events",
    "collect_events",
    "collect_from_checkpoint",
    "refuse_complete",
]


class CollectArgs(TypedDict, total=False):
    """The keyword arguments of both collectors (:func:`collect_events`,
    :func:`collect_draft_events`): which requests, how they are graded, and the run's rules."""

    seeds: Sequence[int] | None  # per request (default 0..n − 1)
    request_ids: Sequence[int] | None  # per request (default 0..n − 1)
    correct: Callable[[int, Any], bool] | None  # grades request r (default: all correct)
    provenance: dict[str, Any] | None  # merged into ``_events.json``
    feature_dtype: str  # the stored hidden states' dtype (default float32)
    batch_size: int  # requests a decode batch (default 64 for ISD, 16 for the drafter's loop)
    on_finish: Callable[[int, Any], None] | None  # hears each request's output as it finishes
    on_resume: Callable[[int], None] | None  # hears how many requests were collected before
    resume: bool  # continue after a partial store's complete batches (default True)


def collect_events(
    backbone: Backbone,
    prompts: Sequence[Sequence[int]],
    options: ISDOptions,
    out: str | Path,
    **how: Unpack[CollectArgs],
) -> EventStore:
    """Decode ``prompts`` head-off with ``options`` and write an event store at ``out``.

    ``correct(r, output) -> bool`` grades request r (default: every response counts as correct);
    ``provenance`` is merged into ``_events.json`` (the keywords: :class:`CollectArgs`).
    ``out`` must not exist yet: the store is built in ``.<name>.partial`` beside it, one decode
    batch of ``batch_size`` requests (default 64) at a time (the batches
    :func:`~brisk.runtime.isd.decode` would run), and renamed when complete. SIGINT or SIGTERM
    discards the batch being decoded and ends with :class:`~brisk._interrupt.Interrupted`; the
    complete batches stay, and ``resume`` (the library's default) continues after them to the
    store an uninterrupted run writes, while without it they are refused. ``on_resume(n)``
    hears how many requests were collected before.
    """
    from brisk.runtime.isd import decode

    batch_size = how.get("batch_size", 64)

    def decode_batch(batch: _Batch, writer: EventWriter, finished: Any) -> list[int]:
        result = decode(
            backbone,
            batch.prompts,
            options,
            seeds=batch.seeds,
            request_ids=batch.ids,
            logger=writer,
            batch_size=batch_size,
            on_finish=finished,
            fit_positions=True,  # a long prompt decodes what fits after it
        )
        return [len(t) for t in result.tokens]

    sizes = _Sizes(
        options.M,
        min(options.top_k, backbone.vocab_size),
        backbone.hidden_size,
        backbone.vocab_size,
        options.stride,
        options.temperature,
    )
    return _collect(
        Path(out), prompts, sizes, asdict(options), decode_batch, "isd", how, batch_size
    )


def collect_draft_events(
    target: Any,
    drafter: DFlashDrafter,
    prompts: Sequence[Sequence[int]],
    options: SDOptions,
    out: str | Path,
    **how: Unpack[CollectArgs],
) -> EventStore:
    """The corrector's events of speculative decoding: ``drafter`` proposing, ``target``
    verifying (:func:`brisk.runtime.drafter.speculative_decode`, head off; greedy drafts at
    T = 0, ``options.draft`` at T > 0, ``sample`` refused: a store holds Top-K candidates). The
    rows hold the drafter's MASK-slot hidden states, a zero anchor hidden state (what SGLang's
    DFlash sampler gives the head) and the drafter's Top-K logits; the store's ``backbone`` is
    the target, whose E and E_out the head reads. Otherwise as :func:`collect_events`: batches
    of ``batch_size`` requests (default 16), interruption, ``resume``."""
    from brisk.runtime.drafter import check_pair, speculative_decode, target_heads

    check_pair(target, drafter)  # before the partial store exists
    if options.temperature > 0 and options.draft == "sample":
        raise ValueError(
            "draft: a store holds Top-K candidates; collect greedy or top-k drafts, not drafts "
            "from the whole softmax"
        )

    def decode_batch(batch: _Batch, writer: EventWriter, finished: Any) -> list[int]:
        result = speculative_decode(
            target,
            drafter,
            batch.prompts,
            options,
            seeds=batch.seeds,
            request_ids=batch.ids,
            logger=writer,
            on_finish=finished,
        )
        return [len(o.tokens) for o in result.outputs]

    V, M = target_heads(target).vocab_size, drafter.spec.M
    sizes = _Sizes(
        M, min(options.top_k, V), drafter.config.hidden_size, V, M + 1, options.temperature
    )
    decoder = {"algorithm": "speculative", **asdict(options)}
    batch_size = how.get("batch_size", 16)
    return _collect(
        Path(out), prompts, sizes, decoder, decode_batch, "speculative", how, batch_size
    )


@dataclass(frozen=True)
class _Sizes:
    """What a store's rows and ``_events.json`` hold the sizes of."""

    M: int
    K: int
    hidden_size: int
    vocab_size: int
    stride: int
    temperature: float


@dataclass(frozen=True)
class _Batch:
    """One decode batch: its prompts, seeds and request ids."""

    prompts: Sequence[Sequence[int]]
    seeds: list[int]
    ids: list[int]


def _collect(
    out: Path,
    prompts: Sequence[Sequence[int]],
    sizes: _Sizes,
    decoder: dict[str, Any],
    decode_batch: Callable[[_Batch, EventWriter, Any], list[int]],
    family: Decoder,
    how: CollectArgs,
    batch_size: int,
) -> EventStore:
    """The collection loop both decoders share: ``decode_batch(batch, writer, finished)``
    decodes a batch into ``writer`` (calling ``finished(r, output)`` with r counted within the
    batch) and returns its token counts. Seeds and request ids default to 0..n − 1."""
    import torch

    refuse_complete(out)
    n = len(prompts)
    given_ids, given_seeds = how.get("request_ids"), how.get("seeds")
    ids = list(range(n)) if given_ids is None else list(given_ids)
    seeds = list(range(n)) if given_seeds is None else list(given_seeds)
    provenance, feature_dtype = how.get("provenance") or {}, how.get("feature_dtype", "float32")
    correct, on_finish = how.get("correct"), how.get("on_finish")
    on_resume = how.get("on_resume")
    inputs = json.dumps([[[int(t) for t in p] for p in prompts], seeds, ids]).encode()
    settings = {  # what makes two runs collect the same store (the path aside: its hash counts)
        "provenance": {  # paths aside: their hashes count
            k: v for k, v in provenance.items() if k not in ("checkpoint", "drafter")
        },
        "decoder": decoder,
        "K": sizes.K,
        "hidden_size": sizes.hidden_size,
        "feature_dtype": feature_dtype,
        "batch_size": batch_size,
        "requests": n,
        "inputs": hashlib.sha256(inputs).hexdigest(),
    }
    partial = PartialStore.open(out, settings, how.get("resume", True))
    if on_resume is not None and partial.requests:
        on_resume(partial.requests)
    grades: dict[int, bool] = {}
    lo = partial.requests  # the first request of the batch being decoded

    def finished(r: int, output: Any) -> None:
        grades[lo + r] = True if correct is None else bool(correct(lo + r, output))
        if on_finish is not None:
            on_finish(lo + r, output)

    with stop_signals() as stop:
        for lo in range(partial.requests, n, batch_size):  # finished() reads lo
            # Between batches: stop on SIGINT/SIGTERM; the committed batches stay.
            if stop.requested:
                raise partial.interrupted(n)
            # A batch: decoded into staging/, thrown away if a signal cuts it short.
            hi = min(lo + batch_size, n)
            writer = EventWriter(
                partial.staging, sizes.M, sizes.K, sizes.hidden_size, feature_dtype, family
            )
            batch = _Batch(prompts[lo:hi], seeds[lo:hi], ids[lo:hi])
            try:
                with (
                    writer,
                    stop.abortable(),
                    torch.inference_mode(),
                ):  # closed before `except` runs
                    tokens = decode_batch(batch, writer, finished)
            except KeyboardInterrupt:
                raise partial.interrupted(n) from None
            partial.commit(writer.events, [grades[r] for r in range(lo, hi)], tokens)
    meta = {
        "format": FORMAT,
        "decoder": {"algorithm": family, "head": "off"},  # what the head is trained to draft for
        **provenance,
        **asdict(sizes),
        "feature_dtype": feature_dtype,
        "events": partial.events,
        "requests": n,
    }
    partial.finish(ids, meta)
    return EventStore.open(out)


def collect_from_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    options: CollectOptions,
    show_progress: bool = True,
    *,
    resume: bool = True,
    device: str | None = None,
    dtype: str | None = None,
    drafter: str | Path | None = None,
) -> EventStore:
    """Events of a checkpoint on the training problems of ``options.task`` (by default the world
    it was trained on), each response graded by the task's grader (interruption and ``resume``
    as in :func:`collect_events`); the model runs on ``device`` in ``dtype``
    (:func:`brisk.runtime.loader.placement`).

    With ``drafter`` (a DFlash drafter for the AR target ``checkpoint``) the events are those of
    speculative decoding (:func:`collect_draft_events`: greedy drafts at T = 0, Top-K drafts at
    T > 0, in float32); ``options.stride`` must be the drafter's block size."""
    from rich.progress import Progress

    from brisk.runtime.drafter import SDOptions, position_limit
    from brisk.runtime.prompts import completion_text, encode_prompts
    from brisk.runtime.train.selfgen import checkpoint_hash, deployed_decoder, tokenizer_hash

    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise ValueError(f"--checkpoint: {checkpoint} is not a directory")
    task = options.task.resolve(
        n=options.problems, seed=options.problem_seed, split="train", checkpoint=checkpoint
    )
    refuse_complete(Path(out))  # before loading the model
    if drafter is not None:
        target, tokenizer, spec = _draft_pair(checkpoint, drafter, options, device, dtype)
    else:
        tokenizer, backbone, dec = deployed_decoder(checkpoint, options, device=device, dtype=dtype)
    problems = task.problems(tokenizer)
    if not problems:
        raise ValueError("--task: the selection holds no problems")
    index = [(i, s) for i in range(len(problems)) for s in range(options.samples)]
    prompts = encode_prompts(tokenizer, [problems[i].prompt for i, _ in index])
    seeds = [options.decode_seed(i, s) for i, s in index]
    if drafter is not None:  # ISD fits its budget after a long prompt; the drafter's loop cannot
        limit = position_limit(target, spec.spec.M)
        for r, prompt in enumerate(prompts):
            if limit is not None and len(prompt) + options.max_new_tokens > limit:
                raise ValueError(
                    f"--task: problem {index[r][0]}'s prompt is {len(prompt)} tokens; with "
                    f"--max-new-tokens {options.max_new_tokens} and a block of "
                    f"{spec.spec.block_size} it exceeds the target's "
                    f"{limit + spec.spec.block_size} positions"
                )

    def correct(r: int, output: Any) -> bool:  # a grader that raises counts as wrong
        text = completion_text(tokenizer, output.tokens)
        return task.grade([problems[index[r][0]]], [text], workers=1).correct[0] is True

    provenance = {
        "checkpoint": str(checkpoint),
        "checkpoint_hash": checkpoint_hash(checkpoint),
        "tokenizer_hash": tokenizer_hash(checkpoint),
        "task": task.describe(),
        "decoder": {"algorithm": "isd", "head": "off"},
        "options": asdict(options),
    }
    with Progress(disable=not show_progress) as progress:
        bar = progress.add_task("collect", total=len(index))
        how: CollectArgs = {
            "seeds": seeds,
            "correct": correct,
            "provenance": provenance,
            "feature_dtype": options.feature_dtype,
            "batch_size": options.batch_size,
            "on_finish": lambda _r, _o: progress.advance(bar),
            "on_resume": lambda n: progress.advance(bar, n),
            "resume": resume,
        }
        if drafter is None:
            return collect_events(backbone, prompts, dec, out, **how)
        provenance["decoder"] = {"algorithm": "speculative", "head": "off"}
        provenance["drafter"] = str(drafter)
        provenance["drafter_hash"] = checkpoint_hash(drafter)
        sd = SDOptions(
            temperature=options.temperature,
            draft="top-k" if options.temperature > 0 else "greedy",
            top_k=options.top_k,
            max_new_tokens=options.max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
        )
        return collect_draft_events(target, spec, prompts, sd, out, **how)


def _draft_pair(
    checkpoint: Path,
    drafter: str | Path,
    options: CollectOptions,
    device: str | None,
    dtype: str | None,
) -> tuple[Any, Any, DFlashDrafter]:
    """The frozen AR target, its tokenizer and the drafter (both in float32), checked against
    each other and against ``options``' stride."""
    from brisk.runtime.drafter import check_pair, load_drafter
    from brisk.runtime.loader import load_target, placement

    if dtype not in (None, "", "auto", "float32"):
        raise ValueError(f"--dtype: the drafter's loop runs in float32, got {dtype}")
    where = placement(device, "float32").device
    target, tokenizer, _ = load_target(checkpoint, "--checkpoint", where, options.mask_token_id)
    try:
        model = load_drafter(drafter, device=where).eval()
        check_pair(target, model)
    except ValueError as err:
        raise ValueError(f"--drafter: {str(err).removeprefix('drafter: ')}") from None
    if options.stride != model.spec.block_size:
        raise ValueError(
            f"--stride: {options.stride}, but the drafter's block is {model.spec.block_size} "
            f"(pass --stride {model.spec.block_size})"
        )
    model.requires_grad_(False)
    return target, tokenizer, model
