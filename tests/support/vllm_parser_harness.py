"""Run vLLM's own argument parser on argvs and tokens (a subprocess of the vLLM parser test,
run with ``.venv-vllm/bin/python``).

Reads JSON from stdin: {"argvs": [[...], ...], "tokens": [...], "table_script": path}.
Writes JSON to stdout: {"version", "argvs": [{"ok", "error", "values"}], "tokens": [...],
"table": text}. An argv goes through ``python -m vllm.entrypoints.openai.api_server``'s
parser whole (FlexibleArgumentParser's rewriting, then argparse). A token resolves as that
parser reads it: its rewriting first (underscores, ``--name.key``, ``-O3``), then argparse's
lookup of the first argument it produced: {"dest"} (an option), {"ambiguous"} (argparse
refuses it) or {} (not an option). "table" is what ``scripts/vllm-options`` would write.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import runpy
import sys
from typing import Any


class _Refused(Exception):
    pass


def main() -> int:
    request = json.load(sys.stdin)
    logging.disable(logging.WARNING)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        import vllm
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

    captured: list[list[str]] = []

    class Parser(FlexibleArgumentParser):  # type: ignore[misc]
        capture = False

        def error(self, message: str) -> Any:  # argparse would print and exit
            raise _Refused(message)

        def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
            if self.capture:  # what FlexibleArgumentParser hands argparse
                captured.append(list(args or []))
                return argparse.Namespace(), []
            return super().parse_known_args(args, namespace)

    parser = make_arg_parser(Parser(prog="vllm.entrypoints.openai.api_server"))
    results = []
    for argv in request.get("argvs", []):
        sink = io.StringIO()
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                namespace = parser.parse_args(argv)
        except _Refused as exc:
            results.append({"ok": False, "error": str(exc)})
            continue
        values = {
            k: v
            for k, v in vars(namespace).items()
            if isinstance(v, str | int | float | bool)
            or (isinstance(v, list) and all(isinstance(i, str) for i in v))
        }
        results.append({"ok": True, "values": values})
    tokens = []
    parser.capture = True
    for token in request.get("tokens", []):
        captured.clear()
        # A --name.key without its value, or --config naming no YAML file: argparse's own
        # lookup of the token as it is, below.
        with contextlib.suppress(IndexError, ValueError, OSError):
            parser.parse_args([token, "1"])
        # JSON arguments (--name.key) go to the end of what argparse gets: the token's own
        # reading is the first option there.
        options = [a for a in (captured[0] if captured else []) if a.startswith("-")]
        first = options[0] if options else token
        try:
            found = parser._parse_optional(first)
        except _Refused:
            tokens.append({"ambiguous": True})
            continue
        action = found[0] if found else None
        tokens.append({"dest": action.dest} if action is not None else {})
    parser.capture = False
    table = None
    if request.get("table_script"):
        script = runpy.run_path(request["table_script"])
        with contextlib.redirect_stdout(io.StringIO()):
            table = script["render"](script["build_table"]())
    json.dump(
        {"version": vllm.__version__, "argvs": results, "tokens": tokens, "table": table},
        sys.stdout,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
