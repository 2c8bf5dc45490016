"""Which pools can serve a model: bundle runs the adapter, slots wide enough; model ids."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.worker_fixtures import fake_model, write_config

from sie_worker.config.adapters import EMBEDDING, GENERATION, TRANSFORMERS
from sie_worker.errors import AmbiguousModel
from sie_worker.gateway.catalogue import Catalogue, bundle_runs
from sie_worker.gateway.pools import PoolSpec
from sie_worker.gateway.service import Gateway
from sie_worker.gateway.settings import GatewaySettings


def _spec(bundle: str, width: int = 1, pool: str = "p") -> PoolSpec:
    return PoolSpec(pool, bundle, "l4", "l4", slot_width=width, service="s", port=8080)


def _catalogue(tmp_path: Path) -> Catalogue:
    write_config(tmp_path, fake_model("org/wide", width=4))
    write_config(tmp_path, fake_model("Qwen/Qwen2.5-7B", profiles={"fast": {"extends": "default"}}))
    minilm = fake_model("org/minilm", task="encode")
    minilm["profiles"]["default"]["adapter_path"] = TRANSFORMERS
    minilm["profiles"]["default"]["adapter_options"]["loadtime"] = {}
    write_config(tmp_path, minilm)
    catalogue, problems = Catalogue.from_config_dir(tmp_path)
    assert problems == []
    return catalogue


def test_sglang_adapters_run_on_sglang_bundles_and_transformers_on_default() -> None:
    assert bundle_runs(GENERATION, "sglang") is None
    assert bundle_runs(EMBEDDING, "sglang-cu130") is None
    assert bundle_runs(TRANSFORMERS, "default") is None
    assert "needs an SGLang bundle" in (bundle_runs(GENERATION, "default") or "")
    assert "default bundle only" in (bundle_runs(TRANSFORMERS, "sglang") or "")
    assert "unknown adapter" in (bundle_runs("sie_server.adapters.nope:X", "sglang") or "")


def test_a_pool_fits_a_model_by_bundle_and_slot_width(tmp_path: Path) -> None:
    catalogue = _catalogue(tmp_path)
    assert set(catalogue.models) == {
        "org/wide",
        "Qwen/Qwen2.5-7B",
        "Qwen/Qwen2.5-7B:fast",
        "org/minilm",
    }
    assert catalogue.fit("org/wide", _spec("sglang", 4)) is None
    why = catalogue.fit("org/wide", _spec("sglang", 2, pool="l4"))
    assert why == (
        "pool l4, bundle sglang: the model needs 4 GPUs per slot (tensor_parallel_size) and "
        "the pool's slots have 2"
    )
    assert catalogue.fit("org/minilm", _spec("default")) is None
    assert "default bundle only" in (catalogue.fit("org/minilm", _spec("sglang")) or "")
    assert catalogue.fit("not/shipped", _spec("sglang")) is None  # the pods say


def test_model_ids_resolve_by_the_one_rule_over_configs_and_pod_listings(
    tmp_path: Path,
) -> None:
    gateway = Gateway(GatewaySettings(tmp_path / "p.yaml"), (), _catalogue(tmp_path), None, None)
    assert gateway.model_id("Qwen/Qwen2.5-7B:default") == "Qwen/Qwen2.5-7B"
    assert gateway.model_id("qwen/qwen2.5-7b:FAST") == "Qwen/Qwen2.5-7B:fast"
    assert gateway.model_id("other/y") == "other/y"  # unknown: select_pools refuses it
    assert gateway.model_id("Qwen__Qwen2.5-7B", generate=True) == "Qwen/Qwen2.5-7B"
    assert gateway.model_id("qwen__qwen2.5-7b:fast", generate=True) == "Qwen/Qwen2.5-7B:fast"
    assert gateway.model_id("Qwen/Qwen2.5-7B", generate=True) == "Qwen/Qwen2.5-7B"


def test_a_name_that_two_served_ids_match_but_for_case_is_ambiguous(tmp_path: Path) -> None:
    write_config(tmp_path, fake_model("Org/M"))
    write_config(tmp_path, fake_model("org/m"))
    catalogue, _ = Catalogue.from_config_dir(tmp_path)
    gateway = Gateway(GatewaySettings(tmp_path / "p.yaml"), (), catalogue, None, None)
    assert gateway.model_id("org/m") == "org/m"
    with pytest.raises(AmbiguousModel, match="Org/M, org/m"):
        gateway.model_id("ORG/M")
