"""The ``brisk`` command: one subcommand group per layer."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from brisk._cli import OneLineErrors
from brisk.mechanism import cli as mechanism_cli
from brisk.runtime import cli as runtime_cli
from brisk.runtime import decode_cli
from brisk.runtime.serving import cli as serving_cli
from brisk.runtime.tasks import cli as tasks_cli
from brisk.theory import cli as theory_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="brisk", description="BRISK-DLM: verified parallel decoding for diffusion LMs"
    )
    # Every layer's parser (and, by argparse's default, the parsers nested in it) reports a bad
    # argument as one line naming it.
    layers = parser.add_subparsers(
        dest="layer", required=True, metavar="LAYER", parser_class=OneLineErrors
    )
    theory_cli.register(layers)
    runtime_cli.register(layers)
    runtime_cli.register_experiment(layers)
    decode_cli.register(layers)
    tasks_cli.register(layers)
    mechanism_cli.register(layers)
    serving_cli.register(layers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; bad input ends as one line on stderr and exit code 2."""
    parser = build_parser()
    try:
        # The layers' parsers are OneLineErrors: they raise ValueError from parse_args too.
        args = parser.parse_args(argv)
        return int(args.run(args))
    except ValueError as err:
        print(f"brisk: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
