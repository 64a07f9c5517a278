"""Auth, reads, metrics, health, limits and the committed OpenAPI document."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from starlette.types import Receive, Scope, Send

from monitor.api.app import create_app, openapi_document
from monitor.api.limits import LimitsMiddleware
from monitor.config import ConfigError, Settings
from monitor.store.routing import RoutingEvent, record_switch
from tests.api.conftest import ADMIN, INGEST, READ, auth, bodies, make_settings, recent, records

ROOT = Path(__file__).resolve().parents[2]


def test_tokens_and_scopes(client: TestClient) -> None:
    batch = {"events": bodies(records(2))}
    missing = client.post("/v1/events", json=batch)
    assert missing.status_code == 401 and missing.json()["error"] == "missing_token"
    assert missing.headers["www-authenticate"].startswith("Bearer")
    wrong = client.post("/v1/events", json=batch, headers=auth("not-a-token-at-all-000"))
    assert wrong.status_code == 401 and wrong.json()["error"] == "invalid_token"
    basic = client.post("/v1/events", json=batch, headers={"Authorization": "Basic dXNlcjpwYXNz"})
    assert basic.status_code == 401
    scope = client.post("/v1/events", json=batch, headers=auth(READ))
    assert (
        scope.status_code == 403
        and scope.json()["error"] == "insufficient_scope"
        and "ingest" in scope.json()["message"]
    )
    assert client.post("/v1/events", json=batch, headers=auth(ADMIN)).status_code == 202
    for path in ("/v1/workloads", "/v1/workloads/code/series", "/metrics"):
        assert client.get(path).status_code == 401
        assert client.get(path, headers=auth(INGEST)).status_code == 403
        assert client.get(path, headers=auth(READ)).status_code == 200
        assert client.get(path, headers=auth(ADMIN)).status_code == 200
    for path in ("/v1/generate", "/v1/chat/completions"):
        assert client.post(path, json={}).status_code == 401
        assert client.post(path, json={}, headers=auth(READ)).status_code == 403
    assert client.get("/healthz").json() == {"status": "ok", "checks": {}}


def test_no_tokens_means_open_but_loopback_only(tmp_path: Path, sqlite_url: str) -> None:
    settings = make_settings(tmp_path, sqlite_url).with_values({"api.tokens": ()})
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/events", json=bodies(records(1))[0]).status_code == 202
    done = subprocess.run(
        [sys.executable, "-m", "monitor.commands", "serve", "--host", "0.0.0.0", "--database-url", sqlite_url],
        capture_output=True,
        text=True,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 2
    assert "refusing to bind 0.0.0.0 without API tokens" in done.stderr


def test_config_errors_never_quote_a_token() -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"HOME": "/h", "DRAFTWATCH_API_TOKENS": "ingest:tooshortsecret"}, None)
    assert "tooshortsecret" not in str(caught.value) and "DRAFTWATCH_API_TOKENS" in str(caught.value)
    settings = Settings.from_env({"HOME": "/h", "DRAFTWATCH_API_TOKENS": f"admin:{ADMIN}"}, None)
    assert ADMIN not in repr(settings)


def test_reads_workloads_series_and_metrics(client: TestClient) -> None:
    start = recent(30)
    batch = bodies(records(20, start=start)) + bodies(records(4, prefix="h", start=start, mode="holdout"))
    assert client.post("/v1/events", json={"events": batch}, headers=auth(INGEST)).status_code == 202
    since = (start - timedelta(minutes=1)).isoformat()
    found = client.get("/v1/workloads", params={"since": since}, headers=auth(READ)).json()
    by_tag = {w["workload"]: w for w in found["workloads"]}
    assert by_tag["code"]["requests"] == 12 and by_tag["chat"]["requests"] == 12
    assert by_tag["code"]["requests_by_mode"] == {"holdout": 2, "speculative": 10}
    assert 0 < by_tag["code"]["acceptance_rate_tokens"] < 1
    series = client.get(
        "/v1/workloads/code/series",
        params={"since": since, "step": "5m", "metric": "acceptance_rate_tokens", "mode": "speculative"},
        headers=auth(READ),
    ).json()
    assert series["step_s"] == 300 and len(series["points"]) == 1
    assert series["points"][0]["value"] == pytest.approx(by_tag["code"]["acceptance_rate_tokens"], rel=0.2)
    full = client.get("/v1/workloads/chat/series", params={"since": since}, headers=auth(READ)).json()
    assert full["points"][0]["requests"] == 12
    text = client.get("/metrics", headers=auth(READ)).text
    spec, plain = 'target="qwen-coder-1.5b",drafter="model:qwen-coder-0.5b"', 'target="qwen-coder-1.5b",drafter="none"'
    assert f'draftwatch_requests_total{{workload="code",{plain},mode="holdout"}} 2' in text
    assert f'draftwatch_requests_total{{workload="code",{spec},mode="speculative"}} 10' in text
    assert f'draftwatch_spec_decode_num_accepted_tokens_per_pos_total{{workload="code",{spec},position="3"}}' in text
    tpot = "draftwatch_request_time_per_output_token_seconds_bucket"
    assert f'{tpot}{{workload="chat",{spec},mode="speculative",le="+Inf"}} 10' in text
    assert f'{tpot}{{workload="chat",{plain},mode="holdout",le="+Inf"}} 2' in text
    assert "draftwatch_recorder_written_total 24" in text
    # Re-sending the same records stores nothing and counts nothing again.
    assert client.post("/v1/events", json={"events": batch}, headers=auth(INGEST)).json()["duplicates"] == 24
    again = client.get("/metrics", headers=auth(READ)).text
    assert f'draftwatch_requests_total{{workload="code",{plain},mode="holdout"}} 2' in again
    assert "draftwatch_recorder_duplicates_total 24" in again
    assert client.get("/readyz").json()["status"] == "ready"


def test_read_ranges_are_whole_minutes_and_say_so(client: TestClient) -> None:
    found = client.get(
        "/v1/workloads", params={"since": "2026-03-01T12:00:30Z", "until": "2026-03-01T12:05:10Z"}, headers=auth(READ)
    ).json()
    assert (found["since"], found["until"]) == ("2026-03-01T12:00:00Z", "2026-03-01T12:06:00Z")


def test_read_errors(client: TestClient) -> None:
    h = auth(READ)
    cases = [
        ("/v1/workloads", {"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "since"),
        ("/v1/workloads", {"since": "last week"}, "since"),
        ("/v1/workloads/code/series", {"step": "5s"}, "step"),
        ("/v1/workloads/code/series", {"step": "1m", "since": "2000-01-01T00:00:00Z"}, "step"),
        ("/v1/workloads/code/series", {"metric": "vibes"}, "metric"),
        ("/v1/workloads/bad%20tag/series", {}, "tag"),
        ("/v1/workloads", {"until": "0001-01-01T00:00:00Z"}, "until"),
        ("/v1/workloads", {"since": "0001-01-01T00:00:00+05:00"}, "since"),
        ("/v1/workloads", {"until": "9999-12-31T23:59:30Z"}, "until"),
    ]
    for path, params, field in cases:
        response = client.get(path, params=params, headers=h)
        assert response.status_code == 422, (path, params, response.text)
        assert response.json()["detail"][0]["loc"][-1] == field
    assert client.get("/nowhere").json()["error"] == "not_found"
    assert client.delete("/v1/events").status_code == 405
    assert client.post("/v1/generate", json={"prompt": "x"}, headers=auth(INGEST)).json()["error"] == "no_decoder"


def test_slow_requests_time_out_with_504() -> None:
    async def slow(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await asyncio.sleep(5)

    async def run() -> httpx.Response:
        app = LimitsMiddleware(slow, max_body_bytes=1000, timeout_s=0.2)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.post("/", content=b"{}")

    response = asyncio.run(run())
    assert response.status_code == 504 and response.json()["error"] == "timeout"


def test_openapi_document_is_committed_and_current(tmp_path: Path, sqlite_url: str) -> None:
    committed = (ROOT / "docs" / "openapi.json").read_text()
    current = openapi_document(create_app(make_settings(tmp_path, sqlite_url)))
    assert committed == current, "docs/openapi.json is stale: run `python -m monitor.api.openapi > docs/openapi.json`"
    paths = json.loads(committed)["paths"]
    assert {"/v1/events", "/v1/events/vllm", "/v1/chat/completions", "/metrics", "/readyz"} <= set(paths)


def test_every_guarded_operation_declares_401_and_403() -> None:
    document = json.loads((ROOT / "docs" / "openapi.json").read_text())
    guarded = [(method, path, op) for path, ops in document["paths"].items() for method, op in ops.items()
               if op.get("security")]  # fmt: skip
    assert len(guarded) == 23  # every operation but the two probes
    for method, path, op in guarded:
        assert {"401", "403"} <= set(op["responses"]), f"{method.upper()} {path}"
    ack = document["paths"]["/v1/alerts/{alert_id}/ack"]["post"]["responses"]
    assert {"404", "409", "413"} <= set(ack)
    assert "404" in document["paths"]["/v1/silences/{silence_id}"]["delete"]["responses"]
    rollouts = document["paths"]["/v1/rollouts"]
    assert {"409", "422"} <= set(rollouts["post"]["responses"]) and "201" in rollouts["post"]["responses"]
    for action in ("promote", "abort"):
        assert {"404", "409"} <= set(document["paths"][f"/v1/rollouts/{{rollout_id}}/{action}"]["post"]["responses"])


def test_the_token_is_checked_before_the_body_is_read(client: TestClient) -> None:
    # FastAPI parses a JSON body before it runs dependencies: malformed JSON without a token was a 422.
    as_json = {"Content-Type": "application/json"}
    lacking = {"/v1/silences": READ, "/v1/alerts/1/ack": INGEST, "/v1/generate": READ, "/v1/chat/completions": READ,
               "/v1/events": READ}  # fmt: skip
    for path, token in lacking.items():
        answer = client.post(path, content=b"{not json", headers=as_json)
        assert (answer.status_code, answer.json()["error"]) == (401, "missing_token"), path
        answer = client.post(path, content=b"{not json", headers={**auth(token), **as_json})
        assert (answer.status_code, answer.json()["error"]) == (403, "insufficient_scope"), path
    answer = client.post("/v1/silences", content=b"{not json", headers={**auth(ADMIN), **as_json})
    assert answer.status_code == 422  # with the token, the body's fault is reported


def test_with_tokens_only_the_probes_answer_without_one(client: TestClient, tmp_path: Path, sqlite_url: str) -> None:
    assert client.get("/openapi.json").status_code == 401
    assert client.get("/openapi.json", headers=auth(INGEST)).status_code == 403
    assert client.get("/openapi.json", headers=auth(READ)).json()["info"]["title"] == "draftwatch sidecar API"
    for page in ("/docs", "/redoc"):
        assert client.get(page).status_code == 404
    assert client.get("/readyz").status_code == 200
    # Without tokens (loopback only) the pages are served for a person at the machine.
    with TestClient(create_app(make_settings(tmp_path, sqlite_url).with_values({"api.tokens": ()}))) as open_client:
        assert open_client.get("/docs").status_code == 200
        assert open_client.get("/openapi.json").status_code == 200


def test_routes_lists_each_workload_s_latest_switch_however_old(client: TestClient) -> None:
    engine = client.app.state.api.engine  # type: ignore[attr-defined]
    now = datetime.now(UTC)

    def switch(workload: str, routed: bool, days_ago: float) -> RoutingEvent:
        return RoutingEvent(now - timedelta(days=days_ago), workload, "qwen", routed, "net_loss", 0.8, 0.7, 0.9)

    with engine.begin() as conn:
        # batch: routed two days ago and silent since; chat: routed, then back an hour ago.
        for event in (switch("batch", True, 2), switch("chat", True, 1), switch("chat", False, 1 / 24)):
            record_switch(conn, event)
    assert client.get("/v1/routes").status_code == 401
    found = client.get("/v1/routes", headers=auth(READ)).json()["routes"]
    assert [(r["workload"], r["routed"]) for r in found] == [("batch", True), ("chat", False)]
    assert found[0]["speedup"] == 0.8 and found[0]["reason"] == "net_loss"
    # /v1/workloads lists neither (no records in its last hour); /v1/routes is what a gateway reads.
    assert client.get("/v1/workloads", headers=auth(READ)).json()["workloads"] == []
