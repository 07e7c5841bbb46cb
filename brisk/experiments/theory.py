"""Theory next to the measurement: what the renewal-reward model says at each arm's profile.

For every arm of the proposal ablation, from its measured acceptance profile a (pooled over
seeds' verify rounds) and its MASK-stream cross-entropies on one common set of samples (the
base's correct self-generated responses, :func:`~brisk.runtime.train.headroom.measure_headroom`):

- **sensitivities** w_i^raw = −∂FPT/∂z_i, z_i = logit a_i: how much one more unit of log-odds of
  acceptance at position i lowers forwards per token (:func:`brisk.theory.progress_weights`
  with ``normalize=False``), and the BRISK weights w̄ = M w^raw / Σ w^raw, both at a;
- **D-PACE weights** at q_i = exp(−CE_mask(i)), the drafter's mean target probability at
  position i (:func:`brisk.theory.dpace_weights`; D-PACE computes them per block, this is their
  value at the arm's mean);
- **predicted TPF**: the complete-cycle TPF of the ISD cost model at the teacher-forced
  acceptance β_i = E Σ_v min(p, q^K) on the common samples, i.e. what the arm's per-position
  cross-entropy changes predict, beside the measured complete-cycle TPF and the renewal TPF at
  the measured profile a.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from brisk.theory import CostModel, dpace_weights, progress_weights, tpf

__all__ = ["ArmTheory", "arm_theory", "theory_markdown"]


@dataclass(frozen=True)
class ArmTheory:
    arm: str
    a: list[float]  # measured acceptance profile
    sensitivity: list[float]  # w_i^raw = −∂FPT/∂z_i at a
    brisk: list[float]  # w̄ at a
    dpace: list[float]  # D-PACE weights at q_i = exp(−CE_mask(i))
    ce_mask: list[float]  # on the common samples
    beta: list[float]
    tpf_profile: float  # renewal TPF at a
    tpf_beta: float  # renewal TPF at β (what the CE changes predict)
    tpf_measured: float  # complete cycles, mean over seeds

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def arm_theory(
    arm: str, reached: Sequence[int], accepted: Sequence[int], headroom: Any, tpf_measured: float
) -> ArmTheory:
    """The theory row of one arm (module docstring); ``headroom`` is a
    :class:`~brisk.runtime.train.headroom.Headroom` of the arm's checkpoint."""
    a = np.asarray(accepted, float) / np.maximum(np.asarray(reached, float), 1)
    M = len(a)
    cost = CostModel.isd(M)
    clipped = np.clip(a, 1e-6, 1 - 1e-6)  # the logit needs 0 < a < 1
    q = np.exp(-np.asarray(headroom.ce_mask, float))
    return ArmTheory(
        arm=arm,
        a=a.tolist(),
        sensitivity=np.asarray(progress_weights(clipped, cost, normalize=False)).tolist(),
        brisk=np.asarray(progress_weights(clipped, cost)).tolist(),
        dpace=np.asarray(dpace_weights(q)).tolist(),
        ce_mask=list(headroom.ce_mask),
        beta=list(headroom.beta),
        tpf_profile=float(tpf(a, cost)),
        tpf_beta=float(headroom.predicted_tpf),
        tpf_measured=tpf_measured,
    )


def _row(name: str, values: Sequence[float], digits: int = 3) -> str:
    return f"| {name} | " + " | ".join(f"{v:.{digits}f}" for v in values) + " |"


def theory_markdown(rows: Sequence[ArmTheory], base: str | None = None, n_samples: int = 0) -> str:
    """The theory tables of the summary: sensitivities, weights, CE and predicted TPF."""
    if not rows:
        return ""
    M = len(rows[0].a)
    head = "| arm | " + " | ".join(f"{i + 1}" for i in range(M)) + " |"
    rule = "|---|" + "---:|" * M
    ref: Mapping[str, ArmTheory] = {r.arm: r for r in rows}
    out = [
        "### Theory at each arm's measured profile\n",
        "Sensitivity w_i^raw = −∂FPT/∂z_i (z_i = logit a_i) at the measured profile a:\n",
        head,
        rule,
        *(_row(r.arm, r.sensitivity, 4) for r in rows),
        "",
        "BRISK weights w̄_i at a:\n",
        head,
        rule,
        *(_row(r.arm, r.brisk) for r in rows),
        "",
        "D-PACE weights at q_i = exp(−CE_mask(i)):\n",
        head,
        rule,
        *(_row(r.arm, r.dpace) for r in rows),
        "",
        f"MASK-stream CE_mask(i) on {n_samples} common samples (the base's correct "
        "self-generated responses)"
        + (f", and its change against {base}" if base in ref else "")
        + ":\n",
        head,
        rule,
    ]
    for r in rows:
        out.append(_row(r.arm, r.ce_mask))
        if base in ref and r.arm != base:
            delta = np.subtract(r.ce_mask, ref[base].ce_mask)  # type: ignore[index]
            out.append(_row(f"Δ {r.arm}", delta))
    out += [
        "",
        "TPF: measured (complete cycles, seed mean), renewal at a, and predicted from "
        "the teacher-forced acceptance β on the common samples:\n",
        "| arm | measured | at a | predicted from β |",
        "|---|---:|---:|---:|",
    ]
    out += [
        f"| {r.arm} | {r.tpf_measured:.3f} | {r.tpf_profile:.3f} | {r.tpf_beta:.3f} |" for r in rows
    ]
    return "\n".join(out) + "\n"
