"""What an SIE request becomes: one engine request, and how its answer comes back."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

__all__ = ["Answer", "EngineCall", "EventTranslator", "Events"]

# The client's response for the engine's 200 JSON answer (decoded) from the served model.
Answer = Callable[[Any, str], Response]
# Turns a batch of whole SSE events from the engine into the events the client gets.
EventTranslator = Callable[[bytes], bytes]
# A new translator for one stream from the served model (it keeps the stream's state).
Events = Callable[[str], EventTranslator]


@dataclass(frozen=True)
class EngineCall:
    """``payload`` to the engine's ``path`` (the worker sets its ``model`` to the served id).
    ``answer`` / ``events`` translate the engine's answer or stream; None relays it as is."""

    path: str
    payload: Mapping[str, Any]
    stream: bool = False
    answer: Answer | None = None
    events: Events | None = None
