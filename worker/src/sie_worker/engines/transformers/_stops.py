"""Find OpenAI ``stop`` strings in streamed text without ever emitting any part of one.

Text that could still turn into a stop string (a suffix that is a prefix of one) is held
back until the next piece decides it. Pure.
"""

from __future__ import annotations

__all__ = ["StopScanner"]


class StopScanner:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        """Add generated text; return what is safe to emit. After a stop string, returns ""."""
        if self.stopped:
            return ""
        text = self._held + piece
        cut = min((i for i in (text.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return text[:cut]
        keep = self._undecided_suffix(text)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """Generation ended: the held text can no longer become a stop string."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _undecided_suffix(self, text: str) -> int:
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if stop.startswith(text[len(text) - size :]):
                    longest = size
                    break
        return longest
