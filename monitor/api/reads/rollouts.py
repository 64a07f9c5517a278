"""Drafter rollouts over HTTP: list and read them (``read``), start, promote and abort them (``admin``).

The rollout is :mod:`monitor.proxy.rollout`'s, as ``draftwatch rollout`` drives it: ``POST /v1/rollouts``
starts one with the ``rollout.*`` settings, each field of the body overriding its setting, on a
deployment with a candidate pool (``proxy.candidate_upstream``, or a route's). A refusal says what
was wrong and what to do: a value that cannot be used is 422 naming its field, a rollout's or the
configuration's state that forbids it 409, an unknown id 404.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Body, Depends, Query, Request
from pydantic import BaseModel, Field, StrictBool, StrictFloat, StrictInt, StrictStr
from sqlalchemy.engine import Engine

from monitor.api.auth import GuardedRoute, require
from monitor.api.errors import BODY_TOO_LARGE, NOT_JSON, ApiError, Problem, described, validation_error
from monitor.api.reads.alerts import RowId
from monitor.api.state import api_state
from monitor.proxy.rollout import RolloutError, abort, promote, start_rollout
from monitor.proxy.settings import parse_steps
from monitor.settings.parsers import parse_duration
from monitor.store.rollouts import MAX_DRAFTER, STATUSES, Rollout, get_rollout, rollout_events, rollouts

router = APIRouter(tags=["rollouts"], route_class=GuardedRoute)
reading, administering = require("read"), require("admin")
read, admin = [Depends(reading)], [Depends(administering)]
Status = Literal["running", "promoted", "rolled_back", "aborted"]
NOT_FOUND: Final = "no rollout has this id"
ENDED: Final = "the rollout has ended (rolled back or aborted)"


class RolloutIn(BaseModel):
    """A rollout to start; a field left out takes its ``rollout.*`` setting (the route: the default deployment)."""

    route: StrictInt | None = Field(
        default=None, ge=1,
        description="the deployment of the Nth [[proxy.routes]] table (1 is the first); default: the default "
        "deployment (proxy.candidate_upstream)",
    )  # fmt: skip
    candidate: StrictStr | None = Field(
        default=None, min_length=1, max_length=2048,
        description="a URL that must be in the deployment's candidate pool (the share goes to the whole pool)",
    )  # fmt: skip
    steps: list[StrictFloat] | None = Field(
        default=None, min_length=1, max_length=100,
        description="the candidate's share of the speculative requests at each step, in percent, rising to 100, "
        "such as [5, 25, 50, 100] (rollout.steps)",
    )  # fmt: skip
    interval: StrictStr | StrictFloat | None = Field(
        default=None, description="how long a step lasts: a duration such as 30m or 2h, or seconds (rollout.interval)"
    )
    per_workload: StrictBool | None = Field(
        default=None, description="keep a failing workload on the current drafter and go on (rollout.per_workload)"
    )
    drafter: StrictStr | None = Field(
        default=None, min_length=1, max_length=MAX_DRAFTER,
        description="the name the candidate's requests are stored under, such as eagle3-v2 (rollout.drafter)",
    )  # fmt: skip


class AbortIn(BaseModel):
    reason: str = Field(default="aborted by hand", min_length=1, max_length=1024, description="why, kept with it")


def _problem(field: str, message: str) -> ApiError:
    return validation_error([Problem(loc=["body", field], msg=message, type="value_error")])


@router.get(
    "/v1/rollouts",
    dependencies=read,
    responses={**reading.responses, **described({422: "invalid query parameters"})},
    summary="drafter rollouts, newest first, each with the judge's newest judgement per workload",
)
def get_rollouts(
    request: Request,
    status: Annotated[list[Status] | None, Query(description="repeatable; default: all")] = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 100,
) -> dict[str, Any]:
    found = rollouts(api_state(request).engine, status=status or STATUSES, limit=limit)
    return {"rollouts": [r.to_json() for r in found]}


@router.get(
    "/v1/rollouts/{rollout_id}",
    dependencies=read,
    responses={**reading.responses, **described({404: NOT_FOUND, 422: "the id is not a positive integer"})},
    summary="one rollout and its events (steps, holds, kept workloads, the end), oldest first",
)
def get_one_rollout(request: Request, rollout_id: RowId) -> dict[str, Any]:
    engine = api_state(request).engine
    with engine.connect() as conn:  # one snapshot: the rollout and its events agree
        rollout = get_rollout(conn, rollout_id)
        if rollout is None:
            raise ApiError(404, "not_found", f"no rollout {rollout_id}: GET /v1/rollouts lists them")
        events = rollout_events(conn, rollout_id=rollout_id)
    return {**rollout.to_json(), "events": [e.to_json() for e in events]}


@router.post(
    "/v1/rollouts",
    dependencies=admin,
    status_code=201,
    responses={
        **administering.responses,
        **described({
            400: NOT_JSON,
            409: "the deployment has no candidate pool, or a running or promoted rollout already",
            413: BODY_TOO_LARGE,
            422: "a value of the body is invalid or cannot be used (loc names it)",
        }),
    },
    summary="start a rollout of the candidate drafter; the body's fields override the rollout.* settings",
)  # fmt: skip
def post_rollout(request: Request, body: Annotated[RolloutIn | None, Body()] = None) -> dict[str, Any]:
    state = api_state(request)
    body = body or RolloutIn()
    changes: dict[str, Any] = {}
    for field, parse, value in (("steps", parse_steps, body.steps), ("interval", parse_duration, body.interval)):
        if value is not None:
            try:
                changes[field] = parse(value)
            except ValueError as error:
                raise _problem(field, str(error)) from None
    if body.per_workload is not None:
        changes["per_workload"] = body.per_workload
    if body.drafter is not None:
        changes["drafter"] = body.drafter
    settings = dataclasses.replace(state.settings.rollout, **changes)
    try:
        rollout = start_rollout(state.engine, state.settings.proxy, settings, datetime.now(UTC), route=body.route,
                                candidate=body.candidate, embedded=state.settings.decoder.candidate)  # fmt: skip
    except RolloutError as error:
        if error.field is not None:
            raise _problem(error.field, str(error)) from None
        raise ApiError(409, error.code, str(error)) from None
    return rollout.to_json()


@router.post(
    "/v1/rollouts/{rollout_id}/promote",
    dependencies=admin,
    responses={**administering.responses, **described({404: NOT_FOUND, 409: "the rollout is not running"})},
    summary="promote a running rollout now: the candidate serves every workload not kept on the current drafter",
)
def post_promote(request: Request, rollout_id: RowId) -> dict[str, Any]:
    return _finish(request, rollout_id, lambda engine, now: promote(engine, rollout_id, now))


@router.post(
    "/v1/rollouts/{rollout_id}/abort",
    dependencies=admin,
    responses={
        **administering.responses,
        **described({400: NOT_JSON, 404: NOT_FOUND, 409: ENDED, 413: BODY_TOO_LARGE}),
    },
    summary="end a running or promoted rollout: every request to the current drafter again",
)
def post_abort(request: Request, rollout_id: RowId, body: Annotated[AbortIn | None, Body()] = None) -> dict[str, Any]:
    reason = (body or AbortIn()).reason
    return _finish(request, rollout_id, lambda engine, now: abort(engine, rollout_id, now, reason))


def _finish(request: Request, rollout_id: int, act: Callable[[Engine, datetime], Rollout]) -> dict[str, Any]:
    engine = api_state(request).engine
    try:
        done = act(engine, datetime.now(UTC))
    except RolloutError as error:
        raise ApiError(404 if error.code == "not_found" else 409, error.code, str(error)) from None
    return done.to_json()
