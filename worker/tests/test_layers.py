"""The parts of ``sie_worker`` import one another only as docs/architecture.md says: what a
config means is decided without a server, ``http`` is shared by every app, the engine
families are read by the worker and the commands but never serve, and the default engine
(``engines.transformers``) runs as its own process."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sie_worker

PACKAGE = Path(sie_worker.__file__).resolve().parent
# part -> parts it must never import
FORBIDDEN = {
    "config": {"sizing", "worker", "router", "gateway", "commands"},
    "sizing": {"worker", "router", "gateway", "commands"},
    "worker": {"router", "backends"},
    # The router and the gateway share their backend table, poll reader and prefix index
    # through ``backends``, never through each other.
    "router": {"worker", "gateway"},
    "gateway": {"worker", "router"},
    "backends": {"router", "gateway", "worker", "sizing", "commands", "config"},
    # What an engine is (its flags, argv, memory, checks) knows no server of its own.
    "engines": {"router", "gateway", "commands", "backends", "engines.transformers"},
}
# part -> the only parts (or single modules) it may import besides itself. The engine may
# read SIE's text rule (pure, no imports) so the worker and the engine form texts alike.
ONLY = {"http": {"errors"}, "engines.transformers": {"sie_api.texts"}}
# The default engine's process is a part of its own, inside engines/.
_ENGINE_PROCESS = "engines.transformers"


def _part(module: str) -> str:
    """``sie_worker.config.rules`` -> ``config``; top-level modules are their own part, and
    the default engine's process (``sie_worker.engines.transformers...``) is one too."""
    rest = _rest(module)
    if rest == _ENGINE_PROCESS or rest.startswith(_ENGINE_PROCESS + "."):
        return _ENGINE_PROCESS
    return module.split(".")[1]


def _rest(module: str) -> str:
    """``sie_worker.sie_api.texts`` -> ``sie_api.texts``."""
    return module.split(".", 1)[1]


def _imports(path: Path) -> set[str]:
    """The ``sie_worker`` modules one file imports (absolute and relative)."""
    module = "sie_worker." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("sie_worker.")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            if name == "sie_worker":  # from sie_worker import errors
                found |= {f"sie_worker.{a.name}" for a in node.names}
            elif name.startswith("sie_worker."):
                found.add(name)
    return found


FILES = sorted(PACKAGE.rglob("*.py"))


def _part_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    if parts[:2] == ("engines", "transformers"):
        return _ENGINE_PROCESS
    return parts[0].removesuffix(".py")


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


@pytest.mark.parametrize(
    "path",
    [f for f in FILES if _part_of(f) in FORBIDDEN],
    ids=_name,
)
def test_part_imports_no_part_above_or_beside_it(path: Path) -> None:
    part = _part_of(path)
    wrong = sorted(m for m in _imports(path) if _part(m) in FORBIDDEN[part])
    assert wrong == [], f"sie_worker/{path.relative_to(PACKAGE)} ({part}/) imports {wrong}"


@pytest.mark.parametrize("path", [f for f in FILES if _part_of(f) in ONLY], ids=_name)
def test_shared_http_and_the_engine_import_only_what_they_may(path: Path) -> None:
    part = _part_of(path)
    allowed = ONLY[part] | {part}
    wrong = sorted(m for m in _imports(path) if _part(m) not in allowed and _rest(m) not in allowed)
    assert wrong == [], f"sie_worker/{path.relative_to(PACKAGE)} ({part}/) imports {wrong}"


def test_the_import_check_sees_imports() -> None:
    # The check is only as good as its parser: known imports must be found.
    assert "sie_worker.config.rules" in _imports(PACKAGE / "config" / "files" / "reader.py")
    assert "sie_worker.errors" in _imports(PACKAGE / "http" / "errors.py")


def test_the_one_module_the_engine_shares_imports_nothing_of_the_package() -> None:
    # The engine runs alone: what it shares with the worker must not pull the worker in.
    assert _imports(PACKAGE / "sie_api" / "texts.py") == set()


# Pure cores: what they may import of the package (nothing that does I/O).
PURE = {
    "worker/placement/allocator.py": {"sie_worker.config.widths"},
    "config/widths.py": {"sie_worker.config.files.json_types"},
    "config/files/json_types.py": set(),
    # The engine families' own memory rules (pure), by kind.
    "sizing/memory_needs.py": {"sie_worker.engines.registry"},
    "sizing/packing.py": {"sie_worker.engines.registry"},
    "sizing/layout.py": {"sie_worker.config.widths", "sie_worker.sizing.arithmetic"},
    "worker/lifecycle.py": {"sie_worker.model_states", "sie_worker.worker.records"},
    "backends/prefix.py": set(),
    "model_server_series.py": set(),
    "backends/bound.py": set(),
    "backends/session.py": set(),
    "backends/lora_affinity.py": set(),
    "gateway/tiers.py": set(),
    "router/tiers.py": {"sie_worker.router.policy"},  # its types only (TYPE_CHECKING)
    "router/policy.py": {
        "sie_worker.model_states",
        "sie_worker.backends.bound",
        "sie_worker.backends.lora_affinity",
        "sie_worker.backends.prefix",
        "sie_worker.router.tiers",
    },
    "gateway/policy.py": {
        "sie_worker.config.widths",
        "sie_worker.backends.bound",
        "sie_worker.backends.lora_affinity",
        "sie_worker.backends.prefix",
        "sie_worker.backends.session",
        "sie_worker.gateway.tiers",
    },
}


@pytest.mark.parametrize("name", sorted(PURE))
def test_pure_cores_import_only_pure_modules(name: str) -> None:
    assert _imports(PACKAGE / name) <= PURE[name], (
        f"sie_worker/{name} imports {_imports(PACKAGE / name)}"
    )
