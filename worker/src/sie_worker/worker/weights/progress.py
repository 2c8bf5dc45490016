"""Byte progress of one snapshot download, shared by its download threads and its readers
(``/v1/models``, metrics, ``sie-worker fetch``'s bar), and the progress-bar class
huggingface_hub reports into, which also stops a cancelled download at its next chunk."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from sie_worker.worker.weights.files import bytes_done, bytes_total

__all__ = ["Progress", "Stopped"]


class Stopped(Exception):
    """Raised inside a file download when its download was cancelled or another file failed."""


class Progress:
    """Bytes of one snapshot present so far; updated by download threads, read anywhere."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sizes: dict[str, int | None] = {}
        self._done: dict[str, int] = {}
        self.fetched = 0  # bytes that came over the network in this download

    def expect(self, sizes: Mapping[str, int | None], present: Mapping[str, int | None]) -> None:
        """Files to fetch with their sizes; those already present count as done."""
        with self._lock:
            self._sizes.update(sizes)
            for path in sizes:
                if path in present:
                    self._done[path] = present[path] or 0

    @property
    def done(self) -> int:
        with self._lock:
            return bytes_done(self._sizes, self._done)

    @property
    def total(self) -> int | None:
        with self._lock:
            return bytes_total(self._sizes) if self._sizes else None

    def _set(self, path: str, value: int) -> None:
        with self._lock:
            self._done[path] = value

    def _add(self, path: str, n: int) -> None:
        with self._lock:
            self._done[path] = self._done.get(path, 0) + n
            self.fetched += n

    def bar(self, path: str, stop: Callable[[], bool]) -> type:
        """A progress-bar class for huggingface_hub's ``tqdm_class``, counting into this
        object for ``path``. It draws nothing, and stops the download (at its next chunk)
        once ``stop()`` is true."""
        progress = self

        class _Bar:
            total: int | None

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                self.total = kwargs.get("total")
                self.n = int(kwargs.get("initial") or 0)
                progress._set(path, self.n)

            def __enter__(self) -> _Bar:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

            def update(self, n: float | None = 1) -> None:
                if stop():
                    raise Stopped(path)
                step = int(n or 0)
                self.n += step
                progress._add(path, step)

            # Called by huggingface_hub; having them makes it count each byte once.
            def update_transfer(self, n: float | None = 1) -> None:
                return None

            def set_postfix_str(self, *args: Any, **kwargs: Any) -> None:
                return None

            def set_transfer_postfix_str(self, *args: Any, **kwargs: Any) -> None:
                return None

            def set_description(self, *args: Any, **kwargs: Any) -> None:
                return None

            def set_description_str(self, *args: Any, **kwargs: Any) -> None:
                return None

            def refresh(self, *args: Any, **kwargs: Any) -> None:
                return None

            def close(self) -> None:
                return None

        return _Bar
