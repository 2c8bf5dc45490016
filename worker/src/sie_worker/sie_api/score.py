"""``POST /v1/score/{model}``: relevance of each item to a query, ranked.

Request: ``{query: {id?, text}, items: [{id?, text}], instruction?, options?: {profile?,
...}}``. Answer: ``{model, query_id, scores: [{item_id, score, rank}], usage}``, best first,
ranks 0..n-1; an item without an id is ``item-<index>``.

A model whose config declares ``tasks.score`` (a cross-encoder) is asked through the
engine's ``/v1/rerank`` (SGLang's shape: ``{query, documents}`` -> ``[{index, score}]``),
the query read as ``f"{instruction} {query}"`` as SIE does; a bi-encoder (``tasks.encode``)
embeds the query (as a query, with the instruction) and the items (as documents) in one
``/v1/embeddings`` request, and each score is the cosine of the two vectors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from sie_worker.config.model import ServedModel
from sie_worker.engines.family import EngineFamily
from sie_worker.errors import EngineUnavailable, InvalidRequest
from sie_worker.sie_api.call import EngineCall
from sie_worker.sie_api.codec import render
from sie_worker.sie_api.encode import engine_texts, text_options, vectors_of
from sie_worker.sie_api.fields import object_at, optional_object, optional_str, refuse_unknown
from sie_worker.sie_api.items import Item, parse_item, parse_items
from sie_worker.sie_api.vectors import cosine, floats, read_embeddings

__all__ = ["ScoreRequest", "parse_score", "ranked", "score_call"]


@dataclass(frozen=True)
class ScoreRequest:
    query: Item
    items: tuple[Item, ...]
    instruction: str | None
    profile: str | None
    options: Mapping[str, Any]


def parse_score(body: object) -> ScoreRequest:
    data = object_at(body, "body")
    refuse_unknown(data, frozenset({"query", "items", "instruction", "options"}), "")
    if data.get("query") is None:
        raise InvalidRequest("query: required: the query item ({id?, text})", param="query")
    options = optional_object(data, "options", "options")
    return ScoreRequest(
        query=parse_item(data["query"], "query"),
        items=parse_items(data.get("items"), "items"),
        instruction=optional_str(data, "instruction", "instruction"),
        profile=optional_str(options, "profile", "options.profile"),
        options=options,
    )


def ranked(scores: Sequence[float], items: Sequence[Item]) -> list[dict[str, Any]]:
    """SIE's ``scores``: best first (ties in request order), ranks 0..n-1."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return [
        {
            "item_id": items[i].id if items[i].id is not None else f"item-{i}",
            "score": scores[i],
            "rank": rank,
        }
        for rank, i in enumerate(order)
    ]


def score_call(
    request: ScoreRequest,
    served: ServedModel,
    *,
    family: EngineFamily,
    as_json: bool,
    headers: dict[str, str],
) -> EngineCall:
    tasks = served.config.tasks
    count = len(request.items)

    def reply(model: str, scores: Sequence[float], tokens: int) -> Response:
        if not all(math.isfinite(s) for s in scores):
            raise EngineUnavailable(f"{model}: engine answered a score that is not a number")
        body = {
            "model": model,
            "query_id": request.query.id,
            "scores": ranked(scores, request.items),
            "usage": {"input_tokens": tokens},
        }
        return render(body, as_json=as_json, headers=headers)

    merged = text_options(served, request.options)
    instruction = request.instruction
    if instruction is None and isinstance(merged.get("instruction"), str):
        instruction = merged["instruction"]
    if "score" in tasks:
        query = f"{instruction} {request.query.text}" if instruction else request.query.text
        payload = {
            "query": query,
            "documents": [item.text for item in request.items],
            "return_documents": False,
        }

        def answer_rerank(engine_answer: Any, model: str) -> Response:
            scores, tokens = _rerank_scores(engine_answer, count, model)
            return reply(model, scores, tokens)

        return EngineCall("/v1/rerank", payload, answer=answer_rerank)
    if "encode" in tasks:
        texts = [request.query.text, *(item.text for item in request.items)]
        payload = engine_texts(
            texts, [True] + [False] * count, [instruction] + [None] * count, merged, family=family
        )

        def answer_cosine(engine_answer: Any, model: str) -> Response:
            vectors, tokens = vectors_of(engine_answer, count + 1, model)
            query, *others = (floats(v) for v in vectors)
            if any(len(v) != len(query) for v in others):
                raise EngineUnavailable(f"{model}: engine answered vectors of different sizes")
            return reply(model, [cosine(query, v) for v in others], tokens)

        return EngineCall("/v1/embeddings", payload, answer=answer_cosine, decode=read_embeddings)
    raise InvalidRequest(
        f"{served.id} does not serve /v1/score: its config declares tasks {sorted(tasks)}; "
        "scoring needs tasks.score (a cross-encoder) or tasks.encode (cosine of embeddings)"
    )


def _rerank_scores(engine_answer: Any, count: int, model: str) -> tuple[list[float], int]:
    """Scores in request order from ``[{index, score}]`` (SGLang) or ``{results: [{index,
    relevance_score}]}``, and the tokens read."""
    results = engine_answer.get("results") if isinstance(engine_answer, dict) else engine_answer
    scores: list[float | None] = [None] * count
    tokens = 0
    for entry in results if isinstance(results, list) else []:
        if not isinstance(entry, dict):
            continue
        index = entry.get("index")
        value = entry.get("score", entry.get("relevance_score"))
        if (
            isinstance(index, int)
            and 0 <= index < count
            and isinstance(value, int | float)
            and not isinstance(value, bool)
        ):
            scores[index] = float(value)
        meta = entry.get("meta_info")
        used = meta.get("prompt_tokens") if isinstance(meta, dict) else None
        tokens += used if isinstance(used, int) and not isinstance(used, bool) else 0
    if any(s is None for s in scores):
        raise EngineUnavailable(f"{model}: engine did not score every one of the {count} items")
    return [s for s in scores if s is not None], tokens
