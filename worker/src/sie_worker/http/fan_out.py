"""One call sent to several backends at once, for the slot router (backends: the pod's
workers) and the gateway (backends: pods) alike.

- :func:`fan_out`: a call that changes every backend it names (unload a model everywhere it
  lives, write a config to every slot). The answer is the first failure in the targets'
  order, else the first target's answer; a header (``X-SIE-Slot``, ``X-SIE-Pod``) lists
  every target the call went to. Transport failures are translated as the relay's are.
- :func:`ask_all`: a GET of merged views (``/v1/models``, ``/v1/devices``): the JSON of
  every target that answered 200, in the targets' order; targets that fail are left out.

Each target's ``done`` runs once its call is over (the caller polls that backend soon:
what it holds may just have changed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from starlette.responses import Response

from sie_worker.errors import SieError
from sie_worker.http.errors import error_response
from sie_worker.http.headers import relayed_headers
from sie_worker.http.relay import Upstream
from sie_worker.http.upstream import translate_errors

__all__ = ["Target", "ask_all", "fan_out"]


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Target:
    name: str  # for messages: "slot 0", "pod sie-l4-7f9c"
    label: str  # what the answer's header lists: "0", "sie-l4-7f9c"
    url: str  # base URL, http://host:port
    done: Callable[[], None] = _nothing


async def fan_out(
    client: httpx.AsyncClient,
    upstream: Upstream,
    targets: Sequence[Target],
    *,
    header: str,
    limits: httpx.Timeout,
) -> Response:
    """Send ``upstream`` to every target at once; answer as the module docstring says."""
    results: dict[int, httpx.Response | SieError] = {}
    has_body = upstream.body or upstream.method not in ("GET", "HEAD", "DELETE")

    async def one(index: int, target: Target) -> None:
        request = client.build_request(
            upstream.method,
            httpx.URL(target.url + upstream.target),
            headers=list(upstream.headers),
            content=upstream.body if has_body else None,
            timeout=limits,
        )
        try:
            with translate_errors(target.name, target.url):
                results[index] = await client.send(request)
        except SieError as exc:
            results[index] = exc
        finally:
            target.done()

    async with anyio.create_task_group() as tg:
        for index, target in enumerate(targets):
            tg.start_soon(one, index, target)
    ordered = [results[i] for i in sorted(results)]
    failures = [r for r in ordered if isinstance(r, SieError) or r.status_code >= 400]
    chosen = failures[0] if failures else ordered[0]
    if isinstance(chosen, SieError):
        response: Response = error_response(chosen)
    else:
        response = Response(
            chosen.content,
            status_code=chosen.status_code,
            headers=dict(relayed_headers(chosen.headers.items(), keep_length=False)),
        )
    response.headers[header] = ",".join(t.label for t in targets)
    return response


async def ask_all(
    client: httpx.AsyncClient,
    targets: Sequence[Target],
    path: str,
    headers: dict[str, str],
    timeout_s: float,
) -> list[tuple[Target, Any]]:
    """GET ``path`` from every target at once: ``(target, JSON body)`` of those that
    answered 200, in the targets' order."""
    answers: dict[int, Any] = {}

    async def ask(index: int, target: Target) -> None:
        try:
            r = await client.get(target.url + path, headers=headers, timeout=timeout_s)
            if r.status_code == 200:
                answers[index] = r.json()
        except (httpx.HTTPError, ValueError):
            return

    async with anyio.create_task_group() as tg:
        for index, target in enumerate(targets):
            tg.start_soon(ask, index, target)
    return [(targets[i], answers[i]) for i in sorted(answers)]
