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
seed: :func:`~brisk.runtime.experiment.table.paired_change`).

The experiment resumes by being rerun: a job with an ``eval.json`` is read back; a training cut
short continues from its newest checkpoint.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from brisk._atomic import atomic_write_text
from brisk.runtime.configs import Config
from brisk.runtime.experiment.common import experiment_step, job_dir, run_jobs
from brisk.runtime.train.drafter_config import WEIGHTINGS, DrafterTrainConfig
from brisk.theory import AcceptanceProfile

__all__ = ["DrafterEval", "DrafterExperimentConfig", "run_drafter_experiment"]


@dataclass(frozen=True)
class DrafterEval(Config):
    """``[eval]``: the held-out prompts every job decodes, and how."""

    problems: int = 68
    max_new_tokens: int = 128
    temperature: float = 0.0  # the target's; drafts greedy (0) or from the drafter's Top-K
    top_k: int = 16

    def __post_init__(self) -> None:
        if self.problems < 1 or self.max_new_tokens < 1 or self.top_k < 1:
            raise ValueError("eval: problems, max_new_tokens and top_k must be ≥ 1")
        if not self.temperature >= 0:
            raise ValueError(f"eval.temperature: must be ≥ 0, got {self.temperature!r}")
        super().__post_init__()


@dataclass(frozen=True)
class DrafterExperimentConfig(Config):
    """Where it writes, the target and its regenerated data, the arms (weightings), the seeds,
    the jobs run at once, the training every job shares and the evaluation."""

    out_dir: str = "runs/drafter_experiment"
    target: str = ""
    dataset: str = ""
    arms: tuple[str, ...] = WEIGHTINGS
    seeds: tuple[int, ...] = (0, 1, 2)
    workers: int = 2
    train: DrafterTrainConfig = field(default_factory=DrafterTrainConfig)
    eval: DrafterEval = field(default_factory=DrafterEval)

    def __post_init__(self) -> None:
        for name in self.arms:
            if name not in WEIGHTINGS:
                raise ValueError(f"arms: unknown arm {name!r} (known: {', '.join(WEIGHTINGS)})")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: need distinct seeds, got {self.seeds!r}")
        if self.workers < 1:
            raise ValueError(f"workers: must be ≥ 1, got {self.workers!r}")
        for name in ("target", "dataset"):
            if not getattr(self, name):
                raise ValueError(f"{name}: the experiment needs one")
        super().__post_init__()


def _job(cfg: DrafterExperimentConfig, arm: str, seed: int) -> dict[str, Any]:
    """Train one arm × seed's drafter (resuming), then decode the held-out prompts with it and
    with the plain AR target; ``eval.json`` (written last, atomically) marks the job done."""
    import torch

    from brisk._interrupt import stop_signals
    from brisk.runtime.drafter import SDOptions, speculative_decode
    from brisk.runtime.train.drafter_loop import heldout_prompts, load_target, train_drafter

    run, saved = job_dir(cfg.out_dir, arm, seed)
    if saved is not None:
        return saved
    torch.set_num_threads(cfg.train.threads)
    train = cfg.train.replace(
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
    from brisk.runtime.drafter import load_drafter
    from brisk.runtime.loader import placement

    device = placement(cfg.train.device, "float32", announce=False).device
    drafter = load_drafter(final, device=device).eval()
    target, tokenizer, _ = load_target(cfg.target, device=device)
    e = cfg.eval
    prompts = heldout_prompts(cfg.dataset, e.problems, tokenizer)
    if prompts is None:
        raise ValueError(f"dataset: {cfg.dataset} has no held-out prompts (a user's file)")
    limit = target.config.max_position_embeddings - train.block_size
    budget = max(1, min(e.max_new_tokens, limit - max(len(p) for p in prompts)))
    options = SDOptions(
        temperature=e.temperature,
        draft="greedy" if e.temperature == 0 else "top-k",
        top_k=e.top_k,
        max_new_tokens=budget,
        eos_token_id=tokenizer.eos_token_id,
    )
    seeds = [seed * 1_000_000 + i for i in range(len(prompts))]
    with stop_signals() as stop, stop.abortable():
        t0 = time.perf_counter()
        result = speculative_decode(target, drafter, prompts, options, seeds=seeds)
        sd_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ar_tokens = _plain_ar(target, prompts, budget, tokenizer.eos_token_id, e.temperature, seeds)
        ar_s = time.perf_counter() - t0
    tokens = sum(len(o.tokens) for o in result.outputs)
    lengths = [L for o in result.outputs for L in o.accept_lengths]
    profile = AcceptanceProfile.from_accept_lengths(np.asarray(lengths, dtype=np.int64), train.M)
    record = {
        "arm": arm,
        "seed": seed,
        "problems": len(prompts),
        "max_new_tokens": budget,
        "output_tokens": tokens,
        "target_forwards": sum(o.target_forwards for o in result.outputs),
        "tpf": result.tpf,
        "mean_accept": result.mean_accept,
        "reached": profile.reached.tolist(),
        "accepted": profile.accepted.tolist(),
        "draft_cost": result.draft_cost,
        "sd_tokens_per_s": tokens / sd_s,
        "ar_tokens_per_s": ar_tokens / ar_s,
        "speedup": (tokens / sd_s) / (ar_tokens / ar_s),
        "train_wall_s": train_wall,
    }
    atomic_write_text(run / "eval.json", json.dumps(record, indent=2))
    return record


def _plain_ar(
    target: Any, prompts: list[list[int]], budget: int, eos: int, T: float, seeds: list[int]
) -> int:
    """The target's own decoding of every prompt, one request at a time (as the speculative
    loop runs them), with its KV cache: the tokens it output."""
    import torch
    from transformers import DynamicCache

    from brisk.runtime.backbone import cache_keyword

    total = 0
    with torch.inference_mode():
        for prompt, seed in zip(prompts, seeds, strict=True):
            generator = torch.Generator(target.device).manual_seed(seed)
            cache = DynamicCache(config=target.config)
            kw = {cache_keyword(target): cache, "use_cache": True}
            ids = torch.tensor([prompt], device=target.device)
            n = 0
            while n < budget:
                logits = target(input_ids=ids, logits_to_keep=1, **kw).logits[:, -1].float()
                if T == 0:
                    nxt = logits.argmax(-1)
                else:
                    nxt = torch.multinomial(torch.softmax(logits / T, -1), 1, generator=generator)[
                        :, 0
                    ]
                n += 1
                if int(nxt) == eos:
                    break
                ids = nxt[:, None]
            total += n
    return total


def run_drafter_experiment(
    cfg: DrafterExperimentConfig, show_progress: bool = True
) -> dict[str, Any]:
    """Every arm × seed (module docstring), then the summary: ``summary.json`` and
    ``summary.md`` under ``cfg.out_dir``."""
    from rich.console import Console

    console = Console(quiet=not show_progress)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(arm, seed) for arm in cfg.arms for seed in cfg.seeds]
    t0 = time.monotonic()

    def done(count: int, arm: str, seed: int, ev: dict[str, Any]) -> None:
        console.print(
            f"[{count}/{len(jobs)}] {arm} seed {seed}: TPF {ev['tpf']:.3f}, E[L] "
            f"{ev['mean_accept']:.3f}, {ev['speedup']:.2f}× AR ({(time.monotonic() - t0) / 60:.1f}"
            " min)"
        )

    with experiment_step("training and evaluating the drafters; every finished job is kept"):
        results = run_jobs(cfg.workers, _job, jobs, (cfg,), done)
    evals = [results[(arm, seed)] for arm, seed in jobs]
    summary = {"config": cfg.to_dict(), "evals": evals, "wall_s": time.monotonic() - t0}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    table = summary_markdown(cfg, evals)
    (out / "summary.md").write_text(table)
    console.print(table)
    return summary


def summary_markdown(cfg: DrafterExperimentConfig, evals: list[dict[str, Any]]) -> str:
    """The experiment's tables: per arm (means over seeds [95 % t interval]), the pooled
    acceptance per position, and the paper's direction for each other weighting."""
    from brisk.mechanism.stats import Interval
    from brisk.runtime.experiment.table import paired_change

    M = cfg.train.block_size - 1
    e = cfg.eval
    law = "greedy" if e.temperature == 0 else f"T = {e.temperature}, drafts from the Top-{e.top_k}"
    lines = [
        f"# Drafter weightings on one target ({len(cfg.seeds)} seeds, block {M + 1}, {law}, "
        f"{evals[0]['problems']} held-out prompts, {cfg.train.token_budget:,} trained tokens)",
        "",
        "| weighting | TPF (tokens / target forward) | E[L] | draft cost ρ | tok/s ÷ plain AR "
        "| seeds |",
        "|---|---|---|---|---|---|",
    ]
    for arm in cfg.arms:
        rows = [ev for ev in evals if ev["arm"] == arm]
        cells = [
            Interval.of([r[k] for r in rows]).format(1.0, d)
            for k, d in (("tpf", 3), ("mean_accept", 3), ("draft_cost", 2), ("speedup", 3))
        ]
        lines.append(f"| {arm} | {' | '.join(cells)} | {len(rows)} |")
    lines += [
        "",
        "Cells: mean over seeds [95 % Student-t interval]. tok/s: brisk's speculative loop and "
        "the target's plain AR decoding, one request at a time each, in the same process.",
        "",
        "Acceptance a_i per position, pooled over seeds [95 % Jeffreys interval]:",
        "",
        "| weighting | " + " | ".join(f"a_{i + 1}" for i in range(M)) + " |",
        "|---|" + "---|" * M,
    ]
    for arm in cfg.arms:
        rows = [ev for ev in evals if ev["arm"] == arm]
        reached = np.sum([r["reached"] for r in rows], axis=0).astype(np.int64)
        accepted = np.sum([r["accepted"] for r in rows], axis=0).astype(np.int64)
        profile = AcceptanceProfile(reached, accepted)
        low, high = profile.interval()
        rates = profile.rates()
        cells = [
            f"{rates[i]:.3f} [{low[i]:.3f}, {high[i]:.3f}]" if reached[i] else "–" for i in range(M)
        ]
        lines.append(f"| {arm} | {' | '.join(cells)} |")
    values = {(ev["arm"], int(ev["seed"])): float(ev["tpf"]) for ev in evals}
    lines += [
        "",
        "The paper's direction (BRISK weights train the better drafter), paired per seed: the "
        "mean log-ratio of TPF [95 % Student-t interval], as a change.",
        "",
        "| comparison | change of TPF [95 % CI] | seeds | verdict |",
        "|---|---:|---:|---|",
    ]
    for other in [a for a in cfg.arms if a != "brisk"]:
        change = paired_change(values, "brisk", other) if "brisk" in cfg.arms else None
        if change is None:
            continue
        cell = f"{100 * change.mean:+.1f} %"
        if change.k > 1:
            cell += f" [{100 * change.low:+.1f}, {100 * change.high:+.1f}]"
        verdict = (
            "above zero"
            if change.k > 1 and change.low > 0
            else "below zero"
            if change.k > 1 and change.high < 0
            else "not distinguishable from zero"
        )
        lines.append(f"| brisk ÷ {other} | {cell} | {change.k} | {verdict} |")
    return "\n".join(lines) + "\n"
