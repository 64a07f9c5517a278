"""A rollout of the embedded decoder's candidate drafter, on stored records: started, judged, followed.

The embedded decoder stores its portfolio's requests under their kinds (``model`` with its draft
model, ``ngram`` without one), speculative or plain as its controller decided, and the candidate's
under the rollout's drafter name (decoder/candidate.py). The judge compares the candidate with the
whole portfolio. On a SQLite file and on PostgreSQL, the clock the test's.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from sqlalchemy import insert
from sqlalchemy.engine import Engine

from decoder import NgramDrafter, SpeculativeDecoder
from decoder.candidate import Candidate
from decoder.record import RequestRecord
from monitor.api.decoding.staging import RolloutFollower
from monitor.config import Settings
from monitor.proxy.rollout import RolloutError, advance_rollouts, deployment_of, start_rollout
from monitor.proxy.routing import build_router
from monitor.proxy.settings import ProxySettings
from monitor.store import migrate
from monitor.store.engine import create_engine
from monitor.store.rollouts import Rollout, RolloutRow, active_rollouts, get_rollout, rollout_events
from tests.decoder.tiny import tiny_model
from tests.proxy.test_rollout import CANDIDATE, INTERVAL, requests, rollout_settings, store
from tests.records import T0

EMBEDDED = Candidate("ngram", ngram_min=1, ngram_max=1)
NO_PROXY = ProxySettings()


def portfolio(workload: str, ms: float, n: int, start: datetime, *, seed: int) -> list[RequestRecord]:
    """The portfolio's ``n`` requests at ``ms`` a token: a third the draft model's, a third decoded plain."""
    out = []
    for i, record in enumerate(requests(workload, "ngram", ms, n, start, seed=seed)):
        if i % 3 == 1:
            record = replace(record, drafter="model", draft_model="smollm2-360m")
        elif i % 3 == 2:
            record = replace(record, mode="plain")
        out.append(record)
    return out


def test_an_embedded_candidate_makes_the_default_deployment_the_decoders(engine: Engine) -> None:
    staged = deployment_of(NO_PROXY, None, EMBEDDED)
    assert staged == ("*", ("ngram:1-1",), "decoder.candidate", ("model", "ngram"))
    proxied = ProxySettings(upstream=("http://spec:8080",), candidate_upstream=("http://cand:8080",))
    assert deployment_of(proxied, None, EMBEDDED).current == ("upstream",)  # a proxy's candidate pool comes first
    unset = r"serve --candidate-upstream URL .* the embedded decoder: serve --candidate-drafter, decoder.candidate"
    with pytest.raises(RolloutError, match=unset):
        start_rollout(engine, NO_PROXY, rollout_settings(), T0)
    with pytest.raises(RolloutError, match="'ngram', 'model'|'model', 'ngram'"):
        start_rollout(engine, NO_PROXY, rollout_settings(drafter="ngram"), T0, embedded=EMBEDDED)
    with pytest.raises(RolloutError, match=r"candidate='ngram:1-4' is not in decoder.candidate"):
        start_rollout(engine, NO_PROXY, rollout_settings(), T0, candidate="ngram:1-4", embedded=EMBEDDED)
    r = start_rollout(engine, NO_PROXY, rollout_settings(), T0, candidate="ngram:1-1", embedded=EMBEDDED)
    stored = get_rollout(engine, r.id or 0)
    assert stored is not None and stored.deployment == "*" and stored.current_drafters == ("model", "ngram")
    assert not stored.of_proxy and stored.to_json()["current_drafters"] == ["model", "ngram"]


def test_per_workload_the_candidate_is_judged_against_the_whole_portfolio(engine: Engine) -> None:
    s = rollout_settings(per_workload=True)
    r = start_rollout(engine, NO_PROXY, s, T0, embedded=EMBEDDED)
    assert r.id is not None
    t = T0
    for step in range(2):
        seed = 100 * step
        store(engine, portfolio("copy", 10.0, 60, t, seed=seed) + requests("copy", CANDIDATE, 7.0, 40, t, seed=seed + 1)
              + portfolio("story", 10.0, 60, t, seed=seed + 2)
              + requests("story", CANDIDATE, 13.0, 40, t, seed=seed + 3))  # fmt: skip
        t += INTERVAL + timedelta(seconds=1)
        events = advance_rollouts(engine, s, t)
        judged = events[-1].judgement["workloads"]
        if step == 0:
            assert [(e.kind, e.workload) for e in events] == [("kept", "story"), ("advanced", None)], events
            # Every request of the portfolio is the current side: the draft model's and the plain ones too.
            assert (judged["copy"]["n_candidate"], judged["copy"]["n_current"]) == (40, 60)
            assert judged["story"]["outcome"] == "fail" and judged["copy"]["outcome"] == "pass"
    done = get_rollout(engine, r.id)
    assert done is not None and done.status == "promoted", done.reason
    assert dict(done.workloads) == {"copy": "candidate", "story": "current"}
    assert [e.kind for e in rollout_events(engine, rollout_id=r.id)] == ["started", "kept", "advanced", "promoted"]


def test_records_of_another_drafter_are_neither_side(engine: Engine) -> None:
    """A proxy's ``upstream`` requests in the same store are not the embedded portfolio's."""
    s = rollout_settings()
    start_rollout(engine, NO_PROXY, s, T0, embedded=EMBEDDED)
    store(engine, portfolio("copy", 10.0, 60, T0, seed=1) + requests("copy", CANDIDATE, 10.0, 40, T0, seed=2)
          + requests("copy", "upstream", 30.0, 60, T0, seed=3))  # fmt: skip
    (event,) = advance_rollouts(engine, s, T0 + INTERVAL + timedelta(seconds=1))
    copy = event.judgement["workloads"]["copy"]
    assert event.kind == "advanced" and copy["n_current"] == 60 and copy["outcome"] == "pass", event.reason


def test_a_rollout_from_before_migration_0015_is_a_proxys(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        migrate.upgrade(engine, "0014")
        columns = {c.name for c in RolloutRow.__table__.c if c.name not in ("id", "current_drafters")}
        row = {"deployment": "*", "drafter": CANDIDATE, "steps": [0.5, 1.0], "interval_s": 60.0, "per_workload": False,
               "status": "running", "step": 0, "holds": 0, "started_at": T0, "step_started_at": T0,
               "finished_at": None, "reason": "started", "workloads": {}, "judgement": {}}  # fmt: skip
        assert set(row) == columns
        with engine.begin() as conn:
            conn.execute(insert(RolloutRow).values(**row))
        migrate.upgrade(engine)
        (old,) = active_rollouts(engine).values()
        assert old.current_drafters == ("upstream",) and old.of_proxy
        assert migrate.downgrade(engine, "0014") == "0014"
    finally:
        engine.dispose()


def test_a_proxy_and_the_embedded_decoder_each_follow_only_their_own_rollouts(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    embedded = start_rollout(engine, NO_PROXY, rollout_settings(steps=(1.0,)), T0, embedded=EMBEDDED)
    settings = Settings.from_env({"HOME": "/h", "DRAFTWATCH_PROXY_UPSTREAM": "http://spec:8080",
                                  "DRAFTWATCH_PROXY_CANDIDATE_UPSTREAM": "http://cand:8080"}, None)  # fmt: skip
    router = build_router(settings, seed=5)
    router.rollouts = active_rollouts(engine)
    assert all(router.choose("chat").drafter is None for _ in range(200))  # at 100 % a proxy's would take all

    decoder = SpeculativeDecoder(tiny_model(seed=1), NgramDrafter(), candidate=NgramDrafter(min_n=1, max_n=1))
    follower = RolloutFollower(decoder)
    with caplog.at_level(logging.INFO, logger="monitor.api.decoding.staging"):
        follower.take(active_rollouts(engine)["*"])
        assert isinstance(decoder.staging, Rollout) and decoder.staging.id == embedded.id
        follower.take(None)
        assert decoder.staging is None
        proxied = replace(embedded, current_drafters=("upstream",), id=(embedded.id or 0) + 1)
        follower.take(proxied)
        follower.take(proxied)
        assert decoder.staging is None
    said = [r.getMessage() for r in caplog.records]
    assert any("the candidate ngram-greedy (candidate:ngram) serves 100% of the requests" in m for m in said), said
    assert any("ended, every request goes to the current drafters again" in m for m in said), said
    assert sum("is a proxy's (its current drafter upstream)" in m for m in said) == 1, said
