"""Alerts, silences, notifications and job history over HTTP.

``GET /v1/alerts`` and ``GET /v1/jobs`` and ``GET /v1/notifications`` need the ``read`` scope;
``POST /v1/alerts/{id}/ack`` and everything under ``/v1/silences`` need ``admin``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, Field

from monitor.alerts import queries
from monitor.alerts.silences import create_silence, expire_silence, list_silences
from monitor.api.auth import GuardedRoute, require
from monitor.api.errors import BODY_TOO_LARGE, NOT_JSON, ApiError, Problem, described, off_calendar, validation_error
from monitor.api.state import api_state
from monitor.scheduler.history import list_jobs

router = APIRouter(tags=["alerts"], route_class=GuardedRoute)
reading, administering = require("read"), require("admin")
read, admin = [Depends(reading)], [Depends(administering)]
AlertState = Literal["pending", "firing", "resolved", "inactive"]
# Ids are BIGINT: a larger one is malformed (422), not merely absent, and could not even be looked up.
MAX_ID: Final = 2**63 - 1
RowId = Annotated[int, Path(ge=1, le=MAX_ID)]


class AckIn(BaseModel):
    by: str = Field("api", min_length=1, max_length=200, description="who acknowledges")
    comment: str = Field("", max_length=2000)


class MatcherIn(BaseModel):
    name: str = Field(min_length=1, max_length=100)
    value: str = Field(max_length=1000)
    regex: bool = False
    equal: bool = True


class SilenceIn(BaseModel):
    matchers: list[MatcherIn] = Field(min_length=1, max_length=50)
    starts_at: datetime | None = Field(None, description="default: now")
    ends_at: datetime
    created_by: str = Field(min_length=1, max_length=200)
    comment: str = Field(min_length=1, max_length=2000)


def _utc(value: datetime, field: str) -> datetime:
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:00-05:00 is a valid time, but past the calendar in UTC
        raise off_calendar(("body", field)) from None


@router.get("/v1/alerts", dependencies=read, responses=reading.responses, summary="alerts, firing first")
def get_alerts(
    request: Request,
    state: Annotated[list[AlertState] | None, Query(description="repeatable; default: all")] = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> dict[str, Any]:
    engine = api_state(request).engine
    return {"alerts": [a.to_json() for a in queries.list_alerts(engine, state or (), limit=limit)]}


@router.post(
    "/v1/alerts/{alert_id}/ack",
    dependencies=admin,
    responses={
        **administering.responses,
        **described(
            {400: NOT_JSON, 404: "no alert has this id", 409: "the alert is resolved or inactive", 413: BODY_TOO_LARGE}
        ),
    },
    summary="acknowledge an alert: no repeats",
)
def ack_alert(request: Request, alert_id: RowId, body: AckIn) -> dict[str, Any]:
    alert = queries.acknowledge(api_state(request).engine, alert_id, body.by, body.comment, datetime.now(UTC))
    if alert is None:
        raise ApiError(404, "not_found", f"no alert {alert_id}")
    if not alert.acknowledged:
        raise ApiError(409, "not_active", f"alert {alert_id} is {alert.state}: only pending or firing alerts")
    return alert.to_json()


@router.get(
    "/v1/silences",
    dependencies=admin,
    responses=administering.responses,
    summary="silences (active and future; ?expired=true: also ended)",
)
def get_silences(request: Request, expired: bool = False) -> dict[str, Any]:
    now = datetime.now(UTC)
    found = list_silences(api_state(request).engine, now, include_expired=expired)
    return {"silences": [s.to_json(now) for s in found]}


@router.post(
    "/v1/silences",
    dependencies=admin,
    status_code=201,
    responses={**administering.responses, **described({400: NOT_JSON, 413: BODY_TOO_LARGE})},
    summary="create a silence",
)
def post_silence(request: Request, body: SilenceIn) -> dict[str, Any]:
    now = datetime.now(UTC)
    starts = _utc(body.starts_at, "starts_at") if body.starts_at else now
    ends = _utc(body.ends_at, "ends_at")
    try:
        silence = create_silence(
            api_state(request).engine,
            [m.model_dump() for m in body.matchers],
            starts,
            ends,
            body.created_by,
            body.comment,
            now,
        )
    except ValueError as error:
        raise validation_error([Problem(loc=["body"], msg=str(error), type="value_error")]) from None
    return silence.to_json(now)


@router.delete(
    "/v1/silences/{silence_id}",
    dependencies=admin,
    responses={**administering.responses, **described({404: "no active or future silence has this id"})},
    summary="end a silence now",
)
def delete_silence(request: Request, silence_id: RowId) -> dict[str, Any]:
    if not expire_silence(api_state(request).engine, silence_id, datetime.now(UTC)):
        raise ApiError(404, "not_found", f"no active or future silence {silence_id}")
    return {"id": silence_id, "expired": True}


@router.get(
    "/v1/notifications",
    dependencies=read,
    responses=reading.responses,
    summary="webhook outbox; status=dead lists dead letters",
)
def get_notifications(
    request: Request,
    status: Literal["pending", "delivered", "dead"] | None = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 200,
) -> dict[str, Any]:
    found = queries.list_notifications(api_state(request).engine, None if status is None else [status], limit=limit)
    return {"notifications": [n.to_json() for n in found]}


@router.get(
    "/v1/jobs", dependencies=read, responses=reading.responses, summary="scheduler job history and the leader lease"
)
def get_jobs(
    request: Request, job: str | None = None, limit: Annotated[int, Query(ge=1, le=5000)] = 100
) -> dict[str, Any]:
    return list_jobs(api_state(request).engine, job=job, limit=limit)
