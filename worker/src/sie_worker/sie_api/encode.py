"""``POST /v1/encode/{model}``: SIE's encode as one OpenAI ``/v1/embeddings`` engine request.

Request: ``{items: [{id?, text}], params?: {output_types?, instruction?, output_dtype?,
options?: {is_query?, profile?, instruction?, normalize?, query_template?, doc_template?,
default_instruction?, lora?, lora_id?, ...}}}`` (``lora_id``, else ``lora``: one of the
profile's LoRA adapters, sent to the engine as ``lora_path``). Answer: ``{model, items:
[{id?, dense: {dims, dtype, values}}], usage: {input_tokens}}``, one item per request item,
in order.

The text a model reads follows SIE (:mod:`.texts`), from the request, then the profile's
``adapter_options.runtime``, then its ``loadtime``: the default engine forms it (it knows the
model's own prompts), so it gets ``is_query``, ``instruction`` and the text options beside
``input``; an SGLang engine gets the finished texts. Only dense vectors are produced here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from sie_worker.config.lora_choice import ADAPTER_FIELD, check_adapter
from sie_worker.config.model import ServedModel
from sie_worker.engines.family import EngineFamily
from sie_worker.errors import EngineUnavailable
from sie_worker.sie_api.call import EngineCall, check_serves
from sie_worker.sie_api.codec import render
from sie_worker.sie_api.fields import (
    bad,
    object_at,
    optional_bool,
    optional_object,
    optional_str,
    refuse_unknown,
)
from sie_worker.sie_api.items import Item, parse_items
from sie_worker.sie_api.texts import TEXT_OPTIONS, TextOptions, check_template, format_text
from sie_worker.sie_api.vectors import OUTPUT_DTYPES, convert, float32_bytes, read_embeddings

__all__ = [
    "EncodeRequest",
    "dense_dims",
    "encode_call",
    "engine_texts",
    "parse_encode",
    "text_options",
    "vectors_of",
]

_PARAMS = frozenset({"output_types", "instruction", "output_dtype", "options"})
_OUTPUT_TYPES = ("dense", "sparse", "multivector")


@dataclass(frozen=True)
class EncodeRequest:
    items: tuple[Item, ...]
    output_types: tuple[str, ...]
    output_dtype: str
    instruction: str | None
    is_query: bool
    profile: str | None
    options: Mapping[str, Any]  # params.options as sent
    lora: tuple[str, str] | None = None  # (adapter, the field that named it)


def parse_encode(body: object) -> EncodeRequest:
    data = object_at(body, "body")
    refuse_unknown(data, frozenset({"items", "params"}), "")
    items = parse_items(data.get("items"), "items")
    params = optional_object(data, "params", "params")
    refuse_unknown(params, _PARAMS, "params")
    options = optional_object(params, "options", "params.options")
    lora: tuple[str, str] | None = None
    for key in ("lora", "lora_id"):  # lora_id wins, as in SIE
        name = optional_str(options, key, f"params.options.{key}")
        if name:
            lora = (name, f"params.options.{key}")
    output_dtype = optional_str(params, "output_dtype", "params.output_dtype") or "float32"
    if output_dtype not in OUTPUT_DTYPES:
        raise bad("params.output_dtype", f"{output_dtype!r}: use one of {', '.join(OUTPUT_DTYPES)}")
    return EncodeRequest(
        items=items,
        output_types=_output_types(params.get("output_types")),
        output_dtype=output_dtype,
        instruction=optional_str(params, "instruction", "params.instruction"),
        is_query=bool(optional_bool(options, "is_query", "params.options.is_query")),
        profile=optional_str(options, "profile", "params.options.profile"),
        options=options,
        lora=lora,
    )


def dense_dims(served: ServedModel) -> int | None:
    """The dense width the config declares (SIE's ``dense.dim`` or our ``dimensions``)."""
    encode = served.config.tasks.get("encode") or {}
    dense = encode.get("dense")
    value = dense.get("dim") if isinstance(dense, Mapping) else encode.get("dimensions")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def engine_texts(
    texts: Sequence[str],
    is_query: Sequence[bool],
    instructions: Sequence[str | None],
    merged: Mapping[str, Any],
    *,
    family: EngineFamily,
) -> dict[str, Any]:
    """The ``/v1/embeddings`` payload for ``texts`` (one ``is_query`` and instruction each,
    ``merged`` from :func:`text_options`): for the default engine the texts with what shapes
    them, for SGLang the finished texts."""
    options = {k: merged[k] for k in TEXT_OPTIONS if isinstance(merged.get(k), str)}
    payload: dict[str, Any] = {"encoding_format": "base64"}
    if family.embedding_body() == "texts":
        payload["input"] = list(texts)
        payload["is_query"] = list(is_query)
        if any(i is not None for i in instructions):
            payload["instruction"] = list(instructions)
        payload.update(options)
        if isinstance(merged.get("normalize"), bool):
            payload["normalize"] = merged["normalize"]
        return payload
    shaping = TextOptions(**options)
    payload["input"] = [
        format_text(t, is_query=q, instruction=i, options=shaping)
        for t, q, i in zip(texts, is_query, instructions, strict=True)
    ]
    return payload


def encode_call(
    request: EncodeRequest,
    served: ServedModel,
    *,
    family: EngineFamily,
    as_json: bool,
    headers: dict[str, str],
) -> EngineCall:
    check_serves(served, "encode", "/v1/encode")
    for kind in request.output_types:
        if kind != "dense":
            raise bad(
                "params.output_types",
                f"{kind!r} is not an output of {served.id}: it produces dense vectors only",
            )
    merged = text_options(served, request.options)
    instruction = request.instruction
    if instruction is None:
        instruction = merged.get("instruction")
    count = len(request.items)
    payload = engine_texts(
        [item.text for item in request.items],
        [request.is_query] * count,
        [instruction] * count,
        merged,
        family=family,
    )
    if request.lora is not None:
        payload[ADAPTER_FIELD] = check_adapter(served, request.lora[0], param=request.lora[1])
    declared = dense_dims(served)

    def answer(engine_answer: Any, model: str) -> Response:
        vectors, tokens = vectors_of(engine_answer, len(request.items), model)
        items = []
        for item, data in zip(request.items, vectors, strict=True):
            values, dtype = convert(data, request.output_dtype)
            entry: dict[str, Any] = {} if item.id is None else {"id": item.id}
            entry["dense"] = {"dims": declared or len(data) // 4, "dtype": dtype, "values": values}
            items.append(entry)
        body = {"model": model, "items": items, "usage": {"input_tokens": tokens}}
        return render(body, as_json=as_json, headers=headers)

    return EngineCall("/v1/embeddings", payload, answer=answer, decode=read_embeddings)


def vectors_of(engine_answer: Any, count: int, model: str) -> tuple[list[bytes], int]:
    """The float32 vectors of an OpenAI embeddings answer, in input order, and its tokens."""
    data = engine_answer.get("data") if isinstance(engine_answer, dict) else None
    if not isinstance(data, list) or len(data) != count:
        got = len(data) if isinstance(data, list) else "no"
        raise EngineUnavailable(f"{model}: engine answered {got} embeddings for {count} inputs")
    ordered = sorted(data, key=lambda e: e.get("index", 0) if isinstance(e, dict) else 0)
    vectors = []
    for entry in ordered:
        vector = float32_bytes(entry.get("embedding") if isinstance(entry, dict) else None)
        if vector is None:
            raise EngineUnavailable(f"{model}: engine answered an embedding that is no vector")
        vectors.append(vector)
    usage = engine_answer.get("usage")
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return vectors, tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0


def _output_types(value: object) -> tuple[str, ...]:
    if value is None:
        return ("dense",)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise bad("params.output_types", "a nonempty list of dense, sparse, multivector")
    for kind in value:
        if kind not in _OUTPUT_TYPES and kind not in ("score", "json"):
            raise bad("params.output_types", f"{kind!r}: use dense, sparse or multivector")
    return tuple(value)


def text_options(served: ServedModel, options: Mapping[str, Any]) -> dict[str, Any]:
    """The text options in force (request options, else the profile's runtime, else its
    loadtime), each checked; a wrong one is refused naming where it was written."""
    profile = served.profile
    merged: dict[str, Any] = {}
    source: dict[str, str] = {}
    layers = (
        (profile.loadtime, f"profiles.{profile.loadtime_from}.adapter_options.loadtime"),
        (profile.runtime, f"profiles.{profile.name}.adapter_options.runtime"),
        (options, "params.options"),
    )
    for layer, where in layers:
        for key in (*TEXT_OPTIONS, "instruction", "normalize"):
            if layer.get(key) is not None:
                merged[key], source[key] = layer[key], f"{where}.{key}"
    for key in (*TEXT_OPTIONS, "instruction"):
        if key in merged and not isinstance(merged[key], str):
            raise bad(source[key], "must be a string")
    if "normalize" in merged and not isinstance(merged["normalize"], bool):
        raise bad(source["normalize"], "must be true or false")
    for key in ("query_template", "doc_template"):
        problem = check_template(merged[key]) if key in merged else None
        if problem is not None:
            raise bad(source[key], problem)
    return merged
