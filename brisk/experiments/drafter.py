"""The cross-backbone experiment (``brisk experiment drafter --config FILE``): the BRISK training
recipe applied to a DLM drafter verified by an AR target, against the drafter weightings
practitioners use (D-PACE, DFlash's decay, uniform).

Every arm is a weighting; each arm × seed trains a drafter for the same target on the same
regenerated data with the same token budget (``brisk train drafter``, :mod:`brisk.runtime.train.
drafter_loop`), then decodes the task's held-out prompts with speculative decoding (decode seed =
the seed) and, in the same process on the same prompts, with the target's plain AR decoding, one
request at a time both. Per job: tokens per target forward (TPF), E[L], the acceptance counts per
position, the measured draft cost, tokens/s of both loops and their ratio. The summary gives each
arm's means over seeds with 95 % Student-t intervals, the pooled per-position acceptance with
Jeffreys intervals, and the paper's directions (BRISK against each other weighting, paired per
seed: :func:`~brisk.experiments.table.paired_change`).

**Head on and off** (``[head] arms``): for each listed arm × seed, the corrector on that
drafter's drafts. The drafter decodes ``head.problems`` of the task's *training* prompts as
deployed (the eval's temperature and draft law, head off), recording the corrector's events
(:func:`~brisk.runtime.train.corrector.events.collect_draft_events`); a head is trained on them
(:func:`~brisk.runtime.train.corrector.recipe.train_corrector`, every response: the drafter's
data is the target's own law, not graded); then the held-out prompts are decoded three ways in one
window, in one process: head off, head on (the head drafting over the drafter's Top-K) and the
plain AR target, so the tok/s ratios compare like with like. At T = 0 head on must output the
same tokens as head off (both are the target's greedy decoding); the job records whether it
did. The summary's head table gives TPF off and on per arm, the change paired per seed and the
tok/s of each against plain AR.

The experiment resumes by being rerun: a job with an ``eval.json`` is read back (and its head
stage, when the config asks for one it lacks, run and added); a training cut short continues
from its newest checkpoint, an event collection after its last complete batch.

Its config is :mod:`brisk.experiments.drafter_config`, its tables
:mod:`brisk.experiments.drafter_table`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from brisk._atomic import atomic_write_text
from brisk.experiments.common import (
    ExperimentRun,
    begin_experiment,
    job_dir,
    run_jobs,
    with_mask,
)
from brisk.experiments.drafter_config import DrafterExperimentConfig
from brisk.experiments.drafter_table import summary_markdown
from brisk.theory import AcceptanceProfile

__all__ = ["DrafterExperimentConfig", "run_drafter_experiment"]


def _job(cfg: DrafterExperimentConfig, arm: str, seed: int) -> dict[str, Any]:
    """Train one arm × seed's drafter (resuming), then decode the held-out prompts with it and
    with the plain AR target, then (for ``head.arms``) its head stage; ``eval.json`` (written
    atomically after each stage) marks what is done."""
    import torch

    run, saved = job_dir(cfg.out_dir, arm, seed)
    wants_head = arm in cfg.head.arms
    if saved is not None and wants_head and "head" in saved:
        ran = saved["head"].get("config")
        if ran != json.loads(json.dumps(cfg.head.to_dict())):  # as eval.json holds it
            raise ValueError(
                f"head: {run} ran its head stage with another [head] section ({ran}); "
                f"remove {run / 'head'} and the 'head' entry of its eval.json to run it again"
            )
    if saved is not None and (not wants_head or "head" in saved):
        return saved
    torch.set_num_threads(cfg.train.threads)
    pair = _Pair.load(cfg, run, arm, seed)
    record = saved if saved is not None else _evaluate(cfg, pair, arm, seed)
    atomic_write_text(run / "eval.json", json.dumps(record, indent=2))
    if wants_head:
        record["head"] = _head_stage(cfg, pair, run, seed)
        atomic_write_text(run / "eval.json", json.dumps(record, indent=2))
    return record


@dataclass
class _Pair:
    """One job's trained drafter, the target, its tokenizer, the held-out prompts and the
    options they are decoded with."""

    drafter: Any
    target: Any
    tokenizer: Any
    prompts: list[list[int]]
    options: Any  # SDOptions
    train_wall_s: float

    @classmethod
    def load(cls, cfg: DrafterExperimentConfig, run: Path, arm: str, seed: int) -> _Pair:
        from brisk.runtime.drafter import SDOptions, load_drafter
        from brisk.runtime.loader import load_target, placement
        from brisk.runtime.train.drafter.evaluate import task_prompts
        from brisk.runtime.train.drafter.recipe import train_drafter

        train = with_mask(cfg, cfg.train).replace(
            target=cfg.target,
            dataset=cfg.dataset,
            out_dir=str(run / "train"),
            weighting=arm,
            seed=seed,
            eval_problems=0,
        )
        final = run / "train" / "final"
        if (final / "config.json").is_file():  # trained before its evaluation was cut short
            ends = [json.loads(line) for line in (run / "train" / "metrics.jsonl").open()]
            train_wall = next(r["train_wall_s"] for r in ends if r["event"] == "end")
        else:
            trained = train_drafter(train, show_progress=False, resume=True)
            final, train_wall = trained.checkpoint, trained.wall_s
        device = placement(cfg.train.device, "float32", announce=False).device
        drafter = load_drafter(final, device=device).eval()
        target, tokenizer, _ = load_target(
            cfg.target, device=device, mask_token_id=train.mask_token_id
        )
        e = cfg.eval
        prompts = task_prompts(cfg.dataset, e.problems, tokenizer)
        limit = target.config.max_position_embeddings - train.block_size
        budget = max(1, min(e.max_new_tokens, limit - max(len(p) for p in prompts)))
        options = SDOptions(
            temperature=e.temperature,
            draft="greedy" if e.temperature == 0 else "top-k",
            top_k=e.top_k,
            max_new_tokens=budget,
            eos_token_id=tokenizer.eos_token_id,
        )
        return cls(drafter, target, tokenizer, prompts, options, train_wall)

    def seeds(self, seed: int) -> list[int]:
        return [seed * 1_000_000 + i for i in range(len(self.prompts))]

    def timed_sd(self, seed: int, head: Any = None) -> tuple[Any, float]:
        from brisk.runtime.drafter import speculative_decode

        t0 = time.perf_counter()
        result = speculative_decode(
            self.target,
            self.drafter,
            self.prompts,
            self.options,
            seeds=self.seeds(seed),
            corrector=head,
        )
        return result, time.perf_counter() - t0

    def timed_ar(self, seed: int) -> tuple[list[list[int]], float]:
        """The plain AR target's outputs and their wall time."""
        from brisk.runtime.drafter import plain_decode

        t0 = time.perf_counter()
        outputs = plain_decode(self.target, self.prompts, self.options, seeds=self.seeds(seed))
        return [list(out.tokens) for out in outputs], time.perf_counter() - t0


def _acceptance(result: Any, M: int) -> dict[str, Any]:
    """TPF, E[L], the per-position counts and the draft cost of a speculative decode."""
    lengths = [L for o in result.outputs for L in o.accept_lengths]
    profile = AcceptanceProfile.from_accept_lengths(np.asarray(lengths, dtype=np.int64), M)
    return {
        "output_tokens": sum(len(o.tokens) for o in result.outputs),
        "target_forwards": sum(o.target_forwards for o in result.outputs),
        "tpf": result.tpf,
        "mean_accept": result.mean_accept,
        "reached": profile.reached.tolist(),
        "accepted": profile.accepted.tolist(),
        "draft_cost": result.draft_cost,
    }


def _evaluate(cfg: DrafterExperimentConfig, pair: _Pair, arm: str, seed: int) -> dict[str, Any]:
    """Head off: speculative decoding of the held-out prompts, then the plain AR target."""
    from brisk._interrupt import stop_signals

    with stop_signals() as stop, stop.abortable():
        result, sd_s = pair.timed_sd(seed)
        ar_outputs, ar_s = pair.timed_ar(seed)
    got = _acceptance(result, cfg.train.block_size - 1)
    ar_tokens = sum(len(out) for out in ar_outputs)
    same = sum(list(o.tokens) == a for o, a in zip(result.outputs, ar_outputs, strict=True))
    return {
        "arm": arm,
        "seed": seed,
        "problems": len(pair.prompts),
        "max_new_tokens": pair.options.max_new_tokens,
        **got,
        "sd_tokens_per_s": got["output_tokens"] / sd_s,
        "ar_tokens_per_s": ar_tokens / ar_s,
        "speedup": (got["output_tokens"] / sd_s) / (ar_tokens / ar_s),
        # outputs token for token the plain AR decoding's (all of them at T = 0)
        "same_as_ar": same,
        "train_wall_s": pair.train_wall_s,
    }


def _head_stage(cfg: DrafterExperimentConfig, pair: _Pair, run: Path, seed: int) -> dict[str, Any]:
    """The corrector on this job's drafts (module docstring): events on the task's training
    prompts, a head trained on them, and head off / head on / plain AR on the held-out prompts
    in one window. Each step's output is kept: a rerun reuses the events and a trained head."""
    from brisk._interrupt import stop_signals
    from brisk.runtime.corrector import Corrector
    from brisk.runtime.drafter import position_limit, target_heads
    from brisk.runtime.train.corrector.config import CorrectorTrainConfig
    from brisk.runtime.train.corrector.events import collect_draft_events
    from brisk.runtime.train.corrector.recipe import train_corrector
    from brisk.runtime.train.corrector.store import EventStore
    from brisk.runtime.train.drafter.evaluate import task_prompts
    from brisk.runtime.train.selfgen import checkpoint_hash, tokenizer_hash

    h, heads = cfg.head, target_heads(pair.target)
    events = run / "head" / "events"
    if (events / "_events.json").is_file():
        store = EventStore.open(events)
    else:
        prompts = task_prompts(cfg.dataset, h.problems, pair.tokenizer, split="train")
        limit = position_limit(pair.target, pair.drafter.spec.M)
        budget = pair.options.max_new_tokens
        fits = [p for p in prompts if limit is None or len(p) + budget <= limit]
        if not fits:
            raise ValueError(
                f"head.problems: none of the {len(prompts)} training prompts leaves room for "
                f"{budget} new tokens and a block in the target's positions"
            )
        drafter = run / "train" / "final"
        store = collect_draft_events(
            pair.target,
            pair.drafter,
            fits,
            pair.options,
            events,
            seeds=[seed * 1_000_000 + 500_000 + i for i in range(len(fits))],
            provenance={  # what collect --drafter records: the store trains on its own
                "checkpoint": cfg.target,
                "checkpoint_hash": checkpoint_hash(cfg.target),
                "tokenizer_hash": tokenizer_hash(cfg.target),
                "decoder": {"algorithm": "speculative", "head": "off"},
                "drafter": str(drafter),
                "drafter_hash": checkpoint_hash(drafter),
            },
            batch_size=16,
        )
    out = run / "head" / "train"
    trained_file = run / "head" / "trained.json"
    if trained_file.is_file():  # trained before the decoding was cut short
        trained = json.loads(trained_file.read_text())
    else:
        head_cfg = CorrectorTrainConfig(
            events=str(events),
            out_dir=str(out),
            head=h.size,  # type: ignore[arg-type]
            K=h.K,
            epochs=h.epochs,
            batch_size=h.batch_size,
            lr=h.lr,
            only_correct=False,
            seed=seed,
            threads=cfg.train.threads,
        )
        result = train_corrector(head_cfg, False, heads, store, resume=True)  # type: ignore[arg-type]
        trained = {
            "val_loss": result.outcome.val_loss,
            "val_loss_init": result.outcome.val_loss_init,
            "wall_s": result.wall_s,
        }
        atomic_write_text(trained_file, json.dumps(trained, indent=2))
    head = Corrector.from_pretrained(out / "final").to(pair.target.device).eval()
    with stop_signals() as stop, stop.abortable():
        off, off_s = pair.timed_sd(seed)
        on, on_s = pair.timed_sd(seed, head=head)
        ar_outputs, ar_s = pair.timed_ar(seed)
    got = _acceptance(on, cfg.train.block_size - 1)
    ar_rate = sum(len(out) for out in ar_outputs) / ar_s
    off_tokens = sum(len(o.tokens) for o in off.outputs)
    return {
        "config": cfg.head.to_dict(),
        **got,
        "tpf_off": off.tpf,
        "identical_output": [o.tokens for o in on.outputs] == [o.tokens for o in off.outputs],
        "events": len(store),
        "event_prompts": int(store.meta["requests"]),
        "head_val_loss": trained["val_loss"],
        "head_val_loss_init": trained["val_loss_init"],
        "head_train_wall_s": trained["wall_s"],
        "sd_tokens_per_s": got["output_tokens"] / on_s,
        "off_tokens_per_s": off_tokens / off_s,
        "ar_tokens_per_s": ar_rate,
        "speedup": got["output_tokens"] / on_s / ar_rate,
        "speedup_off": off_tokens / off_s / ar_rate,
    }


def run_drafter_experiment(
    cfg: DrafterExperimentConfig, show_progress: bool = True
) -> dict[str, Any]:
    """Every arm × seed (module docstring), then the summary: ``summary.json`` and
    ``summary.md`` under ``cfg.out_dir``. SIGINT or SIGTERM ends it with
    :class:`~brisk._interrupt.Interrupted`, every finished job kept."""
    with begin_experiment(cfg, show_progress) as run:
        return _run(cfg, run)


def _run(cfg: DrafterExperimentConfig, run: ExperimentRun) -> dict[str, Any]:
    jobs = [(arm, seed) for arm in cfg.arms for seed in cfg.seeds]

    def done(count: int, arm: str, seed: int, ev: dict[str, Any]) -> None:
        head = f", head on: TPF {ev['head']['tpf']:.3f}" if "head" in ev else ""
        what = f"TPF {ev['tpf']:.3f}, E[L] {ev['mean_accept']:.3f}, {ev['speedup']:.2f}× AR{head}"
        run.job_done(count, len(jobs), arm, seed, what)

    with run.step("training and evaluating the drafters; every finished job is kept"):
        results = run_jobs(cfg.workers, _job, jobs, (cfg,), done)
    with run.summarizing():
        evals = [results[(arm, seed)] for arm, seed in jobs]
        summary = {"config": cfg.to_dict(), "evals": evals, "wall_s": time.monotonic() - run.t0}
        (run.out / "summary.json").write_text(json.dumps(summary, indent=2))
        table = summary_markdown(cfg, evals)
        (run.out / "summary.md").write_text(table)
        run.console.print(table)
    return summary
