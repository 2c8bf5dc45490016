"""What a test does when a tool or environment it needs is missing: on a developer machine it
skips, naming what to run; under CI (``CI=true``) it fails, since CI must run every check."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ["missing"]


def missing(reason: str) -> NoReturn:
    """Skip the test for ``reason``, or fail it under ``CI=true`` (read at the call)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI=true requires it", pytrace=False)
    pytest.skip(reason)
