"""The worker's exception family. Each error carries the code and HTTP status of DESIGN.md.

    SieError
    ├── InvalidConfig        invalid_config      400  (carries every Problem found)
    ├── InvalidRequest       invalid_request     400
    ├── AmbiguousModel       ambiguous_model     400  (names the candidates)
    ├── Unauthorized         unauthorized        401
    ├── Forbidden            forbidden           403
    ├── UnknownModel         unknown_model       404
    ├── NotFound             not_found           404
    ├── MethodNotAllowed     method_not_allowed  405
    ├── PlacementFailed      placement_failed    409
    ├── NotLeader            not_leader          409  (a rank >= 1 of a group of nodes)
    ├── PayloadTooLarge      payload_too_large   413
    ├── HeadersTooLarge      headers_too_large   431
    ├── ModelLoading         model_loading       503  (Retry-After)
    ├── UnknownPool          unknown_pool        404  (gateway)
    ├── NoPool               no_pool             409  (gateway)
    ├── Provisioning         provisioning        503  (gateway; Retry-After)
    ├── QueueFull            queue_full          429  (gateway; Retry-After)
    ├── LoadFailed           load_failed         502
    ├── EngineUnavailable    engine_unavailable  502
    ├── EngineTimeout        engine_timeout      504  (read cap hit; engine not restarted)
    └── StartupTimeout       startup_timeout     504

Endpoints only raise; :mod:`sie_worker.http.errors` renders ``{"error": {"code", "message",
"param"?}}`` (``param``: the request field at fault) with SIE's code for it, from
:data:`SIE_ERROR_CODES`, in the ``X-SIE-Error-Code`` header: sie-sdk reads that header first,
so it raises the exception it documents for each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

__all__ = [
    "SIE_ERROR_CODES",
    "SIE_ERROR_HEADER",
    "SIE_LOAD_FAILED",
    "AmbiguousModel",
    "EngineTimeout",
    "EngineUnavailable",
    "Forbidden",
    "HeadersTooLarge",
    "InvalidConfig",
    "InvalidRequest",
    "LoadFailed",
    "MethodNotAllowed",
    "ModelLoading",
    "NoPool",
    "NotFound",
    "NotLeader",
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


SIE_ERROR_HEADER = "X-SIE-Error-Code"
SIE_LOAD_FAILED = "MODEL_LOAD_FAILED"

# Our code -> SIE's (sie-server's ErrorCode, else SIE's gateway's), for X-SIE-Error-Code.
# sie-sdk acts on MODEL_NOT_FOUND, MODEL_LOADING (retried within its budget),
# RESOURCE_EXHAUSTED (retried on a 503 only), MODEL_LOAD_FAILED, PROVISIONING, QUEUE_FULL.
SIE_ERROR_CODES: Mapping[str, str] = MappingProxyType(
    {
        "invalid_config": "INVALID_INPUT",
        "invalid_request": "INVALID_INPUT",
        "ambiguous_model": "INVALID_INPUT",
        "unauthorized": "UNAUTHORIZED",
        "forbidden": "FORBIDDEN",
        "unknown_model": "MODEL_NOT_FOUND",
        "not_found": "NOT_FOUND",
        "method_not_allowed": "METHOD_NOT_ALLOWED",
        "placement_failed": "RESOURCE_EXHAUSTED",
        "not_leader": "NOT_LEADER",  # ours: SIE has no groups of nodes
        "payload_too_large": "PAYLOAD_TOO_LARGE",
        "headers_too_large": "INVALID_INPUT",
        "model_loading": "MODEL_LOADING",
        "load_failed": SIE_LOAD_FAILED,
        "engine_unavailable": "INFERENCE_ERROR",
        "engine_timeout": "GATEWAY_TIMEOUT",
        "startup_timeout": SIE_LOAD_FAILED,  # the load did not finish in time
        "internal_error": "INTERNAL_ERROR",
        # the gateway's own refusals
        "unknown_pool": "POOL_NOT_FOUND",
        "no_pool": "GPU_NOT_CONFIGURED",
        "provisioning": "PROVISIONING",
        "queue_full": "QUEUE_FULL",
    }
)


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
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.headers: dict[str, str] = dict(headers or {})
        self.param = param  # the request field at fault, when one is
        if status is not None:
            self.status = status

    @property
    def sie_code(self) -> str:
        """SIE's code for this error (``X-SIE-Error-Code``)."""
        return SIE_ERROR_CODES.get(self.code, "INTERNAL_ERROR")

    def body(self) -> dict[str, dict[str, Any]]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.param is not None:
            error["param"] = self.param
        return {"error": error}


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

    @classmethod
    def not_configured(cls, model: str) -> UnknownModel:
        """The one wording of a model this worker does not serve, whichever route asked."""
        return cls(f"model {model!r} is not configured here; GET /v1/models lists the models")


class AmbiguousModel(SieError):
    code = "ambiguous_model"
    status = 400

    @classmethod
    def among(cls, asked: str, candidates: list[str]) -> AmbiguousModel:
        """The one wording of a name that matches several served ids but none exactly."""
        listed = ", ".join(sorted(candidates))
        return cls(
            f"model {asked!r} matches {listed} when case is ignored; name one exactly",
            param="model",
        )


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


class NotLeader(SieError):
    """This worker is a rank >= 1 of a group of nodes: only rank 0 serves requests; the
    message names it."""

    code = "not_leader"
    status = 409

    def __init__(self, rank: int, nodes: int, leader: str) -> None:
        super().__init__(
            f"this worker is rank {rank} of a group of {nodes} nodes, which serves requests "
            f"at its leader only: send them to rank 0 at {leader} (the group's Service "
            "reaches leaders only)"
        )
        self.leader = leader


class PayloadTooLarge(SieError):
    code = "payload_too_large"
    status = 413


class HeadersTooLarge(SieError):
    """A request head (request line and headers) over 64 KiB."""

    code = "headers_too_large"
    status = 431


class ModelLoading(SieError):
    """The model is loading and the client asked not to wait."""

    code = "model_loading"
    status = 503

    def __init__(self, message: str, *, retry_after_s: int = 5) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class LoadFailed(SieError):
    """The engine could not start or died while loading. The next request loads again, so
    the failure is not permanent (SIE's ``error_class``/``permanent``/``attempts``)."""

    code = "load_failed"
    status = 502
    error_class = "ENGINE"

    def body(self) -> dict[str, dict[str, Any]]:
        body = super().body()
        body["error"].update(error_class=self.error_class, permanent=False, attempts=1)
        return body


class EngineUnavailable(SieError):
    code = "engine_unavailable"
    status = 502


class EngineTimeout(SieError):
    code = "engine_timeout"
    status = 504


class StartupTimeout(SieError):
    code = "startup_timeout"
    status = 504
    error_class = "TIMEOUT"

    def body(self) -> dict[str, dict[str, Any]]:
        body = super().body()
        body["error"].update(error_class=self.error_class, permanent=False, attempts=1)
        return body


# -- the gateway's own refusals -----------------------------------------------------------


class UnknownPool(SieError):
    """``X-SIE-Pool`` / ``X-SIE-MACHINE-PROFILE`` name no configured pool."""

    code = "unknown_pool"
    status = 404


class NoPool(SieError):
    """No configured pool can serve the model (its bundle or slot width does not fit)."""

    code = "no_pool"
    status = 409


class Provisioning(SieError):
    """The pool has no ready pod and the request's hold ran out (scale from zero)."""

    code = "provisioning"
    status = 503

    def __init__(self, message: str, *, retry_after_s: int = 5) -> None:
        super().__init__(message, headers={"Retry-After": str(max(1, retry_after_s))})


class QueueFull(SieError):
    """The pool already holds as many requests as it may (``SIE_GATEWAY_MAX_HELD``)."""

    code = "queue_full"
    status = 429

    def __init__(self, message: str, *, retry_after_s: int = 2) -> None:
        super().__init__(message, headers={"Retry-After": str(max(1, retry_after_s))})
