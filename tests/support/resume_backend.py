"""A deterministic generating backend for the tests of stream resumption (DESIGN.md,
"Resuming a stream"), in the test's event loop on a real socket.

Each next word is a function of the words before it (the prompt's, or every message's
for chat, then the words generated so far: :func:`generate`), so a continuation asked
with the prompt plus the text already sent (or the messages plus the partial assistant
message, ``continue_final_message: true``) produces exactly what an uninterrupted run
would have. It answers a worker's polls (for the slot router) and a pod router's (for the
gateway) alike: one ready slot serving :data:`MODEL`. It serves ``/v1/completions``,
``/v1/chat/completions`` and SIE's ``/v1/generate/<model>`` (a JSON or MessagePack body,
the stream as the worker translates it: ``{request_id, seq, text_delta, done}`` events).

Misbehaviour is scripted per stream, shared by every backend of a test (:class:`Script`):
the streams take the script's faults in the order they start, whichever backend they
reach, so a test says "the first stream breaks after 3 events" without knowing where the
hop sends it. Faults: ``("cut", k)`` closes the connection after k events (no end of
body; k = 0: after the head), ``("error", k)`` ends the body cleanly after k events with
the worker's error event (what a worker sends when its engine dies), ``("refuse",
"NOT_LEADER" | "INFERENCE_ERROR")`` answers the worker's refusal before any event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgpack

__all__ = ["MODEL", "Fault", "ResumeBackend", "Script", "generate", "serving"]

MODEL = "m"
_VOCAB = (
    "amber",
    "birch",
    "cedar",
    "delta",
    "ember",
    "fjord",
    "grove",
    "heron",
    "iris",
    "jade",
    "kelp",
    "lumen",
)
_DONE = b"data: [DONE]\n\n"
_REFUSALS = {"NOT_LEADER": (409, "not_leader"), "INFERENCE_ERROR": (502, "engine_unavailable")}

Fault = tuple[str, Any]


def generate(context: list[str], n: int) -> list[str]:
    """The n tokens that follow ``context`` (words): each ``" word"``, the word a function
    of the three words before it."""
    words = list(context)
    tokens = []
    for _ in range(n):
        word = _VOCAB[zlib.crc32(" ".join(words[-3:]).encode()) % len(_VOCAB)]
        words.append(word)
        tokens.append(" " + word)
    return tokens


@dataclass
class Script:
    """The faults of the streams of one test, in the order the streams start, and what
    every backend was asked (``(backend, body, headers)`` per generation request)."""

    faults: list[Fault | None] = field(default_factory=list)
    served: list[tuple[str, dict[str, Any], dict[str, str]]] = field(default_factory=list)

    def next_fault(self) -> Fault | None:
        return self.faults.pop(0) if self.faults else None


class ResumeBackend:
    """One backend named ``name`` (see the module docstring)."""

    def __init__(self, name: str, script: Script, created: int) -> None:
        self.name, self.script, self.created = name, script, created
        self.port = 0
        self._count = 0
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._one(reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.transport.abort()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        fields = (line.partition(":") for line in lines[1:])
        headers = {k.strip().lower(): v.strip() for k, _, v in fields}
        body = await reader.readexactly(int(headers.get("content-length") or 0))
        path = target.split("?", 1)[0]
        if method == "GET" and path in _POLLS:
            _send_json(writer, 200, _POLLS[path])
            return True
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            request = json.loads(body)
            self.script.served.append((self.name, request, headers))
            kind = "chat" if path.endswith("chat/completions") else "completions"
            return await self._generate(writer, request, kind)
        if method == "POST" and path.startswith("/v1/generate/"):
            packed = "msgpack" in headers.get("content-type", "")
            request = msgpack.unpackb(body) if packed else json.loads(body)
            self.script.served.append((self.name, request, headers))
            return await self._generate(writer, {**request, "model": path[13:]}, "generate")
        _send_json(writer, 404, {"error": {"code": "not_found", "message": path}})
        return True

    async def _generate(
        self, writer: asyncio.StreamWriter, request: dict[str, Any], kind: str
    ) -> bool:
        fault = self.script.next_fault()
        if fault is not None and fault[0] == "drop":  # gone before answering anything
            return False
        if fault is not None and fault[0] == "refuse":
            status, code = _REFUSALS[fault[1]]
            error = {"error": {"code": code, "message": f"{self.name} refuses"}}
            _send_json(writer, status, error, [("X-SIE-Error-Code", fault[1])])
            return True
        self._count += 1
        reply = _Reply(f"{self.name}-{self._count}", self.created, request, kind)
        if request.get("stream") is not True:
            if fault is not None:  # a non-streamed answer cut halfway
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n{")
                await writer.drain()
                return False
            _send_json(writer, 200, reply.whole())
            return True
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        index = 0
        async for event in reply.events():
            if fault is not None and index == fault[1]:
                if fault[0] == "error":
                    error = {"error": {"code": "engine_unavailable", "message": "engine exited"}}
                    writer.write(_chunk(b"data: " + json.dumps(error).encode() + b"\n\n"))
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
                    return True
                await writer.drain()
                return False  # cut: the connection closes without the body's end
            writer.write(_chunk(event))
            await writer.drain()
            index += 1
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


class _Reply:
    """One generation: its identity, its context and its tokens."""

    def __init__(self, answer_id: str, created: int, request: dict[str, Any], kind: str):
        self.chat, self.sie, self.request = kind == "chat", kind == "generate", request
        self.identity = {"id": answer_id, "created": created, "model": request["model"]}
        if self.sie:
            self.identity = {"request_id": answer_id}
            context = request["prompt"].split()
            limit = request["max_new_tokens"]
        elif self.chat:
            messages = request["messages"]
            if messages[-1]["role"] == "assistant" and not (
                request.get("continue_final_message") is True
                and request.get("add_generation_prompt") is False
            ):
                raise AssertionError("a partial assistant message without continuation flags")
            context = [w for m in messages for w in str(m["content"]).split()]
            limit = request.get("max_completion_tokens") or request.get("max_tokens")
        else:
            prompt = request["prompt"]
            context = (prompt[0] if isinstance(prompt, list) else prompt).split()
            limit = request.get("max_tokens")
        self.tokens = generate(context, 16 if limit is None else limit)
        total = len(self.tokens)
        self.usage = {
            "prompt_tokens": len(context),
            "completion_tokens": total,
            "total_tokens": len(context) + total,
        }

    def _choice(self, text: str | None, finish: str | None = None) -> dict[str, Any]:
        if self.chat:
            delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        document = {**self.identity, "object": kind, "choices": choices, **extra}
        return b"data: " + json.dumps(document).encode() + b"\n\n"

    async def events(self) -> AsyncIterator[bytes]:
        if self.sie:  # SIE's generate stream, as the worker translates it
            for seq, token in enumerate(self.tokens):
                yield self._sie(seq, text_delta=token, done=False)
            final = {"finish_reason": "length", "usage": self.usage, "ttft_ms": 1.0}
            yield self._sie(len(self.tokens), text_delta="", done=True, **final)
            yield _DONE
            return
        if self.chat:
            role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
            yield self._event([{**role, "logprobs": None, "finish_reason": None}])
        for token in self.tokens:
            yield self._event([self._choice(token)])
        yield self._event([self._choice(None, "length")])
        options = self.request.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            yield self._event([], usage=self.usage)
        yield _DONE

    def _sie(self, seq: int, **fields: Any) -> bytes:
        document = {**self.identity, "seq": seq, **fields}
        return b"data: " + json.dumps(document).encode() + b"\n\n"

    def whole(self) -> dict[str, Any]:
        text = "".join(self.tokens)
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}}
            if self.chat
            else {"index": 0, "text": text}
        )
        return {**self.identity, "choices": [{**choice, "finish_reason": "length"}]}


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _send_json(
    writer: asyncio.StreamWriter,
    status: int,
    document: object,
    headers: list[tuple[str, str]] | None = None,
) -> None:
    body = json.dumps(document).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers or [])
    writer.write(
        f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{extra}"
        f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )


_ENTRY = {
    "id": MODEL,
    "object": "model",
    "state": "ready",
    "devices": ["cuda:0"],
    "width": 1,
    "pinned": False,
    "error": None,
}
_POLLS: dict[str, object] = {
    "/readyz": {"status": "ready", "slots": [{"slot": 0, "up": True, "ready": True}]},
    "/v1/models": {"object": "list", "data": [_ENTRY]},
    "/v1/devices": {"devices": [{"device": "cuda:0", "slot": 0, "model": MODEL}]},
}


@contextlib.asynccontextmanager
async def serving(script: Script, count: int) -> AsyncIterator[list[ResumeBackend]]:
    """``count`` backends (``b0``, ``b1``...) sharing ``script``, listening."""
    backends = [ResumeBackend(f"b{i}", script, 1000 + i) for i in range(count)]
    try:
        for backend in backends:
            await backend.start()
        yield backends
    finally:
        for backend in backends:
            await backend.close()
