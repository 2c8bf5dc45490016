"""`sie-worker serve` (minimal: answers /healthz; the worker issue grows it)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("serve", help="run the worker")
    parser.add_argument("--config-dir", default=None)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    app = Starlette(routes=[Route("/healthz", healthz)])
    uvicorn.run(app, host=args.host, port=args.port)
    return 0
