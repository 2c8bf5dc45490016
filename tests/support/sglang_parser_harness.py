"""Run SGLang's own argument parser on argvs or tokens (a subprocess for the parser tests).

Reads JSON from stdin: {"argvs": [[...], ...], "tokens": [...], "server_args": bool,
"table_script": path}. Writes JSON to stdout: {"version", "argvs": [{"ok", "error",
"values"}], "tokens": [...], "table": text}; "table" is what ``scripts/sglang-options``
would write for this release (its own build_table/render, loaded from table_script).
Each token resolves to {"dest"} (an option), {"ambiguous"} (argparse refuses it) or {} (not
an option). Run with the Python whose sys.path holds the SGLang release to check.

With ``--serve`` it answers one request a line until stdin ends, each answer one line: SGLang
is imported once for them all (``tests/support/sglang_parser.py`` keeps one such process per
release for a pytest process).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import runpy
import sys
from typing import Any


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print and exit
        raise _Refused(message)


def main() -> int:
    if "--serve" in sys.argv[1:]:
        # Only answers on stdout: whatever SGLang prints goes to stderr.
        answers, sys.stdout = sys.stdout, sys.stderr
        parser = _sglang_parser()
        for line in sys.stdin:
            print(json.dumps(_answer(parser, json.loads(line))), file=answers, flush=True)
        return 0
    request = json.load(sys.stdin)
    json.dump(_answer(_sglang_parser(), request), sys.stdout)
    return 0


def _sglang_parser() -> _Parser:
    from sglang.srt.server_args import ServerArgs

    parser = _Parser(prog="sglang.launch_server")
    with contextlib.redirect_stdout(io.StringIO()):
        ServerArgs.add_cli_args(parser)
    return parser


def _answer(parser: _Parser, request: dict[str, Any]) -> dict[str, Any]:
    import sglang
    from sglang.srt.server_args import ServerArgs

    results = []
    for argv in request.get("argvs", []):
        sink = io.StringIO()
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                namespace = parser.parse_args(argv)
                if request.get("server_args"):
                    ServerArgs.from_cli_args(namespace)
        except _Refused as exc:
            results.append({"ok": False, "error": str(exc)})
            continue
        except Exception as exc:
            results.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            continue
        values = {
            k: v
            for k, v in vars(namespace).items()
            if isinstance(v, str | int | float | bool)
            or (isinstance(v, list) and all(isinstance(i, str | dict) for i in v))
        }
        results.append({"ok": True, "values": values})
    tokens = []
    for token in request.get("tokens", []):
        try:
            found = parser._parse_optional(token)
        except _Refused:
            tokens.append({"ambiguous": True})
            continue
        action = found[0] if found else None
        tokens.append({"dest": action.dest} if action is not None else {})
    table = None
    if request.get("table_script"):
        script = runpy.run_path(request["table_script"])
        with contextlib.redirect_stdout(io.StringIO()):
            table = script["render"](script["build_table"]())
    version = getattr(sglang, "__version__", "")
    return {"version": version, "argvs": results, "tokens": tokens, "table": table}


if __name__ == "__main__":
    sys.exit(main())
