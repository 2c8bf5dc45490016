"""A stream survives its backend (DESIGN.md, "Resuming a stream"): through the slot router
and through the gateway, a streamed completion or chat whose backend breaks off at any
point (before the first event, after some, just before ``[DONE]``) reaches the client as
one 200 stream whose text is exactly an uninterrupted run's, with the deterministic
backends of ``tests/support/resume_backend`` (hops and backends in the test's event loop,
on real sockets). And where it must not resume (``X-SIE-Resume: off``, a pool's
``resume: false``, past ``resume_max``, no other backend, a non-streamed request), the
client gets the error as before.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgpack
import pytest
from sie_worker.gateway.pools import PoolSpec
from sie_worker.router.app import create_router_app
from sie_worker.router.settings import RouterSettings

from tests.support.asgi_server import serve
from tests.support.fake_pod import gateway_before
from tests.support.resume_backend import MODEL, ResumeBackend, Script, serving

pytestmark = pytest.mark.anyio

TOKENS = 8
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _body(kind: str, *, stream: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": TOKENS, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if kind == "chat":
        return body | {"messages": [{"role": "user", "content": "tell me of the river"}]}
    return body | {"prompt": "once upon a time"}


def _events_of(kind: str) -> int:
    """The events of an uninterrupted stream: (role), tokens, finish, usage, [DONE]."""
    return (kind == "chat") + TOKENS + 3


@asynccontextmanager
async def hop(
    name: str,
    backends: list[ResumeBackend],
    tmp_path: Path,
    *,
    resume_max: int = 2,
    pool_resume: bool = True,
) -> AsyncIterator[httpx.AsyncClient]:
    """The slot router with one slot per backend, or the gateway with one pool whose pods
    are the backends."""
    if name == "router":
        settings = RouterSettings(
            worker_ports=tuple(b.port for b in backends),
            poll_interval_s=0.05,
            poll_timeout_s=2.0,
            resume_max=resume_max,
        )
        async with (
            serve(create_router_app(settings)) as port,
            httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=20
            ) as client,
        ):
            yield client
        return
    spec = PoolSpec(
        pool="p",
        bundle="sglang",
        machine_profile="l4",
        gpu_type="l4",
        endpoints=tuple(b.url for b in backends),
        resume=pool_resume,
    )
    async with gateway_before([spec], tmp_path, resume_max=resume_max) as client:
        with anyio.fail_after(10):
            # Every pod known before the first request, so a resumption has one to go to.
            while len((await client.get("/health")).json()["workers"]) < len(backends):  # noqa: ASYNC110 - the gateway offers no event
                await anyio.sleep(0.05)
        yield client


@dataclass
class Answer:
    status: int
    documents: list[dict[str, Any]]
    done: int  # [DONE] events

    @property
    def text(self) -> str:
        pieces = []
        for document in self.documents:
            for choice in document.get("choices", []):
                delta = choice.get("delta")
                piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
                pieces.append(piece or "")
        return "".join(pieces)

    @property
    def usage(self) -> list[dict[str, Any]]:
        return [d["usage"] for d in self.documents if d.get("usage")]

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [d["error"] for d in self.documents if "error" in d]

    @property
    def roles(self) -> int:
        return sum(
            1
            for d in self.documents
            for c in d.get("choices", [])
            if isinstance(c.get("delta"), dict) and "role" in c["delta"]
        )


async def ask(
    client: httpx.AsyncClient, kind: str, headers: dict[str, str] | None = None
) -> Answer:
    with anyio.fail_after(20):
        async with client.stream("POST", PATHS[kind], json=_body(kind), headers=headers) as r:
            raw = b"".join([chunk async for chunk in r.aiter_bytes()])
    documents, done = [], 0
    for event in raw.split(b"\n\n"):
        payload = event.removeprefix(b"data: ").strip()
        if payload == b"[DONE]":
            done += 1
        elif payload:
            documents.append(json.loads(payload))
    return Answer(r.status_code, documents, done)


FAULTS = {
    "before the first event": lambda kind: ("cut", 0),
    "after 3 events": lambda kind: ("cut", 3),
    "with an error event after 3 events": lambda kind: ("error", 3),
    "after the finish, before the usage": lambda kind: ("cut", _events_of(kind) - 2),
    "just before [DONE]": lambda kind: ("cut", _events_of(kind) - 1),
}


@pytest.mark.parametrize("where", list(FAULTS))
@pytest.mark.parametrize("kind", ["completions", "chat"])
@pytest.mark.parametrize("name", ["router", "gateway"])
async def test_a_stream_broken_off_anywhere_reaches_the_client_as_one_uninterrupted_answer(
    name: str, kind: str, where: str, tmp_path: Path
) -> None:
    script = Script()
    async with serving(script, 2) as backends, hop(name, backends, tmp_path) as client:
        whole = await ask(client, kind)
        script.faults = [FAULTS[where](kind)]
        script.served.clear()
        resumed = await ask(client, kind)
    assert whole.status == resumed.status == 200
    assert not resumed.errors
    assert resumed.text == whole.text
    assert len(whole.text.split()) == TOKENS
    assert resumed.done == 1
    assert resumed.usage == whole.usage  # the prompt once, every completion token once
    assert resumed.roles == (kind == "chat")
    # One answer: the id, created and model of the first answer the client had events of.
    failed = script.served[0][0]
    first = script.served[1 if where == "before the first event" else 0][0]
    ids = {d["id"] for d in resumed.documents}
    assert len(ids) == 1
    assert ids.pop().startswith(f"{first}-")
    assert {d["created"] for d in resumed.documents} == {1000 + int(first[1:])}
    assert {d["model"] for d in resumed.documents} == {MODEL}
    # Never the failed backend (and none at all when only [DONE] was missing).
    assert failed not in {s[0] for s in script.served[1:]}
    assert len(script.served) == (1 if where == "just before [DONE]" else 2)


@pytest.mark.parametrize("name", ["router", "gateway"])
async def test_x_sie_resume_off_ends_a_broken_stream_with_the_error_event(
    name: str, tmp_path: Path
) -> None:
    script = Script([("cut", 3)])
    async with serving(script, 2) as backends, hop(name, backends, tmp_path) as client:
        answer = await ask(client, "completions", {"X-SIE-Resume": "off"})
    assert answer.status == 200
    assert [e["code"] for e in answer.errors] == ["engine_unavailable"]
    assert answer.done == 0
    assert len(script.served) == 1
    assert script.served[0][2]["x-sie-resume"] == "off"  # the next hop does not resume either


async def test_a_pool_with_resume_false_ends_a_broken_stream_with_the_error_event(
    tmp_path: Path,
) -> None:
    script = Script([("error", 2)])
    async with (
        serving(script, 2) as backends,
        hop("gateway", backends, tmp_path, pool_resume=False) as client,
    ):
        answer = await ask(client, "chat")
    assert [e["code"] for e in answer.errors] == ["engine_unavailable"]
    assert answer.done == 0
    assert len(script.served) == 1
    assert script.served[0][2]["x-sie-resume"] == "off"  # told to the pod's router too


@pytest.mark.parametrize("name", ["router", "gateway"])
async def test_a_stream_is_resumed_at_most_resume_max_times(name: str, tmp_path: Path) -> None:
    script = Script([("cut", 2), ("cut", 2), ("cut", 2)])
    async with serving(script, 3) as backends, hop(name, backends, tmp_path) as client:
        answer = await ask(client, "completions")
    assert [e["code"] for e in answer.errors] == ["engine_unavailable"]
    assert len(script.served) == 3  # the first try and two resumptions
    assert len({s[0] for s in script.served}) == 3
    # What the client got before the error is the text it would have had, thus far.
    assert answer.done == 0
    assert len(answer.text.split()) == 6


async def test_a_router_with_one_slot_ends_a_broken_stream_at_once_with_the_error_event(
    tmp_path: Path,
) -> None:
    script = Script([("cut", 3)])
    async with serving(script, 1) as backends, hop("router", backends, tmp_path) as client:
        answer = await ask(client, "chat")  # within ask's guard: it does not wait for a slot
    assert answer.status == 200
    assert [e["code"] for e in answer.errors] == ["engine_unavailable"]
    assert len(script.served) == 1


@pytest.mark.parametrize("code", ["NOT_LEADER", "INFERENCE_ERROR"])
@pytest.mark.parametrize("name", ["router", "gateway"])
async def test_a_streamed_request_refused_before_any_event_is_sent_to_another_backend(
    name: str, code: str, tmp_path: Path
) -> None:
    script = Script([("refuse", code)])
    async with serving(script, 2) as backends, hop(name, backends, tmp_path) as client:
        answer = await ask(client, "completions")
        metrics = (await client.get("/metrics")).text
    assert answer.status == 200
    assert not answer.errors
    assert answer.done == 1
    assert len(answer.text.split()) == TOKENS
    assert script.served[0][0] != script.served[1][0]
    assert script.served[0][1] == script.served[1][1]  # sent again as it came
    reason = {"NOT_LEADER": "not_leader", "INFERENCE_ERROR": "engine_failed"}[code]
    assert f'sie_{name}_resumes_total{{reason="{reason}"}} 1.0' in metrics


@pytest.mark.parametrize("name", ["router", "gateway"])
async def test_a_stream_whose_backend_drops_it_before_answering_is_sent_to_another(
    name: str, tmp_path: Path
) -> None:
    script = Script([("drop", 0)])
    async with serving(script, 2) as backends, hop(name, backends, tmp_path) as client:
        answer = await ask(client, "chat")
    assert answer.status == 200
    assert not answer.errors
    assert answer.done == 1
    assert len(answer.text.split()) == TOKENS
    assert [s[1] for s in script.served] == [_body("chat")] * 2  # as it came, elsewhere
    assert script.served[0][0] != script.served[1][0]


@pytest.mark.parametrize("fault", [("cut", 0), ("drop", 0)], ids=["mid body", "before answering"])
@pytest.mark.parametrize("name", ["router", "gateway"])
async def test_a_non_streamed_request_that_reached_a_backend_is_never_sent_again(
    name: str, fault: tuple[str, int], tmp_path: Path
) -> None:
    script = Script([fault])
    body = _body("completions", stream=False)
    async with serving(script, 2) as backends, hop(name, backends, tmp_path) as client:
        with anyio.fail_after(20):
            if fault[0] == "cut":  # the head is out: the connection is aborted
                with pytest.raises(httpx.HTTPError):
                    await client.post(PATHS["completions"], json=body)
            else:
                r = await client.post(PATHS["completions"], json=body)
                assert r.status_code == 502
                assert r.json()["error"]["code"] == "engine_unavailable"
    assert len(script.served) == 1


@pytest.mark.parametrize("name", ["router", "gateway"])
async def test_each_resumption_is_counted_by_reason(name: str, tmp_path: Path) -> None:
    script = Script([("cut", 3), ("error", 2)])
    async with serving(script, 3) as backends, hop(name, backends, tmp_path) as client:
        answer = await ask(client, "chat")
        metrics = (await client.get("/metrics")).text
    assert not answer.errors
    assert answer.done == 1
    assert f'sie_{name}_resumes_total{{reason="connection_lost"}} 1.0' in metrics
    assert f'sie_{name}_resumes_total{{reason="error_event"}} 1.0' in metrics


SIE_FAULTS = {
    "before the first event": ("cut", 0),
    "after 3 events": ("cut", 3),
    "with an error event after 3 events": ("error", 3),
    "just before [DONE]": ("cut", TOKENS + 1),
}


async def ask_sie(client: httpx.AsyncClient, *, packed: bool) -> list[bytes]:
    """SIE's generate stream, as sie-sdk asks it (MessagePack) or as JSON."""
    body = {"prompt": "once upon a time", "max_new_tokens": TOKENS, "stream": True}
    content = msgpack.packb(body) if packed else json.dumps(body).encode()
    kind = "application/msgpack" if packed else "application/json"
    with anyio.fail_after(20):
        async with client.stream(
            "POST", f"/v1/generate/{MODEL}", content=content, headers={"content-type": kind}
        ) as r:
            assert r.status_code == 200
            raw = b"".join([chunk async for chunk in r.aiter_bytes()])
    return [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e.strip()]


@pytest.mark.parametrize("packed", [False, True], ids=["json", "msgpack"])
@pytest.mark.parametrize("where", list(SIE_FAULTS))
@pytest.mark.parametrize("name", ["router", "gateway"])
async def test_sies_generate_stream_broken_off_reaches_the_client_as_one_answer(
    name: str, where: str, packed: bool, tmp_path: Path
) -> None:
    script = Script()
    async with serving(script, 2) as backends, hop(name, backends, tmp_path) as client:
        whole = await ask_sie(client, packed=packed)
        script.faults = [SIE_FAULTS[where]]
        script.served.clear()
        resumed = await ask_sie(client, packed=packed)
    assert whole[-1] == resumed[-1] == b"[DONE]"
    events = [json.loads(e) for e in resumed[:-1]]
    reference = [json.loads(e) for e in whole[:-1]]
    assert "".join(e["text_delta"] for e in events) == "".join(e["text_delta"] for e in reference)
    assert [e["seq"] for e in events] == list(range(TOKENS + 1))
    assert len({e["request_id"] for e in events}) == 1
    assert events[-1]["done"] is True
    assert events[-1]["usage"] == reference[-1]["usage"]
    assert not [e for e in events if "error" in e]
    assert len(script.served) == (1 if where == "just before [DONE]" else 2)


async def test_a_refusal_no_other_backend_takes_over_reaches_the_client_as_it_came(
    tmp_path: Path,
) -> None:
    script = Script([("refuse", "NOT_LEADER")])
    async with serving(script, 1) as backends, hop("router", backends, tmp_path) as client:
        with anyio.fail_after(20):
            r = await client.post(PATHS["completions"], json=_body("completions"))
    assert r.status_code == 409
    assert r.headers["x-sie-error-code"] == "NOT_LEADER"
    assert r.json() == {"error": {"code": "not_leader", "message": "b0 refuses"}}
    assert len(script.served) == 1
