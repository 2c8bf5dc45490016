"""Every module of the package keeps an honest ``__all__``: it names only what exists, and
every public class or function the module defines is in it."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
from pathlib import Path
from typing import Any

import pytest

import sie_worker

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(sie_worker.__path__, prefix="sie_worker.")
    if not info.ispkg and not info.name.endswith(".__main__")
)
# The default engine's model code imports torch at its top: importing it is a torch test.
_TORCH_AT_TOP = re.compile(
    r"^(import|from) (torch|transformers|peft|sentence_transformers)\b", re.MULTILINE
)


def _imports_torch(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    origin = spec.origin if spec is not None else None
    return origin is not None and bool(_TORCH_AT_TOP.search(Path(origin).read_text("utf-8")))


def _module_param(name: str) -> Any:
    return pytest.param(name, marks=pytest.mark.torch) if _imports_torch(name) else name


def test_the_package_has_modules_in_every_part() -> None:
    parts = {name.split(".")[1] for name in MODULES}
    assert {"config", "worker", "router", "http", "sizing", "commands", "engines"} <= parts


@pytest.mark.parametrize("name", [_module_param(name) for name in MODULES])
def test_module_exports_exactly_its_public_names(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(getattr(module, "__all__", ()))
    assert all(hasattr(module, n) for n in exported), exported - set(vars(module))
    defined = {
        n
        for n, v in vars(module).items()
        if not n.startswith("_")
        and getattr(v, "__module__", None) == module.__name__
        and (isinstance(v, type) or callable(v))
    }
    assert defined <= exported, defined - exported
