"""The order the root conftest gives the collected tests: modules with a slow test first (so
pytest-xdist starts the long work early), and every module's tests together and in their
written order (so a module fixture, such as a real SGLang import, is set up once)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.support.repo import ROOT


def _root_conftest() -> ModuleType:
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_HOOK = _root_conftest().pytest_collection_modifyitems


@dataclass
class _Item:
    """What the hook reads of a collected test."""

    path: Path
    name: str
    slow: bool
    markers: list[Any] = field(default_factory=list)

    @property
    def nodeid(self) -> str:
        return f"{self.path.name}::{self.name}"

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "slow" and self.slow else None

    def add_marker(self, marker: Any) -> None:
        self.markers.append(marker)


# Modules as collected: each a list of (test, marked slow), in written order.
_modules = st.lists(st.lists(st.booleans(), min_size=1, max_size=6), min_size=1, max_size=8)


@given(_modules)
def test_modules_with_a_slow_test_come_first_each_whole_and_in_its_written_order(
    modules: list[list[bool]],
) -> None:
    items = [
        _Item(Path(f"test_m{m}.py"), f"test_{t}", slow)
        for m, tests in enumerate(modules)
        for t, slow in enumerate(tests)
    ]
    collected = list(items)
    _HOOK(items)
    order = [item.path for item in items]
    runs = [p for i, p in enumerate(order) if i == 0 or order[i - 1] != p]
    assert len(runs) == len(set(runs)), "a module's tests were split apart"
    slow = [Path(f"test_m{m}.py") for m, tests in enumerate(modules) if any(tests)]
    plain = [Path(f"test_m{m}.py") for m, tests in enumerate(modules) if not any(tests)]
    assert runs == slow + plain  # slow modules first, each group in collection order
    for path in runs:
        assert [i for i in items if i.path == path] == [i for i in collected if i.path == path]
