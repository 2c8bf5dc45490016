"""The shipped list of SIE's adapter paths is what ``scripts/sie-adapters`` makes of the
``sie-server`` wheel (downloaded by the test; skipped when the registry is unreachable)."""

from __future__ import annotations

import runpy
from pathlib import Path

from tests.support.sie_wheel import SIE_SERVER_VERSION, sie_server_wheel

from sie_worker.config.sie_adapters import sie_adapters, sie_version

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "sie-adapters"
DATA = ROOT / "worker" / "src" / "sie_worker" / "config" / "data"


def test_shipped_sie_adapter_list_is_current() -> None:
    wheel = sie_server_wheel()
    script = runpy.run_path(str(SCRIPT))
    built = script["render"](script["build"](wheel))
    shipped = (DATA / f"sie-adapters-{SIE_SERVER_VERSION}.json").read_text(encoding="utf-8")
    assert built == shipped, "sie-adapters data is stale: run scripts/sie-adapters WHEEL"


def test_the_list_is_read_from_the_shipped_file() -> None:
    assert sie_version() == SIE_SERVER_VERSION
    assert "sie_server_rust.adapters.candle:CandleEmbeddingAdapter" in sie_adapters()
    assert all(":" in path for path in sie_adapters())
