"""The proxy's routing: which replica a request reaches (Router), and when a workload is routed (decide_routes).

Router tests use pools of addresses nothing listens on: choosing a replica sends nothing.
decide_routes runs on a real, migrated SQLite store, as the scheduler's drift job calls it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from decoder.holdout import HoldoutPolicy
from monitor.drift.verdict import Verdict, VerdictName
from monitor.proxy.decide import decide_routes
from monitor.proxy.pool import Pool
from monitor.proxy.routing import Deployment, Route, Router
from monitor.proxy.settings import ModelRoute, ProxySettings
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.routing import latest_routing, routing_events

SPEC = ("http://127.0.0.1:9", "http://127.0.0.1:10")
BASE = ("http://127.0.0.1:11",)
# A small workload's holdout: 30 per window at 20 % until it has them, then 1 %.
POLICY = HoldoutPolicy(share=0.01, target=30, max_share=0.2)
T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)


def deployment(spec: tuple[str, ...] = SPEC, base: tuple[str, ...] = BASE, model: str = "*") -> Deployment:
    return Deployment(model, Pool.of("speculative", spec, 10), Pool.of("baseline", base, 10), ProxySettings())


def router(policy: str = "share", seed: int = 0) -> Router:
    return Router(deployment(), POLICY, baseline_policy=policy, seed=seed)


def routes(r: Router, workload: str, n: int) -> list[Route]:
    return [r.choose(workload) for _ in range(n)]


@pytest.mark.parametrize("seed", range(5))
def test_share_draws_the_target_within_its_max_share_and_never_starves(seed: int) -> None:
    chosen = routes(router(seed=seed), "qa", 300)
    baseline = [i for i, route in enumerate(chosen) if route.baseline]
    # At 20 % the systematic schedule holds out one request in every 5: the 30th by request 150.
    assert len(baseline) >= 30 and baseline[29] < 150
    assert all(b - a <= 5 for a, b in zip([-1, *baseline[:29]], baseline[:30], strict=True))
    assert [chosen[i].holdout_reason for i in baseline[:30]] == ["target"] * 30
    # Target reached within the window: the floor share, 1 % of the remaining ~150.
    assert 1 <= len(baseline) - 30 <= 2 and {chosen[i].holdout_reason for i in baseline[30:]} == {"share"}
    assert all(route.member.pool == ("baseline" if route.baseline else "speculative") for route in chosen)


def test_share_keeps_each_workload_to_its_own_schedule() -> None:
    r = router()
    routes(r, "busy", 500)
    # A busy workload's holdouts do not count towards a quiet one's target.
    assert sum(route.baseline for route in routes(r, "quiet", 50)) == 10


def test_member_sends_each_request_to_the_least_loaded_replica_and_says_so() -> None:
    r = router("member")
    (spec_a, spec_b), (base,) = r.default.speculative.members, r.default.baseline.members
    spec_a.inflight, spec_b.inflight, base.inflight = 3, 2, 1
    route = r.choose("qa")
    assert (route.member, route.holdout_reason) == (base, "member")
    base.inflight = 5
    route = r.choose("qa")
    assert (route.member, route.holdout_reason, route.baseline) == (spec_b, None, False)


def test_member_spreads_idle_replicas_evenly() -> None:
    r = router("member")
    chosen = routes(r, "qa", 300)
    assert Counter(route.member.upstream.url for route in chosen) == dict.fromkeys((*SPEC, *BASE), 100)
    assert Counter(route.holdout_reason for route in chosen) == {None: 200, "member": 100}


def test_a_routed_workload_goes_to_the_baseline_but_for_its_probes() -> None:
    r = router()
    r.routed = frozenset({"qa"})
    chosen = routes(r, "qa", 100)
    probes = [route for route in chosen if not route.baseline]
    # The probes follow the holdout schedule: 20 % while the window's 30 are not reached.
    assert len(probes) == 20 and all(p.member.pool == "speculative" and p.holdout_reason is None for p in probes)
    assert Counter(route.holdout_reason for route in chosen if route.baseline) == {"route": 80}
    assert all(route.member.pool == "baseline" for route in chosen if route.baseline)
    # Other workloads keep the ordinary share.
    assert Counter(route.holdout_reason for route in routes(r, "chat", 50)) == {None: 40, "target": 10}


def test_without_a_baseline_everything_is_speculative() -> None:
    r = Router(deployment(base=()), POLICY)
    r.routed = frozenset({"qa"})
    assert not any(route.baseline for route in routes(r, "qa", 50))


def test_a_model_takes_the_first_route_it_matches_and_its_own_baseline_policy() -> None:
    code = deployment(("http://127.0.0.1:12",), ("http://127.0.0.1:13",), "qwen*")
    exact = deployment(("http://127.0.0.1:14",), (), "qwen-coder-7b")
    r = Router(deployment(), POLICY, routes=[exact, code])
    assert r.deployments == (exact, code, r.default)
    assert {r.choose("qa", "qwen-coder-7b").member.upstream.url for _ in range(20)} == {"http://127.0.0.1:14"}
    chosen = routes_for(r, "qa", "qwen-max", 50)
    assert {route.deployment for route in chosen} == {code}
    # The route's baseline is drawn by the same holdout policy as the default's: 20 % towards the target.
    assert Counter(route.member.upstream.url for route in chosen) == {"http://127.0.0.1:12": 40,
                                                                      "http://127.0.0.1:13": 10}  # fmt: skip
    for model in ("mistral", None, 7, "Qwen-max"):  # no match, no model, not a string, another case
        assert r.choose("chat", model).deployment is r.default
        assert r.passing(model).deployment is r.default
    assert r.passing("qwen-max").member.upstream.url == "http://127.0.0.1:12"


def routes_for(r: Router, workload: str, model: str, n: int) -> list[Route]:
    return [r.choose(workload, model) for _ in range(n)]


# decide_routes


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    engine = create_engine(f"sqlite:///{tmp_path / 'routing.db'}")
    upgrade(engine)
    try:
        yield engine
    finally:
        engine.dispose()


def settings(on_net_loss: str = "route", dwell_s: float = 3600.0) -> ProxySettings:
    return ProxySettings(upstream=SPEC, baseline_upstream=BASE, on_net_loss=on_net_loss, route_min_dwell_s=dwell_s)


def verdict(name: VerdictName, speedup: float, ci: tuple[float, float], *, measured: bool = True,
            workload: str = "qa", n_speculative: int = 200) -> Verdict:  # fmt: skip
    return Verdict(workload, "smollm2-135m/ngram", name, f"{speedup:.2f}x", speedup, ci, measured, n_speculative, 40)


LOSS = verdict("net_loss", 0.7, (0.6, 0.8))
PAYS = verdict("pays", 1.4, (1.2, 1.6))
UNSURE = verdict("inconclusive", 0.95, (0.8, 1.1))


def test_a_measured_net_loss_routes_the_workload(sqlite_engine: Engine) -> None:
    (event,) = decide_routes(sqlite_engine, settings(), [LOSS], T0)
    assert (event.workload, event.routed, event.target_model) == ("qa", True, "smollm2-135m")
    assert (event.speedup, event.ci_low, event.ci_high) == (0.7, 0.6, 0.8)
    assert event.reason.startswith("net loss established")
    stored = latest_routing(sqlite_engine)["qa"]
    assert stored.routed and stored.ts.replace(tzinfo=UTC) == T0


def test_a_routes_own_baseline_is_enough_to_route_a_net_loss(sqlite_engine: Engine) -> None:
    only_routes = ProxySettings(upstream=SPEC, routes=(ModelRoute("qwen*", ("http://127.0.0.1:12",), None, BASE),),
                                on_net_loss="route")  # fmt: skip
    (event,) = decide_routes(sqlite_engine, only_routes, [LOSS], T0)
    assert (event.workload, event.routed) == ("qa", True)


def test_an_inconclusive_verdict_changes_nothing(sqlite_engine: Engine) -> None:
    assert decide_routes(sqlite_engine, settings(dwell_s=0), [UNSURE], T0) == []
    decide_routes(sqlite_engine, settings(dwell_s=0), [LOSS], T0)
    # Routed, then inconclusive (the hysteresis band between the two bounds): it stays routed.
    assert decide_routes(sqlite_engine, settings(dwell_s=0), [UNSURE], T0 + timedelta(hours=1)) == []
    assert latest_routing(sqlite_engine)["qa"].routed


def test_an_estimated_net_loss_or_alert_only_does_not_route(sqlite_engine: Engine) -> None:
    estimate = verdict("net_loss", 0.7, (0.6, 0.8), measured=False)
    assert decide_routes(sqlite_engine, settings(), [estimate], T0) == []
    assert decide_routes(sqlite_engine, settings("alert"), [LOSS], T0) == []
    assert latest_routing(sqlite_engine) == {}


def test_the_dwell_blocks_a_second_switch_then_pays_returns_it(sqlite_engine: Engine) -> None:
    decide_routes(sqlite_engine, settings(), [LOSS], T0)
    # Ten minutes later the probes say it pays: within the hour's dwell, the route holds.
    assert decide_routes(sqlite_engine, settings(), [PAYS], T0 + timedelta(minutes=10)) == []
    (back,) = decide_routes(sqlite_engine, settings(), [PAYS], T0 + timedelta(hours=1, minutes=1))
    assert (back.routed, back.speedup) == (False, 1.4) and back.reason.startswith("speculation pays again")
    history = routing_events(sqlite_engine, T0 - timedelta(days=1), T0 + timedelta(days=1), "qa")
    assert [e.routed for e in history] == [True, False]


def test_a_workload_already_on_speculation_is_not_switched_by_pays(sqlite_engine: Engine) -> None:
    assert decide_routes(sqlite_engine, settings(dwell_s=0), [PAYS], T0) == []


def test_the_busiest_pair_of_a_workload_decides(sqlite_engine: Engine) -> None:
    # Two pairs of one workload: the one with more speculative requests speaks for it.
    small_loss = verdict("net_loss", 0.7, (0.6, 0.8), n_speculative=40)
    busy_pays = verdict("inconclusive", 1.05, (0.9, 1.2), n_speculative=400)
    assert decide_routes(sqlite_engine, settings(), [small_loss, busy_pays], T0) == []
