"""The application factory of the sidecar API.

``create_app(settings, decoder=None, engine=None)`` builds the FastAPI app; its lifespan migrates
the schema (when ``database.upgrade_on_start``), starts the recorder (whose ``on_durable`` hook
feeds ``/metrics``), makes it the decoder's sink and starts the decoder worker and, with
``capture.share`` above 0, the prompt sample's writer; on shutdown it stops the worker, writes the
queued prompts and drains the recorder. Without a decoder, ingest and reads work and the decode
endpoints answer 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import AsyncIterator
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Final

import anyio.to_thread
from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from sqlalchemy.engine import Engine

from monitor.api import errors
from monitor.api.auth import TokenSet, require
from monitor.api.dates import DateMiddleware
from monitor.api.decoding import generate, openai_chat
from monitor.api.decoding.controller_state import STATE_FILE
from monitor.api.decoding.staging import follow_rollout
from monitor.api.decoding.worker import DecodeWorker
from monitor.api.events import EventBatchIn, EventIn
from monitor.api.ingest import routes as ingest
from monitor.api.ingest.adapters import MODELS
from monitor.api.limits import LimitsMiddleware
from monitor.api.reads import alerts, drift, health, rollouts, workloads
from monitor.api.reads import metrics as prometheus  # the module of /metrics; `metrics` below is its Metrics
from monitor.api.server import DrainMiddleware
from monitor.api.state import ApiState
from monitor.config import Settings
from monitor.ingest.capture.sidecar import PromptCapture
from monitor.ingest.recorder import Recorder
from monitor.proxy.engine_watch import watch as watch_engines
from monitor.proxy.forward import routes as forward
from monitor.proxy.rollout import announce_candidates, served_here
from monitor.proxy.routing import build_router, refresh_routes
from monitor.store import migrate
from monitor.store.engine import create_engine
from monitor.store.settings import DatabaseSettings

if TYPE_CHECKING:
    from decoder.speculation.speculative import SpeculativeDecoder

log = logging.getLogger(__name__)

SCHEMA_RETRY_S: Final = 5.0
SCHEMA_WAIT_S: Final = 5.0


def _version() -> str:
    try:
        return version("draftwatch")
    except PackageNotFoundError:  # running from a bare checkout
        return "0.0.0"


def create_app(
    settings: Settings,
    *,
    decoder: SpeculativeDecoder | None = None,
    engine: Engine | None = None,
    decode_seed: int = 0,
) -> FastAPI:
    """The sidecar API over ``settings`` (database, tokens, limits); ``decoder`` enables generation."""
    tokens = TokenSet(settings.api.tokens)
    metrics = prometheus.Metrics(version=_version())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        eng = engine or create_engine(settings.database.url)
        recorder = Recorder(eng, settings.recorder, on_durable=metrics.observe)
        state = ApiState(settings=settings, engine=eng, recorder=recorder, tokens=tokens, metrics=metrics)
        if eng.dialect.name == "sqlite":
            state.write_lock = threading.Lock()
        state.head_revision = migrate.head_revision()
        schema_task = None
        if settings.database.upgrade_on_start:
            # The start waits for the first attempt, but never long: a database that hangs (or comes up
            # later) must not hold the proxy or ingest, which spool meanwhile; the attempts go on.
            tried = asyncio.Event()
            schema_task = asyncio.create_task(_upgrade_until_done(eng, settings.database, tried))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tried.wait(), SCHEMA_WAIT_S)
            if not tried.is_set():
                log.warning("the database is not answering (the schema upgrade has not returned within %g s): serving "
                            "without it, records spool until it answers; the upgrade goes on in the background",
                            SCHEMA_WAIT_S)  # fmt: skip
        await anyio.to_thread.run_sync(recorder.start)
        if decoder is not None:
            decoder.sink = recorder.record
            state.worker = DecodeWorker(
                decoder,
                queue_size=settings.api.decode_queue_size,
                holdout=settings.holdout_policy,
                seed=decode_seed,
                state_path=settings.data_dir / STATE_FILE,
            ).start()
        staging: asyncio.Task[None] | None = None
        if decoder is not None and decoder.candidate is not None:  # staged by a rollout: decoding/staging.py
            staging = asyncio.create_task(follow_rollout(decoder, eng, settings.proxy.route_refresh_s))
        if settings.capture.share > 0:
            state.capture = PromptCapture(settings.capture).start()
            log.info("prompt sample on: %g of requests considered, kept in %s", settings.capture.share,
                     settings.capture.path)  # fmt: skip
        watcher: asyncio.Task[None] | None = None
        if settings.proxy.upstream:
            state.router = build_router(settings)
            routes = asyncio.create_task(refresh_routes(state.router, eng, settings.proxy.route_refresh_s))
            if settings.proxy.engine_watch_s > 0:
                pools = [
                    (d.settings.kind, p)
                    for d in state.router.deployments
                    for p in (d.speculative, d.baseline, d.candidate)
                ]
                members = [(m, kind) for kind, p in pools for m in p.members]
                watcher = asyncio.create_task(watch_engines(members, settings.proxy.engine_watch_s))
        # Where draftwatch rollout start, with settings of its own, finds the candidates this sidecar serves.
        embedded = settings.decoder.candidate if decoder is not None and decoder.candidate is not None else None
        candidates = served_here(settings.proxy, embedded)
        announcing = asyncio.create_task(announce_candidates(eng, candidates)) if candidates else None
        prometheus.watch(state)
        app.state.api = state
        try:
            yield
        finally:
            if schema_task is not None:
                schema_task.cancel()
            if staging is not None:
                staging.cancel()
            if announcing is not None:
                announcing.cancel()
            if state.worker is not None:
                await anyio.to_thread.run_sync(state.worker.stop)
            if watcher is not None:
                watcher.cancel()
            if state.router is not None:
                routes.cancel()
                await state.router.aclose()
            if state.capture is not None:
                await anyio.to_thread.run_sync(state.capture.close)
            await anyio.to_thread.run_sync(recorder.close)
            if engine is None:
                eng.dispose()

    # With tokens, only the probes answer without one: the API's description needs the read scope,
    # and the browser pages, which cannot send a token, are not served (docs/openapi.json is the same).
    open_docs = not tokens.enabled
    app = FastAPI(
        title="draftwatch sidecar API",
        version=_version(),
        summary="Ingest per-request speculative-decoding records, decode behind HTTP, expose metrics.",
        lifespan=lifespan,
        openapi_url="/openapi.json" if open_docs else None,
        docs_url="/docs" if open_docs else None,
        redoc_url="/redoc" if open_docs else None,
        # Its telemetry is /metrics. FastAPI's native OpenTelemetry would look for a configured provider on
        # every request, a few per cent of a proxied request's time, to find none.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    errors.install(app)
    if settings.proxy.upstream:  # inside the limits: a forwarded request's body is read there, under its own limit
        app.add_middleware(forward.ProxyMiddleware)
    app.add_middleware(
        LimitsMiddleware,
        max_body_bytes=settings.api.max_body_bytes,
        timeout_s=settings.api.request_timeout_s,
        # A proxied request waits on the upstream, under the proxy's own timeout, and has its own body limit.
        proxied=forward.proxied if settings.proxy.upstream else None,
        proxied_max_body_bytes=settings.proxy.max_body_bytes,
        body_timeout_s=settings.api.body_timeout_s,
        max_body_bytes_in_flight=settings.api.max_body_bytes_in_flight,
    )
    # Added last, so outermost: it also answers for an error in the limits middleware.
    app.add_middleware(errors.UnhandledErrorMiddleware)
    # Before any other, once SIGTERM came: /readyz answers 503 (monitor/api/server.py).
    app.add_middleware(DrainMiddleware)
    # Around even that: every answer has one Date (uvicorn's is off, see monitor/api/dates.py).
    app.add_middleware(DateMiddleware)
    # In proxy mode the stack's endpoints are the upstream's, the embedded decoder's chat included.
    served = (forward,) if settings.proxy.upstream else (generate, openai_chat)
    for module in (ingest, *served, workloads, health, prometheus, alerts, drift, rollouts):
        app.include_router(module.router)
    _document_bodies(app)
    if not open_docs:
        _guarded_openapi(app)
    return app


async def _upgrade(engine: Engine, database: DatabaseSettings) -> bool:
    try:
        # Abandoned on shutdown: a migration hung on a frozen database must not hold the event loop.
        upgrade = functools.partial(migrate.upgrade, engine, database=database)
        await anyio.to_thread.run_sync(upgrade, abandon_on_cancel=True)
    except Exception as error:  # the service still starts: it spools, and readyz reports the schema
        log.error("schema upgrade failed (%s); retrying in the background", str(error).splitlines()[0])
        return False
    return True


async def _upgrade_until_done(engine: Engine, database: DatabaseSettings, tried: asyncio.Event) -> None:
    """Upgrade the schema, retrying until it succeeds; ``tried`` is set once the first attempt ended."""
    failed = False
    while not await _upgrade(engine, database):
        failed = True
        tried.set()
        await asyncio.sleep(SCHEMA_RETRY_S)
    tried.set()
    if failed:
        log.info("schema upgrade succeeded")


def _document_bodies(app: FastAPI) -> None:
    """Add the hand-parsed request bodies' schemas to the OpenAPI components the routes refer to."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        models: list[type[BaseModel]] = [EventIn, EventBatchIn, *MODELS.values()]
        _, extra = models_json_schema([(m, "validation") for m in models], ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, definition in extra.get("$defs", {}).items():
            components.setdefault(name, definition)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _guarded_openapi(app: FastAPI) -> None:
    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(require("read"))])
    async def openapi_json() -> JSONResponse:
        return JSONResponse(app.openapi())


def openapi_document(app: FastAPI) -> str:
    """The OpenAPI document as committed in docs/openapi.json (sorted keys, two-space indent)."""
    import json

    return json.dumps(app.openapi(), indent=2, sort_keys=True) + "\n"
