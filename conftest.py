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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # why: pytest-xdist hands tests out in collection order; the slow ones first keep the
    # run's tail short (a long test started last leaves the other workers idle). The sort is
    # stable: each module's tests stay together, in their order.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
