"""Per-workload aggregates and series (``GET /v1/workloads``, ``/v1/workloads/{tag}/series``) and the ``read`` guard
the other reads share (liveness and readiness: health.py; ``/metrics``: metrics.py)."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Final, Literal

import anyio.to_thread
from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel

from decoder.record import WORKLOAD_PATTERN, Mode
from monitor.api.auth import GuardedRoute, require
from monitor.api.errors import Problem, described, off_calendar, validation_error
from monitor.api.state import api_state
from monitor.drift.verdict import NOT_TESTED, Verdict, busiest, latest_verdicts
from monitor.store import scrape
from monitor.store.reads import queries
from monitor.store.rollups import minute_after, minute_of
from monitor.store.routing import RoutingEvent, latest_routing

router = APIRouter(tags=["read"], route_class=GuardedRoute)
guard = require("read")
# Typed, because metrics.py reads both inside an import cycle (through state.py) where mypy cannot infer them.
read: Final[list[Any]] = [Depends(guard)]

DEFAULT_RANGE: Final = timedelta(hours=1)
MAX_POINTS: Final = 10_000
SeriesMetric = Literal[
    "requests",
    "acceptance_rate_tokens",
    "acceptance_rate_requests",
    "mean_acceptance_length",
    "ms_per_token_mean",
    "ms_per_token_p95",
    "tokens_per_second",
]
_STEP: Final = re.compile(r"^(\d{1,6})([mhd]?)$")
READ_ERRORS: Final[dict[int | str, dict[str, Any]]] = {
    **guard.responses,
    **described({422: "invalid query parameters"}),
}


def _range(since: datetime | None, until: datetime | None) -> tuple[datetime, datetime]:
    """The whole minutes that cover ``[since, until)``: rollups are per minute, so that is what is read.

    The response carries this range, so a caller sees the rounding rather than guessing it.
    """
    try:
        end = minute_after(_aware(until) if until is not None else datetime.now(UTC))
    except OverflowError:
        raise off_calendar(("query", "until")) from None
    try:
        start = minute_of(_aware(since)) if since is not None else end - DEFAULT_RANGE
    except OverflowError:
        raise off_calendar(("query", "since" if since is not None else "until")) from None
    if start >= end:
        raise validation_error([Problem(loc=["query", "since"], msg="must be before until", type="value_error")])
    return start, end


def _aware(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def parse_step(step: str) -> timedelta:
    """``5`` or ``5m`` (minutes), ``2h``, ``1d``: a whole number of minutes, as the rollups hold.

    >>> parse_step("90"), parse_step("2h")
    (datetime.timedelta(seconds=5400), datetime.timedelta(seconds=7200))
    """
    match = _STEP.match(step.strip())
    if not match or int(match.group(1)) == 0:
        raise validation_error(
            [Problem(loc=["query", "step"], msg="expected whole minutes like 1m, 15m, 2h or 1d", type="value_error")]
        )
    factor = {"": 1, "m": 1, "h": 60, "d": 1440}[match.group(2)]
    return timedelta(minutes=int(match.group(1)) * factor)


class WorkloadsOut(BaseModel):
    since: datetime
    until: datetime
    workloads: list[dict[str, Any]]
    # Scrape mode: aggregate figures per target and series (the unit is the interval), and each target's health.
    scraped: list[dict[str, Any]] = []
    scrape_targets: list[dict[str, Any]] = []


class SeriesOut(BaseModel):
    workload: str
    since: datetime
    until: datetime
    step_s: int
    metric: str | None
    points: list[dict[str, Any]]


@router.get("/v1/workloads", dependencies=read, response_model=WorkloadsOut, responses=READ_ERRORS)
async def workloads(
    request: Request,
    since: datetime | None = None,
    until: datetime | None = None,
    mode: Mode | None = None,
) -> WorkloadsOut:
    """Per-workload aggregates over ``[since, until)`` (default: the last hour), from the store's rollups.

    ``scraped`` holds the scrape-mode series (aggregate, per target; the unit is the interval) and
    ``scrape_targets`` each target's health."""
    start, end = _range(since, until)
    engine = api_state(request).engine
    found = await anyio.to_thread.run_sync(lambda: queries.workload_summaries(engine, start, end, mode=mode))
    aggregate = await anyio.to_thread.run_sync(lambda: scrape.scraped_summaries(engine, start, end))
    health = await anyio.to_thread.run_sync(lambda: scrape.target_health(engine))
    verdicts = await anyio.to_thread.run_sync(lambda: latest_verdicts(engine))
    routes = await anyio.to_thread.run_sync(lambda: latest_routing(engine))
    return WorkloadsOut(
        since=start,
        until=end,
        workloads=[{**dataclasses.asdict(s), **_verdict_fields(s.workload, verdicts, routes)} for s in found],
        scraped=[dataclasses.asdict(s) for s in aggregate],
        scrape_targets=[dataclasses.asdict(t) for t in health],
    )


def _verdict_fields(workload: str, verdicts: list[Verdict], routes: dict[str, RoutingEvent]) -> dict[str, Any]:
    """Is speculation paying here: the newest drift run's verdict (the busiest pair's, every pair's), the routing."""
    mine = [v for v in verdicts if v.workload == workload]
    main = busiest(mine).get(workload) or Verdict(workload, None, "not_measured", NOT_TESTED)
    route = routes.get(workload)
    return {
        "verdict": main.to_json(),
        "verdicts": [v.to_json() for v in mine],
        "routed_to_baseline": bool(route and route.routed),
        # Routed by load: plain from this many in flight on the speculative replica, speculative below (else null).
        "routed_above_inflight": route.above_inflight if route is not None else None,
    }


class RouteOut(BaseModel):
    workload: str
    routed: bool  # True: to the plain baseline; False: back to speculation
    # Routed by load: to the plain baseline only from this many requests in flight on the speculative replica.
    above_inflight: int | None = None
    ts: datetime  # when the drift run made the switch
    target_model: str
    reason: str
    speedup: float | None
    ci_low: float | None
    ci_high: float | None


class RoutesOut(BaseModel):
    routes: list[RouteOut]


@router.get("/v1/routes", dependencies=read, response_model=RoutesOut, responses=READ_ERRORS)
async def routes(request: Request) -> RoutesOut:
    """Each workload's latest routing switch, however long ago (``routed``: now sent to the plain baseline).

    What a gateway acting on draftwatch's decisions reads (the LiteLLM integration; ``draftwatch routes
    export`` reads the store): unlike ``/v1/workloads``, it lists a routed workload that sent nothing lately.
    """
    engine = api_state(request).engine
    latest = await anyio.to_thread.run_sync(lambda: latest_routing(engine))
    return RoutesOut(routes=[RouteOut(**dataclasses.asdict(event)) for _, event in sorted(latest.items())])


@router.get("/v1/workloads/{tag}/series", dependencies=read, response_model=SeriesOut, responses=READ_ERRORS)
async def series(
    request: Request,
    tag: Annotated[str, Path(max_length=64, pattern=WORKLOAD_PATTERN.pattern)],
    since: datetime | None = None,
    until: datetime | None = None,
    step: Annotated[str, Query(max_length=12)] = "1m",
    metric: SeriesMetric | None = None,
    mode: Mode | None = None,
) -> SeriesOut:
    """One point per ``step`` that has records; with ``metric``, points are ``{bucket, value}``."""
    start, end = _range(since, until)
    delta = parse_step(step)
    if (end - start) / delta > MAX_POINTS:
        raise validation_error(
            [Problem(loc=["query", "step"], msg=f"more than {MAX_POINTS} points: widen step", type="value_error")]
        )
    engine = api_state(request).engine
    points = await anyio.to_thread.run_sync(lambda: queries.time_series(engine, tag, start, end, step=delta, mode=mode))
    rows = [dataclasses.asdict(p) for p in points]
    if metric is not None:
        rows = [{"bucket": row["bucket"], "value": row[metric]} for row in rows]
    return SeriesOut(
        workload=tag, since=start, until=end, step_s=int(delta.total_seconds()), metric=metric, points=rows
    )
