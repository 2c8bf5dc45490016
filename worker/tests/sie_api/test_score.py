"""SIE's score: a cross-encoder through /v1/rerank, a bi-encoder through cosine."""

from __future__ import annotations

import base64
import math
import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.served_models import served

from sie_worker.engines.registry import family_of
from sie_worker.errors import EngineUnavailable, InvalidRequest
from sie_worker.sie_api.items import Item
from sie_worker.sie_api.score import parse_score, ranked, score_call

BODY = {
    "query": {"id": "q", "text": "fox"},
    "items": [{"id": "a", "text": "one"}, {"text": "two"}, {"id": "c", "text": "three"}],
}


def _answer(call: Any, engine_answer: Any) -> dict[str, Any]:
    body: dict[str, Any] = msgpack.unpackb(call.answer(engine_answer, "org/m").body, raw=False)
    return body


def test_a_cross_encoder_is_asked_through_rerank_and_its_scores_ranked() -> None:
    request = parse_score({**BODY, "instruction": "Judge"})
    call = score_call(
        request, served({"score": {}}), family=family_of("transformers"), as_json=False, headers={}
    )
    assert call.path == "/v1/rerank"
    assert call.payload == {
        "query": "Judge fox",
        "documents": ["one", "two", "three"],
        "return_documents": False,
    }
    engine_answer = [
        {"index": 2, "score": 0.9, "meta_info": {"prompt_tokens": 4}},
        {"index": 0, "score": 0.5, "meta_info": {"prompt_tokens": 3}},
        {"index": 1, "score": 0.1, "meta_info": {"prompt_tokens": 3}},
    ]
    body = _answer(call, engine_answer)
    assert body["query_id"] == "q"
    assert body["usage"] == {"input_tokens": 10}
    assert body["scores"] == [
        {"item_id": "c", "score": 0.9, "rank": 0},
        {"item_id": "a", "score": 0.5, "rank": 1},
        {"item_id": "item-1", "score": 0.1, "rank": 2},
    ]


def test_cohere_style_rerank_results_are_read_too() -> None:
    call = score_call(
        parse_score(BODY),
        served({"score": {}}),
        family=family_of("sglang"),
        as_json=False,
        headers={},
    )
    results = {
        "results": [{"index": i, "relevance_score": s} for i, s in enumerate([0.1, 0.3, 0.2])]
    }
    assert [s["item_id"] for s in _answer(call, results)["scores"]] == ["item-1", "c", "a"]


def test_a_bi_encoder_scores_the_cosine_of_the_query_as_a_query_and_items_as_documents() -> None:
    call = score_call(
        parse_score({**BODY, "instruction": "Find"}), served({"encode": {}}),
        family=family_of("transformers"), as_json=False, headers={},
    )  # fmt: skip
    assert call.path == "/v1/embeddings"
    assert call.payload["input"] == ["fox", "one", "two", "three"]
    assert call.payload["is_query"] == [True, False, False, False]
    assert call.payload["instruction"] == ["Find", None, None, None]
    vectors = [(1.0, 0.0), (0.6, 0.8), (0.0, 1.0), (-1.0, 0.0)]
    data = [
        {"index": i, "embedding": base64.b64encode(struct.pack("<2f", *v)).decode()}
        for i, v in enumerate(vectors)
    ]
    scores = _answer(call, {"data": data})["scores"]
    assert [(s["item_id"], s["rank"]) for s in scores] == [("a", 0), ("item-1", 1), ("c", 2)]
    assert [s["score"] for s in scores] == pytest.approx([0.6, 0.0, -1.0])


def test_a_model_that_neither_scores_nor_encodes_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="does not serve /v1/score"):
        score_call(
            parse_score(BODY),
            served({"generate": {}}),
            family=family_of("sglang"),
            as_json=False,
            headers={},
        )


@pytest.mark.parametrize(
    "engine_answer",
    [
        [],
        [{"index": 0, "score": 0.1}],
        [{"index": i, "score": float("nan")} for i in range(3)],
        [{"index": i, "score": "high"} for i in range(3)],
        {"detail": "nope"},
    ],
)
def test_an_engine_that_does_not_score_every_item_with_a_number_fails_the_request(
    engine_answer: Any,
) -> None:
    call = score_call(
        parse_score(BODY),
        served({"score": {}}),
        family=family_of("sglang"),
        as_json=False,
        headers={},
    )
    with pytest.raises(EngineUnavailable):
        _answer(call, engine_answer)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"items": [{"text": "x"}]}, "query"),
        ({"query": "fox", "items": [{"text": "x"}]}, "query"),
        ({"query": {"text": "q"}}, "items"),
        ({"query": {"text": "q"}, "items": [{"text": 2}]}, "items[0].text"),
        ({"query": {"text": "q"}, "items": [{"text": "x"}], "instruction": 5}, "instruction"),
        (
            {"query": {"text": "q"}, "items": [{"text": "x"}], "options": {"profile": 1}},
            "options.profile",
        ),
        ({"query": {"text": "q"}, "items": [{"text": "x"}], "top_k": 1}, "top_k"),
    ],
)
def test_a_wrong_body_is_refused_naming_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_score(body)
    assert caught.value.param == field


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=30))
def test_ranks_run_from_0_best_first_ties_in_request_order(scores: list[float]) -> None:
    items = [Item(id=None, text="") for _ in scores]
    result = ranked(scores, items)
    assert [r["rank"] for r in result] == list(range(len(scores)))
    order = [int(r["item_id"].removeprefix("item-")) for r in result]
    assert order == sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    assert all(math.isfinite(r["score"]) for r in result)
