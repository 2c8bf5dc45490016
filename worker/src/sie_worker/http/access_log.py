"""The worker's access log without the polls: the slot router asks each worker for
``/v1/models``, ``/v1/devices`` and ``/readyz`` every half second, the kubelet probes
``/healthz`` and ``/readyz``, Prometheus scrapes ``/metrics``. Logged, they were six lines a
second per worker that buried the requests, and a formatted line and a write each. Their
answers that succeeded are left out; a failed one (status 400 or above) is still logged, and
``--log-level debug`` keeps them all."""

from __future__ import annotations

import logging

from sie_worker.http.poll import POLLED_PATHS

__all__ = ["QUIET_PATHS", "PollFilter", "quiet_polls"]

QUIET_PATHS = frozenset({*POLLED_PATHS, "/healthz", "/metrics"})
_ACCESS_LOGGER = "uvicorn.access"


class PollFilter(logging.Filter):
    """Drops uvicorn's access record of a successful GET of a polled or probed path."""

    def filter(self, record: logging.LogRecord) -> bool:
        # uvicorn's record: '%s - "%s %s HTTP/%s" %d' % (client, method, path, version, status)
        args = record.args
        if not isinstance(args, tuple) or len(args) != 5:
            return True
        method, path, status = args[1], args[2], args[4]
        return not (
            method == "GET" and path in QUIET_PATHS and isinstance(status, int) and status < 400
        )


def quiet_polls(level: int) -> None:
    """Leave the polls out of uvicorn's access log, unless ``level`` is debug or lower."""
    logger = logging.getLogger(_ACCESS_LOGGER)
    if level > logging.DEBUG and not any(isinstance(f, PollFilter) for f in logger.filters):
        logger.addFilter(PollFilter())
