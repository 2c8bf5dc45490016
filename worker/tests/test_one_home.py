"""A rule the worker, router and gateway share lives in one place and is imported wherever it
applies: no module compares a model's width with a device count or a slot's width itself
(``sie_worker.config.widths.width_fits`` does); the body-size limit is only handed to the
app's front door, never checked elsewhere."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sie_worker

PACKAGE = Path(sie_worker.__file__).resolve().parent
FILES = sorted(PACKAGE.rglob("*.py"))
# What a width is compared with when the width rule is applied.
_CAPACITY = ("slot_width", "device_count", "devices", "count")
_WIDTH_HOME = PACKAGE / "config" / "widths.py"


def _names(node: ast.AST) -> set[str]:
    """Every name and attribute a node mentions (``len(devices)``: len, devices)."""
    found: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            found.add(child.id)
        elif isinstance(child, ast.Attribute):
            found.add(child.attr)
    return found


def _is_width(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return isinstance(name, str) and name.endswith("width") and name != "slot_width"


def _is_capacity(node: ast.AST) -> bool:
    """A device count or a slot's width: ``slot_width``, ``device_count``, ``devices``,
    ``x.count``, ``len(devices)``."""
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id == "len"
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return name in _CAPACITY


def _width_comparisons(path: Path) -> list[str]:
    """Orderings of a width against a capacity (``width > len(devices)``, ``p.slot_width >=
    width``): the width rule. Other checks (a block's bounds, a free run) are not it."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, sides[:-1], sides[1:], strict=True):
            if not isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE):
                continue
            if (_is_width(left) and _is_capacity(right)) or (
                _is_capacity(left) and _is_width(right)
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", [f for f in FILES if f != _WIDTH_HOME], ids=str)
def test_no_module_but_the_rules_compares_a_width_with_a_capacity(path: Path) -> None:
    assert _width_comparisons(path) == [], "use sie_worker.config.widths.width_fits"


def test_the_rules_module_holds_the_width_comparison() -> None:
    assert _width_comparisons(_WIDTH_HOME), "the check above would find nothing"


def _body_limit_reads(path: Path) -> list[int]:
    """Lines that read a ``max_body_bytes`` other than to hand it to ``Middleware(...)`` or
    to the app's front door (``FrontDoor(...)``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    handed = {
        id(keyword.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and {"Middleware", "FrontDoor"} & _names(node.func)
        for keyword in node.keywords
    }
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "max_body_bytes"
        and isinstance(node.ctx, ast.Load)
        and id(node) not in handed
    ]


def test_the_body_limit_check_sees_a_read_and_passes_the_middleware(tmp_path: Path) -> None:
    module = tmp_path / "app.py"
    module.write_text(
        "stack = [Middleware(FrontDoor, max_bytes=settings.max_body_bytes)]\n"
        "if len(body) > settings.max_body_bytes:\n"
        "    raise TooLarge\n"
    )
    assert _body_limit_reads(module) == [2]


@pytest.mark.parametrize("path", FILES, ids=str)
def test_the_body_limit_is_only_handed_to_the_front_door(path: Path) -> None:
    assert _body_limit_reads(path) == [], "sie_worker.http.front_door checks bodies"


@pytest.mark.parametrize("path", FILES, ids=str)
def test_no_module_is_longer_than_400_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= 400, f"{path.relative_to(PACKAGE)} has {lines} lines: split it by concept"
