"""Routing by the measured load crossover (issue 51 item 2): plain from the crossover on, speculative below.

The scheduler's side runs on stored stand-in traffic whose speeds cross at a known load
(tests/drift/ledger_records.py: speculation gains at 1 and 2 in flight, loses from 4): the curve it
measures decides a route by load, stored as a routing event whose reason names the level. The
proxy's side is the Router over real pools whose members' in-flight counts the test sets, as the
forwarding path's acquire and release do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from starlette.requests import Request
from starlette.responses import Response

from monitor.api.app import create_app
from monitor.drift.detectors.crossover import Crossover, Curve
from monitor.drift.settings import DriftSettings
from monitor.proxy.decide import decide_routes, measured_curves
from monitor.proxy.routing import Router, _take_decisions
from monitor.proxy.settings import ProxySettings
from monitor.scheduler.health import health_signals
from monitor.store.routing import RoutingEvent, latest_routing, load_reason, record_switch
from tests.api.conftest import READ, auth, make_settings
from tests.drift.conftest import store
from tests.drift.ledger_records import never_crossing_ms, stream
from tests.proxy.engine import Engine as StandIn
from tests.proxy.engine import flushed, rows, sidecar
from tests.proxy.test_routing import POLICY, deployment, settings, verdict
from tests.serving import serving

T0 = datetime(2026, 3, 1, tzinfo=UTC)
START, END = T0, T0 + timedelta(hours=2)
LATER = END + timedelta(days=1)  # past any dwell


def load_router(above: int, margin: int = 1) -> Router:
    d = deployment(spec=("http://127.0.0.1:9",))
    r = Router(dataclasses.replace(d, settings=ProxySettings(route_load_margin=margin)), POLICY)
    event = RoutingEvent(T0, "qa", "m", True, load_reason(above, "measured"), 0.9, 0.8, 1.0, above_inflight=above)
    _take_decisions(r, ({"qa": event}, {}))
    return r


def at_load(r: Router, load: int, n: int = 10) -> Counter[str | None]:
    """The holdout reasons of ``n`` requests chosen while the speculative replica would run them at ``load``."""
    (member,) = r.default.speculative.members
    member.inflight = load - 1
    return Counter(r.choose("qa").holdout_reason for _ in range(n))


def test_at_and_above_the_crossover_requests_go_plain_but_for_the_probes() -> None:
    r = load_router(4)
    assert r.above == {"qa": 4} and r.routed == frozenset()
    below = at_load(r, 1, 100)
    # Below the crossover the workload is served as an unrouted one: its holdout share (20 % toward the target).
    assert below == {None: 80, "target": 20}
    r = load_router(4)
    above = at_load(r, 4, 100)
    # From the crossover on: routed, the probes (20 % toward the window's target) still reach speculation.
    assert above == {"route": 80, None: 20}
    assert at_load(r, 9, 50) == {"route": 40, None: 10}  # well above: the same side, the probes to their 30


def test_hysteresis_holds_the_side_until_below_the_crossover_less_the_margin() -> None:
    r = load_router(4, margin=1)
    assert "route" not in at_load(r, 3)  # rising through 3: still below the crossover
    assert "route" in at_load(r, 4)
    assert "route" in at_load(r, 3)  # falling back to 3 (= 4 - margin): stays plain
    assert "route" not in at_load(r, 2)  # below 4 - 1: back to speculation
    assert "route" not in at_load(r, 3)  # and 3 keeps it there
    wide = load_router(6, margin=3)
    assert "route" in at_load(wide, 7) and "route" in at_load(wide, 3) and "route" not in at_load(wide, 2)
    low = load_router(2, margin=1)  # the margin would reach 1 in flight: an idle replica serves speculatively still
    assert "route" in at_load(low, 2) and "route" not in at_load(low, 1)


def test_a_workload_routed_whole_is_routed_whatever_the_load() -> None:
    r = Router(deployment(spec=("http://127.0.0.1:9",)), POLICY)
    whole = RoutingEvent(T0, "qa", "m", True, "net loss established", 0.7, 0.6, 0.8)
    _take_decisions(r, ({"qa": whole}, {}))
    assert r.above == {} and r.routed == {"qa"}
    assert at_load(r, 1, 100)["route"] == 80


def test_the_scheduler_routes_a_crossing_workload_by_load_and_the_alert_names_the_level(
    engine: Engine, tmp_path: Path, db_url: str
) -> None:
    store(engine, stream(T0, 40))
    curves = measured_curves(engine, DriftSettings(), START, END)
    assert curves["chat"].crossover is not None and curves["chat"].crossover.inflight == 4
    # The verdict over all loads pays: the crossover routes it by load all the same.
    pays = verdict("pays", 1.2, (1.1, 1.3), workload="chat")
    (event,) = decide_routes(engine, settings(), [pays], LATER, curves)
    assert (event.routed, event.above_inflight) == (True, 4) and event.reason.startswith("route above 4 in flight: ")
    stored = latest_routing(engine)["chat"]
    assert stored.above_inflight == 4
    (signal,) = [s for s in health_signals(engine, make_settings(tmp_path, db_url), LATER) if s.test == "routing"]
    assert signal.decision == "drift" and signal.note is not None and "route above 4 in flight" in signal.note
    window = {"since": START.isoformat(), "until": END.isoformat()}
    with TestClient(create_app(make_settings(tmp_path, db_url))) as client:
        (listed,) = client.get("/v1/workloads", params=window, headers=auth(READ)).json()["workloads"]
    assert (listed["workload"], listed["routed_to_baseline"], listed["routed_above_inflight"]) == ("chat", True, 4)
    # The same crossover next run: no switch; a new one: a switch to its level.
    assert decide_routes(engine, settings(), [pays], LATER + timedelta(days=1), curves) == []
    moved = {"chat": _with_crossover(curves["chat"], 2)}
    (event,) = decide_routes(engine, settings(), [pays], LATER + timedelta(days=2), moved)
    assert event.above_inflight == 2


def _with_crossover(curve: Curve, inflight: int) -> Curve:
    return dataclasses.replace(curve, crossover=Crossover(inflight, 1, inflight + 1))


def test_a_workload_losing_at_every_load_is_routed_whole_as_before(engine: Engine) -> None:
    store(engine, stream(T0, 40, spec_ms=lambda load: 30.0 + 2.0 * load))
    curves = measured_curves(engine, DriftSettings(), START, END)
    assert curves["chat"].crossover is None
    loss = verdict("net_loss", 0.7, (0.6, 0.8), workload="chat")
    (event,) = decide_routes(engine, settings(), [loss], LATER, curves)
    assert (event.routed, event.above_inflight) == (True, None) and event.reason.startswith("net loss established")
    # Routed by load earlier, and now speculation loses at every load: routed whole.
    with engine.begin() as conn:
        record_switch(
            conn,
            RoutingEvent(LATER, "chat", "qwen-coder-1.5b", True, load_reason(4, "x"), 0.9, 0.8, 1.0, above_inflight=4),
        )
    (whole,) = decide_routes(engine, settings(), [loss], LATER + timedelta(days=1), curves)
    assert (whole.routed, whole.above_inflight) == (True, None) and "every load" in whole.reason


def test_no_crossover_routes_nothing_by_load_and_returns_a_load_route(engine: Engine) -> None:
    store(engine, stream(T0, 40, spec_ms=never_crossing_ms))
    curves = measured_curves(engine, DriftSettings(), START, END)
    assert curves["chat"].crossover is None
    pays = verdict("pays", 1.5, (1.3, 1.7), workload="chat")
    assert decide_routes(engine, settings(), [pays], LATER, curves) == []
    # Routed by load earlier, and speculation now loses at no load: back to speculation, though the verdict over
    # all loads is inconclusive (which alone would hold a whole route).
    with engine.begin() as conn:
        record_switch(
            conn,
            RoutingEvent(LATER, "chat", "qwen-coder-1.5b", True, load_reason(4, "x"), 0.9, 0.8, 1.0, above_inflight=4),
        )
    unsure = verdict("inconclusive", 1.05, (0.9, 1.2), workload="chat")
    (back,) = decide_routes(engine, settings(), [unsure], LATER + timedelta(days=1), curves)
    assert (back.routed, back.above_inflight) == (False, None)
    assert latest_routing(engine)["chat"].above_inflight is None


def test_a_load_route_holds_while_its_loads_go_unmeasured(engine: Engine) -> None:
    # Routed from 8 in flight on, the speculative side has no requests up there: the gains below do not return it.
    store(engine, stream(T0, 40, spec_ms=never_crossing_ms, loads=(1, 2, 4)))
    curves = measured_curves(engine, DriftSettings(), START, END)
    assert curves["chat"].crossover is None and curves["chat"].measured[-1].inflight_high == 7
    with engine.begin() as conn:
        record_switch(
            conn,
            RoutingEvent(LATER, "chat", "qwen-coder-1.5b", True, load_reason(8, "x"), 0.9, 0.8, 1.0, above_inflight=8),
        )
    pays = verdict("pays", 1.5, (1.3, 1.7), workload="chat")
    assert decide_routes(engine, settings(), [pays], LATER + timedelta(days=1), curves) == []


class LoadedEngine(StandIn):
    """A stand-in whose answer takes longer the more requests it holds, as a speculative replica slows with batch;
    while ``hold`` is set it holds every request (so that a test knows what is in flight)."""

    def __init__(self, per_request_s: float) -> None:
        super().__init__()
        self.per_request_s = per_request_s
        self.active = 0
        self.hold = False

    async def _chat(self, request: Request) -> Response:
        self.active += 1
        self.header_pause_s = self.per_request_s * self.active
        try:
            while self.hold:
                await asyncio.sleep(0.01)
            return await super()._chat(request)
        finally:
            self.active -= 1


def test_the_proxy_sends_plain_what_would_run_at_the_crossover_on_real_http(
    engine: Engine, tmp_path: Path, db_url: str
) -> None:
    with engine.begin() as conn:  # the scheduler's decision: plain from 4 in flight
        record_switch(
            conn, RoutingEvent(LATER, "qa", "m", True, load_reason(4, "measured"), 0.9, 0.8, 1.0, above_inflight=4)
        )
    # The speculative stand-in slows with its load (50 ms per request it holds); the plain one answers at once.
    spec, plain = LoadedEngine(0.05), StandIn()
    spec.number_answers = plain.number_answers = True
    env = {"DRAFTWATCH_PROXY_ON_NET_LOSS": "route", "DRAFTWATCH_PROXY_ROUTE_REFRESH_S": "0.1",
           "DRAFTWATCH_DECODER_HOLDOUT_TARGET": "0"}  # fmt: skip  # no holdout, no probe: every choice is the load's
    with (
        serving(spec.app()) as spec_url,
        serving(plain.app()) as plain_url,
        sidecar(tmp_path, db_url, spec_url, DRAFTWATCH_PROXY_BASELINE_UPSTREAM=plain_url, **env) as (url, app),
    ):
        time.sleep(0.3)  # the router's first read of the decisions
        spec.hold = True
        with ThreadPoolExecutor(3) as pool:
            held = [pool.submit(chat, url) for _ in range(3)]  # three in flight on the speculative replica
            deadline = time.monotonic() + 10
            while spec.active < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert spec.active == 3
            assert chat(url) == 200  # it would run at 4 in flight: plain
            assert len(plain.seen) == 1
            spec.hold = False
            assert [f.result() for f in held] == [200] * 3
        chat(url)  # alone again: speculative
        flushed(app)
    assert (len(spec.seen), len(plain.seen)) == (4, 1)
    # The stand-ins answer alike (speculative figures), so only the speculative pool's answers are stored.
    assert [
        (r["mode"], r["upstream_inflight"]) for r in sorted(rows(db_url), key=lambda r: r["upstream_inflight"])
    ] == [("speculative", 1), ("speculative", 1), ("speculative", 2), ("speculative", 3)]


def chat(url: str) -> int:
    body = {"model": "qwen-coder", "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers={"X-Workload": "qa"}, timeout=30).status_code
