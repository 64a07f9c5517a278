"""A drafter rollout's steps on stored records: judged per workload, advanced, promoted, held, rolled back.

Records are written as the proxy writes them: the current pool's under drafter ``upstream``, the
candidate's under the rollout's drafter name, both speculative, with decode times drawn per
workload (seeded). The clock is the test's: each ``advance_rollouts`` call is told when it runs.
On a SQLite file and on PostgreSQL.
"""

from __future__ import annotations

import itertools
import unittest.mock
from dataclasses import replace
from datetime import datetime, timedelta

import numpy as np
import pytest
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from decoder.candidate import DRAFTER_KINDS, Candidate
from decoder.record import RequestRecord
from monitor.config import Settings
from monitor.proxy import rollout as steps
from monitor.proxy.rollout import (
    RolloutError,
    Staged,
    abort,
    advance_rollouts,
    promote,
    route_setting,
    served_here,
    staged_for,
    start_rollout,
)
from monitor.proxy.routing import Deployment, build_router
from monitor.proxy.settings import ModelRoute, ProxySettings, RolloutSettings
from monitor.store.candidates import Announced, announce
from monitor.store.rollouts import (
    CURRENT_DRAFTER,
    Rollout,
    active_rollouts,
    get_rollout,
    insert_rollout,
    rollout_events,
    save_rollout,
)
from monitor.store.writes.writer import write_batch
from tests.draws import assert_share
from tests.records import T0, api_record

CANDIDATE = "ngram-greedy"
PROXY = ProxySettings(upstream=("http://spec:8080",), candidate_upstream=("http://cand:8080",))
INTERVAL = timedelta(minutes=10)
_ids = itertools.count()


def rollout_settings(**changes: object) -> RolloutSettings:
    values: dict[str, object] = {"steps": (0.1, 0.5, 1.0), "interval": INTERVAL, "min_requests": 20,
                                 "drafter": CANDIDATE, **changes}  # fmt: skip
    return RolloutSettings(**values)  # type: ignore[arg-type]


def requests(
    workload: str, drafter: str, ms: float, n: int, start: datetime, *, seed: int, errors: int = 0
) -> list[RequestRecord]:
    """``n`` speculative requests of ``workload`` at ``ms`` per token (lognormal, sd 0.15), spread over 5 minutes."""
    rng = np.random.default_rng(seed)
    out = []
    for i, per_token in enumerate(rng.lognormal(np.log(ms), 0.15, n).tolist()):
        ts = start + timedelta(seconds=300 * i / n)
        failed = i < errors
        out.append(api_record(
            f"r{next(_ids)}", ts_start=ts, ts_end=ts + timedelta(seconds=1), workload=workload, drafter=drafter,
            target_model="smollm2-135m", draft_model=None, output_tokens=33,
            decode_ms=None if failed else per_token * 32, ttft_ms=40.0, latency_ms=40.0 + per_token * 32,
            finish_reason="error" if failed else "stop", error="upstream 500" if failed else None, upstream_inflight=1,
        ))  # fmt: skip
    return out


def store(engine: Engine, records: list[RequestRecord]) -> None:
    with engine.begin() as conn:
        write_batch(conn, records, f"b{next(_ids)}", "sync")


def interval_of(engine: Engine, start: datetime, speeds: dict[str, tuple[float, float]], n: int = 40) -> None:
    """One interval's traffic: per workload, (current ms per token, candidate ms per token)."""
    for k, (workload, (current, candidate)) in enumerate(sorted(speeds.items())):
        seed = int(start.timestamp()) + 10 * k
        store(engine, requests(workload, CURRENT_DRAFTER, current, n, start, seed=seed)
              + requests(workload, CANDIDATE, candidate, n, start, seed=seed + 1))  # fmt: skip


def kinds(engine: Engine, rollout_id: int) -> list[str]:
    return [e.kind for e in rollout_events(engine, rollout_id=rollout_id)]


def test_a_candidate_that_wins_everywhere_is_advanced_step_by_step_then_promoted(engine: Engine) -> None:
    """Steps 10 %, 50 %, 100 %: judged at 10 and 50; passing 50 % promotes it (at 100 % nothing is left to compare)."""
    r = start_rollout(engine, PROXY, rollout_settings(), T0)
    assert r.id is not None and active_rollouts(engine)["*"].step_share == pytest.approx(0.1)
    t = T0
    for step in range(2):  # the steps below 100 %; passing the last of them is the promotion
        interval_of(engine, t, {"copy": (10.0, 7.0), "story": (10.0, 9.0)})
        # Before the interval has run its length, a passing step stays where it is.
        assert advance_rollouts(engine, rollout_settings(), t + INTERVAL / 2) == []
        t += INTERVAL + timedelta(seconds=1)
        (event,) = advance_rollouts(engine, rollout_settings(), t)
        assert event.kind == ("advanced" if step < 1 else "promoted"), event.reason
    done = get_rollout(engine, r.id)
    assert done is not None and done.status == "promoted" and done.share("anything") == 1.0
    assert "scores copy 100, story 100" in done.reason
    assert kinds(engine, r.id) == ["started", "advanced", "promoted"]
    # A promoted rollout still serves: a second one on the same deployment is refused until it ends.
    with pytest.raises(RolloutError, match="is promoted on deployment"):
        start_rollout(engine, PROXY, rollout_settings(), t)


def test_a_losing_workload_rolls_the_rollout_back_at_once(engine: Engine) -> None:
    r = start_rollout(engine, PROXY, rollout_settings(), T0)
    interval_of(engine, T0, {"copy": (10.0, 7.0), "story": (10.0, 13.0)})
    # Long before the step's interval ends: a failure does not wait for it.
    (event,) = advance_rollouts(engine, rollout_settings(), T0 + timedelta(minutes=5, seconds=1))
    assert event.kind == "rolled_back" and event.share == 0.0
    assert "story: decode_speed fail" in event.reason and "copy" not in event.reason
    assert r.id is not None and "*" not in active_rollouts(engine)
    # Over: nothing more happens, and a new rollout may start.
    assert advance_rollouts(engine, rollout_settings(), T0 + 3 * INTERVAL) == []
    start_rollout(engine, PROXY, rollout_settings(), T0 + 3 * INTERVAL)


def test_per_workload_keeps_the_loser_on_the_current_drafter_and_promotes_the_winner(engine: Engine) -> None:
    s = rollout_settings(per_workload=True)
    r = start_rollout(engine, PROXY, s, T0)
    assert r.id is not None
    interval_of(engine, T0, {"copy": (10.0, 7.0), "story": (10.0, 13.0)})
    (kept,) = advance_rollouts(engine, s, T0 + timedelta(minutes=5, seconds=1))
    assert (kept.kind, kept.workload) == ("kept", "story")
    running = get_rollout(engine, r.id)
    assert running is not None and running.status == "running"
    assert running.share("story") == 0.0 and running.share("copy") == pytest.approx(0.1)
    t = T0
    for _ in range(2):
        interval_of(engine, t, {"copy": (10.0, 7.0), "story": (10.0, 13.0)})
        t += INTERVAL + timedelta(seconds=1)
        advance_rollouts(engine, s, t)
    done = get_rollout(engine, r.id)
    assert done is not None
    assert done.status == "promoted", done.reason
    assert dict(done.workloads) == {"copy": "candidate", "story": "current"}
    assert done.share("copy") == 1.0 and done.share("story") == 0.0
    # A workload the judge never saw is not given to the candidate on no evidence.
    assert done.share("chat") == 0.0
    assert "kept on the current drafter: story" in done.reason
    assert kinds(engine, r.id) == ["started", "kept", "advanced", "promoted"]


def test_per_workload_the_promotion_waits_for_a_workload_the_candidate_served_but_could_not_judge_yet(
    engine: Engine,
) -> None:
    # Without the wait, copy's pass promoted at the first interval end and story stayed on the current drafter,
    # never judged, though it was about to be (the demo's rollout and benchmarks/rollout_pair.py's replay).
    s = rollout_settings(steps=(0.5, 1.0), per_workload=True, max_holds=2)
    r = start_rollout(engine, PROXY, s, T0)
    assert r.id is not None
    interval_of(engine, T0, {"copy": (10.0, 7.0)})
    interval_of(engine, T0, {"story": (10.0, 13.0)}, n=5)
    (held,) = advance_rollouts(engine, s, T0 + INTERVAL + timedelta(seconds=1))
    assert held.kind == "held" and "unjudged (too few requests): story" in held.reason
    t = T0 + INTERVAL + timedelta(seconds=2)
    interval_of(engine, t, {"story": (10.0, 13.0)})  # story now judged: slower, kept on the current drafter
    events = advance_rollouts(engine, s, t + timedelta(minutes=5, seconds=1))
    assert [e.kind for e in events] == ["kept", "promoted"], [e.reason for e in events]
    done = get_rollout(engine, r.id)
    assert done is not None and dict(done.workloads) == {"copy": "candidate", "story": "current"}


def test_per_workload_the_promotion_waits_for_an_unjudged_workload_only_while_holds_remain(engine: Engine) -> None:
    s = rollout_settings(steps=(0.5, 1.0), per_workload=True, max_holds=2)
    r = start_rollout(engine, PROXY, s, T0)
    assert r.id is not None
    interval_of(engine, T0, {"copy": (10.0, 7.0)})
    interval_of(engine, T0, {"rare": (10.0, 10.0)}, n=5)
    for k in range(1, 4):
        advance_rollouts(engine, s, T0 + k * INTERVAL + timedelta(seconds=1))
    events = rollout_events(engine, rollout_id=r.id)
    assert [e.kind for e in events] == ["started", "held", "held", "promoted"]
    assert "never judged (too few requests), left on the current drafter: rare" in events[-1].reason
    done = get_rollout(engine, r.id)
    assert done is not None and done.share("copy") == 1.0 and done.share("rare") == 0.0


def test_a_workload_too_small_to_judge_is_listed_not_waited_for(engine: Engine) -> None:
    r = start_rollout(engine, PROXY, rollout_settings(), T0)
    assert r.id is not None
    t = T0
    for _ in range(2):
        interval_of(engine, t, {"copy": (10.0, 9.5)})
        interval_of(engine, t, {"rare": (10.0, 10.0)}, n=5)
        t += INTERVAL + timedelta(seconds=1)
        advance_rollouts(engine, rollout_settings(), t)
    events = rollout_events(engine, rollout_id=r.id)
    assert [e.kind for e in events] == ["started", "advanced", "promoted"]
    assert "unjudged (too few requests): rare" in events[1].reason
    assert "never judged (too few requests), promoted with the rest: rare" in events[2].reason
    assert events[1].judgement["workloads"]["rare"]["outcome"] == "unjudged"


def test_a_step_with_nothing_judged_is_held_then_given_up(engine: Engine) -> None:
    s = rollout_settings(max_holds=2)
    r = start_rollout(engine, PROXY, s, T0)
    assert r.id is not None
    interval_of(engine, T0, {"rare": (10.0, 10.0)}, n=5)
    for k in range(1, 4):
        advance_rollouts(engine, s, T0 + k * INTERVAL + timedelta(seconds=1))
        advance_rollouts(engine, s, T0 + k * INTERVAL + timedelta(seconds=30))  # no second event per interval
    events = rollout_events(engine, rollout_id=r.id)
    assert [e.kind for e in events] == ["started", "held", "held", "rolled_back"]
    assert "held (1 of 2): unjudged (too few requests): rare" in events[1].reason
    assert events[-1].reason.startswith("rolled back: no decision after 3 intervals at step 1")


def test_intervals_no_run_judged_are_not_holds(engine: Engine) -> None:
    """The scheduler down for max_holds + 2 intervals: the first run after it holds the step once, not gives up.

    Holds are counted by the runs that find the step undecided, one an interval at most: the step still
    rolls back after max_holds of them.
    """
    s = rollout_settings(max_holds=2)
    r = start_rollout(engine, PROXY, s, T0)
    assert r.id is not None
    interval_of(engine, T0, {"rare": (10.0, 10.0)}, n=5)  # too few to judge
    after = T0 + 4 * INTERVAL + timedelta(seconds=1)  # no run since the start
    (held,) = advance_rollouts(engine, s, after)
    assert held.kind == "held" and "held (1 of 2): unjudged (too few requests): rare" in held.reason, held.reason
    assert advance_rollouts(engine, s, after + timedelta(minutes=5)) == []  # the same interval: no second hold
    stored = get_rollout(engine, r.id)
    assert stored is not None and (stored.status, stored.holds) == ("running", 1)
    assert stored.judgement["held_at"] == 4
    (held,) = advance_rollouts(engine, s, T0 + 5 * INTERVAL + timedelta(seconds=1))
    assert held.kind == "held" and "held (2 of 2)" in held.reason, held.reason
    # Another gap of 3 intervals: one hold more, the one past max_holds.
    (ended,) = advance_rollouts(engine, s, T0 + 8 * INTERVAL + timedelta(seconds=1))
    assert ended.reason.startswith("rolled back: no decision after 3 intervals at step 1"), ended.reason
    assert kinds(engine, r.id) == ["started", "held", "held", "rolled_back"]


def test_a_rollout_held_before_the_interval_of_its_hold_was_kept_goes_on_from_its_holds(engine: Engine) -> None:
    """A rollout stored by an earlier version, held at each interval end (its holds), no ``held_at``."""
    s = rollout_settings(max_holds=2)
    r = start_rollout(engine, PROXY, s, T0)
    assert r.id is not None
    with engine.begin() as conn:
        save_rollout(conn, replace(r, holds=1, judgement={"judged": []}))
    interval_of(engine, T0, {"rare": (10.0, 10.0)}, n=5)
    assert advance_rollouts(engine, s, T0 + INTERVAL + timedelta(minutes=5)) == []  # its hold of this interval
    (held,) = advance_rollouts(engine, s, T0 + 2 * INTERVAL + timedelta(seconds=1))
    assert held.kind == "held" and "held (2 of 2)" in held.reason, held.reason


def test_a_candidate_that_fails_its_requests_is_rolled_back_on_the_error_rate(engine: Engine) -> None:
    start_rollout(engine, PROXY, rollout_settings(), T0)
    store(engine, requests("chat", CURRENT_DRAFTER, 10.0, 40, T0, seed=1)
          + requests("chat", CANDIDATE, 10.0, 40, T0, seed=2, errors=40))  # fmt: skip
    (event,) = advance_rollouts(engine, rollout_settings(), T0 + timedelta(minutes=6))
    assert event.kind == "rolled_back" and "error rate 100.0% against 0.0%" in event.reason


def test_promote_and_abort_by_hand(engine: Engine) -> None:
    r = start_rollout(engine, PROXY, rollout_settings(per_workload=True), T0)
    assert r.id is not None
    done = promote(engine, r.id, T0 + INTERVAL)
    assert done.status == "promoted" and done.share("any") == 1.0
    with pytest.raises(RolloutError, match="is promoted: only a running one can be promoted"):
        promote(engine, r.id, T0 + INTERVAL)
    ended = abort(engine, r.id, T0 + 2 * INTERVAL)
    assert ended.status == "aborted" and ended.share("any") == 0.0 and "*" not in active_rollouts(engine)
    with pytest.raises(RolloutError, match="no rollout 999"):
        abort(engine, 999, T0)
    assert kinds(engine, r.id) == ["started", "promoted", "aborted"]


def test_a_rollout_starts_only_on_a_configured_candidate(engine: Engine) -> None:
    with pytest.raises(RolloutError, match="has no candidate pool: no sidecar announced one in the last 3m and proxy"):
        start_rollout(engine, ProxySettings(upstream=("http://spec:8080",)), rollout_settings(), T0)
    with pytest.raises(RolloutError, match="is not in proxy.candidate_upstream"):
        start_rollout(engine, PROXY, rollout_settings(), T0, candidate="http://elsewhere:9999")
    with pytest.raises(RolloutError, match="other than 'upstream'"):
        start_rollout(engine, PROXY, rollout_settings(drafter="upstream"), T0)
    with pytest.raises(RolloutError, match="route=3: expected a route number 1-1"):
        routed = ProxySettings(upstream=("http://spec:8080",), routes=(ModelRoute("qwen*", ("http://q:8000",)),))
        start_rollout(engine, routed, rollout_settings(), T0, route=3)
    routes = (ModelRoute("qwen*", ("http://q:8000",), candidate_upstream=("http://qc:8000",)),)
    on_route = start_rollout(engine, ProxySettings(upstream=("http://spec:8080",), routes=routes), rollout_settings(),
                             T0, route=1, candidate="http://qc:8000/")  # fmt: skip
    assert on_route.deployment == "qwen*"
    start_rollout(engine, PROXY, rollout_settings(), T0)  # another deployment's rollout does not block this one
    with pytest.raises(RolloutError, match=r"rollout \d+ is running on deployment '\*'"):
        start_rollout(engine, PROXY, rollout_settings(), T0)


def test_a_start_without_a_pool_of_its_own_takes_the_one_its_sidecars_announced(engine: Engine) -> None:
    """The candidate pool is the sidecars' flag: ``rollout start`` elsewhere reads what they announced lately."""
    bare = ProxySettings(upstream=("http://spec:8080",))
    masked = "http://ada:***@cand:8082"
    with engine.begin() as conn:
        announce(conn, "a:1", [Announced("*", (masked,), "proxy.candidate_upstream", (CURRENT_DRAFTER,))], T0)
        announce(conn, "b:2", [Announced("*", ("http://cand-2:8082",), "proxy.candidate_upstream",
                                         (CURRENT_DRAFTER,))], T0 - timedelta(minutes=1))  # fmt: skip
        # A proxy's pool comes before an embedded decoder's drafter, as the settings' do; a stale one is gone.
        announce(conn, "c:3", [Announced("*", ("ngram:1-1",), "decoder.candidate", DRAFTER_KINDS)], T0)
        announce(conn, "d:4", [Announced("*", ("http://gone:1",), "proxy.candidate_upstream", (CURRENT_DRAFTER,))],
                 T0 - steps.FRESH - timedelta(seconds=1))  # fmt: skip
    pool = (masked, "http://cand-2:8082")  # sorted
    assert staged_for(engine, bare, T0) == Staged("*", pool, "proxy.candidate_upstream of 2 sidecars",
                                                  (CURRENT_DRAFTER,))  # fmt: skip
    assert staged_for(engine, PROXY, T0).pool == PROXY.candidate_upstream  # its own settings first
    with pytest.raises(RolloutError, match=r"candidate='http://elsewhere:1' is not in proxy.candidate_upstream of 2"):
        start_rollout(engine, bare, rollout_settings(), T0, candidate="http://elsewhere:1")
    # The sidecar's URL is stored masked: the secret one still names it.
    r = start_rollout(engine, bare, rollout_settings(), T0, candidate="http://ada:secret@cand:8082/")
    assert r.id is not None and r.current_drafters == (CURRENT_DRAFTER,)
    abort(engine, r.id, T0)
    with engine.begin() as conn:  # only the embedded decoder is left: its rollout is the embedded one
        announce(conn, "a:1", [], T0)
        announce(conn, "b:2", [], T0)
    assert staged_for(engine, bare, T0) == Staged("*", ("ngram:1-1",), "decoder.candidate of 1 sidecar", DRAFTER_KINDS)
    assert start_rollout(engine, bare, rollout_settings(), T0).current_drafters == DRAFTER_KINDS
    # A route's deployment is its model glob: announced by none, the refusal says what to set there.
    routed = replace(bare, routes=(ModelRoute("qwen*", ("http://q:8000",)),))
    with pytest.raises(
        RolloutError,
        match=r"deployment 'qwen\*' has no candidate pool: no sidecar announced one in "
        r"the last 3m and candidate_upstream of route 1 is not set here; set "
        r"candidate_upstream in the sidecars' \[\[proxy.routes\]\] table",
    ):
        start_rollout(engine, routed, rollout_settings(), T0, route=1)


def test_a_start_on_a_route_not_configured_here_takes_the_route_its_sidecars_announced(engine: Engine) -> None:
    """``rollout start --route N`` where the command has no ``[[proxy.routes]]``: the sidecars' route N, announced."""
    bare = ProxySettings(upstream=("http://spec:8080",))
    with pytest.raises(RolloutError, match=r"route=1: no \[\[proxy.routes\]\] are configured here and no sidecar "):
        staged_for(engine, bare, T0, route=1)
    with engine.begin() as conn:
        announce(
            conn,
            "a:1",
            [
                Announced("*", ("http://cand:8082",), "proxy.candidate_upstream", (CURRENT_DRAFTER,)),
                Announced("qwen*", ("http://qc:8000",), route_setting(1), (CURRENT_DRAFTER,)),
            ],
            T0,
        )
        announce(conn, "b:2", [Announced("qwen*", ("http://qc-2:8000",), route_setting(1, of_candidate_sidecar=True),
                                         (CURRENT_DRAFTER,))], T0)  # fmt: skip
    assert staged_for(engine, bare, T0, route=1) == Staged(
        "qwen*",
        ("http://qc-2:8000", "http://qc:8000"),
        "candidate_upstream of route 1, upstream of route 1 of a candidate sidecar of 2 sidecars",
        (CURRENT_DRAFTER,),
    )
    with pytest.raises(RolloutError, match=r"route=2: no \[\[proxy.routes\]\]"):
        staged_for(engine, bare, T0, route=2)
    with engine.begin() as conn:  # two sidecars whose route 1 differs: which one is meant is not guessed
        announce(conn, "c:3", [Announced("llama*", ("http://lc:8000",), route_setting(1), (CURRENT_DRAFTER,))], T0)
    with pytest.raises(RolloutError, match=r"route=1: the sidecars' route 1 is not one deployment but 'llama\*', "):
        staged_for(engine, bare, T0, route=1)


def test_a_sidecar_announces_the_candidates_it_serves_per_deployment() -> None:
    routes = (ModelRoute("qwen*", ("http://q:8000",), candidate_upstream=("http://qc:8000",)),
              ModelRoute("llama*", ("http://l:8000",)))  # fmt: skip
    proxy = ProxySettings(upstream=("http://spec:8080",), candidate_upstream=("http://cand:8082",), routes=routes)
    embedded = Candidate("ngram", ngram_min=1, ngram_max=1)
    assert served_here(proxy, None) == [
        Staged("*", ("http://cand:8082",), "proxy.candidate_upstream", (CURRENT_DRAFTER,)),
        Staged("qwen*", ("http://qc:8000",), "candidate_upstream of route 1", (CURRENT_DRAFTER,)),
    ]
    assert served_here(replace(proxy, candidate_upstream=()), embedded)[0] == Staged(
        "*", ("ngram:1-1",), "decoder.candidate", DRAFTER_KINDS)  # fmt: skip
    # Not a proxy: its proxy settings serve nothing; the embedded decoder's drafter is its candidate.
    not_proxy = replace(proxy, upstream=())
    assert served_here(not_proxy, None) == []
    assert served_here(not_proxy, embedded) == [Staged("*", ("ngram:1-1",), "decoder.candidate", DRAFTER_KINDS)]
    # A gateway's candidate sidecar: its upstreams are the candidates, the default deployment's and each route's.
    gateway = ProxySettings(upstream=("http://cand:8082",), speculative="candidate",
                            routes=(ModelRoute("qwen*", ("http://qc:8000",)),))  # fmt: skip
    assert served_here(gateway, None) == [
        Staged("*", ("http://cand:8082",), "proxy.upstream of a candidate sidecar (proxy.speculative = candidate)",
               (CURRENT_DRAFTER,)),
        Staged("qwen*", ("http://qc:8000",), "upstream of route 1 of a candidate sidecar", (CURRENT_DRAFTER,)),
    ]  # fmt: skip


def test_the_router_sends_the_rollouts_share_to_the_candidate_pool(engine: Engine) -> None:
    settings = Settings.from_env({"HOME": "/h", "DRAFTWATCH_PROXY_UPSTREAM": "http://spec:8080",
                                  "DRAFTWATCH_PROXY_CANDIDATE_UPSTREAM": "http://cand:8080"}, None)  # fmt: skip
    router = build_router(settings, seed=5)
    r = start_rollout(engine, settings.proxy, rollout_settings(per_workload=True), T0)
    router.rollouts = active_rollouts(engine)
    chosen = [router.choose("chat") for _ in range(2000)]
    to_candidate = [c for c in chosen if c.drafter == CANDIDATE]
    assert {c.member.pool for c in to_candidate} == {"candidate"}
    assert {c.member.upstream.netloc for c in to_candidate} == {"cand:8080"}
    # 10 % at the first step; 2000 draws put it within 0.07-0.13 with room to spare (sd 0.0067).
    assert 0.07 < len(to_candidate) / len(chosen) < 0.13
    assert r.id is not None
    abort(engine, r.id, T0)
    router.rollouts = active_rollouts(engine)
    assert all(router.choose("chat").drafter is None for _ in range(200))
    assert isinstance(router.default, Deployment)


def test_each_sidecar_and_each_restart_draws_the_candidates_share_of_its_own(engine: Engine) -> None:
    """From one fixed seed every sidecar of a fleet sent the same positions of its traffic to the candidate (their
    errors added up: a 50 % step gave it 32-46 % early on), and a restarted one replayed them."""
    settings = Settings.from_env({"HOME": "/h", "DRAFTWATCH_PROXY_UPSTREAM": "http://spec:8080",
                                  "DRAFTWATCH_PROXY_CANDIDATE_UPSTREAM": "http://cand:8080"}, None)  # fmt: skip
    start_rollout(engine, settings.proxy, rollout_settings(steps=(0.5, 1.0)), T0)
    n, drawn = 2000, []
    for _ in range(3):  # two sidecars and one of them restarted: three processes' routers
        router = build_router(settings)
        router.rollouts = active_rollouts(engine)
        drawn.append(tuple(router.choose("chat").drafter == CANDIDATE for _ in range(n)))
    # Independent draws: two sequences of 2000 agree everywhere with probability 2**-2000.
    assert len(set(drawn)) == 3
    # Each one's share is the step's: three checks, a false failure in about one run of 580,000 (1.7e-6).
    for sequence in drawn:
        assert_share(sequence, 0.5)


def test_a_candidate_pool_declares_the_current_pool_speculative() -> None:
    """An n-gram request of the current pool that drafted nothing stays speculative, as the candidate's does.

    Inferred from the response (``proxy.speculative = auto``), it would be stored plain and left out
    of the current side: the judge would compare the candidate's every request with the current
    drafter's lucky ones.
    """
    env = {"HOME": "/h", "DRAFTWATCH_PROXY_UPSTREAM": "http://spec:8080"}
    assert build_router(Settings.from_env(env, None)).default.speculative_role is None
    staged = {**env, "DRAFTWATCH_PROXY_CANDIDATE_UPSTREAM": "http://cand:8080"}
    assert build_router(Settings.from_env(staged, None)).default.speculative_role is True


def test_one_active_rollout_per_deployment_even_when_two_starts_race(engine: Engine) -> None:
    """The check before the insert cannot see a concurrent start's row; the partial unique index refuses it."""
    first = Rollout("*", CANDIDATE, (0.5, 1.0), 60.0, False, T0, T0)
    with engine.begin() as conn:
        insert_rollout(conn, first)
    with pytest.raises(IntegrityError), engine.begin() as conn:
        insert_rollout(conn, first)  # what a start that passed its check before the first committed would write
    with engine.begin() as conn:
        insert_rollout(conn, replace(first, deployment="qwen*"))  # another deployment
        insert_rollout(conn, replace(first, status="rolled_back"))  # an ended one


def test_a_promotion_by_hand_while_the_judge_runs_is_not_written_over(engine: Engine) -> None:
    r = start_rollout(engine, PROXY, rollout_settings(), T0)
    assert r.id is not None
    interval_of(engine, T0, {"copy": (10.0, 7.0)})
    judged = steps.judge_step

    def judge_then_promote_by_hand(*args: object, **kwargs: object) -> object:
        found = judged(*args, **kwargs)  # type: ignore[arg-type]
        promote(engine, r.id or 0, T0 + INTERVAL)
        return found

    with unittest.mock.patch.object(steps, "judge_step", judge_then_promote_by_hand):
        assert advance_rollouts(engine, rollout_settings(), T0 + INTERVAL + timedelta(seconds=1)) == []
    done = get_rollout(engine, r.id)
    assert done is not None and done.status == "promoted" and done.step == 0
    assert kinds(engine, r.id) == ["started", "promoted"]


def test_per_workload_a_workload_that_passed_earlier_steps_is_promoted_though_unjudged_at_the_last(
    engine: Engine,
) -> None:
    s = rollout_settings(per_workload=True)
    r = start_rollout(engine, PROXY, s, T0)
    assert r.id is not None
    interval_of(engine, T0, {"copy": (10.0, 7.0), "chat": (10.0, 8.0)})
    advance_rollouts(engine, s, T0 + INTERVAL + timedelta(seconds=1))
    t = T0 + INTERVAL + timedelta(seconds=1)
    interval_of(engine, t, {"copy": (10.0, 7.0)})
    interval_of(engine, t, {"chat": (10.0, 8.0)}, n=5)  # too few to judge at the last step
    (event,) = advance_rollouts(engine, s, t + INTERVAL + timedelta(seconds=1))
    done = get_rollout(engine, r.id)
    assert event.kind == "promoted" and done is not None
    assert dict(done.workloads) == {"chat": "candidate", "copy": "candidate"}


def test_per_workload_kept_off_every_workload_it_served_rolls_back_at_once(engine: Engine) -> None:
    s = rollout_settings(per_workload=True)
    r = start_rollout(engine, PROXY, s, T0)
    interval_of(engine, T0, {"copy": (10.0, 13.0), "story": (10.0, 13.0)})
    events = advance_rollouts(engine, s, T0 + timedelta(minutes=5, seconds=1))
    assert [e.kind for e in events] == ["kept", "kept", "rolled_back"]
    assert events[-1].reason.startswith("rolled back: kept off every workload it served")
    assert r.id is not None and "*" not in active_rollouts(engine)
