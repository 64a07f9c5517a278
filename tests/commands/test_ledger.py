"""``draftwatch ledger``: the JSON, the table, the engine settings and bad input, on a real store."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from monitor.commands.main import main
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from tests.drift.conftest import store
from tests.drift.ledger_records import stream

T0 = datetime(2026, 3, 1, tzinfo=UTC)
NOW = (T0 + timedelta(hours=2)).isoformat()


@pytest.fixture
def url(tmp_path: Path) -> str:
    """chat crosses at 4 in flight; solo decodes at one load only, on a target with no plain request at all."""
    url = f"sqlite:///{tmp_path / 'draftwatch.db'}"
    engine = create_engine(url)
    upgrade(engine)
    store(engine, stream(T0, 80) + stream(T0, 40, workload="solo", holdout=False, loads=(1,), target="solo-7b"))
    engine.dispose()
    return url


def run(url: str, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    status = main(["ledger", "--database-url", url, "--now", NOW, *flags])
    out, err = capsys.readouterr()
    return status, out, err


def test_json(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(url, capsys, "--json", "--price", "speculative=3", "--price", "baseline=3")
    assert status == 0
    found = json.loads(out)
    chat, solo = found["workloads"]
    assert (chat["workload"], chat["crossover"]["inflight"], chat["baseline"]) == ("chat", 4, "holdout")
    assert [lv["inflight_low"] for lv in chat["levels"]] == [1, 2, 4, 8]
    # Equal prices: the money is the seconds at 3 USD an hour.
    for level in chat["levels"]:
        assert level["usd_saved"] == pytest.approx(level["gpu_seconds_saved"] * 3 / 3600)
    assert solo["baseline"] is None and solo["note"].startswith("no baseline")
    assert solo["gpu_seconds_saved"] is None and solo["usd_saved"] is None
    assert found["total"]["gpu_seconds_saved"] == pytest.approx(chat["gpu_seconds_saved"])
    assert found["total"]["tokens_unvalued"] == solo["tokens"] > 0


def test_table_says_what_is_missing(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(url, capsys)
    assert status == 0
    assert "no money figures: give --price speculative=USD_PER_HOUR --price baseline=USD_PER_HOUR" in out
    assert "speculation loses from 4 in flight" in out and "no baseline" in out
    assert "Traceback" not in out


def test_engine_settings_with_evidence(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(url, capsys, "--engine-settings", "--workload", "chat")
    assert status == 0
    assert '"num_speculative_tokens_per_batch_size": [[1, 3, K], [4, 4, 0]]' in out
    assert '"max_concurrency": 3' in out and '"hard_disable_by_batch_size": 4' in out
    assert "evidence: 4-7 in flight" in out
    status, out, _ = run(url, capsys, "--engine-settings", "--json", "--workload", "solo")
    (solo,) = json.loads(out)["workloads"]
    assert solo["settings"] == [] and solo["evidence"] == [] and solo["crossover"] is None


@pytest.mark.parametrize(
    ("flag", "said"),
    [
        ("gpu=3", "unknown pool 'gpu'"),
        ("speculative", "expected POOL=USD_PER_HOUR"),
        ("baseline=cheap", "must be a number"),
        ("baseline=-1", "0 or more"),
    ],
)
def test_a_bad_price_is_exit_2_with_a_line(url: str, capsys: pytest.CaptureFixture[str], flag: str, said: str) -> None:
    with pytest.raises(SystemExit) as stop:
        run(url, capsys, "--price", flag)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


def test_an_empty_window_says_so(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(url, capsys, "--window", "1h", "--now", (T0 + timedelta(days=5)).isoformat())
    assert status == 0 and "nothing to bill: no speculative request in the window" in out
    status, out, _ = run(url, capsys, "--engine-settings", "--now", (T0 + timedelta(days=5)).isoformat())
    assert "nothing measured" in out


def test_an_unknown_workload_says_so(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(url, capsys, "--workload", "nope")
    assert status == 0 and out.startswith("workload 'nope': no speculative request between")
