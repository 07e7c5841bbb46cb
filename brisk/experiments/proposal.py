"""The proposal-training ablation, one command (``brisk experiment proposal --config FILE``).

Steps, each skipped when its output already exists (so a rerun resumes):

1. the base checkpoint (trained from ``base_config`` if ``base`` does not exist yet);
2. the self-generated dataset of the base (``brisk train selfgen``);
3. every trained arm × seed: ``brisk train proposal`` from the same base, with the same token
   budget and schedule (:data:`ARMS`), then an evaluation on held-out problems at stride N and
   temperature T (accuracy, rejection %, E[L], whole-run and complete-cycle TPF, tokens/s, with
   every verify round logged); the base arm is evaluated with the same decode seeds;
4. with a ``[head]`` section (:class:`HeadSection`), the head-on row, the paper's full method
   (proposal training + the prefix-conditioned corrector): the best arm is chosen from the
   arms' results, by this rule (:func:`~brisk.experiments.headon.choose_arm`): among
   the trained arms at the largest budget (every trained arm without budgets), those whose mean
   accuracy over seeds is at most δ below the base arm's, δ = the largest of 2 accuracy points
   and the two arms' 95 % t-interval half-widths; of those, the highest mean whole-run TPF
   (without a base arm, the highest TPF; when none qualifies, the most accurate arm). Then, per
   seed s, a job in the same worker pool takes that arm's seed-s checkpoint as a frozen
   backbone, collects its policy-reached events (``[head.collect]``), trains the distilled
   head with seed s (``[head.train]``) and evaluates head on with the arms' evaluation (same
   held-out problems, decode seeds, stride, temperature): the row ``<arm>+head`` of the table
   and of ``summary.json`` (``arms``, ``evals``; the choice and why under ``head``), done when
   its ``eval.json`` exists (:mod:`brisk.experiments.headon`);
5. the table across seeds (markdown shaped like tab:ablation_breakdown, JSON, a plot), the
   weight-evolution figure of the BRISK arm, and ``brisk mechanism report`` on the logs of the
   arm with the highest whole-run TPF.

Jobs run ``workers`` at a time in separate processes with one torch thread each (the arms are
independent; nothing distributed). SIGINT or SIGTERM stops the step under way at its next safe
point (a training run with a checkpoint, the data after its last whole part, an evaluation at
once) and ends the command with one line saying what stays; rerunning it continues
(:mod:`brisk.experiments.common`). Outputs under ``out_dir``: ``data/``,
``arms/<arm>/seed<s>/`` (checkpoint, metrics, ``eval.json``, ``blocks/``), with ``[head]``
``head/<arm>/seed<s>/`` (``events/``, the head's ``final/``, ``train.json``, ``eval.json``,
``blocks/``), ``summary.md``,
``summary.json``, ``arms.png``, ``weights_<arm>.png``, ``mechanism/``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from brisk._atomic import atomic_write_text
from brisk._interrupt import StopSignals, stop_signals
from brisk.experiments.common import (
    ExperimentRun,
    begin_experiment,
    evaluate_held_out,
    job_dir,
    read_eval,
    run_jobs,
    with_mask,
)
from brisk.experiments.headon import choose_arm, head_job, row_name
from brisk.experiments.proposal_config import (
    ARMS,
    Arm,
    ExperimentConfig,
    HeadSection,
    arm_named,
    budget_label,
    split_job,
)
from brisk.experiments.theory import ArmTheory, arm_theory, theory_markdown

__all__ = ["ARMS", "Arm", "ExperimentConfig", "HeadSection", "epoch_tokens", "run_experiment"]


def epoch_tokens(cfg: ExperimentConfig, data_dir: str | Path) -> int:
    """Response tokens of one epoch of the base's correct self-generated responses (what a
    training step counts: every response token and the EOS)."""
    from brisk.runtime.loader import load_tokenizer
    from brisk.runtime.train.evaluate import encode_example
    from brisk.runtime.train.proposal.data import load_examples

    pcfg = cfg.train.replace(
        init=cfg.base, dataset=str(data_dir), data="selfgen-correct", stride=cfg.stride
    )
    tokenizer = load_tokenizer(cfg.base, where="base")
    total = 0
    for ex in load_examples(pcfg):
        seq, prompt_len = encode_example(ex.prompt, ex.response, tokenizer)
        total += len(seq) - prompt_len
    return total


def _job(
    cfg: ExperimentConfig, data_dir: str, tokens_per_epoch: int, name: str, seed: int
) -> dict[str, Any]:
    """Train (unless the base arm) and evaluate one arm (at one budget) × seed; returns the
    evaluation. A signal stops the training at its next step (with a checkpoint) and the
    evaluation at once."""
    with stop_signals() as stop:  # in a worker, its flag for life
        return _train_and_evaluate(cfg, data_dir, tokens_per_epoch, name, seed, stop)


def _train_and_evaluate(
    cfg: ExperimentConfig,
    data_dir: str,
    tokens_per_epoch: int,
    name: str,
    seed: int,
    stop: StopSignals,
) -> dict[str, Any]:
    import torch

    from brisk.runtime.train.proposal.recipe import train_proposal

    torch.set_num_threads(1)
    arm_name, epochs = split_job(name)
    arm = arm_named(arm_name)
    run, done = job_dir(cfg.out_dir, name, seed)
    if done is not None:
        return done
    checkpoint = Path(cfg.base)
    if arm.data != "base":
        budget = cfg.train.token_budget if epochs is None else round(epochs * tokens_per_epoch)
        pcfg = with_mask(cfg, cfg.train).replace(
            init=cfg.base,
            dataset=data_dir,
            out_dir=str(run),
            data=arm.data,
            weights=arm.weights,
            profile=arm.profile,
            seed=seed,
            stride=cfg.stride,
            temperature=cfg.selfgen.temperature,
            token_budget=budget,
            device=cfg.device,
        )
        checkpoint = run / "final"
        if not checkpoint.is_dir():  # final/ is written whole (renamed into place) or not
            train_proposal(pcfg, resume=True, show_progress=False)
    ev = evaluate_held_out(cfg.held_out, checkpoint, run, name, seed, stop)
    atomic_write_text(run / "eval.json", json.dumps(ev.to_dict(), indent=2))
    return ev.to_dict()


def run_experiment(cfg: ExperimentConfig, show_progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the ablation; returns the summary that ``summary.json`` holds. SIGINT or
    SIGTERM ends it with :class:`~brisk._interrupt.Interrupted` (module docstring)."""
    with begin_experiment(cfg, show_progress) as run:
        return _run(cfg, run)


def _run(cfg: ExperimentConfig, run: ExperimentRun) -> dict[str, Any]:
    from brisk.experiments.evaluate import CheckpointEval
    from brisk.runtime.train.selfgen import generate_dataset

    # 1. The base checkpoint.
    run.ensure_checkpoint(cfg.base, cfg.base_config, "training the base model", timing="base_s")

    # 2. Self-generated data from the base, with the deployed decoder.
    data_dir = run.out / "data"
    run.console.print(f"self-generated data → {data_dir}")
    with run.step("generating the dataset", timing="selfgen_s"):
        cfg.decode_problems(generate_dataset, cfg.base, data_dir, cfg.selfgen, run.show_progress)
    tokens_per_epoch = epoch_tokens(cfg, data_dir)
    if cfg.budgets:
        run.console.print(
            f"one epoch of the correct responses: {tokens_per_epoch:,} tokens; "
            f"budgets {', '.join(f'{b:g}' for b in cfg.budgets)} epochs"
        )

    # 3. Arms × seeds, trained and evaluated in worker processes (longest jobs first).
    names = cfg.job_names()
    jobs = [
        (a, seed)
        for a in sorted(names, key=lambda a: -(split_job(a)[1] or 0))
        if a != "base"
        for seed in cfg.seeds
    ]
    jobs += [("base", seed) for seed in cfg.seeds if "base" in cfg.arms]
    evals: dict[tuple[str, int], CheckpointEval] = {}

    def done(count: int, a: str, seed: int, ev: dict[str, Any]) -> None:
        evals[(a, seed)] = read_eval(ev)
        run.eval_done(count, len(jobs), a, seed, ev)

    with run.step(f"running the arm × seed jobs in {run.out / 'arms'}", timing="arms_s"):
        run_jobs(cfg.workers, _job, jobs, (cfg, str(data_dir), tokens_per_epoch), done)

    # 4. The head-on row: the best arm's backbones, a distilled head each, decoded head on.
    head: dict[str, Any] | None = None
    if cfg.head.enabled:
        with run.timed("head_s"):
            head = _head_on(cfg, evals, run)

    # 5. The table, the plots and the mechanism report of the best arm (abortable: a rerun
    # writes them again from the jobs' results).
    with run.summarizing():
        return _summarize(cfg, evals, run, data_dir, tokens_per_epoch, head)


def _head_on(
    cfg: ExperimentConfig, evals: dict[tuple[str, int], Any], run: ExperimentRun
) -> dict[str, Any]:
    """Choose the best arm (:func:`~brisk.experiments.headon.choose_arm`) and run its
    head-on job of every seed in the worker pool; returns the choice and the jobs' results."""
    from brisk.experiments.evaluate import summarize

    names = cfg.job_names()
    summaries = {sm.arm: sm for sm in summarize([evals[(a, s)] for a in names for s in cfg.seeds])}
    arm, why = choose_arm(names, summaries, cfg.budgets)
    run.console.print(f"head-on row: {arm if arm is not None else 'none'} ({why})")
    if arm is None:
        return {"arm": None, "why": why, "results": {}}
    jobs = [(arm, seed) for seed in cfg.seeds]

    def done(count: int, a: str, seed: int, res: dict[str, Any]) -> None:
        run.eval_done(count, len(jobs), row_name(a), seed, res["eval"])

    out = run.out / "head" / arm
    with run.step(f"running the head-on jobs in {out}"):
        results = run_jobs(cfg.workers, head_job, jobs, (cfg,), done)
    return {"arm": arm, "why": why, "results": results}


def _summarize(
    cfg: ExperimentConfig,
    evals: dict[tuple[str, int], Any],
    run: ExperimentRun,
    data_dir: Path,
    tokens_per_epoch: int,
    head: dict[str, Any] | None = None,
) -> dict[str, Any]:
    from brisk.experiments.evaluate import summarize
    from brisk.experiments.table import directions_table, markdown_table, plot_summaries

    out = run.out
    names = cfg.job_names()
    ordered = [evals[(a, seed)] for a in names for seed in cfg.seeds]
    headers: tuple[str, ...] = ("Training data", "W.")
    labels: dict[str, tuple[str, ...]] = {a.name: a.labels for a in ARMS}
    if cfg.budgets:
        headers += ("Budget",)
        labels = {n: (*arm_named(split_job(n)[0]).labels, budget_label(n)) for n in names}
    head_arm = head["arm"] if head is not None else None
    head_rows = []  # the head-on row's evaluations, one per seed
    head_note = ""
    if head is not None and head_arm is not None:
        results = head["results"]
        head_rows = [read_eval(results[(head_arm, seed)]["eval"]) for seed in cfg.seeds]
        data, weights, *rest = labels[head_arm]
        labels[row_name(head_arm)] = (f"{data} + corrector head", weights, *rest)
        preset = cfg.head.train.head
        head_note = (
            f" Head-on row {row_name(head_arm)}: the paper's full method, {head_arm}'s seed-s "
            f"checkpoint frozen, a verifier-distilled prefix-conditioned head ({preset}, "
            f"K = {cfg.head.train.K}) trained with seed s on its own policy-reached events "
            f"({cfg.head.collect.problems} training problems × {cfg.head.collect.samples}), "
            f"decoded head on with the same problems and decode seeds; {head_arm} chosen as "
            f"{head['why']}."
        )
    elif head is not None:
        head_note = f" No head-on row: {head['why']}."
    head_names = [row_name(head_arm)] if head_rows and head_arm is not None else []
    summaries = summarize(ordered + head_rows)
    table = markdown_table(
        summaries, labels, headers, baseline="base" if "base" in cfg.arms else None
    )
    plot_summaries(summaries, out / "arms.png")
    trained = [sm for sm in summaries if sm.arm != "base" and sm.arm in names]
    best = max(trained, key=lambda sm: sm.metrics["tpf_run"].mean).arm if trained else "base"
    from brisk.runtime.train.plots import plot_weight_evolution

    for a in names:
        metrics = out / "arms" / a / f"seed{cfg.seeds[0]}" / "metrics.jsonl"
        if metrics.exists():
            plot_weight_evolution(metrics, out / f"weights_{a}.png")
    from brisk.mechanism.report import analyze, write_report

    blocks = out / "arms" / best / f"seed{cfg.seeds[0]}" / "blocks"
    write_report(analyze(blocks, draws=200), out / "mechanism")  # brisk mechanism report
    theory = _theory(cfg, names, ordered, summaries, data_dir) if cfg.theory_samples else []
    run.timings["total_s"] = time.monotonic() - run.t0
    summary = {
        "config": cfg.to_dict(),
        "tokens_per_epoch": tokens_per_epoch,
        "arms": [sm.to_dict() for sm in summaries],
        "evals": [e.to_dict() for e in ordered + head_rows],
        "theory": [r.to_dict() for r in theory],
        "best_arm": best,
        "timings": run.timings,
    }
    if head is not None:
        summary["head"] = {
            "arm": head_arm,
            "row": row_name(head_arm) if head_arm is not None else None,
            "why": head["why"],
            "runs": [
                {
                    "seed": s,
                    **{k: v for k, v in head["results"][(head_arm, s)].items() if k != "eval"},
                }
                for s in cfg.seeds
            ]
            if head_arm is not None
            else [],
        }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(
        f"# Proposal-training ablation ({len(cfg.seeds)} seeds, N = {cfg.stride}, "
        f"T = {cfg.eval.temperature}, {cfg.eval.problems} held-out problems)\n\n{table}\n"
        f"Cells: mean over seeds [95 % Student-t interval]. tok/s on one CPU thread with block "
        f"logging on. W.: D = BRISK dynamic, S = BRISK static, U = uniform. Best arm by "
        f"whole-run TPF: {best}.{head_note}\n\n"
        f"{_profile_table(cfg, names + head_names, ordered + head_rows)}\n"
        + theory_markdown(theory, "base" if "base" in cfg.arms else None, cfg.theory_samples)
        + "\n### The paper's directions\n\nWhole-run TPF of one arm against another, paired "
        "per seed: mean log-ratio over the seeds [95 % Student-t interval], as a change.\n\n"
        + directions_table(summary["evals"], head_arm)
    )
    run.console.print(table)
    return summary


def _theory(
    cfg: ExperimentConfig,
    names: Sequence[str],
    evals: Sequence[Any],
    summaries: Sequence[Any],
    data_dir: Path,
) -> list[ArmTheory]:
    """The theory row of every table row: its pooled profile, and the headroom measurement of
    its first seed's checkpoint on the first ``theory_samples`` correct self-generated
    responses of the base (the same samples for every arm)."""
    import numpy as np
    import torch

    from brisk.runtime.loader import load_model
    from brisk.runtime.train.headroom import measure_headroom
    from brisk.runtime.train.selfgen import read_dataset

    table = read_dataset(str(data_dir))
    columns = (table[c].to_pylist() for c in ("prompt", "response", "correct"))
    rows = [(p, r) for p, r, ok in zip(*columns, strict=True) if ok]
    samples = rows[: cfg.theory_samples]
    if not samples:
        return []
    tpf_cycles = {sm.arm: sm.metrics["tpf_cycles"].mean for sm in summaries}
    out = []
    torch.set_num_threads(1)
    for name in names:
        run = Path(cfg.out_dir) / "arms" / name / f"seed{cfg.seeds[0]}"
        checkpoint = Path(cfg.base) if name == "base" else run / "final"
        loaded = load_model(
            checkpoint,
            device=cfg.device,
            dtype=cfg.dtype,
            mask_token_id=cfg.mask_token_id,
            where="base",
        )
        headroom = measure_headroom(
            loaded.backbone,
            loaded.tokenizer,
            samples,
            cfg.stride,
            cfg.eval.temperature,
            cfg.train.top_k,
        )
        mine = [e for e in evals if e.arm == name]
        reached = np.sum([e.reached for e in mine], axis=0)
        accepted = np.sum([e.accepted for e in mine], axis=0)
        out.append(
            arm_theory(name, reached.tolist(), accepted.tolist(), headroom, tpf_cycles[name])
        )
    return out


def _profile_table(cfg: ExperimentConfig, names: Sequence[str], evals: Sequence[Any]) -> str:
    """Per arm, the acceptance rate a_i at each position pooled over seeds' verify rounds."""
    import numpy as np

    M = cfg.stride - 1
    lines = [
        "Acceptance profile a_i (pooled over seeds)\n",
        "| arm | " + " | ".join(f"a_{i + 1}" for i in range(M)) + " |",
        "|---|" + "---:|" * M,
    ]
    for arm in names:
        rows = [e for e in evals if e.arm == arm]
        reached = np.sum([e.reached for e in rows], axis=0)
        accepted = np.sum([e.accepted for e in rows], axis=0)
        rates = accepted / np.maximum(reached, 1)
        lines.append(f"| {arm} | " + " | ".join(f"{r:.3f}" for r in rates) + " |")
    return "\n".join(lines) + "\n"
