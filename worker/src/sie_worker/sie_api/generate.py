"""``POST /v1/generate/{model}``: SIE's generate as one OpenAI ``/v1/completions`` request.

Request: ``{prompt, max_new_tokens, temperature?, top_p?, stop?, seed?, frequency_penalty?,
presence_penalty?, logit_bias?, grammar?: {json_schema | regex | ebnf}, lora_adapter?,
stream?, options?: {profile?, ...}, routing_key?, prompt_cache_key?, safety_identifier?}``
(the last three steer routing and are not sent to the engine). Answer: ``{model, text,
finish_reason, usage: {prompt_tokens, completion_tokens, total_tokens}}``.

With ``stream: true`` the engine's completion chunks become SIE's events, one ``data:``
line each: ``{request_id, seq, text_delta, done: false}``, then ``{..., text_delta: "",
done: true, finish_reason, usage, ttft_ms}``, then ``data: [DONE]``. An error event passes
through as it is (``{"error": {"code", "message"}}``, which sie-sdk reads).

A grammar becomes SGLang's ``regex`` / ``ebnf`` / ``json_schema`` field, so a model with a
``grammar_profile`` serves it from that profile, as for ``/v1/completions``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse, Response

from sie_worker.config.lora_choice import check_adapter
from sie_worker.config.model import ServedModel
from sie_worker.errors import EngineUnavailable
from sie_worker.sie_api.call import EngineCall, EventTranslator, check_serves
from sie_worker.sie_api.fields import (
    bad,
    object_at,
    optional_bool,
    optional_int,
    optional_number,
    optional_object,
    optional_str,
    refuse_unknown,
)

__all__ = ["GenerateRequest", "StreamChunks", "generate_call", "lora_path", "parse_generate"]

_FIELDS = frozenset(
    {
        "prompt", "max_new_tokens", "images", "temperature", "top_p", "stop", "stream",
        "frequency_penalty", "presence_penalty", "grammar", "seed", "logit_bias", "logprobs",
        "top_logprobs", "routing_key", "prompt_cache_key", "safety_identifier", "options",
        "lora_adapter",
    }
)  # fmt: skip
_GRAMMARS = ("json_schema", "regex", "ebnf")
_DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class GenerateRequest:
    prompt: str
    max_new_tokens: int
    sampling: Mapping[str, Any]  # OpenAI completion fields, as sent
    grammar: tuple[str, Any] | None  # (kind, value)
    lora_adapter: str | None
    stream: bool
    profile: str | None


def parse_generate(body: object) -> GenerateRequest:
    data = object_at(body, "body")
    refuse_unknown(data, _FIELDS, "")
    prompt = optional_str(data, "prompt", "prompt")
    if not prompt:
        raise bad("prompt", "required: a nonempty string")
    max_new_tokens = optional_int(data, "max_new_tokens", "max_new_tokens", minimum=1)
    if max_new_tokens is None:
        raise bad("max_new_tokens", "required: the most tokens to generate (an integer >= 1)")
    if data.get("images"):
        raise bad("images", "the models served here read text only; send a text prompt")
    if data.get("logprobs") or data.get("top_logprobs"):
        raise bad("logprobs", "log probabilities are not served for generate; omit them")
    for key in ("routing_key", "prompt_cache_key", "safety_identifier"):
        optional_str(data, key, key)
    sampling: dict[str, Any] = {}
    for key in ("temperature", "top_p", "frequency_penalty", "presence_penalty"):
        value = optional_number(data, key, key)
        if value is not None:
            sampling[key] = value
    seed = optional_int(data, "seed", "seed")
    if seed is not None:
        sampling["seed"] = seed
    stop = data.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise bad("stop", "a nonempty string or a list of nonempty strings")
        sampling["stop"] = stops
    if data.get("logit_bias") is not None:
        bias = object_at(data["logit_bias"], "logit_bias")
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in bias.values()):
            raise bad("logit_bias", "a map of token id to a number")
        sampling["logit_bias"] = dict(bias)
    options = optional_object(data, "options", "options")
    return GenerateRequest(
        prompt=prompt,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        grammar=_grammar(data.get("grammar")),
        lora_adapter=optional_str(data, "lora_adapter", "lora_adapter") or None,
        stream=bool(optional_bool(data, "stream", "stream")),
        profile=optional_str(options, "profile", "options.profile"),
    )


def generate_call(
    request: GenerateRequest, served: ServedModel, *, request_id: str, started: float
) -> EngineCall:
    check_serves(served, "generate", "/v1/generate")
    generate = served.config.tasks["generate"]
    cap = generate.get("max_output_tokens")
    if isinstance(cap, int) and request.max_new_tokens > cap:
        raise bad(
            "max_new_tokens",
            f"{request.max_new_tokens} is above {served.id}'s max_output_tokens of {cap}",
        )
    payload: dict[str, Any] = {
        "prompt": request.prompt,
        "max_tokens": request.max_new_tokens,
        **request.sampling,
    }
    if request.grammar is not None:
        kind, value = request.grammar
        declared = (generate.get("capabilities") or {}).get("grammar")
        if isinstance(declared, list) and kind not in declared:
            raise bad(
                f"grammar.{kind}",
                f"{served.id} declares grammar support for {declared or 'none'}, not {kind}",
            )
        payload[kind] = json.dumps(value) if kind == "json_schema" else value
    if request.lora_adapter is not None:
        payload["lora_path"] = lora_path(served, request.lora_adapter)
    if request.stream:
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}

        def events(model: str) -> EventTranslator:
            return StreamChunks(request_id, started)

        return EngineCall("/v1/completions", payload, stream=True, events=events)
    return EngineCall("/v1/completions", payload, answer=_answer)


class StreamChunks:
    """Translates one stream of OpenAI completion chunks into SIE's generate events."""

    def __init__(self, request_id: str, started: float) -> None:
        self._request_id = request_id
        self._started = started
        self._seq = 0
        self._ttft_ms: float | None = None
        self._finish: str | None = None
        self._usage: dict[str, int] | None = None
        self._deltas = 0

    def __call__(self, events: bytes) -> bytes:
        out: list[bytes] = []
        for event in events.split(b"\n\n"):
            data = None
            for line in event.split(b"\n"):
                line = line.rstrip(b"\r")
                if line.startswith(b"data:"):
                    data = line[5:].strip()
                elif line.startswith(b":"):
                    out.append(line + b"\n\n")  # keep-alive comments go on
            if data is None:
                continue
            if data == b"[DONE]":
                out.append(self._event({"text_delta": "", "done": True, **self._final()}))
                out.append(_DONE)
                continue
            try:
                chunk = json.loads(data)
            except ValueError:
                raise EngineUnavailable("engine sent an event whose data is not JSON") from None
            if isinstance(chunk, dict) and "error" in chunk:
                out.append(b"data: " + data + b"\n\n")
                continue
            out += self._chunk(chunk)
        return b"".join(out)

    def _chunk(self, chunk: object) -> list[bytes]:
        if not isinstance(chunk, dict):
            return []
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = _usage(usage)
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict):
            return []
        if isinstance(choice.get("finish_reason"), str):
            self._finish = choice["finish_reason"]
        text = choice.get("text")
        if not isinstance(text, str) or not text:
            return []
        if self._ttft_ms is None:
            self._ttft_ms = round((time.monotonic() - self._started) * 1000, 3)
        self._deltas += 1
        return [self._event({"text_delta": text, "done": False})]

    def _final(self) -> dict[str, Any]:
        usage = self._usage or {
            "prompt_tokens": 0,
            "completion_tokens": self._deltas,
            "total_tokens": self._deltas,
        }
        final: dict[str, Any] = {"finish_reason": self._finish or "stop", "usage": usage}
        if self._ttft_ms is not None:
            final["ttft_ms"] = self._ttft_ms
        return final

    def _event(self, fields: dict[str, Any]) -> bytes:
        payload = {"request_id": self._request_id, "seq": self._seq, **fields}
        self._seq += 1
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _answer(engine_answer: Any, model: str) -> Response:
    choices = engine_answer.get("choices") if isinstance(engine_answer, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict) or not isinstance(choice.get("text"), str):
        raise EngineUnavailable(f"{model}: engine answered a completion without text")
    usage = engine_answer.get("usage")
    body = {
        "model": model,
        "text": choice["text"],
        "finish_reason": choice.get("finish_reason") or "stop",
        "usage": _usage(usage if isinstance(usage, dict) else {}),
    }
    return JSONResponse(body)


def _usage(usage: Mapping[str, Any]) -> dict[str, int]:
    counts = {
        key: value if isinstance(value, int) and not isinstance(value, bool) else 0
        for key in ("prompt_tokens", "completion_tokens")
        for value in [usage.get(key)]
    }
    counts["total_tokens"] = counts["prompt_tokens"] + counts["completion_tokens"]
    return counts


def _grammar(value: object) -> tuple[str, Any] | None:
    if value is None:
        return None
    grammar = object_at(value, "grammar")
    refuse_unknown(grammar, frozenset({*_GRAMMARS, "label", "strict"}), "grammar")
    kinds = [k for k in _GRAMMARS if grammar.get(k) is not None]
    if len(kinds) != 1:
        raise bad("grammar", "exactly one of json_schema, regex, ebnf")
    kind = kinds[0]
    if kind == "json_schema":
        object_at(grammar[kind], "grammar.json_schema")
    elif not isinstance(grammar[kind], str) or not grammar[kind]:
        raise bad(f"grammar.{kind}", "a nonempty string")
    return kind, grammar[kind]


def lora_path(served: ServedModel, name: str) -> str:
    """SGLang's ``lora_path`` for sie-sdk's ``lora_adapter``: one of the profile's
    ``lora_paths`` names, else :class:`~sie_worker.errors.UnknownModel` naming those it has."""
    return check_adapter(served, name, param="lora_adapter")
