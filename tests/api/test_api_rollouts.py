"""``/v1/rollouts``: list, read, start, promote and abort drafter rollouts over HTTP, on a real app and database.

The app runs in proxy mode with a candidate pool (its upstreams are never asked: these routes are
draftwatch's own, not forwarded); a judged rollout is made as tests/proxy/test_rollout.py makes one.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from decoder import NgramDrafter, SpeculativeDecoder
from decoder.candidate import DRAFTER_KINDS
from monitor.api.app import create_app
from monitor.proxy.rollout import advance_rollouts, start_rollout
from monitor.proxy.settings import ProxySettings
from monitor.store.engine import create_engine
from monitor.store.rollouts import get_rollout, rollout_events, rollouts
from tests.api.conftest import ADMIN, INGEST, READ, auth, make_settings
from tests.decoder.tiny import tiny_model
from tests.proxy.test_rollout import INTERVAL, PROXY, interval_of, rollout_settings
from tests.records import T0
from tests.serving import serving
from tests.store.candidates import wait_announced

CANDIDATE_URL = "http://127.0.0.1:9"
PROXIED = {"DRAFTWATCH_PROXY_UPSTREAM": "http://127.0.0.1:8", "DRAFTWATCH_PROXY_CANDIDATE_UPSTREAM": CANDIDATE_URL}


@pytest.fixture
def client(tmp_path: Path, db_url: str) -> Iterator[TestClient]:
    settings = make_settings(tmp_path, db_url, DRAFTWATCH_ROLLOUT_DRAFTER="eagle3-v2", **PROXIED)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture
def store(client: TestClient, db_url: str) -> Iterator[Engine]:
    """The app's database, migrated by its start, for the test to read and seed."""
    engine = create_engine(db_url)
    yield engine
    engine.dispose()


def post(client: TestClient, path: str, body: Any = None, token: str = ADMIN) -> Any:
    return client.post(path, headers=auth(token), **({} if body is None else {"json": body}))


def test_reads_need_the_read_scope_and_writes_the_admin_scope(client: TestClient, store: Engine) -> None:
    reads = ("/v1/rollouts", "/v1/rollouts/1")
    writes = ("/v1/rollouts", "/v1/rollouts/1/promote", "/v1/rollouts/1/abort")
    for path in reads:
        assert client.get(path).status_code == 401
        assert client.get(path, headers=auth(INGEST)).json()["error"] == "insufficient_scope"
    for path in writes:
        assert client.post(path, json={}).json()["error"] == "missing_token"
        for token in (READ, INGEST):
            answer = post(client, path, {}, token)
            assert answer.status_code == 403 and "'admin' scope" in answer.json()["message"], path
        # The token is checked before the body is read: malformed JSON without one is still a 401.
        answer = client.post(path, content=b"{not json", headers={"Content-Type": "application/json"})
        assert answer.status_code == 401, path
    assert rollouts(store) == []
    assert client.get("/v1/rollouts", headers=auth(READ)).json() == {"rollouts": []}
    assert post(client, "/v1/rollouts").status_code == 201  # admin writes
    assert len(client.get("/v1/rollouts", headers=auth(ADMIN)).json()["rollouts"]) == 1  # and reads


def test_start_promote_and_abort(client: TestClient, store: Engine) -> None:
    # No body: every rollout.* setting (the drafter set in the environment, the rest defaults).
    started = post(client, "/v1/rollouts")
    assert started.status_code == 201
    first = started.json()
    assert {k: first[k] for k in ("deployment", "drafter", "status", "steps", "step", "share", "interval_s",
                                  "per_workload")} == {"deployment": "*", "drafter": "eagle3-v2", "status": "running",
                                                       "steps": [0.05, 0.25, 0.5, 1.0], "step": 0, "share": 0.05,
                                                       "interval_s": 1800.0, "per_workload": False}  # fmt: skip
    stored = get_rollout(store, first["id"])
    assert stored is not None and first == stored.to_json()
    promoted = post(client, f"/v1/rollouts/{first['id']}/promote")
    assert promoted.status_code == 200
    assert (promoted.json()["status"], promoted.json()["share"], promoted.json()["reason"]) == (
        "promoted", 1.0, "promoted by hand")  # fmt: skip
    again = post(client, f"/v1/rollouts/{first['id']}/promote")
    said = f"rollout {first['id']} is promoted: only a running one can be promoted"
    assert again.status_code == 409 and again.json() == {"error": "status_conflict", "message": said}
    aborted = post(client, f"/v1/rollouts/{first['id']}/abort", {"reason": "p99 went up"})
    assert aborted.status_code == 200
    assert (aborted.json()["status"], aborted.json()["share"], aborted.json()["reason"]) == ("aborted", 0.0,
                                                                                             "p99 went up")  # fmt: skip
    assert post(client, f"/v1/rollouts/{first['id']}/abort").json()["error"] == "status_conflict"

    # Every field of the body overrides its setting; the interval as a duration or as seconds.
    body = {"steps": [10, 50, 100], "interval": "45m", "per_workload": True, "drafter": "ngram-8",
            "candidate": CANDIDATE_URL + "/"}  # fmt: skip
    second = post(client, "/v1/rollouts", body).json()
    assert (second["drafter"], second["steps"], second["interval_s"], second["per_workload"]) == (
        "ngram-8", [0.1, 0.5, 1.0], 2700.0, True)  # fmt: skip
    ended = post(client, f"/v1/rollouts/{second['id']}/abort")  # no body: the default reason
    assert ended.json()["reason"] == "aborted by hand"
    third = post(client, "/v1/rollouts", {"interval": 90, "route": None}).json()
    assert third["interval_s"] == 90.0 and third["drafter"] == "eagle3-v2"

    listed = client.get("/v1/rollouts", headers=auth(READ)).json()["rollouts"]
    assert [r["id"] for r in listed] == [third["id"], second["id"], first["id"]]  # newest first
    only = client.get("/v1/rollouts", params={"status": ["aborted"]}, headers=auth(READ)).json()["rollouts"]
    assert [r["id"] for r in only] == [second["id"], first["id"]]
    some = client.get("/v1/rollouts", params={"status": ["running", "promoted"], "limit": 1}, headers=auth(READ))
    assert [r["id"] for r in some.json()["rollouts"]] == [third["id"]]
    one = client.get(f"/v1/rollouts/{first['id']}", headers=auth(READ)).json()
    assert [(e["kind"], e["reason"]) for e in one["events"]] == [
        ("started", "started: steps 5%, 25%, 50%, 100%, 1800 s a step"), ("promoted", "promoted by hand"),
        ("aborted", "p99 went up")]  # fmt: skip
    assert {k: v for k, v in one.items() if k != "events"} == aborted.json()


def test_reads_carry_the_judgement_and_the_events(client: TestClient, store: Engine) -> None:
    settings = rollout_settings(per_workload=True)
    r = start_rollout(store, PROXY, settings, T0)
    assert r.id is not None
    interval_of(store, T0, {"copy": (10.0, 7.0), "story": (10.0, 13.0)})
    advance_rollouts(store, settings, T0 + timedelta(minutes=5, seconds=1))  # story fails: kept
    advance_rollouts(store, settings, T0 + INTERVAL + timedelta(seconds=1))  # copy passes: step 2
    stored = get_rollout(store, r.id)
    assert stored is not None and stored.step == 1

    (listed,) = client.get("/v1/rollouts", headers=auth(READ)).json()["rollouts"]
    assert listed == stored.to_json()
    copy = listed["judgement"]["workloads"]["copy"]
    assert copy["outcome"] == "pass" and copy["score"] == 100 and copy["n_candidate"] == 40
    speed = next(m for m in copy["metrics"] if m["metric"] == "decode_speed")
    assert speed["ratio"] > 1.2 and speed["ci"][0] > 1.0  # the candidate runs at 7 ms a token against 10
    assert listed["workloads"] == {"story": "current"}
    one = client.get(f"/v1/rollouts/{r.id}", headers=auth(READ)).json()
    assert one == {**stored.to_json(), "events": [e.to_json() for e in rollout_events(store, rollout_id=r.id)]}
    assert [(e["kind"], e["workload"]) for e in one["events"]] == [("started", None), ("kept", "story"),
                                                                   ("advanced", None)]  # fmt: skip
    assert one["events"][1]["judgement"]["workloads"]["story"]["outcome"] == "fail"


def test_refusals_name_what_was_wrong(client: TestClient, store: Engine) -> None:
    running = post(client, "/v1/rollouts").json()
    conflict = post(client, "/v1/rollouts", {"steps": [50, 100]})
    assert conflict.status_code == 409 and conflict.json() == {
        "error": "rollout_active", "message": f"rollout {running['id']} is running on deployment '*': one rollout "
        f"at a time; promote or abort it first (draftwatch rollout abort {running['id']}, or POST "
        f"/v1/rollouts/{running['id']}/abort)"}  # fmt: skip
    bad: list[tuple[Any, list[str | int], str]] = [
        ({"steps": [50, 25, 100]}, ["body", "steps"], "25 follows 50"),
        ({"steps": [5, 50]}, ["body", "steps"], "the last step to be 100"),
        ({"steps": [0, 100]}, ["body", "steps"], "above 0 and at most 100"),
        ({"steps": []}, ["body", "steps"], "at least 1 item"),
        ({"steps": "5,25,50,100"}, ["body", "steps"], "valid list"),
        ({"steps": [True, 100]}, ["body", "steps", 0], "valid number"),
        ({"interval": "soon"}, ["body", "interval"], "expected a duration like 15m"),
        ({"interval": -5}, ["body", "interval"], "expected a positive duration"),
        ({"interval": True}, ["body", "interval"], ""),
        ({"per_workload": "yes"}, ["body", "per_workload"], "valid boolean"),
        ({"route": 0}, ["body", "route"], "greater than or equal to 1"),
        ({"route": "1"}, ["body", "route"], "valid integer"),
        ({"route": 2}, ["body", "route"], "route=2: no [[proxy.routes]] are configured"),
        ({"candidate": "http://elsewhere:9999"}, ["body", "candidate"], "is not in proxy.candidate_upstream"),
        ({"drafter": "upstream"}, ["body", "drafter"], "other than 'upstream', 'none', 'model', 'ngram'"),
        ({"drafter": " "}, ["body", "drafter"], "expected a name for the candidate drafter"),
        ({"drafter": ""}, ["body", "drafter"], "at least 1 character"),
        ({"drafter": "d" * 257}, ["body", "drafter"], "at most 256 characters"),  # the column holds 256
        ([1, 2], ["body"], ""),
    ]
    for body, loc, said in bad:
        answer = post(client, "/v1/rollouts", body)
        assert answer.status_code == 422, (body, answer.text)
        problems = answer.json()["detail"]  # a value of neither type of a union is one problem per type
        assert all(p["loc"][: len(loc)] == loc for p in problems), (body, problems)
        assert said in problems[0]["msg"], (body, problems)
    as_json = {**auth(ADMIN), "Content-Type": "application/json"}
    assert client.post("/v1/rollouts", content=b"{not json", headers=as_json).status_code == 422
    for path in ("/v1/rollouts/999/promote", "/v1/rollouts/999/abort"):
        missing = post(client, path)
        assert missing.status_code == 404
        assert missing.json() == {
            "error": "not_found",
            "message": "no rollout 999: draftwatch rollout status (GET /v1/rollouts) lists them",
        }
    assert client.get("/v1/rollouts/999", headers=auth(READ)).status_code == 404
    for path in ("/v1/rollouts/0", f"/v1/rollouts/{2**63}", "/v1/rollouts/x"):
        assert client.get(path, headers=auth(READ)).status_code == 422, path
    assert post(client, "/v1/rollouts/1/abort", {"reason": ""}).status_code == 422
    assert client.get("/v1/rollouts", params={"status": "done"}, headers=auth(READ)).status_code == 422
    assert [r.id for r in rollouts(store)] == [running["id"]]  # nothing refused was stored, nothing changed
    assert rollouts(store)[0].status == "running"
    # The longest drafter name the store holds is taken (on PostgreSQL a longer one would not fit).
    post(client, f"/v1/rollouts/{running['id']}/abort")
    assert post(client, "/v1/rollouts", {"drafter": "d" * 256}).status_code == 201


def test_a_deployment_without_a_candidate_pool_is_a_conflict(tmp_path: Path, db_url: str) -> None:
    settings = make_settings(tmp_path, db_url, DRAFTWATCH_PROXY_UPSTREAM="http://127.0.0.1:8")
    with TestClient(create_app(settings)) as client:
        answer = post(client, "/v1/rollouts", {"drafter": "eagle3-v2"})
        assert answer.status_code == 409 and answer.json() == {
            "error": "no_candidate_pool", "message": "deployment '*' has no candidate pool: no sidecar announced one "
            "in the last 3m and proxy.candidate_upstream is not set here; start the sidecars with serve "
            "--candidate-upstream URL (proxy.candidate_upstream, DRAFTWATCH_PROXY_CANDIDATE_UPSTREAM: the same target "
            "served with the new drafter; the embedded decoder: serve --candidate-drafter, decoder.candidate), then "
            "start the rollout"}  # fmt: skip
        assert client.get("/v1/rollouts", headers=auth(READ)).json() == {"rollouts": []}


def test_an_embedded_decoder_announces_its_candidate_drafter_where_rollout_start_finds_it(
    tmp_path: Path, db_url: str
) -> None:
    """``serve --target T --candidate-drafter ngram:1-1``: a start elsewhere, without decoder.candidate of its own,
    takes that drafter and the portfolio's names for the current side."""
    decoder = SpeculativeDecoder(tiny_model(seed=1, name="tiny-target"), NgramDrafter(min_n=1, max_n=3),
                                 candidate=NgramDrafter(min_n=1, max_n=1))  # fmt: skip
    settings = make_settings(tmp_path, db_url, DRAFTWATCH_DECODER_CANDIDATE="ngram:1-1")
    engine = create_engine(db_url)
    try:
        with serving(create_app(settings, decoder=decoder)):
            found = wait_announced(engine)
        assert [(a.candidates, a.setting, a.current_drafters) for a in found] == [
            (("ngram:1-1",), "decoder.candidate", DRAFTER_KINDS)]  # fmt: skip
        r = start_rollout(engine, ProxySettings(), rollout_settings(), datetime.now(UTC))
        assert r.current_drafters == DRAFTER_KINDS and not r.of_proxy
    finally:
        engine.dispose()
