"""A served model's snapshot key carries its engine family's selection of weight files."""

from __future__ import annotations

from typing import Any

from sie_worker.config.files.reader import parse_config
from sie_worker.config.model import ServedModel, served_model
from sie_worker.settings import Settings
from sie_worker.worker.weights.cache import SnapshotKey
from sie_worker.worker.weights.model_key import model_key

LLAMACPP = "sie_server.adapters.llamacpp.generation:LlamaCppGenerationAdapter"
SGLANG = "sie_server.adapters.sglang.chat:SGLangChatAdapter"


def served(profile: dict[str, Any], **top: Any) -> ServedModel:
    doc = {
        "sie_id": "org/model",
        "hf_id": "org/model-GGUF",
        "tasks": {"generate": {"context_length": 512, "max_output_tokens": 32}},
        "profiles": {"default": profile},
        **top,
    }
    return served_model(parse_config(doc, source="m.yaml"), "default")


def test_a_llamacpp_profile_selects_its_gguf_file() -> None:
    model = served(
        {"adapter_path": LLAMACPP, "adapter_options": {"loadtime": {"gguf_file": "m-Q8_0.gguf"}}},
        hf_revision="v1",
    )
    assert model_key(model, Settings()) == SnapshotKey("org/model-GGUF", "v1", ("m-Q8_0.gguf",))


def test_a_llamacpp_profile_without_gguf_file_selects_the_repos_gguf_files() -> None:
    model = served({"adapter_path": LLAMACPP})
    assert model_key(model, Settings()).weights == ("*.gguf",)


def test_a_profile_without_adapter_path_follows_the_bundles_engine() -> None:
    model = served({})
    assert model_key(model, Settings(bundle="llamacpp")).weights == ("*.gguf",)
    assert model_key(model, Settings(bundle="sglang")).weights == ()


def test_other_engines_and_unknown_adapters_take_the_usual_choice() -> None:
    assert model_key(served({"adapter_path": SGLANG}), Settings()) == SnapshotKey("org/model-GGUF")
    gliner = "sie_server.adapters.gliner:GLiNERAdapter"  # SIE's, not run by this image
    assert model_key(served({"adapter_path": gliner}), Settings()).weights == ()
