"""Adapter identifiers: this image's adapters import under SIE's paths, SIE's other adapters
read fine and are refused at load naming their bundle, anything else is refused with the
closest spelling; only declared modules are ever imported."""

from __future__ import annotations

import sys

import pytest

from sie_server.adapters.base import Adapter, EngineKind
from sie_server.adapters.transformers import SieTransformersAdapter
from sie_worker.config.adapters import (
    CHAT,
    CUDA13,
    EMBEDDING,
    GEMMA,
    GENERATION,
    IMAGE_BUNDLES,
    KNOWN_ADAPTERS,
    LEGACY_PATHS,
    OWN_ADAPTERS,
    SIE_TRANSFORMERS_ADAPTERS,
    STRICT_THINKING,
    TRANSFORMERS,
    VLLM_EMBEDDING,
    VLLM_GENERATION,
    NotServedHere,
    UnknownAdapter,
    adapter_problem,
    default_adapter_path,
    resolve_adapter,
    serving_bundles,
)
from sie_worker.config.sie_adapters import sie_adapters, sie_bundles, sie_version
from sie_worker.engines.sglang.release import BUNDLE_VERSIONS

SGLANG_FAMILY = (GENERATION, EMBEDDING, CHAT, GEMMA, CUDA13, STRICT_THINKING)


@pytest.mark.parametrize("path", KNOWN_ADAPTERS)
def test_public_adapter_paths_resolve_to_their_class(path: str) -> None:
    adapter = resolve_adapter(path)
    assert issubclass(adapter, Adapter)
    assert adapter.adapter_path() == path
    assert adapter_problem(path) is None


@pytest.mark.parametrize("path", [p for p in KNOWN_ADAPTERS if p not in OWN_ADAPTERS])
def test_every_adapter_this_image_runs_under_an_sie_path_is_one_sie_defines(path: str) -> None:
    assert path in sie_adapters(), f"{path} is not an adapter path of SIE {sie_version()}"


def test_the_whole_sglang_family_of_sie_resolves() -> None:
    sie_sglang = {p for p in sie_adapters() if p.startswith("sie_server.adapters.sglang.")}
    assert sie_sglang <= set(KNOWN_ADAPTERS)
    for path in SGLANG_FAMILY:
        assert resolve_adapter(path).engine == "sglang"


def test_every_sglang_adapter_accepts_the_seed_options() -> None:
    seed = {
        "tensor_parallel_size",
        "request_read_timeout_s",
        "startup_timeout_s",
        "watchdog_timeout_s",
        "disable_piecewise_cuda_graph",
        "nccl_port",
    }
    for path in SGLANG_FAMILY:
        assert seed <= set(resolve_adapter(path).loadtime_options), path


@pytest.mark.parametrize("path", [CHAT, GEMMA, CUDA13, STRICT_THINKING])
def test_adapters_built_on_generation_are_generation_adapters(path: str) -> None:
    assert issubclass(resolve_adapter(path), resolve_adapter(GENERATION))


def test_bundles_follow_sie_bundles_with_embedding_on_sglang() -> None:
    # SIE's bundles/*.yaml, except that SIE's sglang-embedding bundle is this image's sglang
    # (the same SGLang release; DESIGN.md).
    ours = {"sglang-embedding": "sglang"}
    for path in SGLANG_FAMILY:
        if path == CHAT:
            continue
        [sie_bundle] = sie_adapters()[path].bundles
        assert resolve_adapter(path).bundle == ours.get(sie_bundle, sie_bundle), path
    for path in SIE_TRANSFORMERS_ADAPTERS:
        assert resolve_adapter(path).bundle == "default"
        assert set(sie_adapters()[path].bundles) <= {"default"}, path


def test_cu130_adapters_run_only_on_a_bundle_with_sglang_0_5_20_or_later() -> None:
    assert BUNDLE_VERSIONS == {"sglang-cu130": "0.5.23", "sglang": "0.5.10.post1"}
    for path in (GEMMA, CUDA13, STRICT_THINKING):
        assert serving_bundles(resolve_adapter(path)) == ("sglang-cu130",)
    for path in (GENERATION, EMBEDDING, CHAT):
        assert serving_bundles(resolve_adapter(path)) == ("sglang", "sglang-cu130")
    assert serving_bundles(resolve_adapter(TRANSFORMERS)) == ("default",)
    for path in (VLLM_GENERATION, VLLM_EMBEDDING):
        assert serving_bundles(resolve_adapter(path)) == ("vllm",)
    assert IMAGE_BUNDLES == ("default", "llamacpp", "sglang", "sglang-cu130", "vllm")


@pytest.mark.parametrize("path", SIE_TRANSFORMERS_ADAPTERS)
def test_sie_adapters_the_default_engine_serves_declare_their_task(path: str) -> None:
    adapter = resolve_adapter(path)
    assert issubclass(adapter, SieTransformersAdapter)
    assert adapter.engine == "transformers"
    assert adapter.served_task in ("encode", "score")
    assert "tensor_parallel_size" not in adapter.loadtime_options
    assert set(adapter.engine_options) <= set(adapter.sie_options)


def test_legacy_sglang_paths_resolve_as_sie_remaps_them() -> None:
    for legacy, path in LEGACY_PATHS.items():
        assert resolve_adapter(legacy) is resolve_adapter(path)
        assert adapter_problem(legacy) is None


@pytest.mark.parametrize(
    "path",
    [
        "sie_server_rust.adapters.candle:CandleEmbeddingAdapter",
        "sie_server.adapters.gliner:GLiNERAdapter",
        "sie_server.adapters.splade_flash.adapter:SPLADEFlashAdapter",
        "sie_server.adapters.sglang_vision_extract.adapter:SGLangVisionExtractAdapter",
        "sie_server.adapters.bge_m3:BGEM3Adapter",
    ],
)
def test_sie_adapters_this_image_does_not_run_read_fine_and_refuse_to_load(path: str) -> None:
    assert adapter_problem(path) is None
    with pytest.raises(NotServedHere) as refused:
        resolve_adapter(path)
    message = str(refused.value)
    assert path in message
    assert "default, llamacpp, sglang, sglang-cu130, vllm" in message
    bundles = sie_adapters()[path].bundles
    if bundles:
        assert all(f"{b} bundle" in message or b in message for b in bundles)
    else:
        assert "no SIE bundle carries it" in message


def test_every_sie_adapter_is_either_run_here_or_refused_at_load() -> None:
    for path in sie_adapters():
        if path in KNOWN_ADAPTERS:
            assert resolve_adapter(path).adapter_path() == path
        else:
            with pytest.raises(NotServedHere):
                resolve_adapter(path)


def test_the_shipped_list_names_sie_s_bundles() -> None:
    bundles = sie_bundles()
    assert {"default", "sglang", "sglang-cu130", "candle"} <= set(bundles)
    assert "sie_server.adapters.sglang.gemma" in bundles["sglang-cu130"]
    assert sie_version() == "0.10.1"


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("os:system", "neither SIE 0.10.1 nor this image defines it"),
        ("sie_server.adapters_evil:X", "neither SIE 0.10.1 nor this image defines it"),
        ("sie_server.adapters.nope:X", "neither SIE"),
        ("sie_server.adapters.base:Adapter", "neither SIE"),
        ("sie_server.adapters.sglang.generation", "not module:Class"),
        ("adapter.py:MyAdapter", "custom adapter code"),
        ("./models/x/adapter.py:MyAdapter", "custom adapter code"),
        (
            "sie_server.adapters.sglang.generation:Nope",
            f"did you mean {GENERATION}?",
        ),
        (
            "sie_server.adapters.sglang.gema:SGLangGemmaAdapter",
            f"did you mean {GEMMA}?",
        ),
        (
            "sie_server_rust.adapters.candle:CandelEmbeddingAdapter",
            "did you mean sie_server_rust.adapters.candle:CandleEmbeddingAdapter?",
        ),
    ],
)
def test_unknown_adapters_are_refused_with_the_closest_spelling(path: str, says: str) -> None:
    assert says in (adapter_problem(path) or "")
    with pytest.raises(UnknownAdapter, match="unknown adapter"):
        resolve_adapter(path)


def test_refused_paths_import_nothing() -> None:
    before = set(sys.modules)
    for path in ("os.path:join", "sie_server.adapters.gliner:GLiNERAdapter", "json:loads"):
        with pytest.raises((UnknownAdapter, NotServedHere)):
            resolve_adapter(path)
    assert not {m for m in set(sys.modules) - before if m.startswith(("sie_server", "os", "json"))}


@pytest.mark.parametrize(
    ("engine", "tasks", "expected"),
    [
        ("transformers", {"generate": {}}, TRANSFORMERS),
        ("transformers", {"encode": {}}, TRANSFORMERS),
        ("sglang", {"generate": {}}, GENERATION),
        ("sglang", {"encode": {}}, EMBEDDING),
        ("sglang", {"encode": {}, "generate": {}}, GENERATION),
        ("vllm", {"generate": {}}, VLLM_GENERATION),
        ("vllm", {"encode": {}}, VLLM_EMBEDDING),
        ("vllm", {"encode": {}, "generate": {}}, VLLM_GENERATION),
    ],
)
def test_default_adapter_depends_on_the_bundle_and_tasks(
    engine: EngineKind, tasks: dict[str, object], expected: str
) -> None:
    assert default_adapter_path(engine, tasks) == expected
