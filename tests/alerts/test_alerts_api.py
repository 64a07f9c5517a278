"""The alert endpoints on the real app: listing, acknowledgement, silences (admin scope), jobs; and the schema."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from monitor.alerts.evaluate import evaluate_alerts
from monitor.api.app import create_app
from monitor.store.migrate import alembic_config
from monitor.store.models import Base
from tests.alerting import make_settings, minutes, result
from tests.api.conftest import ADMIN, READ, TOKENS, auth
from tests.faults import refuse_value

OURS = {"alerts", "silences", "notifications", "scheduler_lease", "job_runs"}


@pytest.fixture
def client(tmp_path: Path, engine: Engine) -> Iterator[TestClient]:
    url = engine.url.render_as_string(hide_password=False)
    settings = make_settings(tmp_path, url, DRAFTWATCH_API_TOKENS=TOKENS)
    for i in range(2):
        evaluate_alerts(engine, settings.alert_config, [result("drift", -0.2)], now=minutes(5 * i))
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_alerts_ack_silences_jobs(client: TestClient) -> None:
    listed = client.get("/v1/alerts", headers=auth(READ)).json()["alerts"]
    assert [(a["rule"], a["state"]) for a in listed] == [("acceptance_drop", "firing")]
    alert_id = listed[0]["id"]
    assert client.post(f"/v1/alerts/{alert_id}/ack", json={"by": "ada"}, headers=auth(READ)).status_code == 403
    acked = client.post(f"/v1/alerts/{alert_id}/ack", json={"by": "ada", "comment": "on it"}, headers=auth(ADMIN))
    assert acked.status_code == 200 and acked.json()["acked_by"] == "ada"
    assert client.post("/v1/alerts/999/ack", json={}, headers=auth(ADMIN)).status_code == 404
    assert client.get("/v1/alerts?state=resolved", headers=auth(READ)).json()["alerts"] == []

    assert client.get("/v1/silences", headers=auth(READ)).status_code == 403
    ends = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    body = {"matchers": [{"name": "workload", "value": "code"}], "ends_at": ends, "created_by": "ada", "comment": "x"}
    created = client.post("/v1/silences", json=body, headers=auth(ADMIN))
    assert created.status_code == 201 and created.json()["active"]
    bad = client.post("/v1/silences", json={**body, "matchers": [{"name": "w", "value": "(", "regex": True}]},
                      headers=auth(ADMIN))  # fmt: skip
    assert bad.status_code == 422
    silences = client.get("/v1/silences", headers=auth(ADMIN)).json()["silences"]
    assert [s["id"] for s in silences] == [created.json()["id"]]
    assert client.delete(f"/v1/silences/{created.json()['id']}", headers=auth(ADMIN)).status_code == 200
    assert client.get("/v1/silences", headers=auth(ADMIN)).json()["silences"] == []

    jobs = client.get("/v1/jobs", headers=auth(READ)).json()
    assert jobs == {"lease": None, "runs": []}
    assert client.get("/v1/notifications?status=dead", headers=auth(READ)).json() == {"notifications": []}


def test_silence_times_past_the_calendar_in_utc_are_refused(client: TestClient) -> None:
    ends = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    body = {"matchers": [{"name": "workload", "value": "code"}], "ends_at": ends, "created_by": "ada", "comment": "x"}
    for field, edge in (("ends_at", "9999-12-31T23:00:00-05:00"), ("starts_at", "0001-01-01T00:00:00+05:00")):
        response = client.post("/v1/silences", json={**body, field: edge}, headers=auth(ADMIN))
        assert response.status_code == 422, (field, response.text)
        assert response.json()["detail"][0]["loc"] == ["body", field]
    assert client.get("/v1/silences", headers=auth(ADMIN)).json()["silences"] == []


def test_path_ids_beyond_bigint_are_refused(client: TestClient) -> None:
    # Ids are BIGINT: one past 2**63 - 1 cannot even be looked up (SQLite OverflowError, PostgreSQL out of range).
    h = auth(ADMIN)
    for too_big in (2**63, 10**30):
        for response, name in (
            (client.delete(f"/v1/silences/{too_big}", headers=h), "silence_id"),
            (client.post(f"/v1/alerts/{too_big}/ack", json={}, headers=h), "alert_id"),
        ):
            assert response.status_code == 422, response.text
            assert response.json()["detail"][0]["loc"] == ["path", name]
    assert client.delete(f"/v1/silences/{2**63 - 1}", headers=h).status_code == 404
    assert client.post(f"/v1/alerts/{2**63 - 1}/ack", json={}, headers=h).status_code == 404


def test_a_500_logs_no_request_values(client: TestClient, engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    # The database refuses the ack: PostgreSQL quotes the row in its DETAIL, SQLAlchemy the parameters.
    refuse_value(engine, "alerts", "acked_by", "by-value-5d1")
    (alert,) = client.get("/v1/alerts", headers=auth(READ)).json()["alerts"]
    quiet = TestClient(client.app, raise_server_exceptions=False)  # the running app, answering as a server would
    with caplog.at_level(logging.INFO):
        body = {"by": "by-value-5d1", "comment": "comment-value-5d1"}
        response = quiet.post(f"/v1/alerts/{alert['id']}/ack", json=body, headers=auth(ADMIN))
    assert response.status_code == 500 and response.json()["error"] == "internal_error"
    assert "value-5d1" not in response.text
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "/v1/alerts" in errors[0].getMessage() and "IntegrityError" in caplog.text
    assert "value-5d1" not in caplog.text


def test_single_head_and_models_match_migration(engine: Engine) -> None:
    assert len(ScriptDirectory.from_config(alembic_config()).get_heads()) == 1

    def ours(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
        table = name if type_ == "table" else getattr(getattr(obj, "table", None), "name", None)
        return table in OURS

    with engine.connect() as conn:
        opts = {"compare_type": True, "include_object": ours}
        assert compare_metadata(MigrationContext.configure(conn, opts=opts), Base.metadata) == []
