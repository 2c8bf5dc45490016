"""The engine's one exception: an OpenAI-shaped error with its HTTP status.

Endpoints and request parsing raise :class:`EngineError`; one handler in ``_app.py`` renders
``{"error": {"message", "type", "code", "param"}}``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EngineError"]

_TYPES = {400: "invalid_request_error", 404: "not_found_error", 503: "service_unavailable"}


class EngineError(Exception):
    """A request the engine refuses or cannot serve; ``code`` is a stable machine-readable word."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        code: str = "invalid_request",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        kind = _TYPES.get(
            self.status, "server_error" if self.status >= 500 else "invalid_request_error"
        )
        return {
            "error": {
                "message": self.message,
                "type": kind,
                "code": self.code,
                "param": self.param,
            }
        }
