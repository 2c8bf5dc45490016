"""Which LoRA adapter a request names: the ``model:adapter`` suffix, its ``lora_path``
field, sie-sdk's ``lora_adapter``; unknown adapters refused."""

from __future__ import annotations

from typing import Any

import pytest
from tests.support.served_models import served

from sie_worker.config.lora_choice import (
    adapter_label,
    check_adapter,
    request_adapter,
)
from sie_worker.errors import InvalidRequest, UnknownModel

GENERATE = {"generate": {}}


@pytest.mark.parametrize(
    ("payload", "from_model", "expected"),
    [
        ({}, None, None),
        ({"lora_path": "sql"}, None, "sql"),
        ({"lora_adapter": "sql"}, None, "sql"),
        ({"lora_path": "sql", "lora_adapter": "sql"}, None, "sql"),
        ({"lora_path": "java"}, "sql", "sql"),  # model:adapter wins, as in SGLang
    ],
)
def test_the_model_suffix_then_lora_path_then_lora_adapter_name_the_adapter(
    payload: dict[str, Any], from_model: str | None, expected: str | None
) -> None:
    assert request_adapter(payload, from_model) == expected


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"lora_path": ""}, "lora_path"),
        ({"lora_path": ["a", "b"]}, "lora_path"),
        ({"lora_adapter": 3}, "lora_adapter"),
        ({"lora_path": "a", "lora_adapter": "b"}, "lora_adapter"),
    ],
)
def test_bad_adapter_fields_are_refused_naming_the_field(
    payload: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        request_adapter(payload, None)
    assert caught.value.param == param


def _with_adapters() -> Any:
    loadtime = {"lora_paths": {"sql": "org/sql-lora", "java": "org/java-lora"}}
    return served(GENERATE, profile="lora", lora={"adapter_options": {"loadtime": loadtime}})


def test_an_unknown_adapter_is_a_404_naming_the_models_adapters() -> None:
    model = _with_adapters()
    assert check_adapter(model, "sql") == "sql"
    with pytest.raises(UnknownModel) as caught:
        check_adapter(model, "tax", param="model")
    assert caught.value.status == 404
    assert caught.value.param == "model"
    assert "org/m:lora has no LoRA adapter 'tax' (its adapters: sql, java)" in caught.value.message
    with pytest.raises(UnknownModel, match="declares no LoRA adapters"):
        check_adapter(served(GENERATE), "sql")


def test_metrics_labels_are_declared_adapters_or_none() -> None:
    model = _with_adapters()
    assert adapter_label(model, "sql") == "sql"
    assert adapter_label(model, "anything-a-client-sends") == "none"
    assert adapter_label(model, None) == "none"
