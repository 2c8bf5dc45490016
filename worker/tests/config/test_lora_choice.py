"""Which LoRA adapter a request names: SGLang's ``model:adapter`` (a served id as written
first), its ``lora_path`` field, sie-sdk's ``lora_adapter``; unknown adapters refused."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.served_models import served

from sie_worker.config.lora_choice import (
    adapter_label,
    check_adapter,
    request_adapter,
    split_model,
)
from sie_worker.errors import InvalidRequest, UnknownModel

IDS = ("org/m", "org/m:fast", "s3://bucket/m")
GENERATE = {"generate": {}}


def test_a_served_id_as_written_is_never_split() -> None:
    assert split_model("org/m:fast", IDS) is None  # a profile, not an adapter
    assert split_model("org/m", IDS) is None
    assert split_model("s3://bucket/m", IDS) is None


def test_the_longest_served_id_before_a_colon_is_the_base() -> None:
    assert split_model("org/m:sql", IDS) == ("org/m", "sql")
    assert split_model("org/m:fast:sql", IDS) == ("org/m:fast", "sql")
    assert split_model("s3://bucket/m:sql", IDS) == ("s3://bucket/m", "sql")


def test_no_base_or_no_adapter_is_no_split() -> None:
    assert split_model("other:sql", IDS) is None
    assert split_model("org/m:", IDS) is None
    assert split_model("org/m: ", IDS) is None


@given(
    base=st.sampled_from(IDS),
    adapter=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,20}", fullmatch=True),
)
def test_base_colon_adapter_always_splits_back(base: str, adapter: str) -> None:
    named = f"{base}:{adapter}"
    if named in IDS:
        return
    split = split_model(named, IDS)
    assert split is not None
    assert f"{split[0]}:{split[1]}" == named
    assert split[0] in IDS


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
