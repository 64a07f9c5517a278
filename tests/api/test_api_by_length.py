"""Acceptance by length through the real app: /v1/events takes the span counts (bounded, held to the
totals), /v1/workloads returns the breakdowns by prompt length and output position; both databases."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import INGEST, READ, auth, bodies, recent, records, stored


def spanned(i: int, prompt_tokens: int, drafted: list[int] | None, accepted: list[int] | None) -> dict[str, Any]:
    body = bodies(records(1, prefix=f"len{i}-"))[0]
    body.update(
        request_id=f"len-{i}",
        workload="rag",
        prompt_tokens=prompt_tokens,
        num_speculative_tokens=0,
        num_spec_steps=0,
        accepted_per_position=[],
        acceptance_histogram=[],
        num_draft_tokens=sum(drafted or [10]),
        num_accepted_tokens=sum(accepted or [6]),
        drafted_by_span=drafted,
        accepted_by_span=accepted,
        source="api",
    )
    return body


def test_breakdowns_in_v1_workloads(client: TestClient, db_url: str) -> None:
    events = [
        spanned(0, 100, [20, 10, 0], [18, 5, 0]),
        spanned(1, 3000, [4, 8, 12], [1, 2, 3]),
        spanned(2, 5000, None, None),  # a serving stack: no positions, stored as NULL
    ]
    response = client.post("/v1/events", json={"events": events}, headers=auth(INGEST))
    assert response.status_code == 202, response.json()
    assert stored(db_url, "len-2")["drafted_by_span"] is None
    assert stored(db_url, "len-1")["accepted_by_span"] == [1, 2, 3]
    found = client.get("/v1/workloads", params={"since": recent(30).isoformat()}, headers=auth(READ)).json()
    rag = next(w for w in found["workloads"] if w["workload"] == "rag")
    prompt = {b["bucket"]: b for b in rag["by_prompt_length"]}
    assert list(prompt) == ["0-256", "256-1024", "1024-4096", "4096+"]
    assert (prompt["0-256"]["drafted"], prompt["0-256"]["accepted"]) == (30, 23)
    assert prompt["0-256"]["acceptance_rate"] == pytest.approx(23 / 30)
    assert (prompt["1024-4096"]["drafting_requests"], prompt["4096+"]["drafted"]) == (1, 10)
    assert prompt["256-1024"] == {
        "bucket": "256-1024", "low": 256, "high": 1024, "drafting_requests": 0, "drafted": 0, "accepted": 0,
        "acceptance_rate": None,
    }  # fmt: skip
    spans = [(b["bucket"], b["drafting_requests"], b["drafted"], b["accepted"]) for b in rag["by_output_position"]]
    # The request without spans is left out of the output-position breakdown, not counted as zeros.
    assert spans == [("0-32", 2, 24, 19), ("32-128", 2, 18, 7), ("128+", 1, 12, 3)]
    assert rag["by_output_position"][2]["high"] is None


@pytest.mark.parametrize(
    ("drafted", "accepted", "field", "message"),
    [
        ([20, 10, 0, 0], [18, 5, 0, 0], "drafted_by_span", "at most 3"),
        ([20, 10], [18, 5], "drafted_by_span", "at least 3"),
        ([20, 10, -1], [18, 5, 0], "drafted_by_span", "greater than or equal"),
        ([20, 10, 0], None, "accepted_by_span", "both, or neither"),
        ([20, 10, 0], [18, 11, 0], "accepted_by_span", "span 1: 11 accepted exceeds 10 drafted"),
    ],
)
def test_bad_span_counts_are_refused(
    client: TestClient, drafted: list[int], accepted: list[int] | None, field: str, message: str
) -> None:
    body = spanned(9, 100, drafted, accepted)
    if accepted is None:
        body["num_accepted_tokens"] = 23
    response = client.post("/v1/events", json=body, headers=auth(INGEST))
    assert response.status_code == 422, response.json()
    problems = response.json()["detail"]
    assert any(p["loc"][-1] == field or field in map(str, p["loc"]) for p in problems), problems
    assert any(message in p["msg"] for p in problems), problems
