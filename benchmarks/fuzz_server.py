"""The request fuzzer's long form: thousands of Hypothesis-drawn bodies against real CPU servers.

    .venv-serving/bin/python benchmarks/fuzz_server.py [--requests 1000] [--seed 0] \
        [--out benchmarks/results]

Three servers, each started with ``brisk serve`` on this CPU and stopped by its process group:
``isd`` (``--stride 4`` on a micro I-DLM trained here in ≈ 10 s), ``plain`` (the same checkpoint,
SGLang's own decoding, sampling allowed) and ``drafter`` (``--drafter`` over a Llama-shaped
target without a MASK token, the served-drafter test's world). Each gets ``--requests`` bodies
from :mod:`tests.serving.fuzz` (``/generate``, ``/v1/completions``, ``/v1/chat/completions``;
text and ids, every sampling parameter at and past its edges, stop strings and regexes,
logprobs, streams dropped after one chunk), ``/health`` after every ten. Writes
``fuzz_server.json``: per server the requests, the statuses, the 4xx by the field they name,
the dropped streams, the failures (5xx, a 4xx naming no field, an unparsable 200, a dead or
hung server) and whether the server process was alive at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-s", type=float, default=1200.0, help="per server")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()

    from machine import machine

    from brisk.runtime.serving.cpu import ensure_torchvision

    ensure_torchvision()
    from tests.serving.fuzz import fuzz
    from tests.serving.real_server import start_brisk_serve, train_micro_idlm

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="brisk-fuzz-") as tmp:
        work = Path(tmp)
        idlm = train_micro_idlm(work / "idlm")
        drafter_world = _drafter_world(work / "drafter")
        servers = {
            "isd": (idlm, ["--stride", "4"], 101),
            "plain": (idlm, [], 101),
            "drafter": (drafter_world[0], ["--drafter", str(drafter_world[1])], drafter_world[2]),
        }
        for name, (model, flags, vocab) in servers.items():
            directory = work / "servers" / name
            directory.mkdir(parents=True)
            process, server = start_brisk_serve(
                directory, model, ["--device", "cpu", *flags], ["--max-running-requests", "16"]
            )
            try:
                started = time.monotonic()
                tally = fuzz(
                    server.url,
                    vocab,
                    str(model),
                    requests=args.requests,
                    seed=args.seed,
                    budget_s=args.budget_s,
                )
                alive = process.process is not None and process.process.poll() is None
                log = server.log.read_text()
                results[name] = {
                    **tally.to_dict(),
                    "server_alive": alive,
                    "scheduler_exceptions": log.count("Scheduler hit an exception"),
                    "wall_s": time.monotonic() - started,
                }
            finally:
                process.stop()
            shown = {k: v for k, v in results[name].items() if k != "failures"}
            print(name, json.dumps({**shown, "failures": len(results[name]["failures"])}))
    summary = {
        "servers": results,
        "requests_per_server": args.requests,
        "seed": args.seed,
        "command": f"benchmarks/fuzz_server.py --requests {args.requests} --seed {args.seed}",
        "machine": machine(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fuzz_server.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {args.out / 'fuzz_server.json'}")


def _drafter_world(work: Path) -> tuple[Path, Path, int]:
    """The served-drafter test's target (a Llama without a MASK token) and a drafter fitted to
    its greedy continuations; the target's vocabulary size."""
    import torch
    from transformers import AutoConfig, AutoTokenizer

    from tests.llama_micro import llama_without_mask
    from tests.serving.real_server import greedy_reference
    from tests.serving.test_drafter_server import MAX_NEW_TOKENS, TEXTS, fit_drafter

    torch.set_num_threads(1)
    target = llama_without_mask(work / "target")
    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = [tokenizer(t).input_ids for t in TEXTS]
    outputs, _ = greedy_reference(target, prompts, MAX_NEW_TOKENS)
    sequences = [p + o for p, o in zip(prompts, outputs, strict=True)]
    drafter = fit_drafter(target, sequences, work / "drafter")
    return target, drafter, int(AutoConfig.from_pretrained(target).vocab_size)


if __name__ == "__main__":
    main()
