"""What the router reads from a client request: the slot it names, its model, its body."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode

from starlette.requests import Request

from sie_worker.errors import InvalidRequest
from sie_worker.http.request import model_of

__all__ = ["SLOT_HEADER", "model_of", "named_slot", "request_target"]

SLOT_HEADER = "x-sie-slot"


def named_slot(request: Request, slot_count: int) -> int | None:
    """The slot named by ``?slot=N`` or ``X-SIE-Slot: N``; None when neither is given."""
    # The query is parsed only when it can name a slot (most requests have none).
    raw_query: bytes = request.scope.get("query_string", b"")
    query = request.query_params.get("slot") if b"slot" in raw_query else None
    header = request.headers.get(SLOT_HEADER)
    if query is not None and header is not None and query.strip() != header.strip():
        raise InvalidRequest(f"?slot={query} and X-SIE-Slot: {header} disagree; name the slot once")
    raw = query if query is not None else header
    if raw is None:
        return None
    field = "?slot" if query is not None else "X-SIE-Slot"
    try:
        slot = int(raw.strip())
    except ValueError:
        raise InvalidRequest(
            f"{field}: {raw!r} is not a slot number; use 0..{slot_count - 1}"
        ) from None
    if not 0 <= slot < slot_count:
        raise InvalidRequest(
            f"{field}: slot {slot} does not exist; this pod has slots 0..{slot_count - 1}"
        )
    return slot


def request_target(request: Request) -> str:
    """Raw path and query as the client sent them, minus the router's own ``slot``."""
    raw_path: bytes = request.scope.get("raw_path") or request.url.path.encode()
    raw_query: bytes = request.scope.get("query_string", b"")
    query = raw_query.decode("latin-1")
    if b"slot" in raw_query and "slot" in request.query_params:
        query = urlencode(
            [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != "slot"]
        )
    path = raw_path.decode("latin-1").split("?", 1)[0]
    return f"{path}?{query}" if query else path
