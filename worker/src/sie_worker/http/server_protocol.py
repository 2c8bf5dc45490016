"""The HTTP/1.1 protocol every server of ours runs under uvicorn: uvicorn's httptools
protocol, with its one answer of its own (a request it cannot parse) in our error shape.

uvicorn answers a malformed request head or chunked body with a plain-text 400 and closes
the connection. Behind our hops a client reads JSON errors (DESIGN.md, "Data path"): here
that 400 is ``invalid_request`` like every other, with ``X-SIE-Error-Code``. When an answer
to an earlier request on the connection is still being written (a pipelined request that
does not parse), a second head would corrupt it: the connection is closed instead, which
the client sees as the end of a cut answer. Pinned with the rest of uvicorn's internals that
``sie_worker.http.wire`` relies on (``VERIFIED_UVICORN``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from sie_worker.errors import InvalidRequest
from sie_worker.http.errors import error_body, error_headers

__all__ = ["http_protocol"]

_log = logging.getLogger("sie_worker.http")


def _message() -> InvalidRequest:
    return InvalidRequest(
        "the request is not valid HTTP/1.1 (its request line, headers or chunked body do "
        "not parse); the connection is closed: send a well-formed request on a new one"
    )


def http_protocol() -> type[Any] | str:
    """uvicorn's ``http`` setting: the protocol class below, or ``"auto"`` where uvicorn
    has no httptools (it then serves with h11 and its own 400)."""
    try:
        from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
    except ImportError:
        return "auto"

    class HopHttpProtocol(HttpToolsProtocol):
        def send_400_response(self, msg: str) -> None:
            cycle = self.cycle
            if cycle is not None and cycle.response_started and not cycle.response_complete:
                _log.warning("closing a connection whose next request does not parse: %s", msg)
                self.transport.close()
                return
            error = _message()
            body = json.dumps(error_body(error)).encode()
            fields = [
                *self.server_state.default_headers,
                *(
                    (k.lower().encode("latin-1"), v.encode("latin-1"))
                    for k, v in error_headers(error).items()
                ),
            ]
            head: list[bytes] = [STATUS_LINE[400]]
            for field_name, field_value in fields:
                head += [field_name, b": ", field_value, b"\r\n"]
            head += [
                b"content-type: application/json\r\n",
                b"content-length: %d\r\n" % len(body),
                b"connection: close\r\n\r\n",
            ]
            self.transport.write(b"".join(head) + body)
            self.transport.close()

    return HopHttpProtocol
