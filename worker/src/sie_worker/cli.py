"""``sie-worker`` command line: one subcommand per module in :mod:`sie_worker.commands`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sie_worker._version import __version__
from sie_worker.commands import fetch, gateway, plan, route, serve, size, validate

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sie-worker",
        description=(
            "Serve models too large for one GPU: place each model on a contiguous block of "
            "the devices in SIE_DEVICES and run one engine per model."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (serve, validate, plan, size, fetch, route, gateway):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
