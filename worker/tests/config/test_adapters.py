"""Adapter identifiers: the public paths import, and nothing outside sie_server.adapters does."""

from __future__ import annotations

import pytest

from sie_server.adapters.base import Adapter
from sie_worker.config.adapters import (
    CHAT,
    EMBEDDING,
    GENERATION,
    KNOWN_ADAPTERS,
    TRANSFORMERS,
    UnknownAdapter,
    default_adapter_path,
    resolve_adapter,
)


@pytest.mark.parametrize("path", KNOWN_ADAPTERS)
def test_public_adapter_paths_resolve_to_their_class(path: str) -> None:
    adapter = resolve_adapter(path)
    assert issubclass(adapter, Adapter)
    assert adapter.adapter_path() == path


def test_every_sglang_adapter_accepts_the_seed_options() -> None:
    seed = {
        "tensor_parallel_size",
        "request_read_timeout_s",
        "startup_timeout_s",
        "watchdog_timeout_s",
        "disable_piecewise_cuda_graph",
        "nccl_port",
    }
    for path in (GENERATION, EMBEDDING, CHAT):
        adapter = resolve_adapter(path)
        assert adapter.engine == "sglang"
        assert seed <= set(adapter.loadtime_options)


def test_chat_adapter_is_built_on_the_generation_adapter() -> None:
    assert issubclass(resolve_adapter(CHAT), resolve_adapter(GENERATION))


def test_transformers_adapter_does_not_accept_a_width() -> None:
    adapter = resolve_adapter(TRANSFORMERS)
    assert adapter.engine == "transformers"
    assert "tensor_parallel_size" not in adapter.loadtime_options


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("os:system", "not module:Class inside sie_server.adapters"),
        ("sie_server.adapters_evil:X", "not module:Class inside sie_server.adapters"),
        ("sie_server.adapters.nope:X", "module sie_server.adapters.nope does not exist"),
        ("sie_server.adapters.base:Adapter", "has no adapter class Adapter"),
        ("sie_server.adapters.sglang:SGLANG_LOADTIME_OPTIONS", "has no adapter class"),
        ("sie_server.adapters.sglang.generation", "not module:Class"),
    ],
)
def test_unknown_adapters_are_refused_with_the_known_ones(path: str, says: str) -> None:
    with pytest.raises(UnknownAdapter, match=says):
        resolve_adapter(path)


@pytest.mark.parametrize(
    ("sglang", "tasks", "expected"),
    [
        (False, {"generate": {}}, TRANSFORMERS),
        (False, {"encode": {}}, TRANSFORMERS),
        (True, {"generate": {}}, GENERATION),
        (True, {"encode": {}}, EMBEDDING),
        (True, {"encode": {}, "generate": {}}, GENERATION),
    ],
)
def test_default_adapter_depends_on_the_bundle_and_tasks(
    sglang: bool, tasks: dict[str, object], expected: str
) -> None:
    assert default_adapter_path(sglang, tasks) == expected
