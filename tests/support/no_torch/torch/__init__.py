"""Not torch: what `make check` (``scripts/test --check``) puts first on ``PYTHONPATH``.

The inner loop runs no real model and no real engine, the tests that import torch (a default
engine on a real model, a real engine's own code) run in `make test` alone. A test that
reaches torch here is missing its mark: this says so instead of quietly taking minutes.
"""

raise ImportError(
    "make check runs no test that imports torch (a real model, a real engine's code): mark "
    "the test `torch` (pytest.ini), and `make test` runs it"
)
