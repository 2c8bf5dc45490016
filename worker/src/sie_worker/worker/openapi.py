"""The worker's OpenAPI 3.1 description, served at ``/openapi.json``: the OpenAI routes and
SIE's native ones (``/v1/encode``, ``/v1/score``, ``/v1/generate``) that sie-sdk calls."""

from __future__ import annotations

from typing import Any

from sie_worker._version import __version__
from sie_worker.model_states import MODEL_STATES
from sie_worker.sie_api.models import SIE_STATES
from sie_worker.sie_api.openapi import SIE_SCHEMAS, sie_paths

__all__ = ["spec"]

_ERROR = {"$ref": "#/components/schemas/Error"}
_MODEL_ID = {
    "name": "model_id",
    "in": "path",
    "required": True,
    "description": "A served model id: sie_id, or <sie_id>:<profile>. May contain '/'.",
    "schema": {"type": "string", "minLength": 1},
}
_CONFIG_ID = {
    "name": "sie_id",
    "in": "path",
    "required": True,
    "description": "A model config's sie_id. May contain '/'.",
    "schema": {"type": "string", "minLength": 1},
}


def _errors(*statuses: int) -> dict[str, Any]:
    return {
        str(s): {
            "description": "Error (JSON whatever the Accept; SIE's code in X-SIE-Error-Code)",
            "headers": {"X-SIE-Error-Code": {"schema": {"type": "string"}}},
            "content": {"application/json": {"schema": _ERROR}},
        }
        for s in statuses
    }


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _model_action(summary: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "parameters": [_MODEL_ID],
            "responses": {
                "200": _json({"$ref": "#/components/schemas/Model"}),
                **_errors(400, 401, 404, 409, 502, 504),
            },
        }
    }


def _openai(summary: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "description": (
                "OpenAI-compatible. `model` picks the model, loaded on demand. "
                "`stream: true` answers with server-sent events. `Prefer: wait=N` waits at "
                "most N seconds for a load, else 503 with Retry-After."
            ),
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/OpenAIRequest"}}
                },
            },
            "responses": {
                "200": {
                    "description": "The engine's answer",
                    "content": {
                        "application/json": {"schema": {"type": "object"}},
                        "text/event-stream": {"schema": {"type": "string"}},
                    },
                },
                **_errors(400, 401, 404, 409, 413, 422, 502, 503, 504),
            },
        }
    }


def spec() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sie-worker",
            "version": __version__,
            "description": "Places models on contiguous GPU blocks and serves them.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["code", "message"],
                            "properties": {
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                            },
                        }
                    },
                },
                "Model": {
                    "type": "object",
                    "required": ["id", "object", "state", "devices", "width", "pinned", "error"],
                    "properties": {
                        "id": {"type": "string"},
                        "object": {"const": "model"},
                        "owned_by": {"type": "string"},
                        "state": {"enum": list(MODEL_STATES)},
                        "devices": {"type": "array", "items": {"type": "string"}},
                        "width": {"type": "integer", "minimum": 1},
                        "pinned": {"type": "boolean"},
                        "error": {"type": ["string", "null"]},
                        "last_used": {"type": ["number", "null"]},
                        "inflight": {"type": "integer", "minimum": 0},
                        "config_pending": {"type": "boolean"},
                        "phase": {
                            "enum": ["downloading", "starting", None],
                            "description": "While loading: fetching weights, or starting "
                            "the engine",
                        },
                        "bytes_done": {
                            "type": ["integer", "null"],
                            "minimum": 0,
                            "description": "While loading: bytes of the weights in the cache",
                        },
                        "bytes_total": {
                            "type": ["integer", "null"],
                            "minimum": 0,
                            "description": "While loading: bytes of the weights (when known)",
                        },
                        "memory_bytes": {
                            "type": ["integer", "null"],
                            "minimum": 0,
                            "description": "What it reserves on each of its devices (while "
                            "it holds them, else what it would); null where unknown",
                        },
                    },
                },
                "ModelList": {
                    "type": "object",
                    "required": ["object", "data", "models"],
                    "properties": {
                        "object": {"const": "list"},
                        "data": {"type": "array", "items": {"$ref": "#/components/schemas/Model"}},
                        "models": {
                            "description": "SIE's view: one ModelInfo per config",
                            "type": "array",
                            "items": {"$ref": "#/components/schemas/ModelInfo"},
                        },
                    },
                },
                "ModelDetail": {
                    "description": (
                        "A served model's entry and its config's ModelInfo; state and loaded "
                        "are this served model's in SIE's words, worker_state in ours"
                    ),
                    "type": "object",
                    "required": ["id", "name", "state", "loaded", "worker_state"],
                    "properties": {
                        "id": {"type": "string"},
                        "name": {"type": "string"},
                        "state": {"enum": sorted(set(SIE_STATES.values()))},
                        "loaded": {"type": "boolean"},
                        "worker_state": {"enum": list(MODEL_STATES)},
                    },
                },
                **SIE_SCHEMAS,
                "DeviceList": {
                    "type": "object",
                    "required": ["devices"],
                    "properties": {
                        "devices": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": [
                                    "device",
                                    "model",
                                    "models",
                                    "memory_total_bytes",
                                    "memory_reserved_bytes",
                                ],
                                "properties": {
                                    "device": {"type": "string"},
                                    "model": {
                                        "type": ["string", "null"],
                                        "description": "The first of models",
                                    },
                                    "models": {
                                        "type": "array",
                                        "items": {"type": "string"},
                                        "description": "Every model on the device, in the "
                                        "order they were placed",
                                    },
                                    "memory_total_bytes": {
                                        "type": ["integer", "null"],
                                        "minimum": 0,
                                    },
                                    "memory_budget_bytes": {
                                        "type": ["integer", "null"],
                                        "minimum": 0,
                                        "description": "The total x "
                                        "SIE_MEMORY_PRESSURE_THRESHOLD_PERCENT / 100",
                                    },
                                    "memory_reserved_bytes": {
                                        "type": ["integer", "null"],
                                        "minimum": 0,
                                        "description": "What the models on it reserve",
                                    },
                                },
                            },
                        }
                    },
                },
                "OpenAIRequest": {
                    "type": "object",
                    "required": ["model"],
                    "properties": {
                        "model": {"type": "string", "minLength": 1},
                        "stream": {"type": "boolean"},
                    },
                    "additionalProperties": True,
                },
                "Config": {
                    "type": "object",
                    "required": ["id", "object", "models"],
                    "properties": {
                        "id": {"type": "string"},
                        "object": {"const": "config"},
                        "file": {"type": ["string", "null"]},
                        "models": {"type": "array", "items": {"type": "string"}},
                    },
                },
            },
        },
        "security": [{"bearer": []}],
        "paths": {
            "/healthz": {
                "get": {
                    "summary": "Liveness: 200 while the process serves",
                    "security": [],
                    "responses": {"200": _json({"type": "object"})},
                }
            },
            "/readyz": {
                "get": {
                    "summary": "Readiness: 200 once configs are read and pinned models are ready",
                    "security": [],
                    "responses": {
                        "200": _json({"type": "object"}),
                        "503": _json({"type": "object"}, "Not ready"),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "security": [],
                    "responses": {
                        "200": {
                            "description": "Prometheus text format",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
            "/v1/models": {
                "get": {
                    "summary": "Every served model and its state",
                    "responses": {
                        "200": _json({"$ref": "#/components/schemas/ModelList"}),
                        **_errors(401),
                    },
                }
            },
            "/v1/models/{model_id}": {
                "get": {
                    "summary": "One served model, with SIE's ModelInfo",
                    "parameters": [_MODEL_ID],
                    "responses": {
                        "200": _json({"$ref": "#/components/schemas/ModelDetail"}),
                        **_errors(401, 404),
                    },
                }
            },
            "/v1/devices": {
                "get": {
                    "summary": "Each device and the model claiming it",
                    "responses": {
                        "200": _json({"$ref": "#/components/schemas/DeviceList"}),
                        **_errors(401),
                    },
                }
            },
            "/v1/models/{model_id}/load": _model_action("Load a model; answers when ready"),
            "/v1/models/{model_id}/unload": _model_action("Unload a model (clears its pin)"),
            "/v1/models/{model_id}/pin": _model_action("Pin a model (loads it; never evicted)"),
            "/v1/models/{model_id}/unpin": _model_action("Unpin a model"),
            "/v1/chat/completions": _openai("Chat completions"),
            "/v1/completions": _openai("Completions"),
            "/v1/embeddings": _openai("Embeddings"),
            **sie_paths(_errors),
            "/v1/configs": {
                "get": {
                    "summary": "Model configs known to the worker",
                    "responses": {"200": _json({"type": "object"}), **_errors(401, 403)},
                }
            },
            "/v1/configs/{sie_id}": {
                "get": {
                    "summary": "One model config, as JSON",
                    "parameters": [_CONFIG_ID],
                    "responses": {"200": _json({"type": "object"}), **_errors(401, 403, 404)},
                },
                "put": {
                    "summary": "Write a model config (YAML or JSON), checked like a file",
                    "parameters": [_CONFIG_ID],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/yaml": {"schema": {"type": "string"}},
                            "application/json": {"schema": {"type": "object"}},
                        },
                    },
                    "responses": {
                        "200": _json({"$ref": "#/components/schemas/Config"}, "Replaced"),
                        "201": _json({"$ref": "#/components/schemas/Config"}, "Created"),
                        **_errors(400, 401, 403, 413),
                    },
                },
                "delete": {
                    "summary": "Delete a model config and unload its models",
                    "parameters": [_CONFIG_ID],
                    "responses": {"200": _json({"type": "object"}), **_errors(401, 403, 404)},
                },
            },
        },
    }
