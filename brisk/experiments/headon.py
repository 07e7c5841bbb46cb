"""The head-on row of the proposal ablation: the paper's full method, proposal training plus the
prefix-conditioned corrector, on the best arm's backbone (``[head]`` of
:class:`~brisk.experiments.proposal_config.ExperimentConfig`).

**The best arm** (:func:`choose_arm`): among the trained rows at the largest budget (every trained
row when the config has no budgets), those whose mean accuracy over seeds is at most δ below the
base arm's, δ = the largest of 2 accuracy points and the two rows' 95 % Student-t half-widths
(the base's and the candidate's: a drop inside the seed noise, or under 2 points, is no drop);
of those, the highest mean whole-run TPF. Without a base arm every candidate qualifies; when
none qualifies, the most accurate candidate. The summary names the arm and why.

Then for each seed s, one job in the experiment's worker pool (:func:`head_job`), under
``<out_dir>/head/<arm>/seed<s>/``: that arm's seed-s checkpoint, frozen, collects its
policy-reached events on training problems (``events/``, ``[head.collect]``); the distilled head
is trained on them with seed s (``final/``, ``metrics.jsonl``, ``train.json``,
``[head.train]``); and the backbone is decoded head on with exactly the arms' evaluation (the
same held-out problems, decode seeds, stride, temperature, batch size, block logging into
``blocks/``), the row ``<arm>+head``. Each step is skipped when its output exists, and
``eval.json`` (written last) marks the job done, so a rerun skips it as it skips a finished arm.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brisk._atomic import atomic_write_text
from brisk._interrupt import StopSignals, stop_signals
from brisk.experiments.common import evaluate_held_out, job_dir
from brisk.experiments.heads import collect_once, train_head
from brisk.experiments.proposal_config import ExperimentConfig

if TYPE_CHECKING:
    from brisk.experiments.evaluate import ArmSummary

__all__ = ["ACCURACY_SLACK", "choose_arm", "head_job", "row_name"]

ACCURACY_SLACK = 0.02  # the least accuracy drop (a fraction) the best arm may show


def row_name(arm: str) -> str:
    """The head-on row of ``arm`` (``selfgen-correct-dynamic@5ep+head``)."""
    return f"{arm}+head"


def _half_width(summary: ArmSummary) -> float:
    iv = summary.metrics["accuracy"]
    return (iv.high - iv.low) / 2 if iv.k > 1 and math.isfinite(iv.high - iv.low) else 0.0


def choose_arm(
    names: Sequence[str], summaries: Mapping[str, ArmSummary], budgets: Sequence[float]
) -> tuple[str | None, str]:
    """The best arm (module docstring) among the rows ``names`` (the config's job names, whose
    ``summaries`` are given) and one line saying why; (None, why) without a trained row."""
    largest = max(budgets) if budgets else None
    candidates = [
        n for n in names if n != "base" and (largest is None or n.endswith(f"@{largest:g}ep"))
    ]
    if not candidates:
        return None, "no trained arm, so no head-on row"
    budget = f" at {largest:g} ep" if largest is not None else ""
    base = summaries.get("base")
    if base is None:
        best = max(candidates, key=lambda n: summaries[n].metrics["tpf_run"].mean)
        return best, f"the highest whole-run TPF among the trained arms{budget} (no base arm)"
    floor = base.metrics["accuracy"].mean
    ok = []
    for n in candidates:
        delta = max(ACCURACY_SLACK, _half_width(base), _half_width(summaries[n]))
        if summaries[n].metrics["accuracy"].mean >= floor - delta:
            ok.append(n)
    if not ok:
        best = max(candidates, key=lambda n: summaries[n].metrics["accuracy"].mean)
        return best, (
            f"no trained arm{budget} kept the base's accuracy (within the larger of "
            f"{100 * ACCURACY_SLACK:g} points and the 95 % half-widths): the most "
            "accurate one"
        )
    best = max(ok, key=lambda n: summaries[n].metrics["tpf_run"].mean)
    return best, (
        f"the highest whole-run TPF among the trained arms{budget} whose mean accuracy "
        f"is within max({100 * ACCURACY_SLACK:g} points, the 95 % half-widths) of the "
        f"base's ({len(ok)} of {len(candidates)} qualify)"
    )


def backbone_of(cfg: ExperimentConfig, arm: str, seed: int) -> Path:
    """The checkpoint of ``arm``'s seed-``seed`` job (the base itself for the base arm)."""
    if arm == "base":
        return Path(cfg.base)
    return Path(cfg.out_dir) / "arms" / arm / f"seed{seed}" / "final"


def head_job(cfg: ExperimentConfig, arm: str, seed: int) -> dict[str, Any]:
    """Collect, train and evaluate head on for ``arm``'s seed-``seed`` backbone; returns
    ``{"eval": ..., "train": ..., "backbone": ..., "events": ...}`` (``eval.json``). A signal
    stops the collection after its last whole batch, the training at its next step (with a
    checkpoint) and the evaluation at once."""
    with stop_signals() as stop:  # in a worker, its flag for life
        return _collect_train_evaluate(cfg, arm, seed, stop)


def _collect_train_evaluate(
    cfg: ExperimentConfig, arm: str, seed: int, stop: StopSignals
) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    run, done = job_dir(cfg.out_dir, arm, seed, kind="head")
    if done is not None:
        return done
    backbone = backbone_of(cfg, arm, seed)
    events = run / "events"
    cfg.decode_problems(collect_once, backbone, events, cfg.head.collect)
    tcfg = cfg.head.train.replace(
        events=str(events), out_dir=str(run), seed=seed, device=cfg.device, dtype=cfg.dtype
    )
    head, train_info = train_head(tcfg)
    events_meta = json.loads((events / "_events.json").read_text())
    # the arms' evaluation exactly, with the head on
    ev = evaluate_held_out(cfg.held_out, backbone, run, row_name(arm), seed, stop, corrector=head)
    result = {
        "eval": ev.to_dict(),
        "train": train_info,
        "backbone": str(backbone),
        "head": {"preset": tcfg.head, "K": head.config.K, "checkpoint": str(run / "final")},
        "events": {k: events_meta.get(k) for k in ("events", "requests", "M", "K")},
    }
    atomic_write_text(run / "eval.json", json.dumps(result, indent=2))
    return dict(json.loads(json.dumps(result)))  # as a resumed run reads it back
