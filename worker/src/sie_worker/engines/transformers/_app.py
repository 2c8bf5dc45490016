"""The engine's HTTP surface: Starlette routes over one loaded model.

Endpoints only raise :class:`EngineError`; one handler renders it. Model work goes through
the :class:`ModelThread`, so the event loop keeps answering ``/health`` during long calls.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from sie_worker.engines.transformers import _responses as shapes
from sie_worker.engines.transformers._errors import EngineError
from sie_worker.engines.transformers._model_thread import ModelThread
from sie_worker.engines.transformers._requests import (
    EmbeddingRequest,
    Sampling,
    parse_chat,
    parse_completion,
    parse_embedding,
    parse_rerank,
    requested_adapter,
)
from sie_worker.engines.transformers._state import EngineState
from sie_worker.engines.transformers._stream import collect, stream_text
from sie_worker.sie_api.texts import TextOptions, format_text

if TYPE_CHECKING:
    from sie_worker.engines.transformers._embed import Embedder
    from sie_worker.engines.transformers._generate import Generator, Prepared
    from sie_worker.engines.transformers._score import Scorer

__all__ = ["create_app"]

_log = logging.getLogger("sie_worker.engines")
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_TASK_OF_PATH = {
    "/v1/embeddings": "encode",
    "/v1/completions": "generate",
    "/v1/chat/completions": "generate",
    "/v1/rerank": "score",
}
_SERVES = {"encode": "embeddings", "generate": "completions", "score": "rerank"}

# Each chunk builder takes the text piece (or None for the final chunk) and the finish reason.
_ChunkFn = Callable[[str | None, str | None], dict[str, Any]]


def create_app(state: EngineState, thread: ModelThread) -> Starlette:
    api = _Api(state, thread)
    return Starlette(
        routes=[
            Route("/health", api.health, methods=["GET"]),
            Route("/v1/models", api.models, methods=["GET"]),
            Route("/v1/embeddings", api.embeddings, methods=["POST"]),
            Route("/v1/completions", api.completions, methods=["POST"]),
            Route("/v1/chat/completions", api.chat, methods=["POST"]),
            Route("/v1/rerank", api.rerank, methods=["POST"]),
        ],
        exception_handlers={
            EngineError: _engine_error,
            HTTPException: _http_error,
            Exception: _unexpected_error,
        },
    )


class _Api:
    def __init__(self, state: EngineState, thread: ModelThread) -> None:
        self._state = state
        self._thread = thread
        self._name = state.options.served_model_name

    async def health(self, request: Request) -> Response:
        status = 200 if self._state.status == "ready" else 503
        body = {"status": "ok" if status == 200 else self._state.status, "model": self._name}
        return JSONResponse({**body, **self._state.describe()}, status_code=status)

    async def models(self, request: Request) -> Response:
        entry = {
            "id": self._name,
            "object": "model",
            "created": self._state.created,
            "owned_by": "sie-worker",
            **self._state.describe(),
        }
        return JSONResponse({"object": "list", "data": [entry]})

    async def embeddings(self, request: Request) -> Response:
        self._check_task(request)
        req = parse_embedding(await _json(request))
        embedder = self._embedder()
        if req.dimensions not in (None, embedder.dimensions):
            raise EngineError(
                f"dimensions: this model's embeddings have {embedder.dimensions} dimensions; "
                f"omit dimensions or send {embedder.dimensions}",
                param="dimensions",
            )
        texts, shaped = self._shaped(req, embedder.prompts)
        normalize = self._state.options.normalize if req.normalize is None else req.normalize
        vectors, tokens = await self._thread.call(
            embedder.embed, texts, normalize=normalize, shaped=shaped
        )
        items = [shapes.embedding_item(i, v, req.encoding_format) for i, v in enumerate(vectors)]
        return JSONResponse(shapes.embeddings_response(self._name, items, tokens))

    async def rerank(self, request: Request) -> Response:
        """SGLang's ``/v1/rerank``: ``[{index, score, meta_info: {prompt_tokens}}]``, best
        first."""
        self._check_task(request)
        req = parse_rerank(await _json(request))
        scorer = self._scorer()
        scores, tokens = await self._thread.call(scorer.score, req.query, req.documents)
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        results = [
            {"index": i, "score": scores[i], "meta_info": {"prompt_tokens": tokens[i]}}
            for i in order
        ]
        return JSONResponse(results)

    def _shaped(self, req: EmbeddingRequest, prompts: Mapping[str, str]) -> tuple[list[str], bool]:
        """The texts the model reads (SIE's rules, :mod:`sie_worker.sie_api.texts`), and
        whether they were shaped here. A request that asks nothing of it, for a model
        configured with no template, is read as it is (its default prompt included)."""
        flags = self._state.options
        options = TextOptions(
            query_template=req.text_options.get("query_template", flags.query_template),
            doc_template=req.text_options.get("doc_template", flags.doc_template),
            default_instruction=req.text_options.get(
                "default_instruction", flags.default_instruction
            ),
            prompts=prompts,
        )
        configured = options.query_template or options.doc_template or options.default_instruction
        if req.is_query is None and req.instructions is None and not configured:
            return list(req.texts), False
        count = len(req.texts)
        queries = req.is_query or (False,) * count
        instructions = req.instructions or (None,) * count
        texts = [
            format_text(text, is_query=bool(q), instruction=i, options=options)
            for text, q, i in zip(req.texts, queries, instructions, strict=True)
        ]
        return texts, True

    async def completions(self, request: Request) -> Response:
        self._check_task(request)
        body = await _json(request)
        req = parse_completion(body)
        adapter = requested_adapter(body, self._name)
        generator = self._generator()
        prepared = [
            await self._thread.call(
                generator.prepare, p, req.sampling, add_special_tokens=True, adapter=adapter
            )
            for p in req.prompts
        ]
        rid = shapes.new_id("cmpl")
        if req.stream:
            created = int(time.time())

            def chunk(text: str | None, reason: str | None) -> dict[str, Any]:
                return shapes.completion_chunk(
                    rid=rid,
                    model=self._name,
                    text=text or "",
                    finish_reason=reason,
                    created=created,
                )

            events = self._events(generator, prepared[0], req.sampling, chunk, req.include_usage)
            return StreamingResponse(events, media_type="text/event-stream", headers=_SSE_HEADERS)
        choices: list[tuple[str, str]] = []
        prompt_tokens = completion_tokens = 0
        for one in prepared:
            text, outcome = await collect(self._thread, generator, one, req.sampling)
            choices.append((text, outcome.finish_reason))
            prompt_tokens += outcome.prompt_tokens
            completion_tokens += outcome.completion_tokens
        body = shapes.completion_response(
            rid=rid,
            model=self._name,
            choices=choices,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )
        return JSONResponse(body)

    async def chat(self, request: Request) -> Response:
        self._check_task(request)
        body = await _json(request)
        req = parse_chat(body)
        adapter = requested_adapter(body, self._name)
        generator = self._generator()
        prompt, special = await self._thread.call(generator.chat_prompt, req.messages)
        prepared = await self._thread.call(
            generator.prepare, prompt, req.sampling, add_special_tokens=special, adapter=adapter
        )
        rid = shapes.new_id("chatcmpl")
        if req.stream:
            created = int(time.time())

            def chunk(text: str | None, reason: str | None) -> dict[str, Any]:
                # why: OpenAI's first chunk carries the role, the last an empty delta
                delta = {} if text is None else {"content": text}
                return shapes.chat_chunk(
                    rid=rid, model=self._name, delta=delta, finish_reason=reason, created=created
                )

            first = shapes.chat_chunk(
                rid=rid,
                model=self._name,
                delta={"role": "assistant", "content": ""},
                finish_reason=None,
                created=created,
            )
            events = self._events(
                generator, prepared, req.sampling, chunk, req.include_usage, first=first
            )
            return StreamingResponse(events, media_type="text/event-stream", headers=_SSE_HEADERS)
        text, outcome = await collect(self._thread, generator, prepared, req.sampling)
        body = shapes.chat_response(
            rid=rid,
            model=self._name,
            text=text,
            finish_reason=outcome.finish_reason,
            prompt_tokens=outcome.prompt_tokens,
            completion_tokens=outcome.completion_tokens,
        )
        return JSONResponse(body)

    async def _events(
        self,
        generator: Generator,
        prepared: Prepared,
        sampling: Sampling,
        chunk: _ChunkFn,
        include_usage: bool,
        *,
        first: dict[str, Any] | None = None,
    ) -> AsyncIterator[str]:
        if first is not None:
            yield shapes.sse(first)
        try:
            async for item in stream_text(self._thread, generator, prepared, sampling):
                if isinstance(item, str):
                    yield shapes.sse(chunk(item, None))
                    continue
                yield shapes.sse(chunk(None, item.finish_reason))
                if include_usage:
                    final = chunk(None, None)
                    final["choices"] = []
                    final["usage"] = shapes.usage(item.prompt_tokens, item.completion_tokens)
                    yield shapes.sse(final)
        except EngineError as exc:
            # why: the status line is already sent; the error travels as an event
            _log.error("stream failed: %s", exc.message)
            yield shapes.sse(exc.body())
        yield shapes.DONE

    def _check_task(self, request: Request) -> None:
        needed = _TASK_OF_PATH[request.url.path]
        task = self._state.options.task
        if needed != task:
            served = _SERVES[task]
            raise EngineError(
                f"model {self._name} serves task {task!r} ({served}); {request.url.path} needs "
                f"a model configured with tasks.{needed}",
                code="unsupported_task",
            )

    def _ready(self) -> None:
        if self._state.status == "loading":
            raise EngineError(
                f"model {self._name} is still loading; retry when /health answers 200",
                status=503,
                code="model_loading",
            )
        if self._state.status == "failed":
            raise EngineError(
                f"model {self._name} failed to load: {self._state.error}",
                status=503,
                code="load_failed",
            )

    def _embedder(self) -> Embedder:
        self._ready()
        assert self._state.embedder is not None  # ready with task encode
        return self._state.embedder

    def _scorer(self) -> Scorer:
        self._ready()
        assert self._state.scorer is not None  # ready with task score
        return self._state.scorer

    def _generator(self) -> Generator:
        self._ready()
        assert self._state.generator is not None  # ready with task generate
        return self._state.generator


async def _json(request: Request) -> object:
    raw = await request.body()
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise EngineError(f"request body: not valid JSON ({exc})") from exc


async def _engine_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, EngineError)
    return JSONResponse(exc.body(), status_code=exc.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = "not_found" if exc.status_code == 404 else "method_not_allowed"
    error = EngineError(
        f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code, code=code
    )
    return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    _log.error("unexpected error on %s", request.url.path, exc_info=exc)
    error = EngineError(f"internal error: {exc}", status=500, code="internal_error")
    return JSONResponse(error.body(), status_code=500)
