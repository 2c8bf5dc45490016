"""Fixtures shared by worker/tests and tests/: each area keeps its own plugin module."""

pytest_plugins = [
    "tests.support.engine_fixtures",  # fake SGLang engine command
    "tests.support.model_fixtures",  # tiny models built at test time
    "tests.support.worker_fixtures",  # a real `sie-worker serve` subprocess
]
