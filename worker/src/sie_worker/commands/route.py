"""``sie-worker route``: run the pod's slot router in front of its worker containers."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from types import FrameType
from typing import Any

from sie_worker.commands._heap import settle_heap
from sie_worker.router.settings import DEFAULT_ROUTER_PORT, RouterSettings, RouterSettingsError

__all__ = ["register", "run"]


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "route",
        help="run the pod's slot router",
        description=(
            "Serve the pod's one endpoint: route each request to the slot (worker) that "
            "holds its model, else the least busy one. Slots come from SIE_GPU_COUNT, "
            "worker ports on localhost from SIE_WORKER_PORTS (one per slot) or, when only "
            "SIE_GPU_COUNT is set, SIE_WORKER_BASE_PORT + slot (base 8081)."
        ),
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_ROUTER_PORT, help="port to listen on (8080)"
    )
    parser.add_argument("--log-level", default="info", help="uvicorn log level")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        settings = RouterSettings.from_env(os.environ)
    except RouterSettingsError as exc:
        print(f"sie-worker route: {exc}", file=sys.stderr)
        return 2
    if args.port in settings.worker_ports:
        print(
            f"sie-worker route: --port {args.port} is also a worker port "
            f"({','.join(map(str, settings.worker_ports))}); give the router its own port",
            file=sys.stderr,
        )
        return 2

    import uvicorn

    from sie_worker.http.server_protocol import http_protocol
    from sie_worker.router.app import create_router_app

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("sie_worker.router").info(
        "routing %d slot(s) to %s",
        settings.slot_count,
        ", ".join(settings.worker_url(i) for i in range(settings.slot_count)),
    )
    # uvicorn drains on SIGTERM and then re-raises it; this handler turns that into exit 0.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    app = create_router_app(settings)
    settle_heap()
    uvicorn.run(
        app,
        http=http_protocol(),  # JSON 400s for requests that do not parse
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=int(settings.drain_timeout_s),
        access_log=False,
        ws="none",  # why: no WebSocket route; auto would import wsproto on every start
    )
    return 0


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)
