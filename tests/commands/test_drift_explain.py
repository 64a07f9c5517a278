"""``draftwatch drift explain``: the JSON shape, the workload filter, the table and the help, on a real store."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from monitor.commands.main import main
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from tests.drift.conftest import store
from tests.drift.records import window_stream

T0 = datetime(2026, 3, 1, tzinfo=UTC)
CUR = T0 + timedelta(hours=24)
NOW = T0 + timedelta(hours=25)
PART_KEYS = {"cause", "workload", "value", "low", "high", "detail"}


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A SQLite store: code's acceptance falls in the current hour, chat's and sum's stay."""
    url = f"sqlite:///{tmp_path / 'draftwatch.db'}"
    engine: Engine = create_engine(url)
    upgrade(engine)
    records = []
    for workload, alpha in {"code": 0.8, "chat": 0.5, "sum": 0.65}.items():
        records += window_stream(T0, CUR, 300, workload=workload, alpha=alpha, answer_tokens=100)
        current = 0.6 if workload == "code" else alpha
        records += window_stream(CUR, NOW, 300, workload=workload, alpha=current, seed=1, answer_tokens=100)
    records += window_stream(T0, NOW, 12, workload="rare", alpha=0.5)
    store(engine, records)
    engine.dispose()
    return url


def test_json_shape(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["drift", "explain", "--json", "--database-url", url, "--now", NOW.isoformat()]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"change", "low", "high", "parts"} <= set(out)
    assert out["low"] < out["change"] < out["high"] < 0
    assert all(set(p) == PART_KEYS for p in out["parts"])
    causes = [(p["cause"], p["workload"]) for p in out["parts"]]
    # "rare" has no request in the current hour: too thin for a part of its own, and alone, so not split.
    # Code's within part is named, so it is split over the factor groups that vary there (prompt length
    # only): its rate fell inside every cell, which is its own unexplained part.
    assert causes == [
        ("mix", None),
        ("within", "chat"),
        ("length", "code"),
        ("unexplained", "code"),
        ("within", "sum"),
        ("unexplained", None),
    ]
    assert "rare" in out["parts"][-1]["detail"]["reason"]
    assert sum(p["value"] for p in out["parts"]) == pytest.approx(out["change"], abs=1e-12)
    named = [(p["cause"], p["workload"]) for p in out["parts"] if p["detail"]["named"]]
    assert named == [("unexplained", "code")]
    within = out["parts"][2]["detail"]["within"]
    assert within["named"] and within["value"] == pytest.approx(out["parts"][2]["value"] + out["parts"][3]["value"])
    assert out["detail"]["summary"].startswith("Acceptance fell")


def test_workload_filter_and_windows(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["drift", "explain", "--json", "--database-url", url, "--now", NOW.isoformat()]
    assert main([*base, "--workload", "chat"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(p["cause"], p["workload"]) for p in out["parts"]] == [
        ("mix", None),
        ("within", "chat"),
        ("unexplained", None),
    ]
    # A current window that ends before the change: nothing moved, nothing named.
    assert main([*base[:-1], (CUR - timedelta(hours=1)).isoformat(), "--reference", "20h"]) == 0
    quiet = json.loads(capsys.readouterr().out)
    assert not any(p["detail"]["named"] for p in quiet["parts"])


def test_table_and_empty_store(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["drift", "explain", "--database-url", url, "--now", NOW.isoformat()]) == 0
    table = capsys.readouterr().out
    assert "acceptance split" in table and "* unexplained  code" in table
    assert table.strip().splitlines()[-1].startswith("Acceptance fell")
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    assert main(["drift", "explain", "--json", "--database-url", empty]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["change"] is None and [p["cause"] for p in out["parts"]] == ["unexplained"]
    assert "not enough data to split" in out["parts"][0]["detail"]["reason"]


def test_help_and_bad_window(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["drift", "explain", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "mix" in text and "within" in text and "--workload" in text and "--reference" in text
    with pytest.raises(SystemExit) as bad:
        main(["drift", "explain", "--current", "soon"])
    assert bad.value.code == 2
