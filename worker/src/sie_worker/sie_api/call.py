"""What an SIE request becomes: one engine request, and how its answer comes back."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from sie_worker.config.model import ServedModel
from sie_worker.errors import InvalidRequest

__all__ = ["Answer", "Decode", "EngineCall", "EventTranslator", "Events", "check_serves"]

# The client's response for the engine's 200 JSON answer (decoded) from the served model.
Answer = Callable[[Any, str], Response]
# The engine's 200 JSON answer, bytes to what ``Answer`` takes (ValueError: not JSON).
Decode = Callable[[bytes | bytearray], Any]
# Turns a batch of whole SSE events from the engine into the events the client gets.
EventTranslator = Callable[[bytes], bytes]
# A new translator for one stream from the served model (it keeps the stream's state).
Events = Callable[[str], EventTranslator]


@dataclass(frozen=True)
class EngineCall:
    """``payload`` to the engine's ``path`` (the worker sets its ``model`` to the served id).
    ``answer`` / ``events`` translate the engine's answer or stream; None relays it as is.
    ``decode`` reads the answer for ``answer`` (None: ``json.loads``)."""

    path: str
    payload: Mapping[str, Any]
    stream: bool = False
    answer: Answer | None = None
    events: Events | None = None
    decode: Decode | None = None


def check_serves(served: ServedModel, task: str, route: str) -> None:
    """Refuse a route whose task the served model's config does not declare."""
    tasks = sorted(served.config.tasks)
    if task not in tasks:
        raise InvalidRequest(
            f"{served.id} does not serve {route}: its config declares tasks {tasks}, not {task!r}"
        )
