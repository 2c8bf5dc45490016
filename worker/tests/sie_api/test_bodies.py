"""Whatever body a client sends, SIE's routes answer a request or a 400 naming the field:
never another exception (which would be a 500)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.served_models import served

from sie_worker.errors import InvalidRequest
from sie_worker.sie_api.encode import encode_call, parse_encode
from sie_worker.sie_api.generate import generate_call, parse_generate
from sie_worker.sie_api.score import parse_score, score_call

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=4)
)
_KEYS = st.sampled_from(
    ["items", "params", "text", "id", "output_types", "output_dtype", "options", "is_query",
     "instruction", "profile", "query", "prompt", "max_new_tokens", "stream", "stop", "grammar",
     "regex", "json_schema", "temperature", "seed", "logit_bias", "lora_adapter", "x"]
)  # fmt: skip
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=12,
)
_BODIES = st.dictionaries(_KEYS, _VALUES, max_size=5) | _VALUES


def _refused_or_served(build: Any) -> None:
    refused: InvalidRequest | None = None
    try:
        build()
    except InvalidRequest as error:
        refused = error
    if refused is not None:
        assert refused.status == 400
        assert refused.message


@given(_BODIES)
def test_any_encode_body_is_served_or_refused(body: Any) -> None:
    model = served({"encode": {}})
    _refused_or_served(
        lambda: encode_call(parse_encode(body), model, engine="sglang", as_json=False, headers={})
    )


@given(_BODIES)
def test_any_score_body_is_served_or_refused(body: Any) -> None:
    model = served({"score": {}})
    _refused_or_served(
        lambda: score_call(
            parse_score(body), model, engine="transformers", as_json=True, headers={}
        )
    )


@given(_BODIES)
def test_any_generate_body_is_served_or_refused(body: Any) -> None:
    model = served({"generate": {"max_output_tokens": 8}})
    _refused_or_served(
        lambda: generate_call(parse_generate(body), model, request_id="r", started=0.0)
    )


@pytest.mark.parametrize("parse", [parse_encode, parse_score, parse_generate])
def test_a_body_that_is_not_an_object_is_refused(parse: Any) -> None:
    for body in (None, [], "x", 3, b"x"):
        with pytest.raises(InvalidRequest):
            parse(body)
