"""The weights tests' fake hub (``HF_ENDPOINT``), with huggingface_hub allowed to reach it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from huggingface_hub import constants as hf_constants
from tests.support.fake_hub import FakeHub


@pytest.fixture(autouse=True)
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    # The session may have imported huggingface_hub under HF_HUB_OFFLINE=1 (model fixtures);
    # the hub here is local, so the library may use the network.
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as fake:
        yield fake
