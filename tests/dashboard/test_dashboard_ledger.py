"""The Ledger page (AppTest) on a store whose speculative and plain decode speeds cross at 4 in flight, and empty."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from tests.dashboard.conftest import AppFactory, Store
from tests.drift.conftest import store
from tests.drift.ledger_records import stream


@pytest.fixture(scope="module")
def crossing_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    url = f"sqlite:///{tmp_path_factory.mktemp('ledger') / 'ledger.db'}"
    engine = create_engine(url)
    upgrade(engine)
    now = datetime.now(UTC)
    store(engine, stream(now - timedelta(hours=2), 40))
    yield Store(url, engine, now)
    engine.dispose()


def test_the_grid_the_curves_and_the_crossover(app: AppFactory, crossing_store: Store) -> None:
    at = app(crossing_store.url, "ledger")
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == ["Ledger"]
    (grid,) = [e.value for e in at.dataframe]
    assert list(grid["In flight"]) == ["1-1", "2-3", "4-7", "8-15"]
    assert grid["GPU-s saved"].iloc[0] > 0 > grid["GPU-s saved"].iloc[-1]
    (chart,) = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    # The crossover is marked on the curves.
    assert {"workload": "chat", "inflight": 4} in [v for d in _datasets(chart) for v in d]
    assert any("speculation loses from 4 in flight" in c.value for c in at.caption)
    assert "set both prices" in [m.value for m in at.metric]


def test_an_empty_store_says_what_to_do(app: AppFactory, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    upgrade(create_engine(url))
    at = app(url, "ledger")
    assert not at.exception and "No records yet" in at.info[0].value


def _datasets(chart: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Every inline data set of a (layered) Vega-Lite spec."""
    found = [chart["data"]["values"]] if "values" in chart.get("data", {}) else []
    found += list(chart.get("datasets", {}).values())
    for layer in chart.get("layer", []):
        found += _datasets(layer)
    return found
