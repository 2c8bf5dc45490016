"""SIE's ModelInfo: per config, SIE's state words, merged across slots, the detail view."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.served_models import served

from sie_worker.model_states import MODEL_STATES, ModelState
from sie_worker.sie_api.models import merge_model_infos, model_detail, model_info, sie_state


def _config(tasks: dict[str, Any]) -> Any:
    return served(tasks, fast={"extends": "default"}).config


@pytest.mark.parametrize(
    ("ours", "sies"),
    [("unloaded", "available"), ("loading", "loading"), ("ready", "loaded"), ("failed", "failed")],
)
def test_states_are_in_sies_words(ours: ModelState, sies: str) -> None:
    assert sie_state(ours) == sies


def test_an_encoder_shows_its_outputs_dims_and_profiles() -> None:
    config = _config({"encode": {"dimensions": 384, "max_sequence_length": 256}})
    info = model_info(config, {"org/m": ("ready", None), "org/m:fast": ("unloaded", None)})
    assert info["name"] == "org/m"
    assert (info["state"], info["loaded"], info["last_error"]) == ("loaded", True, None)
    assert info["outputs"] == ["dense"]
    assert info["dims"] == {"dense": 384}
    assert info["inputs"] == ["text"]
    assert info["max_sequence_length"] == 256
    assert info["capabilities"] is None
    assert info["profiles"] == {
        "default": {"is_default": True, "state": "loaded"},
        "fast": {"is_default": False, "state": "available"},
    }


def test_a_generator_and_a_scorer_show_their_outputs() -> None:
    generator = model_info(_config({"generate": {"context_length": 64}}), {})
    assert generator["outputs"] == ["tokens"]
    assert generator["capabilities"]["streaming"] is True
    assert generator["max_sequence_length"] == 64
    assert model_info(_config({"score": {}}), {})["outputs"] == ["score"]


def test_a_generator_lists_its_lora_adapters_as_sies_gateway_does() -> None:
    loadtime = {"lora_paths": {"sql": "org/sql-lora", "java": "org/java-lora"}}
    config = served(
        {"generate": {}}, tuned={"adapter_options": {"loadtime": loadtime}}, fast={}
    ).config
    capabilities = model_info(config, {})["capabilities"]
    assert capabilities["lora_adapters"] == ["sql", "java"]
    assert capabilities["profile_lora_adapters"] == {"tuned": ["sql", "java"]}
    assert "lora_adapters" not in model_info(_config({"generate": {}}), {})["capabilities"]


def test_the_furthest_profile_state_is_the_models_and_a_failure_has_its_error() -> None:
    config = _config({"encode": {}})
    loading = model_info(config, {"org/m": ("failed", "boom"), "org/m:fast": ("loading", None)})
    assert (loading["state"], loading["last_error"]) == ("loading", None)
    failed = model_info(config, {"org/m": ("failed", "boom")})
    assert failed["state"] == "failed"
    assert failed["last_error"] == {
        "code": "ENGINE",
        "message": "boom",
        "attempts": 1,
        "permanent": False,
    }


def test_the_detail_is_the_served_models_entry_with_its_configs_info_in_sies_words() -> None:
    config = _config({"encode": {}})
    entry = {
        "id": "org/m:fast",
        "object": "model",
        "state": "ready",
        "devices": ["cuda:0"],
        "error": None,
    }
    detail = model_detail(entry, model_info(config, {"org/m:fast": ("ready", None)}))
    assert detail["id"] == "org/m:fast"
    assert detail["name"] == "org/m"
    assert (detail["state"], detail["loaded"], detail["worker_state"]) == ("loaded", True, "ready")
    assert detail["devices"] == ["cuda:0"]
    failed = model_detail({**entry, "state": "failed", "error": "no GPU"}, model_info(config, {}))
    assert failed["last_error"]["message"] == "no GPU"


_STATE = st.sampled_from(["available", "loading", "loaded", "failed"])


@given(st.lists(st.tuples(_STATE, _STATE), min_size=1, max_size=5))
def test_merged_slots_show_the_furthest_state_of_the_model_and_of_each_profile(
    slots: list[tuple[str, str]],
) -> None:
    order = {"available": 0, "failed": 1, "loading": 2, "loaded": 3}
    lists = [
        [
            {
                "name": "org/m",
                "state": model,
                "profiles": {"default": {"state": model}, "fast": {"state": fast}},
            }
        ]
        for model, fast in slots
    ]
    (merged,) = merge_model_infos(lists)
    assert merged["state"] == max((m for m, _ in slots), key=order.__getitem__)
    assert merged["profiles"]["fast"]["state"] == max((f for _, f in slots), key=order.__getitem__)


def test_every_state_has_a_word() -> None:
    assert {sie_state(s) for s in MODEL_STATES} == {"available", "loading", "loaded", "failed"}
