"""The code world's figures after ``make code-world`` (issue 32, acceptance 1 and 2).

    .venv/bin/python benchmarks/code_world.py [--runs runs/code] [--out benchmarks/results]

Reads what ``make code-world`` left under ``--runs`` (the AR and converted runs' metrics, the
decodes of the held-out functions at N = 4 and 8, greedy and T = 1, with block logs) and adds:

- the held-out causal loss of both models (:func:`brisk.runtime.train.pretrain.recipe.causal_loss`
  on every document of the held-out files, the converted base read causally);
- ``brisk mechanism report`` of each block log (``<runs>/report_N<N>_T<T>``);
- HumanEval: ``brisk decode problems --task humaneval`` and ``brisk decode`` at N = 8, greedy,
  each prompt's budget what fits the model (greedy ISD is greedy AR: pass@1 of the model).

It writes ``code_world.json`` into ``--out`` and prints the tables RESULTS.md quotes; the
mechanism report of N = 8, T = 1 is copied to ``benchmarks/figures/code_mechanism_N8_T1.md``,
and after ``make code-head`` the report of the head beside the base (same states, blocks scored)
to ``benchmarks/figures/code_mechanism_N8_T1_head.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CELLS = [(N, T) for N in (4, 8) for T in (0, 1)]


def brisk(*args: str | Path) -> None:
    command = [sys.executable, "-m", "brisk.cli", *(str(a) for a in args)]
    subprocess.run(command, check=True, cwd=ROOT)


def events(run: Path) -> list[dict[str, Any]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def run_figures(run: Path) -> dict[str, Any]:
    """Parameters, steps, train wall and the final evaluation of a training run."""
    log = events(run)
    first = next(e for e in log if e["event"] == "start")
    trained = [e for e in log if e["event"] == "train"]
    end = next(e for e in reversed(log) if e["event"] == "end")
    budget = [e for e in log if e["event"] == "budget"]
    evals = [e for e in log if e["event"] == "eval"]
    config = json.loads((run / "final" / "train_config.json").read_text())
    return {
        "params": first.get("params"),
        "steps": budget[-1]["step"] if budget else trained[-1]["step"] + 1,
        "steps_planned": config["steps"],
        "stopped_by_time_budget": bool(budget),
        "train_wall_s": end["train_wall_s"],
        "wall_s": end["wall_s"],
        "first_loss": trained[0]["loss"],
        "last_loss": trained[-1]["loss"],
        # the run's own final evaluation (its problems as they were when it ran)
        "final_eval": {k: evals[-1].get(k) for k in ("accuracy", "n_problems", "grader_errors")}
        if evals
        else None,
    }


def trained(run: Path) -> tuple[Any, Any]:
    """The model (eval mode, float32, CPU) and tokenizer of ``run/final``."""
    import torch

    from brisk.runtime.loader import load_model

    torch.set_num_threads(2)
    loaded = load_model(run / "final", device="cpu", dtype="float32", announce=False)
    return loaded.backbone.model.eval(), loaded.tokenizer


def heldout_figures(cfg: Any, run: Path) -> dict[str, Any]:
    """The held-out loss ``brisk train ar`` logs (:func:`heldout_loss`), of ``run``'s model."""
    from brisk.runtime.train.pretrain.recipe import heldout_loss

    model, tokenizer = trained(run)
    h = heldout_loss(cfg, model, tokenizer)
    assert h is not None, "the code world's corpus has held-out documents"
    return {"loss_nats": h["loss"], "ppl": math.exp(h["loss"]), "tokens": h["tokens"]}


def ar_compile_rate(cfg: Any, run: Path) -> dict[str, Any]:
    """The causal LM's greedy completions of the held-out functions, graded ``compiles``:
    ``brisk train ar``'s final evaluation (:func:`final_evaluation`), on the problems as they
    are now."""
    from brisk.runtime.train.pretrain.recipe import final_evaluation

    report = final_evaluation(cfg, *trained(run))
    return {"accuracy": report.accuracy, "n": report.n_problems, "errors": report.grader_errors}


def decode_figures(rows_file: Path) -> dict[str, Any]:
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    tokens, forwards = sum(r["tokens"] for r in rows), sum(r["forwards"] for r in rows)
    graded = [r for r in rows if "correct" in r]
    return {
        "requests": len(rows),
        "tokens": tokens,
        "forwards": forwards,
        "tpf_whole_run": tokens / forwards,
        "mean_tokens": tokens / len(rows),
        "eos_share": sum(r.get("finished") == "eos" for r in rows) / len(rows),
        "correct": sum(bool(r["correct"]) for r in graded),
        "graded": len(graded),
        "grader_errors": sum("grader_error" in r for r in graded),
    }


def mechanism(runs: Path, N: int, T: int, suffix: str = "") -> dict[str, Any]:
    report = runs / f"report_N{N}_T{T}{suffix}"
    if not (report / "summary.json").is_file():
        brisk("mechanism", "report", runs / f"blocks_N{N}_T{T}{suffix}", "--out", report)
    summary = json.loads((report / "summary.json").read_text())
    keys = ("M", "K", "blocks", "requests", "tpf", "acceptance_profile", "coverage", "replay")
    return {k: summary[k] for k in (*keys, "repetition", "likelihood")}


def humaneval(runs: Path) -> dict[str, Any]:
    problems, out = runs / "humaneval.jsonl", runs / "humaneval_N8_T0.jsonl"
    model = runs / "base" / "final"
    if not problems.is_file():
        brisk(
            "decode",
            "problems",
            "--checkpoint",
            model,
            "--task",
            "humaneval",
            "--n",
            "164",
            "--out",
            problems,
        )
    if not out.is_file():
        brisk(
            "decode",
            "--model",
            model,
            "--prompts",
            problems,
            "--stride",
            "8",
            "--temperature",
            "0",
            "--batch-size",
            "41",
            "--out",
            out,
        )
    figures = decode_figures(out)
    figures["pass_at_1"] = figures["correct"] / figures["requests"]
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "code")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--humaneval",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="decode and grade HumanEval (a model of fewer positions than its prompts: --no-…)",
    )
    args = parser.parse_args()
    runs: Path = args.runs
    result: dict[str, Any] = {"runs": str(runs)}
    from brisk.runtime.train.pretrain.config import PretrainConfig

    cfg = PretrainConfig.load(runs / "ar" / "final" / "train_config.json")
    for name in ("ar", "base"):
        result[name] = run_figures(runs / name) | {"heldout": heldout_figures(cfg, runs / name)}
    result["ar"]["compiles_greedy"] = ar_compile_rate(cfg, runs / "ar")
    result["decode"] = {
        f"N{N}_T{T}": decode_figures(runs / f"out_N{N}_T{T}.jsonl")
        | {"mechanism": mechanism(runs, N, T)}
        for N, T in CELLS
    }
    if (runs / "out_N8_T1_head.jsonl").is_file():  # make code-head: the head beside the base
        result["head"] = decode_figures(runs / "out_N8_T1_head.jsonl") | {
            "mechanism": mechanism(runs, 8, 1, "_head")
        }
        report = runs / "report_N8_T1_head" / "summary.md"
        shutil.copy(report, ROOT / "benchmarks" / "figures" / "code_mechanism_N8_T1_head.md")
    result["humaneval"] = humaneval(runs) if args.humaneval else None
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "code_world.json").write_text(json.dumps(result, indent=1) + "\n")
    shutil.copy(
        runs / "report_N8_T1" / "summary.md",
        ROOT / "benchmarks" / "figures" / "code_mechanism_N8_T1.md",
    )
    print(render(result))
    return 0


def render(r: dict[str, Any]) -> str:
    ar, base = r["ar"], r["base"]
    lines = [
        "| stage | params | steps (planned) | train wall | held-out loss (nats/token, ppl) | "
        "held-out functions compile |",
        "|---|---|---|---|---|---|",
    ]
    greedy, ar_greedy = r["decode"]["N8_T0"], ar["compiles_greedy"]
    compiled = {
        "AR pre-training": f"{ar_greedy['accuracy']:.3f} of {ar_greedy['n']}",
        "I-DLM conversion": f"{greedy['correct'] / greedy['graded']:.3f} of {greedy['graded']}",
    }
    for name, f in (("AR pre-training", ar), ("I-DLM conversion", base)):
        h = f["heldout"]
        lines.append(
            f"| {name} | {f['params']:,} | {f['steps']} ({f['steps_planned']}) | "
            f"{f['train_wall_s'] / 60:.1f} min | {h['loss_nats']:.3f} ({h['ppl']:.1f}) over "
            f"{h['tokens']:,} tokens | {compiled[name]} |"
        )
    lines += [
        "",
        "| N | T | requests | TPF whole run | TPF cycles | TPF renewal | E[L] rates by position "
        "[95% CI] | compile rate | EOS share |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, d in r["decode"].items():
        N, T = key[1:].split("_T")
        m = d["mechanism"]
        tpf = m["tpf"]
        prof = m["acceptance_profile"]
        rates = ", ".join(
            f"{a:.2f} [{lo:.2f}, {hi:.2f}]"
            for a, lo, hi in zip(prof["rates"], prof["low"], prof["high"], strict=True)
            if a is not None
        )
        lines.append(
            f"| {N} | {T} | {d['requests']} | {d['tpf_whole_run']:.3f} | "
            f"{_get(tpf, 'complete_cycles')} | {_get(tpf, 'renewal')} | {rates} | "
            f"{d['correct']}/{d['graded']} | {d['eos_share']:.2f} |"
        )
    h = r["humaneval"]
    if h is None:
        return "\n".join(lines)
    lines += [
        "",
        f"HumanEval (164 problems, greedy ISD N = 8 = greedy AR): pass@1 {h['pass_at_1']:.4f} "
        f"({h['correct']}/{h['requests']}), TPF {h['tpf_whole_run']:.3f}, grader errors "
        f"{h['grader_errors']}",
    ]
    return "\n".join(lines)


def _get(tpf: dict[str, Any], key: str) -> str:
    value = tpf.get(key)
    if isinstance(value, dict):
        est = value.get("estimate", value.get("median"))
        lo, hi = value.get("low"), value.get("high")
        if lo is not None:
            return f"{est:.3f} [{lo:.3f}, {hi:.3f}]"
        return f"{est:.3f}"
    return "—" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    raise SystemExit(main())
