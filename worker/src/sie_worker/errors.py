"""The worker's exception family. Each error carries its error code and HTTP status:

    SieError
    ├── InvalidConfig        invalid_config      400  (carries every Problem found)
    ├── InvalidRequest       invalid_request     400
    ├── Unauthorized         unauthorized        401
    ├── Forbidden            forbidden           403
    ├── UnknownModel         unknown_model       404
    ├── NotFound             not_found           404
    ├── MethodNotAllowed     method_not_allowed  405
    ├── PlacementFailed      placement_failed    409
    ├── PayloadTooLarge      payload_too_large   413
    ├── ModelLoading         model_loading       503  (Retry-After)
    ├── UnknownPool          unknown_pool        404  (gateway; SIE code POOL_NOT_FOUND)
    ├── NoPool               no_pool             409  (gateway; GPU_NOT_CONFIGURED)
    ├── Provisioning         provisioning        503  (gateway; Retry-After, PROVISIONING)
    ├── QueueFull            queue_full          429  (gateway; Retry-After, QUEUE_FULL)
    ├── LoadFailed           load_failed         502
    ├── EngineUnavailable    engine_unavailable  502
    ├── EngineTimeout        engine_timeout      504  (read cap hit; engine not restarted)
    └── StartupTimeout       startup_timeout     504

Endpoints only raise; :mod:`sie_worker.http.errors` renders ``{"error": {"code", "message"}}``
for every app.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "EngineTimeout",
    "EngineUnavailable",
    "Forbidden",
    "InvalidConfig",
    "InvalidRequest",
    "LoadFailed",
    "MethodNotAllowed",
    "ModelLoading",
    "NoPool",
    "NotFound",
    "PayloadTooLarge",
    "PlacementFailed",
    "Problem",
    "Provisioning",
    "QueueFull",
    "SieError",
    "StartupTimeout",
    "Unauthorized",
    "UnknownModel",
    "UnknownPool",
]


@dataclass(frozen=True, order=True)
class Problem:
    """One thing wrong with a config: where (JSON path like ``$.profiles.default``) and what.

    ``file`` is the config's source (a path, or ``<request>`` for Config API bodies).
    """

    path: str
    message: str
    file: str | None = None

    def __str__(self) -> str:
        prefix = f"{self.file}: " if self.file else ""
        return f"{prefix}{self.path}: {self.message}"


class SieError(Exception):
    """Base of every error the worker answers with a JSON error body."""

    code: str = "internal_error"
    status: int = 500

    def __init__(
        self,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.headers: dict[str, str] = dict(headers or {})
        if status is not None:
            self.status = status

    def body(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code, "message": self.message}}


class InvalidConfig(SieError):
    """A model config breaks the schema or a rule; ``problems`` lists all of them, sorted."""

    code = "invalid_config"
    status = 400

    def __init__(self, problems: Iterable[Problem], *, headline: str | None = None) -> None:
        self.problems: tuple[Problem, ...] = tuple(sorted(problems))
        lines = [str(p) for p in self.problems]
        message = "; ".join(lines) if lines else (headline or "invalid config")
        if headline and lines:
            message = f"{headline}: {message}"
        super().__init__(message)


class InvalidRequest(SieError):
    code = "invalid_request"
    status = 400


class Unauthorized(SieError):
    code = "unauthorized"
    status = 401

    def __init__(self, message: str = "missing or invalid bearer token") -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(SieError):
    code = "forbidden"
    status = 403


class UnknownModel(SieError):
    code = "unknown_model"
    status = 404


class NotFound(SieError):
    code = "not_found"
    status = 404


class MethodNotAllowed(SieError):
    code = "method_not_allowed"
    status = 405


class PlacementFailed(SieError):
    """No block of devices can be freed for the model; a later request may retry."""

    code = "placement_failed"
    status = 409

    def __init__(self, message: str, *, retry_after_s: int = 2) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class PayloadTooLarge(SieError):
    code = "payload_too_large"
    status = 413


class ModelLoading(SieError):
    """The model is loading and the client asked not to wait."""

    code = "model_loading"
    status = 503

    def __init__(self, message: str, *, retry_after_s: int = 5) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class LoadFailed(SieError):
    code = "load_failed"
    status = 502


class EngineUnavailable(SieError):
    code = "engine_unavailable"
    status = 502


class EngineTimeout(SieError):
    code = "engine_timeout"
    status = 504


class StartupTimeout(SieError):
    code = "startup_timeout"
    status = 504


# -- the gateway's own refusals ---------------------------------------------------------
# Each also carries SIE's code in X-SIE-Error-Code, the header sie-sdk reads first, so the
# SDK raises what it documents (ProvisioningError, RateLimitError, RequestError).


class UnknownPool(SieError):
    """``X-SIE-Pool`` / ``X-SIE-MACHINE-PROFILE`` name no configured pool."""

    code = "unknown_pool"
    status = 404

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"X-SIE-Error-Code": "POOL_NOT_FOUND"})


class NoPool(SieError):
    """No configured pool can serve the model (its bundle or slot width does not fit)."""

    code = "no_pool"
    status = 409

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"X-SIE-Error-Code": "GPU_NOT_CONFIGURED"})


class Provisioning(SieError):
    """The pool has no ready pod and the request's hold ran out (scale from zero)."""

    code = "provisioning"
    status = 503

    def __init__(self, message: str, *, retry_after_s: int = 5) -> None:
        super().__init__(
            message,
            headers={"Retry-After": str(max(1, retry_after_s)), "X-SIE-Error-Code": "PROVISIONING"},
        )


class QueueFull(SieError):
    """The pool already holds as many requests as it may (``SIE_GATEWAY_MAX_HELD``)."""

    code = "queue_full"
    status = 429

    def __init__(self, message: str, *, retry_after_s: int = 2) -> None:
        super().__init__(
            message,
            headers={"Retry-After": str(max(1, retry_after_s)), "X-SIE-Error-Code": "QUEUE_FULL"},
        )
