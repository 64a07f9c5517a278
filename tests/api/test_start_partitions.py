"""A service's start makes the partitions of ``requests`` as ``database.partition_days`` and ``..._ahead_days`` say.

Before this, the API, the CLI and the dashboard migrated with the defaults, so a store set to weekly
partitions got daily ones at start until the retention job next ran.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from monitor.api.app import create_app
from monitor.commands.main import main
from monitor.store.engine import create_engine
from monitor.store.partitions import Partition, list_partitions
from tests.api.conftest import make_settings

WEEKLY = {"DRAFTWATCH_DATABASE_PARTITION_DAYS": "7", "DRAFTWATCH_DATABASE_PARTITIONS_AHEAD_DAYS": "20"}


def ranged(url: str) -> list[Partition]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [p for p in list_partitions(conn) if not p.is_default]
    finally:
        engine.dispose()


def assert_weekly_and_ahead(partitions: list[Partition]) -> None:
    assert partitions, "no partitions were made at start"
    widths = {(p.end - p.start).days for p in partitions if p.start is not None and p.end is not None}
    assert widths == {7}
    last = max(p.end for p in partitions if p.end is not None)
    assert last >= datetime.now(UTC) + timedelta(days=20)


def test_the_api_start_makes_partitions_of_the_configured_width_and_reach(tmp_path: Path, pg_url: str) -> None:
    with TestClient(create_app(make_settings(tmp_path, pg_url, **WEEKLY))):
        pass
    assert_weekly_and_ahead(ranged(pg_url))


def test_a_command_start_makes_partitions_of_the_configured_width_and_reach(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in {**WEEKLY, "DRAFTWATCH_DATABASE_URL": pg_url, "DRAFTWATCH_DATA_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(key, value)
    assert main(["alerts", "list"]) == 0
    assert_weekly_and_ahead(ranged(pg_url))
