"""The routing pool under partial faults and biased traffic (issue 37): the member baseline's share is the
generations' own whatever else a client asks, a pool that was out as a whole comes back as a whole, and
what the proxy itself could not write counts against no replica. The pool's rules on members nothing
listens on; the rest on real ports with stand-in upstreams."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from monitor.proxy.pool import Ejection, Pool
from tests.proxy.engine import sidecar
from tests.proxy.test_health import metric
from tests.proxy.upstream import Upstream, serving

CHAT = {"model": "qwen-coder", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'proxy.db'}"


def generations(stub: Upstream) -> int:
    return sum(path == "/v1/chat/completions" for path, _, _ in stub.seen)


def models_before(client: httpx.Client) -> None:
    assert client.get("/v1/models").status_code == 200
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


def models_after(client: httpx.Client) -> None:
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert client.get("/v1/models").status_code == 200


def plain(client: httpx.Client) -> None:
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


@pytest.mark.parametrize("pattern", [models_before, models_after, plain], ids=lambda p: p.__name__)
def test_the_member_baselines_share_is_half_whatever_else_a_sequential_client_asks(
    tmp_path: Path, db_url: str, pattern: Callable[[httpx.Client], None]
) -> None:
    speculative, baseline = Upstream(), Upstream()
    with serving(speculative) as spec_url, serving(baseline) as base_url:
        env = {"DRAFTWATCH_PROXY_BASELINE_UPSTREAM": base_url, "DRAFTWATCH_PROXY_BASELINE_POLICY": "member"}
        with sidecar(tmp_path, db_url, spec_url, **env) as (url, _), httpx.Client(base_url=url, timeout=30) as client:
            for _ in range(40):
                pattern(client)
    # Idle members take turns, the listings' picks a turn of their own (models-before once gave 0 of 40).
    assert generations(speculative) + generations(baseline) == 40
    assert 16 <= generations(baseline) <= 24


def test_a_pool_out_as_a_whole_for_a_brief_error_is_back_as_a_whole_soon_after_it_ends(
    tmp_path: Path, db_url: str
) -> None:
    a, b = Upstream(), Upstream()
    env = {"DRAFTWATCH_PROXY_EJECT_AFTER": "2", "DRAFTWATCH_PROXY_EJECT_COOLDOWN_S": "30"}
    with (
        serving(a) as a_url,
        serving(b) as b_url,
        sidecar(tmp_path, db_url, f"{a_url},{b_url}", **env) as (url, _),
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        netlocs = [u.removeprefix("http://") for u in (a_url, b_url)]
        for stub in (a, b):
            stub.fail_with = 503  # the engines overloaded together, for a while
        failing = [client.post("/v1/chat/completions", json=CHAT).status_code for _ in range(8)]
        assert set(failing) == {503} and [metric(url, n) for n in netlocs] == ["0", "0"]
        for stub in (a, b):
            stub.fail_with = None
        seen = (len(a.seen), len(b.seen))
        answers = [client.post("/v1/chat/completions", json=CHAT).status_code for _ in range(4)]
        # The one tried first answers; the other is on trial at once rather than idle for 30 s, and answers too.
        assert answers == [200] * 4 and [metric(url, n) for n in netlocs] == ["1", "1"]
        assert len(a.seen) > seen[0] and len(b.seen) > seen[1]


def test_one_answer_puts_the_rest_of_a_pool_that_was_out_as_a_whole_on_trial_and_a_failure_sends_it_out_again() -> None:
    pool = Pool.of("speculative", ("http://127.0.0.1:9", "http://127.0.0.1:10", "http://127.0.0.1:11"), 10,
                   Ejection(1, 60))  # fmt: skip
    a, b, c = pool.members
    for member in (a, b, c):
        member.failed("status 503")
    assert {pool.pick() for _ in range(6)} == {a}  # due back first
    a.answered()
    assert {pool.pick() for _ in range(6)} == {a, b, c}
    b.failed("status 503")  # on trial: one failure and it is out for a whole cool-down again
    assert not b.up and {pool.pick() for _ in range(6)} == {a, c}
    c.answered()
    assert c.up and {pool.pick() for _ in range(6)} == {a, c}


def test_a_member_out_while_another_served_stays_out_for_its_cool_down() -> None:
    pool = Pool.of("speculative", ("http://127.0.0.1:9", "http://127.0.0.1:10", "http://127.0.0.1:11"), 10,
                   Ejection(1, 60))  # fmt: skip
    a, b, c = pool.members
    a.failed("ConnectError")
    b.failed("ConnectError")
    c.answered()
    assert {pool.pick() for _ in range(6)} == {c}
    b.out_until = time.monotonic() - 1  # b's cool-down over: on trial, it answers
    b.answered()
    # c served all along: a's failures were its own, and it sits out its cool-down.
    assert b.up and {pool.pick() for _ in range(6)} == {b, c}


def test_a_target_the_proxy_cannot_write_counts_against_no_member() -> None:
    pool = Pool.of("speculative", ("http://127.0.0.1:9",), 10, Ejection(1, 60))
    (member,) = pool.members
    with pytest.raises(ValueError, match="no request line can carry"):
        asyncio.run(member.send("GET", b"/v1/models x", [], b""))
    assert member.up and member.failures == 0
