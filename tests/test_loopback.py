"""Tests reach their servers through tests.support.loopback, never a TLS context per call.

Each ``httpx.get`` (or any client httpx makes on its own) loads certifi's CA bundle into a
new TLS context, 19 ms of CPU; in polling loops that was the suite's largest cost.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import loopback
from tests.support.repo import ROOT

# httpx's functions and client that build a TLS context of their own when given none.
_BUILDERS = {"get", "post", "put", "patch", "delete", "head", "options", "request", "stream"}
_BUILDERS |= {"Client"}


def _calls_that_build_a_context(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        func = node.func
        if not (isinstance(func.value, ast.Name) and func.value.id == "httpx"):
            continue
        if func.attr in _BUILDERS and not any(k.arg == "verify" for k in node.keywords):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: httpx.{func.attr}(...)")
    return found


def test_no_test_makes_an_httpx_client_with_a_tls_context_of_its_own() -> None:
    own = Path(loopback.__file__).resolve()
    sources = [p for d in ("tests", "worker/tests") for p in (ROOT / d).rglob("*.py")]
    found = [line for p in sources if p != own for line in _calls_that_build_a_context(p)]
    assert not found, "use tests.support.loopback instead:\n" + "\n".join(found)
