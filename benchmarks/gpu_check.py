"""``make gpu-check``: brisk's GPU paths at I-DLM-8B shapes with random weights, PASS/FAIL lines.

Written for a lent device (one H100 or H200; python3, torch, triton, transformers, no SGLang;
``PYTHONPATH=.``), ≤ 8 minutes. Every check prints one line, ``PASS name: figures`` or
``FAIL name: why``; a check that cannot run here says ``SKIP name: why``. The lines also go to
``$OUT/gpu_check.json`` (or ``--json``) so the session that ran it can record them in
``benchmarks/RESULTS.md``.

In this process (the model shapes: 8B layers are hidden 4096, 32 query / 8 KV heads of 128,
FFN 12,288, vocabulary 151,936; four of them instead of 36 keep the run short, and every
per-token tensor has the 8B width):

- ``decode_8b_bf16_16x1024``: ISD (N = 8, T = 1) of 16 prompts of 1,024 tokens in bf16; the
  peak above the weights against the ``[16, 1024, V]`` bf16 prefill logits (target ≤ 10 %);
- ``isd_greedy_equals_ar`` / ``isd_T1_batch_invariant``: a small fp32 model (its LM head scaled
  so greedy has no near-ties): greedy ISD equals greedy AR decoding token for token; T = 1
  outputs are the same at batch 1 and batch 6;
- ``corrector_triton_equals_naive_T*``, ``corrector_cuda_graph_equals_eager``: the fused head
  against its torch twin, and its CUDA-graph replay against eager;
- ``isd_fused_head_equals_naive_T1_bf16``: ISD with the head on, fused vs naive, same tokens;
- ``sd_greedy_equals_ar``: speculative decoding with a random DFlash-shaped drafter (block 8)
  on the small fp32 target equals its greedy AR decoding token for token;
- ``sd_8b_bf16``: the same loop on the 8B-shaped bf16 target with a 1-layer drafter at its width
  (block 16, DFlash's shape): the draft cost ρ, tok/s and the peak above the weights;
- ``flex_compiled_proposal_step``: a bf16 proposal step (hidden states, chunked stream losses,
  backward) at three (L, offset) pairs through compiled flex: the graphs dynamo compiled (one
  per padded length) and the peak against the micro-batch's bf16 logits (target ≤ 2×);

in subprocesses: ``dist_collectives`` (one torchrun rank: ``Dist.sum`` of a CPU float64 and a
CUDA tensor through the ``cpu:gloo,cuda:nccl`` group), ``fsdp2_0.6b`` (``fsdp_bench.py`` at
Qwen3-0.6B, bf16, compiled flex, activation checkpointing), ``two_ranks`` (two GPUs only), and
the GPU tests of the suite when pytest is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GiB = 2**30
V = 151_936
RESULTS: list[dict[str, Any]] = []


def report(status: str, name: str, info: str = "") -> None:
    print(f"{status} {name}: {info}", flush=True)
    RESULTS.append({"status": status, "name": name, "info": info})


def check(name: str, fn: Callable[[], tuple[bool, str]]) -> None:
    t = time.monotonic()
    try:
        ok, info = fn()
    except Exception as err:  # a check that raises is a failure, and the next one still runs
        last = traceback.format_exception_only(type(err), err)[-1].strip()
        report("FAIL", name, f"{last[:300]} ({time.monotonic() - t:.1f} s)")
        return
    report("PASS" if ok else "FAIL", name, f"{info} ({time.monotonic() - t:.1f} s)")


DEVICE = "cuda"


def qwen3(
    hidden: int,
    layers: int,
    heads: int,
    kv: int,
    head_dim: int,
    ffn: int,
    vocab: int,
    dtype: Any,
    scale: float = 1.0,
) -> Any:
    """A random Qwen3 built on :data:`DEVICE` in ``dtype``; the LM head scaled by ``scale``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    with torch.device(DEVICE):
        model = Qwen3ForCausalLM(cfg)
    model.lm_head.weight.data.mul_(scale)
    return model.to(dtype).eval()


def eight_b_layers(dtype: Any, smoke: bool) -> Any:
    if smoke:  # the script's own test on a CPU: the same checks at a toy width
        return qwen3(64, 2, 4, 2, 16, 128, V, dtype, scale=50.0)
    return qwen3(4096, 4, 32, 8, 128, 12288, V, dtype, scale=50.0)


class Memory:
    """Peak device memory since :meth:`reset` (CUDA), or nothing to measure (the CPU smoke)."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.cuda, self.torch = cuda, torch

    def reset(self) -> int:
        if not self.cuda:
            return 0
        self.torch.cuda.synchronize()
        self.torch.cuda.reset_peak_memory_stats()
        return int(self.torch.cuda.memory_allocated())

    def peak(self) -> int:
        if not self.cuda:
            return 0
        self.torch.cuda.synchronize()
        return int(self.torch.cuda.max_memory_allocated())


def in_process(budget_s: float, smoke: bool) -> None:
    import torch

    from brisk.runtime.backbone import HFBackbone
    from brisk.runtime.corrector import Corrector, CorrectorConfig, CorrectorInputs
    from brisk.runtime.isd import ISDOptions, decode
    from brisk.runtime.train.evaluate import greedy_decode

    dev, mem = torch.device(DEVICE), Memory(DEVICE == "cuda")
    torch.manual_seed(0)
    t0 = time.monotonic()
    dtype = torch.float32 if smoke else torch.bfloat16
    big = HFBackbone(eight_b_layers(dtype, smoke), V - 1)
    n_prompts, length = (2, 64) if smoke else (16, 1024)

    def decode_8b() -> tuple[bool, str]:
        prompts = torch.randint(0, V - 2, (n_prompts, length)).tolist()
        base = mem.reset()
        t = time.monotonic()
        out = decode(
            big,
            prompts,
            ISDOptions(stride=8, temperature=1.0, max_new_tokens=32),
            batch_size=n_prompts,
        )
        above, full = mem.peak() - base, n_prompts * length * V * 2
        return above <= 0.10 * full, (
            f"peak above the weights {above / GiB:.2f} GiB = {above / full:.3f} of the bf16 "
            f"prefill logits ({full / GiB:.2f} GiB); {out.generated} tokens in "
            f"{time.monotonic() - t:.1f} s, TPF {out.generated / out.forwards:.2f}"
        )

    check(f"decode_8b_bf16_{n_prompts}x{length}", decode_8b)

    small = HFBackbone(qwen3(256, 2, 8, 4, 32, 704, 4096, torch.float32, scale=50.0), 4095)
    P = torch.randint(0, 4000, (6, 40)).tolist()

    def greedy() -> tuple[bool, str]:
        ar = torch.no_grad()(greedy_decode)(small, P, 48, -1)
        isd = decode(small, P, ISDOptions(stride=8, max_new_tokens=48), batch_size=6).tokens
        same = sum(a == b for a, b in zip(ar, isd, strict=True))
        return same == len(P), f"{same}/{len(P)} prompts token for token"

    check("isd_greedy_equals_ar", greedy)
    sampled = ISDOptions(stride=8, temperature=1.0, max_new_tokens=48)

    def invariant() -> tuple[bool, str]:
        one = decode(small, P, sampled, batch_size=1).tokens
        six = decode(small, P, sampled, batch_size=6).tokens
        same = sum(a == b for a, b in zip(one, six, strict=True))
        return same == len(P), f"{same}/{len(P)} requests equal at batch 1 and 6"

    check("isd_T1_batch_invariant", invariant)

    H = big.hidden_size
    head = Corrector(CorrectorConfig.paper(H, V, 7)).to(dev)
    torch.nn.init.normal_(head.w_s.weight, std=1.0)
    B = 3
    anchor_h = torch.randn(B, H, device=dev, dtype=dtype)
    mask_h = torch.randn(B, 7, H, device=dev, dtype=dtype)
    cand_logits = torch.randn(B, 7, 16, device=dev).sort(-1, descending=True).values
    cand_ids = torch.randint(0, V, (B, 7, 16), device=dev)
    u = torch.rand(B, 7, device=dev, dtype=torch.float64)
    blocks = {  # the head's inputs at each temperature (uniforms when sampling)
        T: CorrectorInputs(
            anchor_h, cand_ids[:, 0, 0], mask_h, cand_logits, cand_ids, u if T else None
        )
        for T in (0.0, 0.8)
    }
    fused = "naive" if smoke else "triton"  # the CPU smoke has no Triton launch

    for T in (0.0, 0.8):

        def kernel(T: float = T) -> tuple[bool, str]:
            naive = head.select(big, blocks[T], T, impl="naive")
            other = head.select(big, blocks[T], T, impl=fused)
            diff = (naive.refined - other.refined).abs().max().item()
            return torch.equal(naive.ranks, other.ranks), f"ranks equal, max |Δ refined| {diff:.1e}"

        check(f"corrector_triton_equals_naive_T{T}", kernel)

    def graphs() -> tuple[bool, str]:
        from brisk.runtime.kernels.corrector_step.graph import CorrectorGraphs

        eager = head.select(big, blocks[0.8], 0.8, impl="triton")
        replay = CorrectorGraphs(head, big).select(big, blocks[0.8], 0.8)
        return torch.equal(replay.ranks, eager.ranks), "replayed ranks equal eager"

    if smoke:
        report("SKIP", "corrector_cuda_graph_equals_eager", "CUDA graphs need a GPU")
    else:
        check("corrector_cuda_graph_equals_eager", graphs)

    def fused_isd() -> tuple[bool, str]:
        Q = torch.randint(0, V - 2, (4, 64)).tolist()
        head.impl = fused
        with_kernel = decode(big, Q, sampled, corrector=head).tokens
        head.impl = "naive"
        naive = decode(big, Q, sampled, corrector=head).tokens
        same = sum(a == b for a, b in zip(with_kernel, naive, strict=True))
        return same == len(Q), f"{same}/{len(Q)} requests equal"

    check("isd_fused_head_equals_naive_T1_bf16", fused_isd)

    def drafter_for(target: Any, block: int, dtype: Any) -> Any:
        from brisk.runtime.drafter import DFlashDrafter, drafter_config

        cfg = drafter_config(
            target.config,
            num_layers=1,
            block_size=block,
            mask_token_id=target.config.vocab_size - 1,
            target_layer_ids=[0],
        )
        return DFlashDrafter(cfg).to(dev, dtype).eval()

    def sd_greedy() -> tuple[bool, str]:
        from brisk.runtime.drafter import SDOptions, speculative_decode

        R, n = (P[:2], 16) if smoke else (P, 48)  # one request at a time: slow on a CPU
        ar = torch.no_grad()(greedy_decode)(small, R, n, -1)
        drafter = drafter_for(small.model, 8, torch.float32)
        sd = speculative_decode(small.model, drafter, R, SDOptions(max_new_tokens=n))
        same = sum(a == o.tokens for a, o in zip(ar, sd.outputs, strict=True))
        return same == len(R), f"{same}/{len(R)} prompts token for token, TPF {sd.tpf:.2f}"

    check("sd_greedy_equals_ar", sd_greedy)

    def sd_8b() -> tuple[bool, str]:
        from brisk.runtime.drafter import SDOptions, speculative_decode

        drafter = drafter_for(big.model, 16, dtype)
        Q = torch.randint(0, V - 2, (2, 256)).tolist()
        base = mem.reset()
        t = time.monotonic()
        n = 16 if smoke else 64
        out = speculative_decode(big.model, drafter, Q, SDOptions(max_new_tokens=n))
        wall, above = time.monotonic() - t, mem.peak() - base
        tokens = sum(len(o.tokens) for o in out.outputs)
        return tokens == len(Q) * n and out.draft_cost > 0, (
            f"{tokens} tokens in {wall:.1f} s ({tokens / wall:.0f} tok/s, batch 1), TPF "
            f"{out.tpf:.2f}, draft cost ρ {out.draft_cost:.2f}, peak above the weights "
            f"{above / GiB:.2f} GiB"
        )

    check("sd_8b_bf16", sd_8b)
    if not smoke:  # the 8B-shaped layers and the head are done with: room for training
        big.model.to("meta")
        torch.cuda.empty_cache()

    if time.monotonic() - t0 > budget_s:
        report("SKIP", "flex_compiled_proposal_step", "the time budget is spent")
        return
    check("flex_compiled_proposal_step", lambda: flex_step(smoke))


def flex_step(smoke: bool) -> tuple[bool, str]:
    """Three (L, offset) pairs through compiled flex, bf16, the chunked stream losses (the CPU
    smoke: eager flex, fp32, short L)."""
    import torch
    import torch._dynamo as dynamo

    from brisk.runtime.train.distributed import Dist, autocast, prepare
    from brisk.runtime.train.flex import padded_length
    from brisk.runtime.train.forward import set_attention, training_forward
    from brisk.runtime.train.idlm import build_batch
    from brisk.runtime.train.vocab import stream_losses

    dev, mem = torch.device(DEVICE), Memory(DEVICE == "cuda")
    attention, precision = ("flex", "fp32") if smoke else ("flex-compiled", "bf16")
    model = qwen3(64 if smoke else 512, 2, 8, 4, 8 if smoke else 64, 1536, V, torch.float32)
    model.train()
    set_attention(model, attention)
    net = prepare(model, Dist(device=dev), fsdp=False, precision=precision, checkpointing=True)
    before = dynamo.utils.counters["stats"]["unique_graphs"]
    pairs = ((256, 0), (288, 0), (256, 3)) if smoke else ((2048, 0), (2304, 0), (2048, 3))
    rungs = {padded_length(L) for L, _ in pairs}
    lines, worst = [], 0.0
    for L, offset in pairs:
        seqs = torch.randint(0, V - 2, (1, L)).tolist()
        batch = build_batch(
            seqs, [L // 4], 7, V - 1, 0, offset=offset, device=dev, dense_mask=False
        )
        base = mem.reset()
        t = time.monotonic()
        with autocast(precision, False, dev):
            h_noisy, h_clean = training_forward(net, batch, attention, hidden=True)
            losses = stream_losses(h_noisy, h_clean, model.lm_head.weight, batch)
        (losses.noisy.sum() + losses.clean.sum()).backward()
        model.zero_grad(set_to_none=True)
        ratio = (mem.peak() - base) / (2 * L * V * 2)
        worst = max(worst, ratio)
        lines.append(
            f"L={L} offset={offset}: {time.monotonic() - t:.1f} s, peak {ratio:.2f}× "
            "the bf16 logits"
        )
    compiled = dynamo.utils.counters["stats"]["unique_graphs"] - before
    ok = compiled <= len(rungs) and worst <= 2.0
    return ok, f"{compiled} graphs for {len(rungs)} padded lengths; " + "; ".join(lines)


def subprocess_check(name: str, argv: list[str], timeout: float) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "0"}
    t = time.monotonic()
    try:
        done = subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        report("FAIL", name, f"timed out after {timeout:.0f} s")
        return
    tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
    status = "PASS" if done.returncode == 0 else "FAIL"
    report(status, name, f"{' | '.join(tail)[-400:]} ({time.monotonic() - t:.1f} s)")


DIST_SCRIPT = """
import torch
from brisk.runtime.train.distributed import Dist
d = Dist.from_env(fsdp=True)
cpu = d.sum(torch.tensor([1.0, 2.0], dtype=torch.float64))
gpu = d.sum(torch.ones(3, device=d.device))
assert d.device == torch.device("cuda", 0), d.device
assert cpu.tolist() == [1.0, 2.0] and gpu.device == d.device, (cpu, gpu)
print("Dist.sum reduced a CPU float64 and a CUDA tensor on", d.device)
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--budget", type=float, default=420.0, help="seconds for the whole check")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="the in-process checks on this CPU at a toy width (the script's own test)",
    )
    args = p.parse_args(argv)
    t0 = time.monotonic()
    import torch

    global DEVICE, V
    if args.smoke:
        DEVICE, V = "cpu", 8192
        in_process(budget_s=args.budget, smoke=True)
    elif not torch.cuda.is_available():
        report("SKIP", "all", "no CUDA device here")
    else:
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
        try:
            in_process(budget_s=args.budget * 0.45, smoke=False)
        except Exception as err:  # an import error: the later checks still run
            report("FAIL", "in_process", traceback.format_exception_only(type(err), err)[-1])
        run = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        script = Path(os.environ.get("TMPDIR", "/tmp")) / "brisk_dist_check.py"
        script.write_text(DIST_SCRIPT)
        subprocess_check("dist_collectives", [*run, "--nproc-per-node", "1", str(script)], 90)
        left = args.budget - (time.monotonic() - t0)
        subprocess_check(
            "fsdp2_0.6b",
            [
                *run,
                "--nproc-per-node",
                "1",
                "benchmarks/fsdp_bench.py",
                "--shape",
                "0.6b",
                "--device",
                "cuda",
                "--precision",
                "bf16",
                "--attention",
                "flex-compiled",
                "--checkpointing",
                "--L",
                "2048",
                "--steps",
                "2",
            ],
            max(60.0, left * 0.5),
        )
        if torch.cuda.device_count() >= 2:
            subprocess_check(
                "two_ranks",
                [
                    *run,
                    "--nproc-per-node",
                    "2",
                    "benchmarks/fsdp_bench.py",
                    "--shape",
                    "tiny",
                    "--device",
                    "cuda",
                    "--steps",
                    "2",
                ],
                120,
            )
        else:
            report("SKIP", "two_ranks", f"{torch.cuda.device_count()} GPU here")
        left = args.budget - (time.monotonic() - t0)
        try:
            import pytest  # noqa: F401
        except ImportError:
            report("SKIP", "gpu_tests", "pytest is not installed here")
        else:
            subprocess_check(
                "gpu_tests",
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-x",
                    "-p",
                    "no:cacheprovider",
                    "tests/runtime/test_corrector_kernel.py",
                    "tests/runtime/test_flex.py",
                    "-k",
                    "cuda",
                ],
                max(30.0, left),
            )
    out = args.json or (Path(os.environ["OUT"]) / "gpu_check.json" if "OUT" in os.environ else None)
    if out is not None:
        out.write_text(json.dumps(RESULTS, indent=2) + "\n")
    failed = [r["name"] for r in RESULTS if r["status"] == "FAIL"]
    print(
        f"{len(RESULTS) - len(failed)} checks passed or skipped, {len(failed)} failed"
        + (f": {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
