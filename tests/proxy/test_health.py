"""Passive health: a replica that fails proxy.eject_after times in a row leaves its pool for the cool-down, the
traffic goes on at the others, it comes back once it answers, and a pool whose replicas are all out still
tries one (issue 32, item 3). The pick's rules on members nothing listens on; the rest on real ports."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import httpx
import pytest

from monitor.proxy.pool import Ejection, Pool
from tests.api.conftest import READ, auth
from tests.proxy.engine import flushed, rows, sidecar
from tests.proxy.upstream import Upstream, serving
from tests.serving import free_port

CHAT = {"model": "qwen-coder", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'proxy.db'}"


def test_a_member_leaves_after_its_failures_in_a_row_and_is_back_on_trial_after_the_cool_down() -> None:
    pool = Pool.of("speculative", ("http://127.0.0.1:9", "http://127.0.0.1:10"), 10, Ejection(3, 0.2))
    a, b = pool.members
    a.failed("status 503")
    a.failed("status 503")
    a.answered()  # not in a row: counting starts over
    a.failed("status 503")
    a.failed("status 503")
    assert {pool.pick() for _ in range(4)} == {a, b}
    a.failed("ConnectError")
    assert not a.up and {pool.pick() for _ in range(10)} == {b}
    time.sleep(0.25)
    assert {pool.pick() for _ in range(4)} == {a, b}  # on trial
    a.failed("ConnectError")  # one failure on trial and it is out again
    assert {pool.pick() for _ in range(10)} == {b}
    time.sleep(0.25)
    a.answered()
    assert a.up and (a.failures, {pool.pick() for _ in range(4)}) == (0, {a, b})


def test_with_every_member_out_the_one_due_back_first_is_still_tried() -> None:
    pool = Pool.of("speculative", ("http://127.0.0.1:9", "http://127.0.0.1:10"), 10, Ejection(1, 60))
    a, b = pool.members
    b.failed("ConnectError")
    a.failed("ConnectError")
    assert {pool.pick() for _ in range(10)} == {b}


def metric(url: str, upstream: str) -> str:
    lines = httpx.get(f"{url}/metrics", headers=auth(READ), timeout=30).text.splitlines()
    return next(line.rpartition(" ")[2] for line in lines
                if line.startswith(f'draftwatch_proxy_upstream_up{{upstream="{upstream}"'))  # fmt: skip


def test_a_killed_member_is_ejected_traffic_goes_on_at_the_other_and_it_returns_after_the_cool_down(
    tmp_path: Path, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    a, b, default = Upstream(), Upstream(), Upstream()
    port = free_port()
    netloc = f"127.0.0.1:{port}"
    caplog.set_level(logging.INFO, "monitor.proxy.pool")
    with serving(b) as b_url, serving(default) as default_url:
        # Credentials in the URL never reach the log.
        pool = [f"http://user:s3cret@{netloc}", b_url]
        table = json.dumps([{"model": "qwen-*", "upstream": pool}])
        env = {"DRAFTWATCH_PROXY_ROUTES": table, "DRAFTWATCH_PROXY_EJECT_AFTER": "2",
               "DRAFTWATCH_PROXY_EJECT_COOLDOWN_S": "1.5"}  # fmt: skip
        with sidecar(tmp_path, db_url, default_url, **env) as (url, _), httpx.Client(base_url=url) as client:
            with serving(a, port):
                statuses = [client.post("/v1/chat/completions", json=CHAT).status_code for _ in range(4)]
                assert statuses == [200] * 4 and len(a.seen) == len(b.seen) == 2
            # Killed: its two refused connections go to the other member, count as two failures in a row, and
            # it is out.
            statuses = [client.post("/v1/chat/completions", json=CHAT).status_code for _ in range(12)]
            assert statuses == [200] * 12
            assert len(b.seen) == 2 + 12 and metric(url, netloc) == "0"
            assert httpx.get(f"{url}/healthz").json()["checks"]["upstreams"] == {"members": 3, "out": [netloc]}
            with serving(a, port):
                time.sleep(1.6)
                statuses = [client.post("/v1/chat/completions", json=CHAT).status_code for _ in range(6)]
                assert statuses == [200] * 6 and len(a.seen) == 2 + 3
                assert metric(url, netloc) == "1"
                assert httpx.get(f"{url}/healthz").json()["checks"]["upstreams"]["out"] == []
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "monitor.proxy.pool"]
    assert [level for level, _ in logged] == ["WARNING", "INFO"]
    assert logged[0][1].startswith(f"upstream {netloc} left the speculative pool for 1.5 s: 2 failures in a row")
    assert logged[1][1] == f"upstream {netloc} is back in the speculative pool: it answered after its cool-down"
    assert "s3cret" not in caplog.text


def test_a_pool_whose_only_member_is_out_still_sends_to_it(tmp_path: Path, db_url: str) -> None:
    stub = Upstream()
    port = free_port()
    env = {"DRAFTWATCH_PROXY_EJECT_AFTER": "1", "DRAFTWATCH_PROXY_EJECT_COOLDOWN_S": "600"}
    with sidecar(tmp_path, db_url, f"http://127.0.0.1:{port}", **env) as (url, _), httpx.Client(base_url=url) as client:
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 502  # out for ten minutes
        with serving(stub, port):
            assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
            assert metric(url, f"127.0.0.1:{port}") == "1"


def test_a_refused_connection_goes_once_to_another_member_and_still_counts_towards_its_health(
    tmp_path: Path, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    live = Upstream()
    closed = f"127.0.0.1:{free_port()}"  # nothing listens: every connection is refused
    caplog.set_level(logging.INFO, "monitor.proxy.forward.exchange")
    env = {"DRAFTWATCH_PROXY_EJECT_AFTER": "3", "DRAFTWATCH_PROXY_EJECT_COOLDOWN_S": "600"}
    with (
        serving(live) as live_url,
        sidecar(tmp_path, db_url, f"http://{closed},{live_url}", **env) as (url, app),
        httpx.Client(base_url=url) as client,
    ):
        answers = [client.post("/v1/chat/completions", json=CHAT) for _ in range(7)]
        streamed = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        # Refused three times in a row (each sent on to the live member): out of the pool.
        assert metric(url, closed) == "0"
        flushed(app)
    assert [a.status_code for a in answers] == [200] * 7 and answers[0].json() == live.chat
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    assert len(live.seen) == 8
    moved = [r.getMessage() for r in caplog.records if "refused the connection" in r.getMessage()]
    assert moved == [f"upstream {closed} refused the connection; the request goes to {live_url[7:]}"] * 3
    # Each record an answer (the stand-in's fixed ids keep one a route): the refusal is no failed request.
    assert [r["error"] for r in rows(db_url)] == [None, None]


def test_a_refused_connection_with_no_other_member_is_a_502(tmp_path: Path, db_url: str) -> None:
    closed = f"127.0.0.1:{free_port()}"
    with sidecar(tmp_path, db_url, f"http://{closed}") as (url, app), httpx.Client(base_url=url) as client:
        answer = client.post("/v1/chat/completions", json=CHAT)
        flushed(app)
    assert answer.status_code == 502 and answer.json()["error"]["type"] == "upstream_unavailable"
    assert answer.json()["error"]["message"] == f"the upstream at {closed} cannot be reached (ConnectError)"
    assert [r["error"] for r in rows(db_url)] == ["upstream unreachable: ConnectError"]


@pytest.mark.parametrize(("status", "ejected"), [(503, True), (502, True), (500, False), (429, False)])
def test_the_engines_own_unavailability_ejects_it_and_an_error_about_the_request_does_not(
    tmp_path: Path, db_url: str, status: int, ejected: bool
) -> None:
    failing, fine = Upstream(), Upstream()
    failing.fail_with = status
    with serving(failing) as failing_url, serving(fine) as fine_url:
        env = {"DRAFTWATCH_PROXY_EJECT_AFTER": "2", "DRAFTWATCH_PROXY_EJECT_COOLDOWN_S": "600"}
        with (
            sidecar(tmp_path, db_url, f"{failing_url},{fine_url}", **env) as (url, _),
            httpx.Client(base_url=url) as client,
        ):
            answers = [client.post("/v1/chat/completions", json=CHAT) for _ in range(8)]
    # The engine's error reaches the client as it sent it, whether or not it ejects the replica.
    assert {(a.status_code, a.json()["error"]["code"]) for a in answers if a.status_code != 200} == {(status, status)}
    assert len(failing.seen) == (2 if ejected else 4) and len(fine.seen) == 8 - len(failing.seen)
