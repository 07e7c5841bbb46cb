"""What every ablation command shares: the plan's checks, the checkpoint it starts from, and
the worker pool that runs its arm × seed jobs."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

__all__ = ["check_plan", "ensure_checkpoint", "run_jobs"]


def check_plan(
    arms: Sequence[str], known: Collection[str], seeds: Sequence[int], workers: int
) -> None:
    """Arms must be known, seeds distinct and non-empty, workers ≥ 1 (errors name the field)."""
    for name in arms:
        if name not in known:
            raise ValueError(f"arms: unknown arm {name!r} (known: {', '.join(sorted(known))})")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: need distinct seeds, got {seeds!r}")
    if workers < 1:
        raise ValueError(f"workers: must be ≥ 1, got {workers!r}")


def ensure_checkpoint(checkpoint: str, base_config: str, console: Any, show_progress: bool) -> None:
    """Train the base model of ``base_config`` into ``checkpoint`` unless it exists already."""
    if (Path(checkpoint) / "config.json").is_file():
        return
    from brisk.runtime.train.base import train_base
    from brisk.runtime.train.config import BaseTrainConfig

    console.print(f"training the base model ({base_config}) → {checkpoint}")
    cfg = BaseTrainConfig.load(base_config).replace(out_dir=str(Path(checkpoint).parent))
    trained = train_base(cfg, show_progress=show_progress)
    if trained.checkpoint.resolve() != Path(checkpoint).resolve():
        raise ValueError(f"base: training wrote {trained.checkpoint}, expected {checkpoint}")


def run_jobs(
    workers: int,
    job: Callable[..., dict[str, Any]],
    jobs: Sequence[tuple[str, int]],
    args: Sequence[Any],
    done: Callable[[int, str, int, dict[str, Any]], None],
) -> dict[tuple[str, int], dict[str, Any]]:
    """``job(*args, arm, seed)`` for every (arm, seed) in ``workers`` spawned processes (one torch
    thread each, set by the job); ``done(count, arm, seed, result)`` as each one finishes."""
    results: dict[tuple[str, int], dict[str, Any]] = {}
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(job, *args, arm, seed): (arm, seed) for arm, seed in jobs}
        for count, future in enumerate(as_completed(futures), 1):
            arm, seed = futures[future]
            results[(arm, seed)] = future.result()
            done(count, arm, seed, results[(arm, seed)])
    return results


def job_dir(out_dir: str, arm: str, seed: int) -> tuple[Path, dict[str, Any] | None]:
    """An arm × seed's run directory (created) and its saved evaluation, if the job finished
    before (``eval.json``, written atomically last): what makes the experiments resume."""
    run = Path(out_dir) / "arms" / arm / f"seed{seed}"
    result_file = run / "eval.json"
    if result_file.exists():
        return run, dict(json.loads(result_file.read_text()))
    run.mkdir(parents=True, exist_ok=True)
    return run, None


def held_out_problems(checkpoint: str | Path, n: int, seed: int) -> list[Any]:
    """``n`` test-split problems of the task the checkpoint was trained on (its
    ``train_config.json``), the same for every arm and seed."""
    from brisk.runtime.tiny.task import make_split
    from brisk.runtime.train.config import BaseTrainConfig

    task = BaseTrainConfig.load(Path(checkpoint) / "train_config.json").task
    return make_split(task, "test", n, seed)
