"""The engines' command-line options, as their own parsers define them, one table per
engine release.

The worker never imports an engine: ``scripts/sglang-options`` and ``scripts/vllm-options``
write each release's ``{option string: dest}`` table, and each dest's action (kind, value
type, choices), from the engine's real parser into ``data/<engine>-options-<version>.json``,
one per release a bundle runs (SGLang 0.5.23 and 0.5.10.post1, vLLM 0.32.0).
:func:`resolve` matches a token exactly as the engine's argparse does (``allow_abbrev`` on:
``--tp=2`` sets SGLang's ``--tp-size`` because ``--tp`` is its unique prefix; ``-t`` sets
vLLM's ``-tp``); a ``flexible`` table (vLLM's FlexibleArgumentParser) first turns the
underscores of an option's name into dashes and reads ``--name.key value`` as ``--name``.
:func:`table_for` finds a release's table.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from sie_worker.engines.sglang.release import version_key

__all__ = [
    "Action",
    "FlagMatch",
    "OptionTable",
    "disables_cuda_graph",
    "flag_value",
    "flexible_option",
    "option_tables",
    "resolve",
    "table_for",
    "unknown_option",
]

_DATA = Path(__file__).resolve().parent.parent / "data"  # config/data
_TABLE_FILE = re.compile(
    r"^(?P<engine>[a-z][a-z0-9]*)-options-(?P<version>[0-9][0-9A-Za-z.+-]*)\.json$"
)
# vLLM's FlexibleArgumentParser: the option's name up to its first "." (the key of a
# ``--name.key value`` JSON argument), whose underscores it turns into dashes.
_NAME = re.compile(r"(?<=--)[^.]*")


@dataclass(frozen=True)
class Action:
    """What one dest takes: argparse's action (``Store``, ``StoreTrue``...), the value type's
    name (``int``, ``float``, ``str``...), and the allowed values when it has choices."""

    kind: str
    type: str | None
    choices: tuple[str, ...] | None


@dataclass(frozen=True)
class OptionTable:
    """One engine release's ``{option string: dest}`` and ``{dest: Action}``; ``complete`` is
    False for the fallback; ``flexible``: vLLM's parser (see the module docstring)."""

    version: str
    options: Mapping[str, str]
    complete: bool = True
    actions: Mapping[str, Action] = field(default_factory=dict)
    engine: str = "sglang"
    flexible: bool = False
    # What a token is looked up in: the options, and argparse's own -h/--help (the tables
    # leave them out; they make prefixes such as --he ambiguous).
    lookup: Mapping[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lookup", {**self.options, "-h": "help", "--help": "help"})

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
    with the part before ``=`` (``--`` tokens) or with the whole token (``-`` tokens, which
    also match a two-character option followed by its value, ``-n2``). A token with a space
    and no ``=`` is a positional value to argparse. A flexible table reads the token as vLLM
    hands it on (:func:`flexible_option`).
    """
    if table.flexible:
        token = flexible_option(token)
    options = table.lookup
    if token in options:
        return FlagMatch(token, (token,), (options[token],))
    if len(token) < 2 or token[0] != "-" or (" " in token and "=" not in token):
        return FlagMatch(token, (), ())
    if "=" in token and (option := token.split("=", 1)[0]) in options:
        return FlagMatch(token, (option,), (options[option],))
    if token.startswith("--"):
        prefix = token.split("=", 1)[0]
        hits = sorted(s for s in options if s.startswith(prefix))
    else:
        short, prefix = token[:2], token
        hits = sorted(s for s in options if s == short or s.startswith(prefix))
    return FlagMatch(token, tuple(hits), tuple(options[s] for s in hits))


def flexible_option(token: str) -> str:
    """What vLLM's FlexibleArgumentParser passes argparse for ``token``: underscores of the
    option's name made dashes (``--tensor_parallel_size=2`` -> ``--tensor-parallel-size=2``),
    a ``--name.key`` (or ``-n.key``) JSON argument as ``--name`` (``-n``); ``-O3`` is
    ``--optimization-level``."""
    if token.startswith("--"):
        key, equals, value = token.partition("=")
        key = _NAME.sub(lambda m: m.group(0).replace("_", "-"), key, count=1)
        if "." in key:  # --name.key value: argparse sees --name '{"key": value}'
            return key.split(".", 1)[0]
        return key + equals + value
    if token.startswith("-O") and len(token) > 2:
        return "--optimization-level"
    key = token.partition("=")[0]
    if token.startswith("-") and "." in key:
        return key.split(".", 1)[0]
    return token


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
def _all_tables() -> tuple[OptionTable, ...]:
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
            tables.append(
                OptionTable(
                    match.group("version"),
                    options,
                    actions=actions,
                    engine=match.group("engine"),
                    flexible=bool(data.get("flexible", False)),
                )
            )
    tables.sort(key=lambda t: version_key(t.version), reverse=True)
    return tuple(tables)


def option_tables(engine: str = "sglang") -> tuple[OptionTable, ...]:
    """The shipped tables of one engine, newest release first (empty when none ships)."""
    return tuple(t for t in _all_tables() if t.engine == engine)


def table_for(version: str, engine: str = "sglang") -> OptionTable | None:
    """The shipped table of this exact release of ``engine``, else None (not shipped)."""
    for table in option_tables(engine):
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


def unknown_option(option: str, table: OptionTable, release: str) -> str:
    """The message for an option ``release``'s parser does not know, with the nearest one."""
    close = difflib.get_close_matches(option, list(table.options), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"{option} is not an option of {release}{hint}"
