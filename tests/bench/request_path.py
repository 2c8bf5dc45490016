"""Which files of ``sie_worker`` a streamed chat completion passes through at one hop, in
order: the count ``docs/architecture.md`` quotes ("The request path").

The slot router and the gateway each run in this process on a real socket, in front of a
pod stand-in (:class:`tests.support.fake_pod.FakePod`) that streams the answer. Once the
hop has polled its backend (polls then paused: 30 s apart), one request is sent with a
profile hook (``sys.setprofile``) on the event loop's thread, which notes the file of every
function called in ``sie_worker/`` (the client, uvicorn, Starlette and the stand-in are
not ``sie_worker``). Consecutive calls in one file count once: the path is the list of
files entered, a file that appears twice was returned to after another was entered.

    .venv/bin/python -m tests.bench.request_path

Prints, per hop, the files in order, how many distinct files, and how many returns.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from tests.support.asgi_server import serve
from tests.support.fake_pod import FakePod, gateway_before

__all__ = ["entered_files", "main", "returns"]

_BODY = {
    "model": "org/m",
    "messages": [{"role": "user", "content": "hello " * 100}],
    "stream": True,
}
_MARK = "/sie_worker/"


def returns(files: Sequence[str]) -> int:
    """How many times the path enters a file it had left."""
    return len(files) - len(set(files))


async def entered_files(client: httpx.AsyncClient) -> list[str]:
    """The ``sie_worker`` files one chat completion through ``client`` enters, in order."""
    files: list[str] = []

    def note(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        name = frame.f_code.co_filename
        at = name.find(_MARK)
        if at >= 0:
            short = name[at + len(_MARK) :]
            if not files or files[-1] != short:
                files.append(short)

    sys.setprofile(note)
    try:
        async with client.stream("POST", "/v1/chat/completions", json=_BODY) as answer:
            await answer.aread()
    finally:
        sys.setprofile(None)
    if answer.status_code != 200:
        raise RuntimeError(f"the hop answered {answer.status_code}")
    return files


async def _router(pod_port: int) -> list[str]:
    from sie_worker.router.app import create_router_app
    from sie_worker.router.settings import RouterSettings

    settings = RouterSettings(worker_ports=(pod_port,), poll_interval_s=30.0)
    app = create_router_app(settings)
    async with app.router.lifespan_context(app), serve(app, lifespan="off") as port:
        await app.state.table.polled_once.wait()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=20) as client:
            return await entered_files(client)


async def _gateway(pod_port: int) -> list[str]:
    from sie_worker.gateway.pools import PoolSpec

    spec = PoolSpec("p", "sglang", "l4", "l4", endpoints=(f"http://127.0.0.1:{pod_port}",))
    with tempfile.TemporaryDirectory() as tmp:
        async with gateway_before([spec], Path(tmp), poll_interval_s=30.0) as client:
            while True:  # until the gateway has polled its pod
                if (await client.get("/readyz")).status_code == 200:
                    return await entered_files(client)
                await asyncio.sleep(0.05)


async def _both() -> dict[str, list[str]]:
    pod = FakePod({"org/m": "ready"}, {"org/m": 1})
    async with serve(pod.app(), lifespan="off") as pod_port:
        return {"router": await _router(pod_port), "gateway": await _gateway(pod_port)}


def main(argv: Sequence[str] | None = None) -> int:
    for hop, files in asyncio.run(_both()).items():
        print(f"{hop}: {len(set(files))} files, {returns(files)} returns")
        print("  " + " -> ".join(f.removesuffix(".py") for f in files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
