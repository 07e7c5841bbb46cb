"""Peak memory at the vocabulary of the users' checkpoints (V = 151,936) on a narrow model, next
to what the full-vocabulary tensors would need: ISD decoding with long prompts, and one
proposal-training step at L = 4,096 (issue 30, point 8).

A narrow Qwen3 (hidden 64, 2 layers) keeps the weights small (the two [V, 64] embeddings are
78 MB), so whatever a forward allocates per vocabulary row shows: a ``[B, prompt, V]`` prefill
logits tensor is 16 × 1,024 × 151,936 × 4 B = 10 GB in float32, a training micro-batch's bf16
logits ``[1, 8,192, 151,936]`` 2.5 GB. Each measurement runs in its own process: the resident
set after the model (and optimizer) exist is the baseline, the kernel's peak counter is reset
(``/proc/self/clear_refs``) and read back after the work (``VmHWM``); the figure is the peak
above the baseline. The training step also runs under a dispatch mode that records every
tensor an operator returns with V as its last dimension: the largest one's size, and whether any
is float64.

    python benchmarks/memory_bench.py [--json benchmarks/results/memory.json]

The targets (issue 30): decode's peak above the weights ≤ 10 % of the full-vocabulary prefill
logits; the training step's peak ≤ 2× the bf16 logits of one micro-batch, and no ``[*, V]``
float64 tensor. Generous bounds on the same measurements at a smaller shape run in
``tests/runtime/test_memory.py``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

V = 151_936
GB = 1e9


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def narrow_model(vocab: int, positions: int, seed: int = 0) -> Any:
    """A random narrow Qwen3 (hidden 64, 2 layers, 4 heads) with ``vocab`` rows, MASK = last id."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=positions,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(cfg).eval()


def decode_peak(vocab: int, prompts: int, length: int, new_tokens: int) -> dict[str, Any]:
    """``brisk.runtime.isd.decode`` (stride 8, T = 1) of ``prompts`` random prompts of
    ``length`` tokens, in this process: the peak above the resident set with the model loaded."""
    import torch

    from brisk.runtime.backbone import HFBackbone
    from brisk.runtime.isd import ISDOptions, decode

    torch.set_num_threads(1)
    model = narrow_model(vocab, length + new_tokens + 64)
    backbone = HFBackbone(model, vocab - 1)
    ids = torch.randint(0, vocab - 1, (prompts, length), generator=torch.Generator().manual_seed(1))
    options = ISDOptions(stride=8, temperature=1.0, max_new_tokens=new_tokens)
    base = _kib("VmRSS")
    _reset_peak()
    decode(backbone, ids.tolist(), options, batch_size=prompts)
    peak = _kib("VmHWM") - base
    full = prompts * length * vocab * 4  # float32 prefill logits
    return {
        "what": "decode",
        "vocab": vocab,
        "prompts": prompts,
        "length": length,
        "new_tokens": new_tokens,
        "peak_above_weights": peak,
        "full_prefill_logits": full,
        "ratio": peak / full,
    }


def training_peak(vocab: int, L: int, batch: int = 1) -> dict[str, Any]:
    """One proposal-training step's loss, backward and AdamW update of ``batch`` sequences of
    ``L`` tokens (half prompt, half response; stride 8, BRISK weights at a flat profile, fp32
    on the CPU) as ``brisk train proposal`` takes it: the last hidden states, the chunked
    stream losses, the acceptance probabilities. The peak above the resident set with the model
    and a first step's optimizer state allocated, and every ``[*, V]`` tensor's dtype."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from brisk.runtime.train.idlm import build_batch
    from brisk.runtime.train.vocab import stream_losses

    torch.set_num_threads(1)
    model = narrow_model(vocab, L + 8).train()
    g = torch.Generator().manual_seed(2)
    seqs = torch.randint(0, vocab - 2, (batch, L), generator=g).tolist()
    b = build_batch(seqs, [L // 2] * batch, 7, vocab - 1, 0, offset=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        h_noisy, h_clean = _hidden(model, b)
        losses = stream_losses(h_noisy, h_clean, model.lm_head.weight, b, temperature=1.0)
        n = losses.totals(b)
        loss = losses.noisy.sum() / n[2] + losses.clean.sum() / n[3]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # gradients and AdamW moments exist from here on: part of the baseline
    seen: dict[str, Any] = {"largest": 0, "float64": False}

    class VocabTensors(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, tuple | list) else (out,):
                if isinstance(t, torch.Tensor) and t.ndim and t.shape[-1] == vocab:
                    seen["largest"] = max(seen["largest"], t.numel() // vocab)
                    seen["float64"] |= t.dtype == torch.float64
            return out

    base = _kib("VmRSS")
    _reset_peak()
    step()
    peak = _kib("VmHWM") - base
    with VocabTensors():
        step()
    logits = batch * 2 * L * vocab * 2  # bf16 logits of the micro-batch
    return {
        "what": "proposal step",
        "vocab": vocab,
        "L": L,
        "batch": batch,
        "peak_above_weights": peak,
        "bf16_logits": logits,
        "ratio": peak / logits,
        "largest_vocab_rows": seen["largest"],
        "vocab_float64": seen["float64"],
    }


def _hidden(model: Any, batch: Any) -> tuple[Any, Any]:
    from brisk.runtime.train.idlm import idlm_forward

    return idlm_forward(model, batch, hidden=True)


def run_child(kind: str, **kwargs: Any) -> dict[str, Any]:
    """One measurement in a fresh process (its own resident set and peak counter)."""
    code = (
        f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        f"import memory_bench as m; print(json.dumps(m.{kind}(**{kwargs!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=_env()
    )
    if done.returncode:
        raise RuntimeError(f"{kind}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _env() -> dict[str, str]:
    import os

    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--length", type=int, default=1024)
    p.add_argument("--L", type=int, default=4096)
    args = p.parse_args(argv)
    rows = [
        run_child("decode_peak", vocab=V, prompts=args.prompts, length=args.length, new_tokens=32),
        run_child("training_peak", vocab=V, L=args.L),
    ]
    print("| measurement | peak above weights | full-vocabulary tensor | ratio | target |")
    print("|---|---|---|---|---|")
    d, t = rows
    print(
        f"| brisk decode, {d['prompts']} × {d['length']} tokens, V = {V:,} | "
        f"{d['peak_above_weights'] / GB:.2f} GB | prefill logits (fp32) "
        f"{d['full_prefill_logits'] / GB:.2f} GB | {d['ratio']:.3f} | ≤ 0.10 |"
    )
    print(
        f"| proposal step, L = {t['L']:,}, V = {V:,} | {t['peak_above_weights'] / GB:.2f} GB | "
        f"bf16 logits of the micro-batch {t['bf16_logits'] / GB:.2f} GB | {t['ratio']:.3f} | "
        f"≤ 2 |"
    )
    print(
        f"largest [*, V] tensor of the step: {t['largest_vocab_rows']} rows; float64 [*, V]: "
        f"{t['vocab_float64']}"
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
