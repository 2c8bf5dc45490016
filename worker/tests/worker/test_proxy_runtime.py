"""A profile's runtime options in the proxy: the body the engine gets, and the first-chunk,
inter-chunk and overall timeouts (504 ``engine_timeout``, or an SSE error event once a stream
has started; the engine connection is closed, so SGLang aborts the request)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest
from tests.support.proxy_app import BOTH_PATHS, EVERY_LOOP, Releases, client_of, proxy_app
from tests.support.scripted_engine import HANG, answer_with, scripted_engine

from sie_worker.config.runtime import RequestRuntime, Timeouts
from sie_worker.http.deadlines import Limit
from sie_worker.worker.proxy import Lease, _deadlines

pytestmark = EVERY_LOOP

JSON = {"content-type": "application/json"}


async def _post(app: Any, body: dict[str, Any], over: str = "asgi") -> httpx.Response:
    async with client_of(app, over) as client:
        return await client.post("/v1/completions", json={"model": "org/m", **body})


def _error(response: httpx.Response) -> dict[str, Any]:
    if response.headers["content-type"].startswith("application/json"):
        error: dict[str, Any] = response.json()["error"]
        return error
    last = [e for e in response.text.split("\n\n") if e.strip()][-1]
    event: dict[str, Any] = json.loads(last.removeprefix("data: "))["error"]
    return event


@pytest.mark.anyio
async def test_the_engine_gets_the_profile_s_defaults_and_stops() -> None:
    runtime = RequestRuntime(
        default_sampling={"temperature": 0.6, "top_k": 20}, stop_tokens=("<|im_end|>",)
    )
    async with scripted_engine(answer_with(b'{"choices": []}', headers=JSON)) as engine:
        app = proxy_app(engine.base_url, Releases(), runtime=runtime)
        response = await _post(app, {"prompt": "x", "temperature": 0.1, "stop": "END"})
        seen = [json.loads(r.body) for r in engine.requests]
    assert response.status_code == 200
    assert seen == [
        {
            "model": "org/m",
            "prompt": "x",
            "temperature": 0.1,
            "stop": ["END", "<|im_end|>"],
            "top_k": 20,
        }
    ]


def _timeouts(**seconds: float) -> RequestRuntime:
    return RequestRuntime(timeouts=Timeouts(**seconds))


CASES: list[tuple[str, Callable[[], Any], dict[str, float], bool, str]] = [
    (
        "no head",
        lambda: answer_with(HANG, head=b""),
        {"first_chunk_s": 0.3},
        False,
        "first_chunk_timeout_s=0.3s",
    ),
    (
        "no event",
        lambda: answer_with(HANG),
        {"first_chunk_s": 0.3},
        True,
        "first_chunk_timeout_s=0.3s",
    ),
    (
        "slow body",
        lambda: answer_with(b'{"choices"', HANG, headers=JSON),
        {"overall_s": 0.4},
        False,
        "overall_timeout_s=0.4s",
    ),
    (
        "silent body",
        lambda: answer_with(b'{"choices"', HANG, headers=JSON),
        {"inter_chunk_s": 0.3},
        False,
        "inter_chunk_timeout_s=0.3s",
    ),
]


@pytest.mark.parametrize(
    ("name", "script", "seconds", "stream", "says"), CASES, ids=[c[0] for c in CASES]
)
@BOTH_PATHS
@pytest.mark.anyio
async def test_a_timeout_before_the_answer_starts_is_a_504_and_closes_the_engine_connection(
    name: str,
    script: Callable[[], Any],
    seconds: dict[str, float],
    stream: bool,
    says: str,
    over: str,
) -> None:
    releases = Releases()
    async with scripted_engine(script()) as engine:
        app = proxy_app(engine.base_url, releases, read_timeout=30, runtime=_timeouts(**seconds))
        with anyio.fail_after(10):
            response = await _post(app, {"prompt": "x", "stream": stream}, over)
            await engine.client_closed.wait()
    assert response.status_code == 504
    error = _error(response)
    assert error["code"] == "engine_timeout"
    assert says in error["message"]
    assert "the engine keeps running" in error["message"]
    assert releases.count == 1


@pytest.mark.parametrize(
    ("seconds", "says"),
    [
        ({"overall_s": 0.5}, "overall_timeout_s=0.5s"),
        ({"inter_chunk_s": 0.3}, "inter_chunk_timeout_s=0.3s"),
    ],
)
@BOTH_PATHS
@pytest.mark.anyio
async def test_a_timeout_mid_stream_ends_it_with_one_error_event(
    seconds: dict[str, float], says: str, over: str
) -> None:
    releases = Releases()
    async with scripted_engine(answer_with(b'data: {"n": 1}\n\n', HANG)) as engine:
        app = proxy_app(
            engine.base_url,
            releases,
            read_timeout=30,
            runtime=_timeouts(first_chunk_s=5, **seconds),
        )
        with anyio.fail_after(10):
            response = await _post(app, {"prompt": "x", "stream": True}, over)
            await engine.client_closed.wait()
    assert response.status_code == 200
    assert response.text.startswith('data: {"n": 1}\n\n')
    error = _error(response)
    assert error["code"] == "engine_timeout"
    assert says in error["message"]
    assert releases.count == 1


@BOTH_PATHS
@pytest.mark.anyio
async def test_a_stream_within_its_limits_is_relayed_whole(over: str) -> None:
    events = b'data: {"n": 1}\n\ndata: [DONE]\n\n'
    releases = Releases()
    async with scripted_engine(answer_with(events[:7], events[7:])) as engine:
        runtime = _timeouts(first_chunk_s=5, inter_chunk_s=5, overall_s=10)
        app = proxy_app(engine.base_url, releases, runtime=runtime)
        response = await _post(app, {"prompt": "x", "stream": True}, over)
    assert response.text == events.decode()
    assert releases.count == 1


@pytest.mark.anyio
async def test_the_read_cap_still_applies_when_it_is_the_smaller_limit() -> None:
    releases = Releases()
    async with scripted_engine(answer_with(b'{"choices"', HANG, headers=JSON)) as engine:
        app = proxy_app(
            engine.base_url, releases, read_timeout=0.3, runtime=_timeouts(inter_chunk_s=30)
        )
        with anyio.fail_after(10):
            response = await _post(app, {"prompt": "x"})
    assert response.status_code == 504
    assert "request_read_timeout_s=0.3s" in _error(response)["message"]


@pytest.mark.parametrize(
    ("cap", "inter", "expected"),
    [
        (None, None, None),
        (30.0, None, Limit("request_read_timeout_s", 30.0)),
        (30.0, 5.0, Limit("inter_chunk_timeout_s", 5.0)),
        (2.0, 5.0, Limit("request_read_timeout_s", 2.0)),
        (None, 5.0, Limit("inter_chunk_timeout_s", 5.0)),
    ],
)
@pytest.mark.anyio
async def test_the_read_timeout_is_the_smaller_of_the_cap_and_the_inter_chunk_limit(
    cap: float | None, inter: float | None, expected: Limit | None
) -> None:
    lease = Lease("org/m", "http://engine", cap, on_release=int)
    assert _deadlines(lease, Timeouts(inter_chunk_s=inter)).read == expected
