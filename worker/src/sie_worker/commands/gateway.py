"""``sie-worker gateway``: run the front door of every pool (pool and replica choice,
holding through scale-from-zero, cluster health)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from sie_worker.commands._heap import settle_heap
from sie_worker.gateway.pools import PoolsFileError
from sie_worker.gateway.settings import DEFAULT_GATEWAY_PORT, GatewaySettings, GatewaySettingsError

__all__ = ["register", "run"]

_EPILOG = """\
pools file (SIE_GATEWAY_POOLS), one entry per pool x bundle; the chart renders it:
  - {pool: l4-4x, bundle: sglang, machine_profile: l4-4x, gpu_type: l4,
     slots: 1, slot_width: 4, service: sie-sie-workers-l4-4x-sglang, port: 8080}
for a local run, list the pod routers instead of a Service:
  - {pool: local, bundle: sglang, gpu_type: l4, endpoints: [http://127.0.0.1:9001]}

environment: SIE_GATEWAY_MAX_HELD (256), SIE_GATEWAY_HOLD_S (60), SIE_GATEWAY_RETRY_AFTER_S
(5), SIE_GATEWAY_SLOT_TARGET (4), SIE_GATEWAY_NAMESPACE, SIE_CONFIG_DIR, SIE_API_KEY,
SIE_MAX_BODY_BYTES, SIE_DRAIN_TIMEOUT_S (30); see README.md, "Gateway".
"""


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "gateway",
        help="run the gateway in front of every pool",
        description=(
            "Serve one endpoint for every pool x bundle of the pools file (SIE_GATEWAY_POOLS): "
            "pick the pool from X-SIE-Pool / X-SIE-MACHINE-PROFILE (what gpu= sends) or from "
            "what the model needs, and the pod that has the model; hold requests while a pool "
            "scales up from zero; GET /health is cluster health in SIE's shape."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_GATEWAY_PORT, help="port to listen on (8080)"
    )
    parser.add_argument(
        "--config-dir",
        type=Path,
        default=None,
        help="the shipped model configs (default SIE_CONFIG_DIR): which pools can serve a model",
    )
    parser.add_argument("--log-level", default="info", help="log level (info)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    if args.config_dir is not None:
        env["SIE_CONFIG_DIR"] = str(args.config_dir)
    try:
        settings = GatewaySettings.from_env(env)
    except GatewaySettingsError as exc:
        print(f"sie-worker gateway: {exc}", file=sys.stderr)
        return 2
    if settings.config_dir is not None and not settings.config_dir.is_dir():
        print(
            f"sie-worker gateway: config dir {settings.config_dir} is not a directory",
            file=sys.stderr,
        )
        return 2

    import uvicorn

    from sie_worker.gateway.app import create_gateway_app
    from sie_worker.http.server_protocol import http_protocol

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        app = create_gateway_app(settings)
    except PoolsFileError as exc:
        print(f"sie-worker gateway: {exc}", file=sys.stderr)
        return 2
    gateway = app.state.gateway
    logging.getLogger("sie_worker.gateway").info(
        "gateway for %s", ", ".join(str(s.key) for s in gateway.specs)
    )

    class _Server(uvicorn.Server):
        """On SIGTERM, answer held requests at once (drain), then let in-flight ones finish
        and exit 0 (uvicorn would re-raise the signal, ending the process with -15)."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            gateway.request_drain()
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM and sig in self._captured_signals:
                self._captured_signals.remove(sig)

    config = uvicorn.Config(
        app,
        http=http_protocol(),  # JSON 400s for requests that do not parse
        ws="none",  # why: no WebSocket route; auto would import wsproto on every start
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=int(settings.drain_timeout_s),
        timeout_keep_alive=75,
        access_log=False,
        log_config=None,
    )
    settle_heap()
    _Server(config).run()
    return 0
