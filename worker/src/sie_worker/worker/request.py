"""What the worker reads from an inference request before it acquires an engine. Pure.

- :func:`grammar_target`: the served model that answers a grammar-constrained request
  (:func:`~sie_worker.config.runtime.is_grammar_constrained`) sent to a served id: the
  profile :func:`~sie_worker.config.grammar_routing.grammar_profile_for` names (the model's
  ``grammar_profile`` unless the profile it was sent to enforces grammars already); worked
  out once per config (:mod:`sie_worker.worker.serving`), every other request being served
  by the model it names;
- :func:`task_of`: the task an engine endpoint needs (``generate``, ``encode``, ``score``);
- :func:`load_wait`: how long a request waits for its model to load: ``Prefer: wait=N``
  (RFC 7240) when sent; else, for SIE's native routes and for sie-sdk (``X-SIE-SDK-Version``),
  :data:`SIE_CLIENT_LOAD_WAIT_S`, since sie-sdk reads for at most 150 s, never retries a read
  timeout, and retries a 503 ``MODEL_LOADING`` after its ``Retry-After``; else until loaded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from sie_worker.config.grammar_routing import grammar_profile_for
from sie_worker.config.model import DEFAULT_PROFILE, ModelConfig
from sie_worker.http.errors import from_sie_sdk

__all__ = [
    "ENDPOINT_TASKS",
    "ENGINE_TASKS",
    "SIE_CLIENT_LOAD_WAIT_S",
    "grammar_target",
    "load_wait",
    "prefer_wait",
    "task_of",
]

ENDPOINT_TASKS: Mapping[str, str] = {
    "/v1/chat/completions": "generate",
    "/v1/completions": "generate",
    "/v1/embeddings": "encode",
}
# The engine endpoints the worker calls: the OpenAI ones, and SGLang's rerank (SIE's score).
ENGINE_TASKS: Mapping[str, str] = {**ENDPOINT_TASKS, "/v1/rerank": "score"}
SIE_CLIENT_LOAD_WAIT_S = 120.0
_PREFER_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*(\d+(?:\.\d+)?)", re.IGNORECASE)


def grammar_target(config: ModelConfig, model_id: str) -> str:
    """The served model that answers a grammar-constrained request sent to ``model_id``."""
    profile = DEFAULT_PROFILE if model_id == config.sie_id else model_id[len(config.sie_id) + 1 :]
    target = grammar_profile_for(config, profile)
    if target == profile:
        return model_id
    return config.sie_id if target == DEFAULT_PROFILE else f"{config.sie_id}:{target}"


def task_of(path: str) -> str:
    return ENGINE_TASKS[path]


def load_wait(headers: Mapping[str, str], *, sie_route: bool) -> float | None:
    """Seconds the request waits for a load (None: until the model is ready)."""
    asked = prefer_wait(headers)
    if asked is not None:
        return asked
    if sie_route or from_sie_sdk(headers):
        return SIE_CLIENT_LOAD_WAIT_S
    return None


def prefer_wait(headers: Mapping[str, str]) -> float | None:
    """Seconds from ``Prefer: wait=N``; None when the client did not ask to wait less."""
    prefer = headers.get("prefer")
    if not prefer:
        return None
    match = _PREFER_WAIT.search(prefer)
    return float(match.group(1)) if match else None
