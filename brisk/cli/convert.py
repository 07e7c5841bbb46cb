"""``brisk convert``: checkpoints in other formats as the transformers checkpoints brisk runs.

``brisk convert gguf FILE OUT`` writes a GGUF file (llama.cpp's format, quantized or not) as a
checkpoint directory, every weight dequantized to ``--dtype`` and the tokenizer checked against
the file's own vocabulary (:mod:`brisk.runtime.gguf`)::

    brisk convert gguf SmolLM2-135M-Instruct.Q4_1.gguf runs/smollm2/model

torch and transformers are imported inside the command, so ``brisk --help`` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(layers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = layers.add_parser("convert", help="checkpoints in other formats (GGUF) for brisk")
    formats = parser.add_subparsers(dest="command", required=True, metavar="FORMAT")
    g = formats.add_parser("gguf", help="a GGUF file as a transformers checkpoint directory")
    g.add_argument("file", type=Path, metavar="FILE", help="the .gguf file")
    g.add_argument(
        "out", type=Path, metavar="OUT", help="the checkpoint directory to write (new or empty)"
    )
    g.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the weights' dtype once dequantized (default: float32)",
    )
    g.set_defaults(run=run_gguf)


def run_gguf(args: argparse.Namespace) -> int:
    import json
    import time

    from brisk.runtime.gguf import SOURCE_FILE, convert_gguf

    start = time.perf_counter()
    out = convert_gguf(args.file, args.out, dtype=args.dtype)
    record = json.loads((out / SOURCE_FILE).read_text())
    print(
        f"wrote {out}: {record['architecture']}, {record['parameters']:,} parameters in "
        f"{record['dtype']}, {record['tokens']:,}-token tokenizer "
        f"({time.perf_counter() - start:.1f} s)"
    )
    return 0
