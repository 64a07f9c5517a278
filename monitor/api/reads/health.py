"""Liveness and readiness: ``GET /healthz`` and ``GET /readyz``, unauthenticated (a load balancer asks them)."""

from __future__ import annotations

import asyncio
from typing import Any, Final

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import text

from monitor.api.auth import GuardedRoute
from monitor.api.state import ApiState, api_state
from monitor.store.migrate import current_revision

router = APIRouter(tags=["read"], route_class=GuardedRoute)

UPSTREAM_PROBE_S: Final = 1.0  # readiness: how long an upstream has to take a connection


class Health(BaseModel):
    status: str
    checks: dict[str, Any] = {}


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
async def healthz(request: Request) -> Health:
    state = api_state(request)
    if state.router is None:
        return Health(status="ok")
    # Proxy mode: the database's health is a figure of its own, never a reason to restart the proxy.
    # Read on the event loop that forwards every request: stats() takes no lock held across a disk write.
    stats = state.recorder.stats()
    database = {"ok": stats.database_available, "hung": stats.database_hung, "spool_pending": stats.spool_pending}
    members = list(state.router.members())
    # The replicas passive health has taken out of their pools (proxy.eject_after), by host:port.
    out = [m.upstream.netloc for m in members if not m.up]
    return Health(status="ok", checks={"database": database, "upstreams": {"members": len(members), "out": out}})


@router.get(
    "/readyz",
    response_model=Health,
    responses={503: {"model": Health, "description": "not ready; checks say why"}},
    summary="Readiness: database reachable, schema at head, recorder not backed up",
)
async def readyz(request: Request) -> JSONResponse:
    state = api_state(request)
    if state.draining:  # SIGTERM: out of the load balancer first, while requests are still served
        body = Health(status="not_ready", checks={"shutdown": {"ok": False, "draining": True}})
        return JSONResponse(body.model_dump(), status_code=503, headers={"connection": "close"})
    if state.router is not None:
        checks = await proxy_readiness(state)
    else:
        checks = await anyio.to_thread.run_sync(lambda: readiness(state))
    ready = all(check["ok"] for check in checks.values())
    body = Health(status="ready" if ready else "not_ready", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


async def proxy_readiness(state: ApiState) -> dict[str, dict[str, Any]]:
    """Proxy mode: ready while a speculative pool's replica takes connections, whatever the database does.

    A proxy that forwards must stay behind its load balancer while the monitor's database is away
    or hangs (records spool meanwhile; ``/healthz`` and ``/metrics`` say how the database is), so
    the database is not asked here, and nothing here waits on it.
    """
    assert state.router is not None
    members = [m for d in state.router.deployments for m in d.speculative.members]
    answers = await asyncio.gather(*(m.upstream.reachable(UPSTREAM_PROBE_S) for m in members))
    return {"upstream": {"ok": any(answers), "reachable": sum(answers), "members": len(members)}}


def readiness(state: ApiState) -> dict[str, dict[str, Any]]:
    checks: dict[str, dict[str, Any]] = {}
    try:
        with state.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        revision = current_revision(state.engine)
        checks["database"] = {"ok": True}
        checks["schema"] = {"ok": revision == state.head_revision, "revision": revision, "head": state.head_revision}
    except Exception as error:  # reported, not raised: this is what readiness is for
        checks["database"] = {"ok": False, "error": type(error).__name__}
        checks["schema"] = {"ok": False, "revision": None, "head": state.head_revision}
    stats = state.recorder.stats()
    limit = state.settings.recorder.queue_size
    backed_up = stats.spool_pending or stats.queued >= 0.9 * limit
    checks["recorder"] = {"ok": not backed_up, "queued": stats.queued, "spool_pending": stats.spool_pending}
    return checks
