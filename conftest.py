"""Fixtures shared by worker/tests and tests/: each area keeps its own plugin module."""

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
