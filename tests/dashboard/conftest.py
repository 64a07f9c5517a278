"""Fixtures for the dashboard tests: a seeded and an empty SQLite store, and AppTest on dashboard/app.py.

The app reads its database from ``DRAFTWATCH_DATABASE_URL`` like every other part; AppTest runs
the scripts in this process, so the fixture sets the variable for the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from streamlit.testing.v1 import AppTest

from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from tests.dashboard.seed import seed

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
PAGES = ("overview", "workload", "drift", "alerts", "pairs", "rollouts")


@dataclass
class Store:
    url: str
    engine: Engine
    now: datetime | None


@pytest.fixture(scope="session")
def seeded_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    url = f"sqlite:///{tmp_path_factory.mktemp('dash') / 'seeded.db'}"
    engine = create_engine(url)
    upgrade(engine)
    now = seed(engine)
    yield Store(url, engine, now)
    engine.dispose()


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    url = f"sqlite:///{tmp_path_factory.mktemp('dash') / 'empty.db'}"
    engine = create_engine(url)
    upgrade(engine)
    yield Store(url, engine, None)
    engine.dispose()


AppFactory = Callable[[str, str], AppTest]


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> AppFactory:
    """``app(url, page)``: the app run once on ``page`` (one of :data:`PAGES`) against ``url``."""
    monkeypatch.delenv("DRAFTWATCH_CONFIG", raising=False)

    def make(url: str, page: str = "overview") -> AppTest:
        monkeypatch.setenv("DRAFTWATCH_DATABASE_URL", url)
        at = AppTest.from_file(str(APP), default_timeout=60)
        at.run()
        if page != "overview":
            at.switch_page(f"views/{page}.py")
            at.run()
        return at

    return make
