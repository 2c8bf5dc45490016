"""Run the engine: start loading on the model thread, serve HTTP at once, exit on failure."""

from __future__ import annotations

import logging
from concurrent.futures import Future

from sie_worker.engines.transformers._app import create_app
from sie_worker.engines.transformers._device import StartupError
from sie_worker.engines.transformers._model_thread import ModelThread
from sie_worker.engines.transformers._options import EngineOptions
from sie_worker.engines.transformers._state import EngineState, load

__all__ = ["serve"]

_log = logging.getLogger("sie_worker.engines")
_SHUTDOWN_GRACE_S = 2


def serve(options: EngineOptions) -> int:
    """Serve until SIGINT/SIGTERM (exit 0) or a failed load (exit 1)."""
    import uvicorn

    state = EngineState(options)
    thread = ModelThread(options.threads)
    config = uvicorn.Config(
        create_app(state, thread),
        host=options.host,
        port=options.port,
        log_config=None,  # why: plain lines on stderr through the root logger
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=_SHUTDOWN_GRACE_S,
    )
    server = uvicorn.Server(config)

    def loaded(future: Future[None]) -> None:
        error = future.exception()
        if error is None:
            return
        state.status = "failed"
        state.error = str(error)
        if isinstance(error, StartupError | OSError):
            _log.error("cannot load the model: %s", error)
        else:
            _log.error("cannot load the model", exc_info=error)
        server.should_exit = True

    thread.submit(load, state).add_done_callback(loaded)
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits this way when it cannot bind the port
        return exc.code if isinstance(exc.code, int) else 1
    return 1 if state.status == "failed" else 0
