"""The dashboard's pure helpers: their doctests (dashboard/ is not in pytest's doctest paths) and edge cases."""

from __future__ import annotations

import doctest
from datetime import UTC, datetime, timedelta

import pytest

from dashboard import charts, status, timerange
from dashboard.timerange import RANGES, time_range
from monitor.store.reads.dashboard import speedup_inputs
from tests.dashboard.conftest import Store


@pytest.mark.parametrize("module", [charts, status, timerange])
def test_doctests(module: object) -> None:
    failures, tried = doctest.testmod(module)  # type: ignore[arg-type]
    assert tried and not failures


@pytest.mark.parametrize("name", RANGES)
def test_ranges_are_minute_aligned_with_bounded_points(name: str) -> None:
    r = time_range(name, datetime(2026, 5, 1, 13, 7, 59, 999, tzinfo=UTC))
    assert r.end == datetime(2026, 5, 1, 13, 8, tzinfo=UTC) and r.span == RANGES[name]
    assert r.start.second == 0 and r.step >= timedelta(minutes=1) and r.span / r.step <= timerange.MAX_POINTS


def test_speedup_inputs_follow_the_records(seeded_store: Store) -> None:
    now = seeded_store.now
    assert now is not None
    code = speedup_inputs(seeded_store.engine, "code", now - timedelta(days=1), now + timedelta(minutes=1))
    translate = speedup_inputs(seeded_store.engine, "translate", now - timedelta(days=1), now + timedelta(minutes=1))
    assert code is not None and translate is not None
    assert code.t1_source == "holdout" and translate.t1_source == "verify"
    assert code.alpha > translate.alpha and code.speedup() > 1 > translate.speedup()
    assert speedup_inputs(seeded_store.engine, "nothing", now - timedelta(days=1), now) is None
