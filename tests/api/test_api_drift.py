"""``GET /v1/drift`` serves the stored results of a real drift run, filtered, on both databases."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fastapi.testclient import TestClient

from monitor.api.app import create_app
from monitor.drift.run import run_drift
from monitor.ingest.synthetic import synthetic_record
from monitor.store.engine import create_engine
from monitor.store.writes.writer import write_batch
from tests.api.conftest import INGEST, READ, auth, make_settings


def test_drift_endpoint_serves_the_latest_run(tmp_path: Path, db_url: str) -> None:
    settings = make_settings(tmp_path, db_url)
    now = datetime.now(UTC)
    # 'code' accepts like itself for a day, then like 'translate' in the last hour: a real drop.
    reference = [synthetic_record(i, workload="code", prefix="ref", start=now - timedelta(hours=20),
                                  spacing=timedelta(minutes=5)) for i in range(120)]  # fmt: skip
    current = [
        dataclasses.replace(
            synthetic_record(
                i, workload="translate", prefix="cur", start=now - timedelta(minutes=50), spacing=timedelta(seconds=30)
            ),
            workload="code",
        )
        for i in range(80)
    ]
    with TestClient(create_app(settings)) as client:
        empty = {"run_id": None, "results": [], "acceptance_split": None, "speed_split": None}
        assert client.get("/v1/drift", headers=auth(READ)).json() == empty
        engine = create_engine(db_url)
        with engine.begin() as conn:
            write_batch(conn, sorted([*reference, *current], key=lambda r: r.ts_start), "drift-api-test", "sync")
        run = run_drift(engine, settings.drift, now=now)
        body = client.get("/v1/drift", params={"workload": "code", "test": "acceptance"}, headers=auth(READ)).json()
        assert body["run_id"] == run.run_id
        (result,) = [r for r in body["results"] if r["metric"] == "acceptance_rate"]
        assert result["decision"] == "drift" and result["effect"] < -0.2
        assert result["n_ref"] > 0 and result["n_cur"] > 0 and result["q"] <= result["p"] * 100
        # The run's acceptance split, as stored with it (one workload: its within part is the whole change).
        assert run.explanation is not None and body["acceptance_split"] == run.split_json()
        assert body["acceptance_split"]["workloads"] == {}
        assert body["speed_split"] == run.speed_json() and body["speed_split"]["metric"] == "ms_per_token"
        assert "within code (" in body["acceptance_split"]["detail"]["summary"]
        unknown = client.get("/v1/drift", params={"run_id": "no-such-run"}, headers=auth(READ)).json()
        assert unknown == {"run_id": "no-such-run", "results": [], "acceptance_split": None, "speed_split": None}
        drifting = client.get("/v1/drift", params={"decision": "drift"}, headers=auth(READ)).json()["results"]
        assert drifting and all(r["decision"] == "drift" for r in drifting)
        assert client.get("/v1/drift", params={"decision": "maybe"}, headers=auth(READ)).status_code == 422
        assert client.get("/v1/drift", headers=auth(INGEST)).status_code == 403
        assert client.get("/v1/drift").status_code == 401
        engine.dispose()
