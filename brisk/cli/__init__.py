"""The ``brisk`` command: one module per command group (theory, mechanism, train with its
corrector commands, experiment, decode, tasks, bench, serve, convert); the library never
imports this package.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from brisk.cli import (
    bench,
    convert,
    decode,
    experiment,
    mechanism,
    serve,
    tasks,
    theory,
    train,
)
from brisk.cli._common import OneLineErrors


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="brisk", description="BRISK-DLM: verified parallel decoding for diffusion LMs"
    )
    # Every layer's parser (and, by argparse's default, the parsers nested in it) reports a bad
    # argument as one line naming it.
    layers = parser.add_subparsers(
        dest="layer", required=True, metavar="LAYER", parser_class=OneLineErrors
    )
    theory.register(layers)
    train.register(layers)
    experiment.register(layers)
    decode.register(layers)
    tasks.register(layers)
    mechanism.register(layers)
    bench.register(layers)
    serve.register(layers)
    convert.register(layers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; bad input, and a write that finds the disk full, end as one line on
    stderr and exit code 2; under torchrun a rank whose peer died ends in one line, exit 1.
    ``argv`` None: this is the program (``brisk``, ``python -m brisk.cli``), which ends its
    ranks together when it ran under torchrun."""
    parser = build_parser()
    try:
        # The layers' parsers are OneLineErrors: they raise ValueError from parse_args too.
        args = parser.parse_args(argv)
        code = int(args.run(args))
    except ValueError as err:
        print(f"brisk: error: {err}", file=sys.stderr)
        return 2
    except Exception as err:
        from brisk._atomic import disk_full

        gone = _peer_gone(err)
        if gone is not None:
            print(gone, file=sys.stderr)
            return 1
        reason = disk_full(err)
        if reason is None:
            raise
        print(
            f"brisk: error: {reason}; what was complete before is kept (a checkpoint, whole "
            "parts), and --resume continues from it where the command has one",
            file=sys.stderr,
        )
        return 2
    if argv is None:  # the program itself (brisk, python -m brisk.cli), not a caller's call
        _finish_process_group()
    return code


# how gloo and nccl say that another rank's process is gone
_PEER_GONE = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "remote process exited",
    "NCCL communicator was aborted",
)


def _peer_gone(err: BaseException) -> str | None:
    """Under torchrun, one line for a collective that failed because another rank's process
    ended (killed by the OOM killer, a signal): this rank, the world, the backend's words, and
    how to go on. None for any other error (or outside torchrun)."""
    import os

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return None
    text = " ".join(str(err).split())
    said = next((p for p in _PEER_GONE if p in text), None)
    if said is None:
        return None
    rank = os.environ.get("RANK", "?")
    return (
        f"brisk: error: rank {rank} of {world}: another rank's process is gone ({said}); this "
        "rank stops too; rerun the command with --resume to continue from the last checkpoint"
    )


def _finish_process_group() -> None:
    """A command that ran under torchrun as the program ends with its ranks together
    (:func:`~brisk.runtime.train.distributed.finish_group`); commands that never imported
    torch.distributed skip it. A caller that runs ``main(argv)`` in its own process keeps its
    process group (it may go on using it)."""
    if "torch.distributed" in sys.modules:
        from brisk.runtime.train.distributed import finish_group

        finish_group()


if __name__ == "__main__":
    sys.exit(main())
