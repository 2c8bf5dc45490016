"""HTTP from tests to the servers they start on 127.0.0.1: httpx's calls, one TLS context.

httpx builds a new TLS context for every client it makes, loading certifi's whole CA
bundle: 19 ms of CPU, spent even for a plain ``http://`` URL. ``httpx.get`` makes a client
per call, so a test polling a server every 50 ms burnt 40% of a core on contexts it never
used; over the suite that was about 270 s of CPU, the largest single cost of
``make test`` (issue 29). These are httpx's own functions with every client sharing one
context, built once; use them (not ``httpx.get`` / ``httpx.Client``) in tests and
benchmarks. Timeouts, headers and the rest are httpx's arguments as they are.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

__all__ = ["client", "get", "post", "stream"]

# The tests speak plain HTTP; the context only has to exist for httpx to share it.
_CONTEXT = ssl.create_default_context()


def client(**kwargs: Any) -> httpx.Client:
    """``httpx.Client(**kwargs)`` on the shared TLS context."""
    return httpx.Client(verify=_CONTEXT, **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.get(url, verify=_CONTEXT, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(url, verify=_CONTEXT, **kwargs)


@contextmanager
def stream(method: str, url: str, **kwargs: Any) -> Iterator[httpx.Response]:
    with httpx.stream(method, url, verify=_CONTEXT, **kwargs) as response:
        yield response
