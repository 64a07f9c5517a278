"""Every stack response under tests/fixtures/stacks/, through its parser and through its adapter endpoint.

One file per response, built from the stack's source or captured from a running server
(``real-*.json``); tests/fixtures/stacks/README.md gives the format. A new file is a new case:
the directory is globbed. Each case runs twice: the parser alone, checked against the figures the
stack reported, and a real app on SQLite and PostgreSQL, checked against the stored row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from monitor.api.app import create_app
from monitor.ingest.stacks import PARSERS, STACKS, Stack, StackError
from monitor.store.engine import create_engine
from monitor.store.models import RequestRow
from tests.api.conftest import INGEST, auth, make_settings, stored

FIXTURES: Final = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"
CASES: Final = sorted(FIXTURES.glob("*/*.json"))
# Expected names the stored row spells differently, and those the report does.
COLUMNS: Final = {
    "drafted": "num_draft_tokens",
    "accepted": "num_accepted_tokens",
    "steps": "num_spec_steps",
    "histogram": "acceptance_histogram",
    "per_position": "accepted_per_position",
}
REPORTED: Final = {"target_model": "model"}


@dataclass(frozen=True)
class Fixture:
    stack: Stack
    speculative: bool | None
    posted: dict[str, Any]
    response: dict[str, Any]
    expected: dict[str, Any] | None
    error: str | None


def load(path: Path) -> Fixture:
    data = json.loads(path.read_text())
    assert data["stack"] in STACKS and data["stack"] == path.parent.name, path
    assert {"version", "source", "endpoint", "streamed", "response"} <= set(data), path
    assert ("expected" in data) != ("error" in data), f"{path}: give expected or error, not both"
    return Fixture(
        stack=data["stack"],
        speculative=data["speculative"] if "speculative" in data else _drafted(data["response"]),
        posted=data.get("posted", {}),
        response=data["response"],
        expected=data.get("expected"),
        error=data.get("error"),
    )


def _drafted(response: dict[str, Any]) -> bool | None:
    # Captured llama-server responses name no mode: one with draft counts came from a speculative server.
    return True if "draft_n" in (response.get("timings") or {}) else None


def _plain(value: Any) -> Any:
    """A report's or a row's value as the fixture writes it."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC).isoformat()
    return value


def _matches(got: Any, want: Any) -> bool:
    if isinstance(want, float) and isinstance(got, int | float):
        return bool(got == pytest.approx(want, rel=1e-9, abs=1e-6))
    return bool(_plain(got) == want)


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_parser_reports_what_the_stack_reported(path: Path) -> None:
    fixture = load(path)
    parse = PARSERS[fixture.stack]
    given = fixture.posted.get("num_speculative_tokens")
    if fixture.error is not None:
        with pytest.raises(StackError) as caught:
            parse(fixture.response, speculative=fixture.speculative, num_speculative_tokens=given)
        assert fixture.error in str(caught.value)
        return
    assert fixture.expected is not None
    report = parse(fixture.response, speculative=fixture.speculative, num_speculative_tokens=given)
    checked = 0
    for key, want in fixture.expected.items():
        name = REPORTED.get(key, key)
        if key in fixture.posted or not hasattr(report, name):
            continue  # the caller's figure, or one only the record has (sampling settings)
        assert _matches(getattr(report, name), want), (key, getattr(report, name), want)
        checked += 1
    assert checked >= 4, "a fixture must pin what the stack reported"


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_adapter_stores_what_the_stack_reported(path: Path, tmp_path: Path, db_url: str) -> None:
    fixture = load(path)
    body: dict[str, Any] = {**fixture.response, "workload": "fixtures", **fixture.posted}
    if fixture.speculative is not None:
        body["speculative"] = fixture.speculative
    expected = fixture.expected or {}
    if "request_id" not in expected and "request_id" not in body:
        body["request_id"] = f"fx-{path.stem}"
    if "model" not in fixture.response and "target_model" not in body:
        body["target_model"] = "fixture-model"
    with TestClient(create_app(make_settings(tmp_path, db_url))) as client:
        response = client.post(f"/v1/events/{fixture.stack}", json=body, headers=auth(INGEST))
    if fixture.error is not None:
        assert response.status_code == 422, response.text
        assert any(fixture.error in problem["msg"] for problem in response.json()["detail"]), response.json()
        assert _count(db_url) == 0
        return
    assert response.status_code == 202, response.text
    row = stored(db_url, expected.get("request_id") or body["request_id"])
    assert row["source"] == f"proxy:{fixture.stack}" and row["workload"] == "fixtures"
    for key, want in expected.items():
        got = row[COLUMNS.get(key, key)]
        assert _matches(got, want), (key, got, want)


def _count(db_url: str) -> int:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(RequestRow)).scalar_one())
    finally:
        engine.dispose()
