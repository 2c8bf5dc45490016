"""Fixtures of the reliability suite: worker launchers that check for leftovers at teardown."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.reliability._support import Launcher


def _close(launcher: Launcher) -> None:
    leftovers = launcher.close()
    assert not leftovers, f"engine processes outlived their worker: {leftovers}"


@pytest.fixture
def launcher(
    tmp_path_factory: pytest.TempPathFactory, fake_engine_minimal_command: str
) -> Iterator[Launcher]:
    """Start workers for one test (``launcher.start(configs, devices=..., env=...)``)."""
    started = Launcher(tmp_path_factory.mktemp("workers"), fake_engine_minimal_command)
    yield started
    _close(started)


@pytest.fixture(scope="module")
def module_launcher(
    tmp_path_factory: pytest.TempPathFactory, fake_engine_minimal_command: str
) -> Iterator[Launcher]:
    """Start workers shared by a module's tests (each test leaves them clean)."""
    started = Launcher(tmp_path_factory.mktemp("shared-workers"), fake_engine_minimal_command)
    yield started
    _close(started)
