"""The engine's lock: one thread runs every model call, in arrival order.

Tokenizers and models are not safe to drive from several threads at once, and one call at a
time is also the fastest schedule for a single small model. Work queued here waits in the
executor's queue (no thread per waiter), and a queued call whose caller went away is dropped.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["ModelThread"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


class ModelThread:
    def __init__(self, threads: int | None) -> None:
        self._executor = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="model",
            initializer=_set_torch_threads,
            initargs=(threads,),
        )

    async def call(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def submit(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        return self._executor.submit(fn, *args, **kwargs)


def _set_torch_threads(threads: int | None) -> None:
    if threads is None:
        return
    import torch

    # why: torch's intra-op thread count is per calling thread under OpenMP; set it where the
    # model runs
    torch.set_num_threads(threads)
