"""POST /v1/events: single records, batches, duplicates, every validation path, on both databases."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from decoder.record import RequestRecord
from monitor.api.app import create_app
from monitor.api.events import EventIn
from tests.api.conftest import INGEST, auth, bodies, make_settings, records, stored
from tests.api.test_api_adapters import LLAMACPP, VLLM

H = auth(INGEST)


def test_the_wire_schema_has_exactly_the_records_fields() -> None:
    # EventIn is the record's wire form with bounds; a field added to one and not the other fails here.
    assert list(EventIn.model_fields) == [f.name for f in dataclasses.fields(RequestRecord)]


def test_single_record_and_batch_are_stored(client: TestClient, db_url: str, count_rows: Callable[[], int]) -> None:
    one, *batch = bodies(records(6))
    response = client.post("/v1/events", json=one, headers=H)
    assert response.status_code == 202
    assert response.json() == {"received": 1, "stored": 1, "duplicates": 0, "spooled": 0}
    response = client.post("/v1/events", json={"events": batch}, headers=H)
    assert response.json() == {"received": 5, "stored": 5, "duplicates": 0, "spooled": 0}
    assert count_rows() == 6
    row = stored(db_url, one["request_id"])
    assert row["num_accepted_tokens"] == one["num_accepted_tokens"]
    assert row["accepted_per_position"] == one["accepted_per_position"]


def test_resending_never_double_counts(client: TestClient, count_rows: Callable[[], int]) -> None:
    batch = bodies(records(4))
    client.post("/v1/events", json={"events": batch}, headers=H)
    again = client.post("/v1/events", json={"events": [*batch, batch[0]]}, headers=H).json()
    assert again == {"received": 5, "stored": 0, "duplicates": 5, "spooled": 0}
    assert count_rows() == 4


def _mutated(change: dict[str, Any]) -> dict[str, Any]:
    body = bodies(records(1, prefix="bad"))[0]
    body.update(change)
    return body


PROBLEMS: list[tuple[dict[str, Any], str, str]] = [
    ({"num_accepted_tokens": 10**6}, "num_accepted_tokens", "exceeds"),
    ({"num_draft_tokens": -1}, "num_draft_tokens", "greater than or equal"),
    ({"num_draft_tokens": 10**7}, "num_draft_tokens", "num_spec_steps x num_speculative_tokens"),
    ({"accepted_per_position": [1]}, "accepted_per_position", "sums to"),
    ({"acceptance_histogram": [1, 2]}, "acceptance_histogram", ""),
    ({"ttft_ms": "fast"}, "ttft_ms", "number"),
    ({"latency_ms": 1e300}, "latency_ms", "less than"),
    ({"ts_start": "yesterday"}, "ts_start", "datetime"),
    ({"ts_end": (datetime.now(UTC) + timedelta(days=2)).isoformat()}, "ts_end", "future"),
    ({"ts_start": "1999-12-31T23:00:00+00:00"}, "ts_start", "2000"),
    ({"ts_end": "2020-01-01T00:00:00+00:00"}, "ts_end", "before ts_start"),
    ({"workload": "no spaces"}, "workload", "pattern"),
    ({"workload": "x" * 65}, "workload", "at most 64"),
    ({"target_model": "a\u0000b"}, "target_model", "NUL"),
    ({"target_model": "\ud800"}, "target_model", ""),
    ({"mode": "turbo"}, "mode", ""),
    ({"output_tokens": True}, "output_tokens", "integer"),
    ({"surprise": 1}, "surprise", "Extra"),
    ({"request_id": ""}, "request_id", "at least 1"),
]


def test_field_level_problems_name_the_field(client: TestClient, count_rows: Callable[[], int]) -> None:
    # One app per database for all cases: validation runs before the database, the count after it.
    for change, field, fragment in PROBLEMS:
        # json.dumps escapes what httpx would refuse to encode (an unpaired surrogate), as a hostile client could.
        content = json.dumps({"events": [bodies(records(1))[0], _mutated(change)]})
        response = client.post("/v1/events", content=content, headers={**H, "Content-Type": "application/json"})
        assert response.status_code == 422, (change, response.text)
        body = response.json()
        assert body["error"] == "validation_error"
        problem = body["detail"][0]
        assert problem["loc"][:3] == ["body", "events", 1], change
        assert problem["loc"][3] == field, change
        assert fragment in problem["msg"], (change, problem)
        assert "input" not in problem  # bodies are never echoed
    assert count_rows() == 0  # all-or-nothing: the valid first record was never stored either


def test_times_past_the_calendar_in_utc_are_refused(client: TestClient, count_rows: Callable[[], int]) -> None:
    # A valid ISO 8601 time whose conversion to UTC falls after 9999-12-31: 422 naming the field, never a 500.
    edge = "9999-12-31T23:00:00-05:00"
    record = {**bodies(records(1, prefix="edge"))[0], "ts_end": edge}
    cases: list[tuple[str, Any, list[Any]]] = [
        ("/v1/events", record, ["body", "ts_end"]),
        ("/v1/events", {"events": [record]}, ["body", "events", 0, "ts_end"]),
        ("/v1/events/vllm", {**VLLM, "workload": "chat", "ts_end": edge}, ["body", "ts_end"]),
        ("/v1/events/llamacpp", {**LLAMACPP, "workload": "c", "request_id": "l1", "ts_end": edge}, ["body", "ts_end"]),
    ]
    for path, body, loc in cases:
        response = client.post(path, json=body, headers=H)
        assert response.status_code == 422, (path, response.text)
        assert response.json()["detail"][0]["loc"] == loc, (path, response.json())
    assert count_rows() == 0


def test_missing_required_fields_are_listed(client: TestClient) -> None:
    response = client.post("/v1/events", json={"workload": "chat"}, headers=H)
    assert response.status_code == 422
    missing = {tuple(p["loc"]) for p in response.json()["detail"]}
    assert ("body", "request_id") in missing and ("body", "target_model") in missing


NOT_RECORDS: list[tuple[bytes, int, str]] = [
    (b"{not json", 400, "invalid_json"),
    (b'{"ttft_ms": NaN}', 400, "invalid_json"),
    (b"[" * 100_000 + b"]" * 100_000, 400, "invalid_json"),
    (b"\xff\xfe\x00", 400, "invalid_json"),
    (b"[1, 2]", 422, "validation_error"),
    (b'"text"', 422, "validation_error"),
    (b'{"events": {"a": 1}}', 422, "validation_error"),
    (b'{"events": [], "extra": 1}', 422, "validation_error"),
    (b'{"events": [1, "x", null]}', 422, "validation_error"),
]


def test_bodies_that_are_not_records(client: TestClient, count_rows: Callable[[], int]) -> None:
    for content, status, code in NOT_RECORDS:
        response = client.post("/v1/events", content=content, headers={**H, "Content-Type": "application/json"})
        assert response.status_code == status, content[:20]
        assert response.json()["error"] == code
    assert client.post("/v1/events", json={"events": []}, headers=H).json()["received"] == 0
    assert count_rows() == 0


def test_batch_and_body_size_limits(tmp_path: Path, sqlite_url: str) -> None:
    settings = make_settings(
        tmp_path, sqlite_url, DRAFTWATCH_API_MAX_BATCH_SIZE="3", DRAFTWATCH_API_MAX_BODY_BYTES="8192"
    )
    with TestClient(create_app(settings)) as client:
        # Four records are about 4.5 KB: within the body limit, past the batch's.
        response = client.post("/v1/events", json={"events": bodies(records(4))}, headers=H)
        assert response.status_code == 422
        assert "at most 3 events" in response.json()["detail"][0]["msg"]
        response = client.post("/v1/events", json={"events": bodies(records(3)), "pad": "x" * 9000}, headers=H)
        assert response.status_code == 413
        assert response.json()["error"] == "body_too_large"

        def chunks() -> Any:  # no Content-Length: cut off while streaming
            for _ in range(10):
                yield b" " * 1000

        response = client.post("/v1/events", content=chunks(), headers=H)
        assert response.status_code == 413


def test_unreachable_database_spools_and_still_answers_202(tmp_path: Path) -> None:
    # Nothing listens on port 1: the schema upgrade fails, the batch is fsync'd to the spool.
    settings = make_settings(tmp_path, "postgresql+psycopg://postgres@127.0.0.1:1/none")
    with TestClient(create_app(settings)) as client:
        response = client.post("/v1/events", json={"events": bodies(records(3))}, headers=H)
        assert response.status_code == 202
        assert response.json() == {"received": 3, "stored": 0, "duplicates": 0, "spooled": 3}
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"]["database"]["ok"] is False
        assert ready.json()["checks"]["recorder"]["spool_pending"] is True
    assert any(settings.recorder.spool_dir.glob("spool-*.jsonl"))
