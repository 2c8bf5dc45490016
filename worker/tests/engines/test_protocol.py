"""The engine protocol holds: outside the engines' own packages no code compares, matches or
keys on an engine family's name; every family answers the whole protocol."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sie_worker.engines.family import EngineFamily
from sie_worker.engines.registry import BUNDLE_ENGINES, FAMILIES, family_of

SOURCES = Path(__file__).resolve().parents[2] / "src"
ENGINES = SOURCES / "sie_worker" / "engines"
NAMES = frozenset(FAMILIES)


def _names_in(node: ast.AST) -> set[str]:
    """The family names a literal holds (itself, or the items of a tuple, list or set)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {n for item in node.elts for n in _names_in(item)}
    return set()


def engine_name_branches(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for every comparison, match case or dict key on a family's name."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                for name in _names_in(side):
                    found.append((node.lineno, f"compares with {name!r}"))
        elif isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue):
            for name in _names_in(node.pattern.value):
                found.append((node.pattern.lineno, f"matches {name!r}"))
        elif isinstance(node, ast.Dict):
            for key in node.keys:
                for name in _names_in(key) if key is not None else ():
                    found.append((key.lineno, f"keys a table on {name!r}"))
    return found


def _outside_engines() -> list[Path]:
    return sorted(p for p in SOURCES.rglob("*.py") if ENGINES not in p.parents)


def test_no_code_outside_the_engines_branches_on_an_engine_name() -> None:
    offenders = [
        f"{path.relative_to(SOURCES)}:{line}: {what}"
        for path in _outside_engines()
        for line, what in engine_name_branches(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], "ask the engine family instead:\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    "source",
    [
        'if engine == "vllm": pass',
        'x = kind != "sglang"',
        'ok = engine in ("sglang", "vllm")',
        'table = {"transformers": 1}',
        'match engine:\n    case "vllm":\n        pass',
    ],
)
def test_the_scan_finds_each_kind_of_branch(source: str) -> None:
    assert engine_name_branches(source)


def test_the_scan_lets_names_pass_that_are_not_compared() -> None:
    assert engine_name_branches('family = family_of("vllm")\nx = ("sglang",)') == []


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_every_family_is_registered_under_its_kind_and_answers_the_protocol(kind: str) -> None:
    family = family_of(kind)
    assert isinstance(family, EngineFamily)
    assert family.kind == kind
    assert family.bundles
    assert all(BUNDLE_ENGINES[b] == kind for b in family.bundles)
    assert family.adapters, "a family runs at least one adapter"
    assert set(family.own_adapters) <= set(family.adapters)
    # Each behaviour is the family's own, not the base's unfinished one.
    for method in ("argv", "memory_need", "share", "default_adapter"):
        assert getattr(type(family), method) is not getattr(EngineFamily, method), method
    if family.memory_option is not None:
        assert family.memory_flag is not None


def test_an_unknown_engine_kind_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="sglang"):
        family_of("tgi")
