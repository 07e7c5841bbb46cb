"""One evaluation of a checkpoint in the paper's terms, and the same numbers across seeds.

An arm of an ablation (a training recipe) is trained with several seeds; each trained checkpoint
is decoded once on the same held-out problems with the deployed decoder (ISD at stride N,
temperature T) and scored by :func:`evaluate_checkpoint`:

- **accuracy**: answers graded correct (the paper's normalized answer match),
- **rejection %**: rejected proposals ÷ proposals that verification reached, pooled over every
  verify round (the paper's per-position rate, app:training_details, summed over positions),
- **mean accepted prefix** E[L] over verify rounds,
- **TPF, whole run** (output tokens ÷ forwards, the prefill's included) and **TPF, complete
  cycles** (the renewal quantity of eq:idlm_tpf_instantiation),
- **tokens/s**: output tokens ÷ decoding wall seconds on this machine; with a corrector also
  the same without the head's own time (``tokens_per_s_net``: what a free head would give) and
  that time (``head_s``, measured by :class:`TimedCorrector`, which stands in for the caller's
  head);
- **grader errors**: answers whose grader raised (counted wrong), and what the first said, so an
  accuracy never hides them.

:func:`summarize` turns the per-seed numbers of each arm into a mean with a Student-t interval
across seeds (seeds are the replication unit: each is a separately trained model), and
:func:`markdown_table` prints them in the shape of the paper's tab:ablation_breakdown.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from brisk.mechanism.stats import Interval

__all__ = [
    "ArmSummary",
    "CheckpointEval",
    "Decoding",
    "TimedCorrector",
    "evaluate_checkpoint",
    "summarize",
]

METRICS = ("accuracy", "rejection", "accept_length", "tpf_run", "tpf_cycles", "tokens_per_s")


@dataclass(frozen=True)
class Decoding:
    """How :func:`evaluate_checkpoint` decodes: ISD at ``stride`` and ``temperature``, at most
    ``max_new_tokens`` tokens a request, ``batch_size`` requests a batch; the model on
    ``device`` in ``dtype`` with the MASK id ``mask_token_id`` (None: the checkpoint's own;
    :func:`brisk.runtime.loader.load_model`)."""

    stride: int = 8
    temperature: float = 1.0
    max_new_tokens: int = 256
    batch_size: int = 64
    device: str | None = None
    dtype: str | None = None
    mask_token_id: int | None = None


@dataclass(frozen=True)
class CheckpointEval:
    """The paper's efficiency and quality numbers for one decoded checkpoint."""

    arm: str
    seed: int
    problems: int
    accuracy: float  # fraction in [0, 1]
    rejection: float  # rejected ÷ reached proposal positions, in [0, 1]
    accept_length: float  # mean accepted prefix E[L] per verify round
    tpf_run: float
    tpf_cycles: float
    tokens_per_s: float
    output_tokens: int
    forwards: int
    reached: tuple[int, ...]  # per proposal position, over every verify round
    accepted: tuple[int, ...]
    head_s: float = 0.0  # seconds spent in the corrector's selection (0 head-off)
    tokens_per_s_net: float = math.nan  # output tokens ÷ (wall − head_s)
    grader_errors: int = 0  # answers whose grader raised (counted as wrong in accuracy)
    first_grader_error: str | None = None  # what the first of them said

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TimedCorrector:
    """Stands in for a corrector in :func:`~brisk.runtime.isd.decode` and times its selection:
    ``seconds`` adds up the wall time of every :meth:`select` call (the head's own work: CPU
    kernels run synchronously); everything else, the teacher-forced call of a shadow run
    included, is the wrapped head's, untimed. The caller's head is never changed."""

    def __init__(self, head: Any) -> None:
        self.head = head
        self.seconds = 0.0

    def select(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.head.select(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.head(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # config, impl, tables, …: the head's own
        return getattr(self.head, name)


def evaluate_checkpoint(
    checkpoint: str | Path,
    prompts: Sequence[str],
    answers: Sequence[object],
    *,
    arm: str,
    seed: int,
    decoding: Decoding = Decoding(),
    corrector: Any = None,
    log_blocks: str | Path | None = None,
    shadow: bool = False,
    grader: str = "gsm8k",
) -> CheckpointEval:
    """Decode ``prompts`` from ``checkpoint`` as ``decoding`` says (ISD) and score the outputs
    against ``answers`` with ``grader``.

    Request r is decoded with seed ``seed · len(prompts) + r`` and request id r, so two
    checkpoints evaluated with the same ``seed`` see the same uniforms for the same problem.
    With ``log_blocks`` every verify round is written to that block-log directory (for
    ``brisk mechanism report``). ``shadow`` decodes head-off with the corrector run beside the
    base and both blocks scored by the verifier (the mechanism diagnostics' same-state logs; an
    extra forward per round, so its TPF and speed are the head-off decoder's, not the head's).
    """
    import numpy as np
    import torch

    from brisk.runtime.isd import decode
    from brisk.runtime.isd.blocklog import BlockLogger
    from brisk.runtime.loader import load_model
    from brisk.runtime.prompts import completion_texts, encode_prompts, isd_options
    from brisk.runtime.tasks.graders import grade_all

    if len(prompts) != len(answers):
        raise ValueError(f"answers: expected {len(prompts)} (one per prompt), got {len(answers)}")
    if not prompts:
        raise ValueError("prompts: need at least one prompt")
    d = decoding
    device, dtype, mask_id = d.device, d.dtype, d.mask_token_id
    loaded = load_model(
        checkpoint, device=device, dtype=dtype, mask_token_id=mask_id, where="checkpoint"
    )
    tokenizer, backbone = loaded.tokenizer, loaded.backbone
    if corrector is not None:
        corrector.to(backbone.device)
    if shadow and (corrector is None or log_blocks is None):
        raise ValueError("shadow: needs a corrector and log_blocks")
    options = isd_options(
        tokenizer,
        stride=d.stride,
        temperature=d.temperature,
        max_new_tokens=d.max_new_tokens,
        shadow=shadow,
        score_blocks=shadow,
    )
    encoded = encode_prompts(tokenizer, prompts)
    n = len(encoded)
    K = corrector.config.K if corrector is not None else min(options.top_k, backbone.vocab_size)
    logger = BlockLogger(log_blocks, options.M, K) if log_blocks is not None else None
    head = TimedCorrector(corrector) if corrector is not None else None
    if corrector is not None and hasattr(corrector, "tables"):
        corrector.tables(backbone)  # fold the head's tables before the clock starts
    start = time.perf_counter()
    with torch.inference_mode():
        result = decode(
            backbone,
            encoded,
            options,
            corrector=head,  # type: ignore[arg-type]  # the head's stand-in (TimedCorrector)
            seeds=[seed * n + r for r in range(n)],
            request_ids=list(range(n)),
            logger=logger,
            batch_size=d.batch_size,
        )
    wall = time.perf_counter() - start
    head_s = head.seconds if head is not None else 0.0
    if logger is not None:
        logger.close()
    requests = result.requests
    texts = completion_texts(tokenizer, result)
    grades = grade_all(grader, texts, list(answers), workers=1)
    correct = [c is True for c in grades.correct]
    lengths = np.concatenate([np.asarray(r.accept_lengths, int) for r in requests])
    reached = sum((r.profile(options.M).reached for r in requests), np.zeros(options.M, int))
    accepted = sum((r.profile(options.M).accepted for r in requests), np.zeros(options.M, int))
    tokens = sum(len(r.tokens) for r in requests)
    forwards = sum(r.forwards for r in requests)
    cycle_tokens = sum(r.cycle_tokens for r in requests)
    cycle_forwards = sum(r.cycle_forwards for r in requests)
    rejected = int(reached.sum() - accepted.sum())
    return CheckpointEval(
        arm=arm,
        seed=seed,
        problems=n,
        accuracy=sum(correct) / n,
        rejection=rejected / int(reached.sum()) if reached.sum() else math.nan,
        accept_length=float(lengths.mean()) if lengths.size else math.nan,
        tpf_run=tokens / forwards if forwards else math.nan,
        tpf_cycles=cycle_tokens / cycle_forwards if cycle_forwards else math.nan,
        tokens_per_s=tokens / wall if wall > 0 else math.nan,
        output_tokens=tokens,
        forwards=forwards,
        reached=tuple(int(x) for x in reached),
        accepted=tuple(int(x) for x in accepted),
        head_s=head_s,
        tokens_per_s_net=tokens / (wall - head_s) if wall > head_s else math.nan,
        grader_errors=grades.errors,
        first_grader_error=grades.first_error,
    )


@dataclass(frozen=True)
class ArmSummary:
    """An arm's metrics across its seeds, and its seeds' grader errors added up."""

    arm: str
    seeds: tuple[int, ...]
    metrics: dict[str, Interval]
    grader_errors: int = 0  # answers whose grader raised, over every seed (counted as wrong)

    def to_dict(self) -> dict[str, Any]:
        metrics = {k: asdict(v) for k, v in self.metrics.items()}
        return {
            "arm": self.arm,
            "seeds": list(self.seeds),
            **metrics,
            "grader_errors": self.grader_errors,
        }


def summarize(
    evals: Sequence[CheckpointEval], level: float = 0.95, metrics: Sequence[str] = METRICS
) -> list[ArmSummary]:
    """Per arm (in first-seen order): each metric's mean and t-interval across its seeds."""
    arms: dict[str, list[CheckpointEval]] = {}
    for e in evals:
        arms.setdefault(e.arm, []).append(e)
    out = []
    for arm, rows in arms.items():
        seeds = [e.seed for e in rows]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"evals: arm {arm!r} has seed(s) evaluated twice: {sorted(seeds)}")
        values = {m: Interval.of([getattr(e, m) for e in rows], level) for m in metrics}
        out.append(ArmSummary(arm, tuple(seeds), values, sum(e.grader_errors for e in rows)))
    return out
