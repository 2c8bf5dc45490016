"""The worker's HTTP app: ``create_app(settings, configs)`` wires routes, middleware, errors."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sie_worker.config.lora_choice import check_adapter
from sie_worker.config.model import ModelConfig, served_models
from sie_worker.errors import UnknownModel
from sie_worker.http.app_shell import app_shell
from sie_worker.http.transport import hop_client
from sie_worker.settings import Settings
from sie_worker.sie_api.ids import resolve_model_id, split_model
from sie_worker.sie_api.models import model_detail, model_info, model_infos
from sie_worker.worker import openapi
from sie_worker.worker.config_store import ConfigStore, parse_body, plain
from sie_worker.worker.engine_metrics import engine_metrics
from sie_worker.worker.inference import SIE_PATHS, openai_request, sie_request
from sie_worker.worker.manager import ModelManager
from sie_worker.worker.metrics import WorkerMetrics
from sie_worker.worker.placement.memory import device_memory
from sie_worker.worker.records import ModelRecord, adapter_entries
from sie_worker.worker.request import ENDPOINT_TASKS

__all__ = ["create_app"]

_log = logging.getLogger("sie_worker.app")


def create_app(
    settings: Settings,
    configs: Mapping[str, ModelConfig] | None = None,
    *,
    client: httpx.AsyncClient | None = None,
    base_env: Mapping[str, str] | None = None,
) -> Starlette:
    """Build the worker app. ``configs`` are the model configs read at start (by sie_id)."""
    configs = dict(configs or {})
    environ = os.environ if base_env is None else base_env
    memory = device_memory(settings, environ)
    metrics = WorkerMetrics(settings.devices, memory.totals, memory.budgets())
    store = ConfigStore(settings.config_dir, settings.config_api)
    store.remember(configs)
    owns_client = client is None
    # The worker's own calls to its engines (readiness, metrics, LoRA loads) go through the
    # same client as their requests (sie_worker.http.upstream), on kept-alive connections.
    http = client or hop_client(httpx.Timeout(5.0))
    manager = ModelManager(settings, http, metrics, configs, base_env=environ, memory=memory)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for path in store.remove_stale_temp_files():
            _log.warning("removed a config temp file left by an interrupted write: %s", path)
        manager.start()
        try:
            yield
        finally:
            await manager.shutdown()
            if owns_client:
                await http.aclose()

    routes = [
        # The hot routes first: Starlette tries routes in order, and these paths are exact.
        *[Route(path, openai_request, methods=["POST"]) for path in ENDPOINT_TASKS],
        Route("/healthz", _healthz, methods=["GET"]),
        Route("/readyz", _readyz, methods=["GET"]),
        Route("/metrics", _metrics, methods=["GET"]),
        Route("/openapi.json", _openapi, methods=["GET"]),
        Route("/v1/models", _list_models, methods=["GET"]),
        Route("/v1/devices", _list_devices, methods=["GET"]),
        Route("/v1/models/{model_id:path}/load", _load, methods=["POST"]),
        Route("/v1/models/{model_id:path}/unload", _unload, methods=["POST"]),
        Route("/v1/models/{model_id:path}/pin", _pin, methods=["POST"]),
        Route("/v1/models/{model_id:path}/unpin", _unpin, methods=["POST"]),
        Route("/v1/models/{model_id:path}", _get_model, methods=["GET"]),
        *[Route(path, sie_request, methods=["POST"]) for path in SIE_PATHS.values()],
        Route("/v1/configs", _list_configs, methods=["GET"]),
        Route("/v1/configs/{sie_id:path}", _get_config, methods=["GET"]),
        Route("/v1/configs/{sie_id:path}", _put_config, methods=["PUT"]),
        Route("/v1/configs/{sie_id:path}", _delete_config, methods=["DELETE"]),
    ]
    app = app_shell(routes, settings, lifespan)
    app.state.settings = settings
    app.state.manager = manager
    app.state.store = store
    app.state.metrics = metrics
    app.state.http = http
    return app


# --- probes and metrics ------------------------------------------------------------------


async def _healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def _readyz(request: Request) -> Response:
    manager: ModelManager = request.app.state.manager
    rank = manager.group.probe_fields()  # a rank of a group of nodes says which
    if manager.ready:
        return JSONResponse({"status": "ready", **rank})
    waiting = [r.id for r in manager.records.values() if r.pinned and r.state != "ready"]
    return JSONResponse({"status": "not ready", "waiting_for": waiting, **rank}, status_code=503)


async def _metrics(request: Request) -> Response:
    """The worker's own and model-server series, then its engines' (labelled by model)."""
    metrics: WorkerMetrics = request.app.state.metrics
    engines = await engine_metrics(request.app.state.http, _manager(request).metric_sources())
    return Response(
        metrics.render(engines.loads) + engines.text,
        media_type="text/plain; version=0.0.4; charset=utf-8",
    )


async def _openapi(request: Request) -> Response:
    return JSONResponse(openapi.spec())


# --- models and devices ------------------------------------------------------------------


def _manager(request: Request) -> ModelManager:
    manager: ModelManager = request.app.state.manager
    return manager


def _states(manager: ModelManager) -> dict[str, tuple[Any, str | None]]:
    return {r.id: (r.state, r.error) for r in manager.records.values()}


async def _list_models(request: Request) -> Response:
    """OpenAI's ``data`` (one entry per served model) and SIE's ``models`` (per config)."""
    manager = _manager(request)
    infos = model_infos(manager.configs().values(), _states(manager))
    return JSONResponse({"object": "list", "data": manager.model_entries(), "models": infos})


async def _get_model(request: Request) -> Response:
    """One served model: its entry and its config's SIE ModelInfo (ids resolve as SIE's)."""
    manager = _manager(request)
    asked = request.path_params["model_id"]
    model_id = resolve_model_id(asked, manager.records)
    split = split_model(asked, manager.records) if model_id is None else None
    record: ModelRecord = manager.record(split[0] if split else model_id or asked)
    info = model_info(record.served.config, _states(manager))
    entry = manager.model_entry(record)
    if split is not None:  # a LoRA adapter: its own entry, with its base's SIE info
        check_adapter(record.served, split[1], param="model")
        wanted = f"{record.id}:{split[1]}"
        entry = next(e for e in adapter_entries(record, entry) if e["id"] == wanted)
    return JSONResponse(model_detail(entry, info))


async def _list_devices(request: Request) -> Response:
    return JSONResponse({"devices": _manager(request).device_entries()})


async def _load(request: Request) -> Response:
    return JSONResponse(await _manager(request).load(request.path_params["model_id"]))


async def _unload(request: Request) -> Response:
    return JSONResponse(await _manager(request).unload(request.path_params["model_id"]))


async def _pin(request: Request) -> Response:
    return JSONResponse(await _manager(request).pin(request.path_params["model_id"]))


async def _unpin(request: Request) -> Response:
    return JSONResponse(await _manager(request).unpin(request.path_params["model_id"]))


# --- Config API --------------------------------------------------------------------------


def _store(request: Request) -> ConfigStore:
    store: ConfigStore = request.app.state.store
    return store


def _config_entry(manager: ModelManager, store: ConfigStore, config: ModelConfig) -> dict[str, Any]:
    path = store.paths.get(config.sie_id)
    return {
        "id": config.sie_id,
        "object": "config",
        "file": str(path) if path else None,
        "models": [s.id for s in served_models(config)],
    }


async def _list_configs(request: Request) -> Response:
    store = _store(request)
    store.check_readable()
    manager = _manager(request)
    data = [_config_entry(manager, store, c) for c in manager.configs().values()]
    return JSONResponse({"object": "list", "data": data})


async def _get_config(request: Request) -> Response:
    store = _store(request)
    store.check_readable()
    sie_id = request.path_params["sie_id"]
    config = _manager(request).configs().get(sie_id)
    if config is None:
        raise UnknownModel(f"no config with id {sie_id!r}; GET /v1/configs lists them")
    return JSONResponse(plain(config.raw))


async def _put_config(request: Request) -> Response:
    store = _store(request)
    store.check_writable()
    sie_id = request.path_params["sie_id"]
    # The file it goes to (ids that cannot name a file are refused before the body is read);
    # a relative model_path in the body resolves against that file's folder.
    target = store.paths.get(sie_id) or store.path_for(sie_id)
    body = await request.body()
    config, media = parse_body(
        body, request.headers.get("content-type", ""), base_dir=target.parent
    )
    created = await store.write(sie_id, config, body, media)
    manager = _manager(request)
    await manager.apply_config(config)
    return JSONResponse(_config_entry(manager, store, config), status_code=201 if created else 200)


async def _delete_config(request: Request) -> Response:
    store = _store(request)
    sie_id = request.path_params["sie_id"]
    await store.delete(sie_id)
    await _manager(request).remove_config(sie_id)
    return JSONResponse({"id": sie_id, "object": "config", "deleted": True})
