"""SGLang's command-line options, as its own parsers define them, one table per release.

The worker never imports SGLang: ``scripts/sglang-options`` writes each release's
``{option string: dest}`` table, and each dest's action (kind, value type, choices), from
SGLang's real parser into ``data/sglang-options-<version>.json``, one per release a bundle
runs (0.5.23 and 0.5.10.post1). :func:`resolve` matches a token exactly as SGLang's argparse
does (``allow_abbrev`` on: ``--tp=2`` sets ``--tp-size`` because ``--tp`` is its unique
prefix); :func:`table_for` finds a release's table.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from sie_worker.config.sglang_release import version_key

__all__ = [
    "Action",
    "FlagMatch",
    "OptionTable",
    "disables_cuda_graph",
    "flag_value",
    "option_tables",
    "resolve",
    "table_for",
]

_DATA = Path(__file__).resolve().parent / "data"
_TABLE_FILE = re.compile(r"^sglang-options-(?P<version>[0-9][0-9A-Za-z.+-]*)\.json$")


@dataclass(frozen=True)
class Action:
    """What one dest takes: argparse's action (``Store``, ``StoreTrue``...), the value type's
    name (``int``, ``float``, ``str``...), and the allowed values when it has choices."""

    kind: str
    type: str | None
    choices: tuple[str, ...] | None


@dataclass(frozen=True)
class OptionTable:
    """One SGLang release's ``{option string: dest}`` and ``{dest: Action}``; ``complete`` is
    False for the fallback."""

    version: str
    options: Mapping[str, str]
    complete: bool = True
    actions: Mapping[str, Action] = field(default_factory=dict)

    def has(self, option: str) -> bool:
        """Whether ``option`` is one of this release's option strings (spelled out)."""
        return option in self.options

    def action_of(self, option: str) -> Action | None:
        dest = self.options.get(option)
        return self.actions.get(dest) if dest is not None else None

    def strings_of(self, dest: str) -> tuple[str, ...]:
        """Every option string of one action, long form first (``--tensor-parallel-size``)."""
        found = [s for s, d in self.options.items() if d == dest]
        return tuple(sorted(found, key=lambda s: (-len(s), s)))


@dataclass(frozen=True)
class FlagMatch:
    """How one argv token resolves: the option strings it may set, and their dests.

    ``candidates`` holds one option string for an exact or unique-prefix match, several
    for an ambiguous prefix (argparse refuses those), none when nothing matches.
    """

    token: str
    candidates: tuple[str, ...]
    dests: tuple[str, ...]

    @property
    def ambiguous(self) -> bool:
        # Python 3.11's argparse refuses a prefix of several option strings, even of one action.
        return len(self.candidates) > 1

    @property
    def dest(self) -> str | None:
        return self.dests[0] if len(self.candidates) == 1 else None


def resolve(token: str, table: OptionTable) -> FlagMatch:
    """Resolve ``token`` like argparse (``allow_abbrev=True``, ``prefix_chars='-'``).

    Exact option string first (also before the ``=``), else every option string that starts
    with the part before ``=``. Single-dash tokens cannot reach SGLang's long options, and a
    token with a space and no ``=`` is a positional value to argparse.
    """
    if token in table.options:
        return FlagMatch(token, (token,), (table.options[token],))
    if not token.startswith("--") or (" " in token and "=" not in token):
        return FlagMatch(token, (), ())
    option = token.split("=", 1)[0]
    if option in table.options:
        return FlagMatch(token, (option,), (table.options[option],))
    hits = sorted(s for s in table.options if s.startswith(option))
    return FlagMatch(token, tuple(hits), tuple(table.options[s] for s in hits))


def flag_value(args: Sequence[str], dests: Collection[str], table: OptionTable) -> str | None:
    """The value the last flag of ``args`` that sets one of ``dests`` gives it, as argparse
    reads it (abbreviations, ``--flag=value`` or ``--flag value``); None when none does."""
    value: str | None = None
    for index, token in enumerate(args):
        if resolve(token, table).dest in dests:
            if "=" in token:
                value = token.split("=", 1)[1]
            elif index + 1 < len(args):
                value = args[index + 1]
    return value


@cache
def option_tables() -> tuple[OptionTable, ...]:
    """The shipped tables, newest SGLang first (empty when none ships)."""
    tables: list[OptionTable] = []
    if _DATA.is_dir():
        for path in _DATA.iterdir():
            match = _TABLE_FILE.match(path.name)
            if match is None:
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
            options = {str(k): str(v) for k, v in data["options"].items()}
            actions = {
                str(dest): Action(
                    str(entry["kind"]),
                    entry["type"],
                    tuple(entry["choices"]) if entry["choices"] is not None else None,
                )
                for dest, entry in data.get("actions", {}).items()
            }
            tables.append(OptionTable(match.group("version"), options, actions=actions))
    tables.sort(key=lambda t: version_key(t.version), reverse=True)
    return tuple(tables)


def table_for(version: str) -> OptionTable | None:
    """The shipped table of this exact SGLang release, else None (not shipped)."""
    for table in option_tables():
        if table.version == version:
            return table
    return None


def disables_cuda_graph(args: Sequence[str], tables: Sequence[OptionTable] | None = None) -> bool:
    """Whether ``args`` holds a flag that SGLang reads as ``--disable-cuda-graph``."""
    chosen = tables if tables is not None else option_tables()
    for token in args:
        for table in chosen:
            match = resolve(token, table)
            if match.dest == "disable_cuda_graph":
                return True
    return False
