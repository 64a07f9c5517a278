"""candidate_pools (migration 0019): what each sidecar announces it serves a rollout with, on SQLite and PostgreSQL."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from sqlalchemy.engine import Engine

from monitor.store.candidates import FORGET_AFTER, Announced, announce, announced
from tests.records import T0
from tests.store.schema import assert_migrated_as_declared

PROXY = Announced("*", ("http://cand:8082",), "proxy.candidate_upstream", ("upstream",))
ROUTE = Announced("qwen*", ("http://qc:8000",), "candidate_upstream of route 1", ("upstream",))


def test_the_migration_creates_the_table_the_model_declares(engine: Engine) -> None:
    assert_migrated_as_declared(engine, {"candidate_pools"})


def test_each_announcement_replaces_the_sidecars_own_and_forgets_the_processes_gone(engine: Engine) -> None:
    with engine.begin() as conn:
        announce(conn, "a:1", [PROXY, ROUTE], T0)
        announce(conn, "b:2", [PROXY], T0 + timedelta(minutes=1))
    assert [(a.instance, a.seen_at) for a in announced(engine, "*", T0)] == [("b:2", T0 + timedelta(minutes=1)),
                                                                             ("a:1", T0)]  # fmt: skip
    assert announced(engine, "*", T0 + timedelta(seconds=1))[0].instance == "b:2"  # since: the fresh ones only
    assert announced(engine, "qwen*", T0) == [replace(ROUTE, instance="a:1", seen_at=T0)]
    with engine.begin() as conn:  # a: restarted without its route's candidate
        announce(conn, "a:1", [PROXY], T0 + timedelta(minutes=2))
    assert announced(engine, "qwen*", T0) == []
    with engine.begin() as conn:  # a day on, any process's write forgets the rows nobody renewed
        announce(conn, "c:3", [], T0 + timedelta(minutes=1) + FORGET_AFTER + timedelta(seconds=1))
    assert [a.instance for a in announced(engine, "*", T0)] == ["a:1"]
