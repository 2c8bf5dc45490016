#!/usr/bin/env python3
"""Write the chart's copy of the worker's refusal tables, _helpers-worker-tables.tpl.

chart/templates/_helpers-worker-tables.tpl lets the chart refuse at render what the worker
would refuse when it reads a model config, so `helm install` never ships a config the
worker then rejects. The tables come from the
worker's own code, never by hand:

- every spelling of a reserved engine flag that one of the shipped SGLang option tables
  resolves (exact option string, unique prefix, ambiguous prefix with a reserved candidate),
  each with the message ``sie_worker.config.flags.reserved_flags.reserved_flag_problem`` gives;
  the same for vLLM's tables (read for a profile with a vLLM adapter; the chart first
  rewrites a token as vLLM's FlexibleArgumentParser does: underscores of the option's name
  to dashes, ``--name.key`` to ``--name``);
- llama.cpp's reserved spellings (exact, and a long option's underscore form) with the
  worker's messages, and the message for any ``--flag=value`` token (its parser reads none),
  as a format of the token, the flag and the value
  (``sie_worker.engines.llamacpp.checks.extra_arg_problems``); which engine's parser reads a
  profile's extra_launch_args, by adapter path, and how (``engineParsers``);
- the device-visibility variables (``sie_worker.config.rules.VISIBILITY_VARIABLES``) and
  the core-binding ones (``sie_worker.config.flags.launch_rules.BINDING_VARIABLES``);
- the characters Python's ``str.strip()`` removes, so the chart trims variable names as the
  worker does (Go's TrimSpace knows fewer);
- a model's width for every tensor width and pipeline depth
  (``sie_worker.config.widths.model_width``), so the chart sizes a group of nodes as the
  worker does;
- the base of a group model's rendezvous port when its config declares no ``nccl_port``
  (``sie_worker.worker.launcher.ranks.GROUP_PORT_BASE``), so the chart's NetworkPolicy opens
  the port every rank uses.

Usage (with the project venv, which imports sie_worker):
    .venv/bin/python scripts/chart_tables.py          # write the file
    .venv/bin/python scripts/chart_tables.py --check  # exit 1 when the file is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from sie_worker.config.flags.launch_rules import BINDING_VARIABLES, env_problems
from sie_worker.config.flags.option_tables import OptionTable, option_tables
from sie_worker.config.flags.reserved_flags import (
    RESERVED_DESTS,
    VLLM_RESERVED_DESTS,
    reserved_flag_problem,
)
from sie_worker.config.rules import VISIBILITY_VARIABLES
from sie_worker.config.widths import MAX_WIDTH, model_width
from sie_worker.engines.llamacpp.checks import extra_arg_problems
from sie_worker.engines.llamacpp.reserved import RESERVED as LLAMACPP_RESERVED
from sie_worker.engines.registry import FAMILIES
from sie_worker.worker.launcher.ranks import GROUP_PORT_BASE

__all__ = ["OUTPUT", "PYTHON_WHITESPACE", "main", "refused_spellings", "render", "width_table"]

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "chart" / "templates" / "_helpers-worker-tables.tpl"
COMMAND = "scripts/chart_tables.py"
PYTHON_WHITESPACE = "".join(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace())


def _check_matching_rule(tables: Sequence[OptionTable]) -> None:
    # The chart looks a token's part before the first "=" up in the spellings, as resolve()
    # does once the token is a "--" option (a token with a space and no "=" is not one).
    # That agrees with resolve() only while every option string is a "--" string (argparse's
    # -h aside; vLLM's short aliases are looked up whole) without "=", "." or a space; a
    # release that breaks this needs sie-workers.launchArgProblem changed.
    for table in tables:
        odd = [
            s
            for s in table.options
            if not (s.startswith("--") or table.flexible or s == "-h")
            or "=" in s
            or "." in s
            or " " in s
        ]
        if odd:
            raise SystemExit(
                f"{COMMAND}: SGLang {table.version} has option strings the chart's matching "
                f"rule does not cover: {odd[:5]}; update sie-workers.launchArgProblem"
            )


def refused_spellings(
    tables: Sequence[OptionTable] | None = None, engine: str = "sglang"
) -> dict[str, str]:
    """``{option part of a token: refusal message after the token}`` for every refused one.

    Only a prefix of a reserved option string can resolve to a reserved dest (exactly, as
    a unique prefix, or as one candidate of an ambiguous prefix), so these are all of them.
    """
    chosen = tuple(tables) if tables is not None else option_tables(engine)
    if not chosen:
        raise SystemExit(f"{COMMAND}: no {engine} option table ships in sie_worker/config/data")
    _check_matching_rule(chosen)
    reserved = VLLM_RESERVED_DESTS if engine == "vllm" else RESERVED_DESTS
    candidates = {
        option[:end]
        for table in chosen
        for option, dest in table.options.items()
        if dest in reserved
        for end in range(2, len(option) + 1)
    }
    refused: dict[str, str] = {}
    for spelling in sorted(candidates):
        message = reserved_flag_problem(spelling, chosen)
        if message is not None:
            shown = repr(spelling)
            assert message.startswith(shown + " "), message
            refused[spelling] = message[len(shown) + 1 :]
    return refused


def llamacpp_spellings() -> dict[str, str]:
    """``{option part of a token: message after the token}`` of llama.cpp's reserved flags:
    each spelling, and a long one's underscore form (the chart makes underscores dashes)."""
    refused: dict[str, str] = {}
    for spelling in sorted(LLAMACPP_RESERVED):
        [(_, message)] = extra_arg_problems([spelling], None)
        shown = repr(spelling)
        assert message.startswith(shown + " "), message
        refused[spelling] = message[len(shown) + 1 :]
    return refused


def llamacpp_equals_format() -> str:
    """The worker's message for a ``--flag=value`` token as a Go format of the token, the
    flag and the value (``%[1]q`` ...): Python's repr of each becomes the chart's quoting."""
    token, flag, value = "--example-flag=example-value", "--example-flag", "example-value"
    [(_, message)] = extra_arg_problems([token], None)
    for index, part in enumerate((token, flag, value), 1):
        message = message.replace(repr(part), f"%[{index}]q")
    assert message.count("%[") == 3, message
    return message


def engine_parsers() -> dict[str, dict[str, str]]:
    """How the chart reads a profile's extra_launch_args: by adapter path, the engine whose
    parser reads them (``adapters``; any other path: SGLang's, as the worker), and each
    engine's way of reading (``parsers``: argparse, vLLM's flexible one, llama.cpp's exact)."""
    adapters = {
        path: family.kind
        for family in FAMILIES.values()
        if family.kind in _PARSERS
        for path in family.adapters
    }
    return {"adapters": adapters, "parsers": dict(_PARSERS)}


def flag_variables() -> dict[str, object]:
    """The variable prefixes an engine reads as its flags (llama.cpp's ``LLAMA_ARG_*``), by
    engine label, and the worker's message for one as a Go format of the name as written
    and the variable (``sie_worker.config.flags.launch_rules.env_problems``)."""
    prefixes = {p: f.label for f in FAMILIES.values() for p in f.owned_prefixes}
    sample_prefix = next(iter(prefixes))
    name = variable = sample_prefix + "EXAMPLE" if sample_prefix.endswith("_") else sample_prefix
    [problem] = env_problems({name: "1"}, ("extra_env",))
    message = problem.message.replace(repr(name), "%[1]q", 1).replace(variable, "%[2]s")
    message = message.replace(prefixes[sample_prefix], "%[3]s")
    assert message.count("%[") == 3, message
    return {"prefixes": prefixes, "message": message}


# The engines whose parser the chart reads extra_launch_args with, and how.
_PARSERS = {"sglang": "argparse", "vllm": "flexible", "llamacpp": "exact"}


def width_table() -> dict[str, int]:
    """``{"<tensor>x<stages>": width}`` for every tensor width and pipeline depth 1..8."""
    return {
        f"{tensor}x{stages}": model_width(tensor, stages)
        for tensor in range(1, MAX_WIDTH + 1)
        for stages in range(1, MAX_WIDTH + 1)
    }


def _define(name: str, doc: str, usage: str, body: str) -> str:
    return (
        f"{{{{/*\n{doc}\nUsage: {usage}\n*/}}}}\n"
        f'{{{{- define "sie-workers.{name}" -}}}}\n{body}\n{{{{- end -}}}}\n'
    )


def _json_object(entries: Mapping[str, str]) -> str:
    lines = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in entries.items()]
    return "{\n" + ",\n".join(lines) + "\n}"


def render(tables: Sequence[OptionTable] | None = None) -> str:
    """The file's text."""
    chosen = tuple(tables) if tables is not None else option_tables()
    releases = ", ".join(t.version for t in chosen)
    vllm = option_tables("vllm")
    vllm_releases = ", ".join(t.version for t in vllm)
    parts = [
        "{{/*\n"
        f"GENERATED by {COMMAND} from the worker's own tables; do not edit, run\n"
        f"`.venv/bin/python {COMMAND}` (a test fails while this file is stale).\n"
        "*/}}\n",
        _define(
            "reservedFlagSpellings",
            "extra_launch_args tokens the worker refuses, by the token's part before the first\n"
            f"'=': every spelling SGLang {releases} resolves to a flag SIE sets itself, with the\n"
            "worker's message (printed after the token). From\n"
            "sie_worker.config.flags.reserved_flags.reserved_flag_problem.",
            '{{ include "sie-workers.reservedFlagSpellings" . | fromJson }}',
            _json_object(refused_spellings(chosen)),
        ),
        _define(
            "vllmReservedFlagSpellings",
            "The same for a profile with a vLLM adapter: every spelling vLLM\n"
            f"{vllm_releases} resolves to a flag SIE sets itself, once the token is rewritten as\n"
            "vLLM's FlexibleArgumentParser does (sie-workers.launchArgProblem).",
            '{{ include "sie-workers.vllmReservedFlagSpellings" . | fromJson }}',
            _json_object(refused_spellings(vllm, "vllm")),
        ),
        _define(
            "llamacppReservedFlagSpellings",
            "The same for a profile with a llama.cpp adapter: every spelling llama-server reads\n"
            "as a flag SIE sets itself (no prefixes; the chart makes a long option's\n"
            "underscores dashes). From sie_worker.engines.llamacpp.checks.extra_arg_problems.",
            '{{ include "sie-workers.llamacppReservedFlagSpellings" . | fromJson }}',
            _json_object(llamacpp_spellings()),
        ),
        _define(
            "llamacppEqualsMessage",
            "The worker's refusal of a --flag=value token for llama.cpp (its parser reads\n"
            "none), as a printf format of the token, the flag and the value.",
            '{{ printf (include "sie-workers.llamacppEqualsMessage" .) $token $flag $value }}',
            "{{- " + json.dumps(llamacpp_equals_format()) + " -}}",
        ),
        _define(
            "engineParsers",
            "Which engine's parser reads a profile's extra_launch_args, by adapter path\n"
            '("adapters"; any other path: "sglang"), and how each reads them ("parsers").\n'
            "From the engine families of sie_worker.engines.registry.",
            '{{ include "sie-workers.engineParsers" . | fromJson }}',
            json.dumps(engine_parsers(), indent=1, sort_keys=True),
        ),
        _define(
            "engineFlagVariables",
            "Environment variable prefixes an engine reads as its flags, by engine label,\n"
            "refused in extra_env in any letter case, and the worker's message for one as a\n"
            "printf format of the name as written, the variable and the engine. From\n"
            "sie_worker.config.flags.launch_rules.env_problems.",
            '{{ include "sie-workers.engineFlagVariables" . | fromJson }}',
            json.dumps(flag_variables(), sort_keys=True),
        ),
        _define(
            "engineBindingVariables",
            "Environment variables that bind an engine to its devices' cores, refused in\n"
            "extra_env in any letter case: the launcher writes them. From\n"
            "sie_worker.config.flags.launch_rules.BINDING_VARIABLES.",
            '{{ include "sie-workers.engineBindingVariables" . | fromJsonArray }}',
            json.dumps(list(BINDING_VARIABLES)),
        ),
        _define(
            "deviceVisibilityVariables",
            "Environment variables that choose visible devices, refused in extra_env in any\n"
            "letter case: the worker writes the device mask itself. From\n"
            "sie_worker.config.rules.VISIBILITY_VARIABLES.",
            '{{ include "sie-workers.deviceVisibilityVariables" . | fromJsonArray }}',
            json.dumps(list(VISIBILITY_VARIABLES)),
        ),
        _define(
            "pythonWhitespace",
            "The characters Python's str.strip() removes, as a trimAll cutset: the worker strips\n"
            "them from extra_env names before comparing.",
            '{{ trimAll (include "sie-workers.pythonWhitespace" .) $name }}',
            "{{- " + json.dumps(PYTHON_WHITESPACE) + " -}}",
        ),
        _define(
            "modelWidthTable",
            "A model's width (the devices its engine spans in all) by its loadtime\n"
            'tensor_parallel_size and pipeline_parallel_size, keyed "<tensor>x<stages>" (each\n'
            f"1..{MAX_WIDTH}). From sie_worker.config.widths.model_width.",
            '{{ get (include "sie-workers.modelWidthTable" . | fromJson) "8x2" }}',
            json.dumps(width_table(), separators=(",", ":")),
        ),
        _define(
            "groupPortBase",
            "A group model's rendezvous port without a declared nccl_port: this + the model's\n"
            "index in SIE_PINNED_MODELS (the same on every rank). From\n"
            "sie_worker.worker.launcher.ranks.GROUP_PORT_BASE.",
            '{{ include "sie-workers.groupPortBase" . | int }}',
            "{{- " + str(GROUP_PORT_BASE) + " -}}",
        ),
    ]
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is stale")
    args = parser.parse_args(argv)
    text = render()
    shown = OUTPUT.relative_to(ROOT)
    if args.check:
        if not OUTPUT.is_file() or OUTPUT.read_text(encoding="utf-8") != text:
            print(f"{shown} is stale: run .venv/bin/python {COMMAND}", file=sys.stderr)
            return 1
        print(f"{shown} is up to date")
        return 0
    partial = OUTPUT.with_name(OUTPUT.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(OUTPUT)
    print(f"wrote {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
