"""Bridge a generation on the model thread to the event loop, applying ``stop`` strings.

The model thread pushes decoded pieces with ``call_soon_threadsafe``; the event loop never
blocks on it. When a stop string appears, or the consumer goes away (client disconnect,
shutdown), the generation is cancelled at its next token.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from sie_worker.engines.transformers._errors import EngineError
from sie_worker.engines.transformers._model_thread import ModelThread
from sie_worker.engines.transformers._requests import Sampling
from sie_worker.engines.transformers._stops import StopScanner

if TYPE_CHECKING:
    from sie_worker.engines.transformers._generate import Generator, Outcome, Prepared

__all__ = ["collect", "stream_text"]


@dataclasses.dataclass(frozen=True)
class _Failed:
    error: BaseException


async def stream_text(
    thread: ModelThread, generator: Generator, prepared: Prepared, sampling: Sampling
) -> AsyncIterator[str | Outcome]:
    """Yield text pieces, then the :class:`Outcome` last."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | Outcome | _Failed] = asyncio.Queue()
    cancel = threading.Event()

    def sink(item: str | Outcome | _Failed) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, item)

    def job() -> None:
        try:
            sink(generator.generate(prepared, sampling, sink, cancel))
        except BaseException as exc:
            sink(_Failed(exc))

    future = thread.submit(job)
    scanner = StopScanner(sampling.stop)
    try:
        while True:
            item = await queue.get()
            if isinstance(item, str):
                text = scanner.feed(item)
                if scanner.stopped:
                    cancel.set()
                if text:
                    yield text
            elif isinstance(item, _Failed):
                raise EngineError(
                    f"generation failed: {item.error}", status=500, code="generation_failed"
                ) from item.error
            else:
                tail = scanner.flush()
                if tail:
                    yield tail
                yield dataclasses.replace(item, finish_reason="stop") if scanner.stopped else item
                return
    finally:
        # why: a consumer that stops early (disconnect, error) must free the model thread
        cancel.set()
        future.cancel()


async def collect(
    thread: ModelThread, generator: Generator, prepared: Prepared, sampling: Sampling
) -> tuple[str, Outcome]:
    pieces: list[str] = []
    async for item in stream_text(thread, generator, prepared, sampling):
        if isinstance(item, str):
            pieces.append(item)
        else:
            return "".join(pieces), item
    raise RuntimeError("generation ended without an outcome")  # pragma: no cover
