"""``GET /v1/drift`` (``read`` scope): the latest (or one) run's results, filtered, its acceptance and speed splits."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request

from monitor.api.auth import GuardedRoute, require
from monitor.api.state import api_state
from monitor.drift.queries import latest_results, latest_run, run_splits

router = APIRouter(tags=["drift"], route_class=GuardedRoute)
guard = require("read")
Decision = Literal["drift", "no_drift", "insufficient_data"]


@router.get(
    "/v1/drift", dependencies=[Depends(guard)], responses=guard.responses, summary="drift results of the latest run"
)
def get_drift(
    request: Request,
    run_id: Annotated[str | None, Query(max_length=64, description="default: the newest run")] = None,
    workload: Annotated[str | None, Query(max_length=64)] = None,
    test: Annotated[str | None, Query(max_length=64)] = None,
    metric: Annotated[str | None, Query(max_length=64)] = None,
    pair: Annotated[str | None, Query(max_length=300)] = None,
    decision: Decision | None = None,
) -> dict[str, Any]:
    engine = api_state(request).engine
    if run_id is None:  # resolve the run once, so that the id and the results agree
        newest = latest_run(engine)
        if newest is None:
            return {"run_id": None, "results": [], "acceptance_split": None, "speed_split": None}
        run_id = newest.run_id
    results = latest_results(
        engine, run_id=run_id, workload=workload, test=test, metric=metric, pair=pair, decision=decision
    )
    results_json = [stored.to_json() for stored in results]
    acceptance, speed = run_splits(engine, run_id)
    return {"run_id": run_id, "results": results_json, "acceptance_split": acceptance, "speed_split": speed}
