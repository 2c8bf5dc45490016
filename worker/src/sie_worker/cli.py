"""``sie-worker`` command line: one subcommand per module in :mod:`sie_worker.commands`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from sie_worker._version import __version__

__all__ = ["COMMANDS", "build_parser", "main"]

# Each names its module in sie_worker.commands, which registers the subcommand's parser.
COMMANDS = ("serve", "validate", "plan", "size", "fetch", "route", "gateway")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``only`` the one subcommand that will run.

    why: a process imports just its command's module. The others pull in what only they use
    (the hub client for ``fetch``, the sizing tables, the schema validator), which cost
    ``route`` and ``gateway`` a third of their start-up (issue 29: the tests start hundreds
    of them). The subcommand's own parser, help and errors are the same either way.
    """
    parser = argparse.ArgumentParser(
        prog="sie-worker",
        description=(
            "Serve models too large for one GPU: place each model on a contiguous block of "
            "the devices in SIE_DEVICES and run one engine per model."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        if only is None or name == only:
            importlib.import_module(f"sie_worker.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else list(argv)
    command = args_in[0] if args_in and args_in[0] in COMMANDS else None
    args = build_parser(command).parse_args(args_in)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
