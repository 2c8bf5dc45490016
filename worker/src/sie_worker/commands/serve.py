"""``sie-worker serve``: run the worker until SIGTERM (then drain, stop engines, exit 0)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from sie_worker.commands._heap import settle_heap

__all__ = ["register", "run"]

_DESCRIPTION = """\
Run the worker. It reads the model configs in --config-dir (every *.yaml/*.yml/*.json
below it; hidden files are skipped), owns the devices in SIE_DEVICES, loads models on
demand (and the SIE_PINNED_MODELS at start) and serves the HTTP API on --host:--port.
A config that breaks a rule stops the start, with one line per problem.

Environment: SIE_DEVICES, SIE_BUNDLE, SIE_MODEL_READY_TIMEOUT_S,
SIE_SGLANG_GENERATE_READ_TIMEOUT_S, SIE_API_KEY, SIE_SGLANG_COMMAND, SIE_PINNED_MODELS,
SIE_WORKER_LIVENESS_BUDGET_S, SIE_CONFIG_DIR, SIE_CONFIG_API (read-write | read-only |
disabled), SIE_MAX_BODY_BYTES, SIE_DRAIN_TIMEOUT_S, SIE_ENGINE_STOP_GRACE_S,
SIE_WEIGHTS_DOWNLOAD (worker | engine).

Weights: a model without a local model_path is fetched from the Hugging Face Hub into the
cache (HF_HOME, HF_HUB_CACHE) before its engine starts, from HF_ENDPOINT with HF_TOKEN, and
the engine runs from the local snapshot; a snapshot complete in the cache needs no network
(HF_HUB_OFFLINE=1 allows nothing else). `sie-worker fetch` prefetches.
"""


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="run the worker",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config-dir",
        type=Path,
        default=None,
        help="folder of model configs (default: $SIE_CONFIG_DIR; none: no models)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (engine output is logged at info; the access log leaves out "
        "successful polls and probes below debug)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # httpx logs every request at info: the readiness polling of engines would flood the log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from sie_worker.http.access_log import quiet_polls

    quiet_polls(logging.getLevelNamesMapping()[args.log_level.upper()])
    from sie_worker.config.files.reader import load_config_dir
    from sie_worker.settings import Settings, SettingsError

    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as exc:
        print(f"sie-worker serve: {exc}", file=sys.stderr)
        return 1
    from sie_worker.engines.registry import family_of

    mismatch = family_of(settings.engine).release_mismatch(settings.bundle)
    if mismatch is not None:
        logging.getLogger("sie_worker").warning("%s", mismatch)
    config_dir = args.config_dir or settings.config_dir
    if config_dir is not None and not config_dir.is_dir():
        print(f"sie-worker serve: --config-dir {config_dir} is not a folder", file=sys.stderr)
        return 1
    settings = settings.with_overrides(config_dir=config_dir, host=args.host, port=args.port)
    configs, problems = load_config_dir(config_dir) if config_dir else ({}, [])
    if problems:
        for problem in sorted(problems):
            print(problem, file=sys.stderr)
        print(f"sie-worker serve: {len(problems)} problem(s) in {config_dir}", file=sys.stderr)
        return 1
    known = {s for c in configs.values() for s in _served_ids(c)}
    unknown = [m for m in settings.pinned_models if m not in known]
    if unknown:
        print(
            f"sie-worker serve: SIE_PINNED_MODELS names {', '.join(unknown)}, which no config "
            f"in {config_dir} serves; fix the list or add the config",
            file=sys.stderr,
        )
        return 1

    import uvicorn

    from sie_worker.http.server_protocol import http_protocol
    from sie_worker.worker.app import create_app

    class _Server(uvicorn.Server):
        """Exit 0 after a SIGTERM: it is how a pod is asked to stop (uvicorn would re-raise
        the signal once it has drained, ending the process with -15)."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM and sig in self._captured_signals:
                self._captured_signals.remove(sig)

    app = create_app(settings, configs)
    config = uvicorn.Config(
        app,
        http=http_protocol(),  # JSON 400s for requests that do not parse
        ws="none",  # why: no WebSocket route; auto would import wsproto on every start
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=int(settings.drain_timeout_s),
        # Above the 5 s idle expiry of httpx, the OpenAI SDK and the router's pools, so the
        # server never closes a connection a client is about to reuse.
        timeout_keep_alive=75,
        log_config=None,
    )
    settle_heap()
    _Server(config).run()
    # Non-zero when a group model's engine rank ended (sie_worker.worker.group_role).
    return int(app.state.manager.group.exit_status)


def _served_ids(config: Any) -> list[str]:
    from sie_worker.config.model import served_models

    return [s.id for s in served_models(config)]
