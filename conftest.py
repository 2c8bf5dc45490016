"""Fixtures shared by worker/tests and tests/: each area keeps its own plugin module."""

import pytest
from hypothesis import settings

pytest_plugins = [
    "tests.support.engine_fixtures",  # fake SGLang engine command
    "tests.support.model_fixtures",  # tiny models built at test time
    "tests.support.worker_fixtures",  # a real `sie-worker serve` subprocess
    "tests.support.gateway_fixtures",  # pods (router + workers) and gateways as processes
    "tests.support.sie_sdk",  # SIE's client sie-sdk in .venv-sdk
    "tests.support.prometheus",  # a real Prometheus (tests/observability)
]

# No per-example deadline: it is a timed assertion, and CI machines are noisy. Speed is
# measured by the benchmarks (tests/bench), not by tests.
settings.register_profile("sie", deadline=None)
settings.load_profile("sie")


# The fixtures of real models (tests/support/model_fixtures.py): a test that asks for one
# builds or serves a real model, so it is marked torch (left out of make check) without
# saying so itself.
MODEL_FIXTURES = frozenset(
    {
        "tiny_llama_dir",
        "tiny_cross_encoder_dir",
        "tiny_lora_dirs",
        "tiny_vllm_llama_dir",
        "tiny_vllm_lora_dir",
        "minilm_dir",
    }
)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks, and -m selects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.torch)
    # why: pytest-xdist hands tests out in collection order; the slow ones first keep the
    # run's tail short (a long test started last leaves the other workers idle). Modules
    # move whole (any test of theirs marked slow moves them), in a stable sort: each
    # module's tests stay together and in their order, so a module fixture is set up once
    # (a module split by the sort set it up twice: a real SGLang import or engine again).
    slow_modules = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_modules)
    # why: a module (or class) fixture is set up once per worker that runs one of its tests:
    # spread over four workers, a module of real engines started them four times. Such a
    # module's tests form one xdist group (--dist loadgroup); the others spread freely.
    for item in items:
        if _uses_a_shared_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


def _uses_a_shared_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)  # set on every test function pytest collects
    if info is None:
        return False
    return any(
        definition.scope in ("module", "class", "package")
        for definitions in info.name2fixturedefs.values()
        for definition in definitions
    )
