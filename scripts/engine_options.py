"""What scripts/sglang-options, scripts/vllm-options and scripts/llamacpp-options share: one
engine release's option table (every option string with the ``dest`` it sets, and each
dest's action), rendered as the JSON the worker ships in
``sie_worker/config/data/<engine>-options-<v>.json``.

The Python engines' scripts build their engine's own argparse parser (:func:`table_of`);
llamacpp-options reads llama-server's ``--help`` instead. Each calls :func:`run`; the parser
tests load the scripts and compare :func:`render` of the table with the shipped file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "worker" / "src" / "sie_worker" / "config" / "data"


def table_of(
    parser: argparse.ArgumentParser, *, engine: str, version: str, script: str, **extra: object
) -> dict[str, object]:
    """The option table of one built parser."""
    options = {
        option: action.dest
        for option, action in sorted(parser._option_string_actions.items())
        if option not in ("-h", "--help")
    }
    actions = {
        action.dest: _action(action)
        for action in parser._actions
        if action.option_strings and action.dest != "help"
    }
    return {
        engine: version,
        "generated_by": script,
        "allow_abbrev": parser.allow_abbrev,
        "prefix_chars": parser.prefix_chars,
        **extra,
        "options": options,
        "actions": dict(sorted(actions.items())),
    }


def _action(action: argparse.Action) -> dict[str, object]:
    """What a value of this option must be: the argparse action class without its
    underscores and ``Action`` suffix (``_StoreTrueAction`` -> ``StoreTrue``), its type's name,
    nargs, and choices (as strings) when it has them."""
    kind = type(action).__name__.strip("_").removesuffix("Action")
    value_type = getattr(action.type, "__name__", None) if action.type is not None else None
    return {
        "kind": kind,
        "type": value_type if isinstance(value_type, str) else None,
        "nargs": action.nargs if isinstance(action.nargs, int | str) else None,
        "choices": sorted(str(c) for c in action.choices) if action.choices is not None else None,
    }


def render(table: dict[str, object]) -> str:
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


def run(
    argv: list[str] | None,
    *,
    engine: str,
    build_table: Callable[[], dict[str, object]],
    description: str,
) -> int:
    """The command line of both scripts: write, ``--check`` or ``--stdout`` the table."""
    script = f"scripts/{engine}-options"
    cli = argparse.ArgumentParser(description=description)
    mode = cli.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="fail when the shipped table is stale")
    mode.add_argument("--stdout", action="store_true", help="print the table, write nothing")
    cli.add_argument("--out-dir", type=Path, default=DATA, help=f"default: {DATA}")
    args = cli.parse_args(argv)
    table = build_table()
    text = render(table)
    count = len(table["options"])  # type: ignore[arg-type]
    if args.stdout:
        sys.stdout.write(text)
        return 0
    target = args.out_dir / f"{engine}-options-{table[engine]}.json"
    if args.check:
        current = target.read_text(encoding="utf-8") if target.is_file() else None
        if current != text:
            print(f"{target}: stale or missing; run {script}", file=sys.stderr)
            return 1
        print(f"{target}: up to date ({count} options)", file=sys.stderr)
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    print(f"wrote {target} ({count} options)", file=sys.stderr)
    return 0
