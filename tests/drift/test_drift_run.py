"""Drift runs over stored records on SQLite and PostgreSQL: A/A, injected changes, minimum sizes,
version boundaries, pinned baselines, stored results and the CLI."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from monitor.commands.main import main
from monitor.config import Settings
from monitor.drift import run as drift_run
from monitor.drift import windows as drift_windows
from monitor.drift.models import DetectorStateRow, DriftResultRow
from monitor.drift.queries import latest_results, latest_run, pin_baseline
from monitor.drift.run import DriftRun, run_drift
from monitor.drift.settings import DriftSettings
from tests.drift.conftest import store
from tests.drift.records import window_stream

T0 = datetime(2026, 3, 1, tzinfo=UTC)
CUR = T0 + timedelta(hours=24)
NOW = T0 + timedelta(hours=25)
ALPHA = {"code": 0.8, "chat": 0.55, "sum": 0.65}
KEYS = {"test", "workload", "pair", "metric", "n_ref", "n_cur", "statistic", "p", "q", "effect", "ci", "decision"}


def populate(engine: Engine, *, n: int = 150, cur_alpha: dict[str, float] | None = None, **cur_kwargs: object) -> None:
    records = []
    for workload, alpha in ALPHA.items():
        records += window_stream(T0, CUR, n, workload=workload, alpha=alpha)
        changed = (cur_alpha or {}).get(workload, alpha)
        kwargs = cur_kwargs.get(workload, {}) if isinstance(cur_kwargs.get(workload), dict) else {}
        records += window_stream(CUR, NOW, n, workload=workload, alpha=changed, seed=1, **kwargs)  # type: ignore[arg-type]
    store(engine, records)


def run(engine: Engine, settings: Settings | None = None) -> DriftRun:
    return run_drift(
        engine, settings.drift if settings else None, NOW, current=timedelta(hours=1), reference=timedelta(hours=24)
    )


def drifts(result: DriftRun) -> set[tuple[str | None, str]]:
    return {(r.workload, r.test) for r in result.drifts}


def test_aa_run_is_quiet_and_stored(engine: Engine) -> None:
    populate(engine)
    result = run(engine)
    assert drifts(result) == set()
    by_test = {(r.workload, r.test, r.metric): r for r in result.results}
    acc = by_test[("chat", "acceptance", "acceptance_rate")]
    assert (acc.n_ref, acc.n_cur, acc.decision) == (150, 150, "no_drift") and acc.q is not None
    assert by_test[(None, "traffic_mix", "workload_share")].decision == "no_drift"
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(DriftResultRow)).scalar_one() == len(result.results)
    stored = latest_results(engine, workload="chat", test="acceptance")
    assert [s.result.effect for s in stored] == [pytest.approx(acc.effect)]
    assert latest_run(engine).run_id == result.run_id  # type: ignore[union-attr]
    assert all(set(r.to_json()) >= KEYS for r in result.results)


def test_acceptance_drop_is_found_for_that_workload_only(engine: Engine) -> None:
    populate(engine, cur_alpha={"chat": 0.35})
    found = drifts(run(engine))
    assert ("chat", "acceptance") in found
    assert {w for w, _ in found} == {"chat"}
    # A drop of every request is a drop within each prompt-length bucket too.
    assert {t for _, t in found} <= {"acceptance", "acceptance_by_length", "page_hinkley"}


def test_latency_rise_is_a_regression(engine: Engine) -> None:
    populate(engine, code={"ms_per_token": 32.0})
    result = run(engine)
    found = {(r.workload, r.test, r.metric) for r in result.drifts}
    assert ("code", "latency", "ms_per_token") in found
    assert {w for w, _, _ in found} == {"code"}


def test_too_few_requests_is_insufficient_never_no_drift(engine: Engine) -> None:
    populate(engine, n=12)
    result = run(engine)
    per_workload = [r for r in result.results if r.workload and r.test != "page_hinkley"]
    assert per_workload and {r.decision for r in per_workload} == {"insufficient_data"}
    assert all(r.q is None for r in per_workload)


def test_version_change_marks_a_boundary(engine: Engine) -> None:
    populate(engine)
    change = CUR + timedelta(minutes=30)
    store(engine, window_stream(change, NOW, 100, workload="code", alpha=0.5, seed=2, draft_version="d2"))
    result = run(engine)
    code = next(r for r in result.results if r.workload == "code" and r.test == "acceptance")
    assert code.note and "since draft version d1 → d2" in code.note
    assert code.cur_start == change and code.ref_end == change
    assert ("code", "acceptance") in drifts(result)


def test_pinned_baseline_replaces_the_reference(engine: Engine) -> None:
    populate(engine)
    pin_baseline(engine, "chat", at=T0 + timedelta(hours=12), length=timedelta(hours=12))
    result = run(engine)
    chat = next(r for r in result.results if r.workload == "chat" and r.test == "acceptance")
    assert (chat.ref_start, chat.ref_end) == (T0, T0 + timedelta(hours=12)) and "pinned" in (chat.note or "")
    assert 70 <= chat.n_ref <= 80
    code = next(r for r in result.results if r.workload == "code" and r.test == "acceptance")
    assert code.ref_start == T0 and code.n_ref == 150


def test_workload_floor_from_settings(engine: Engine) -> None:
    populate(engine, cur_alpha={"chat": 0.35})
    settings = Settings.from_env({"HOME": "/h", "DRAFTWATCH_DRIFT_WORKLOAD_FLOORS": "chat:acceptance=0.5"}, None)
    result = run(engine, settings)
    acc = next(r for r in result.results if r.workload == "chat" and r.test == "acceptance")
    assert acc.q is not None and acc.q < 0.01 and acc.decision == "no_drift"


def test_detector_state_persists_across_runs(engine: Engine) -> None:
    populate(engine)
    first = next(r for r in run(engine).results if r.workload == "chat" and r.test == "page_hinkley")
    assert (first.n_ref, first.n_cur) == (0, 150)
    store(engine, window_stream(NOW, NOW + timedelta(minutes=30), 40, workload="chat", alpha=0.55, seed=3))
    second = run_drift(engine, None, NOW + timedelta(minutes=30), current=timedelta(hours=1))
    ph = next(r for r in second.results if r.workload == "chat" and r.test == "page_hinkley")
    assert (ph.n_ref, ph.n_cur) == (150, 40)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(DetectorStateRow)).scalar_one() == 3


def test_cli_json_and_baseline_pin(engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    populate(engine, cur_alpha={"chat": 0.35})
    url = engine.url.render_as_string(hide_password=False)
    argv = ["drift", "run", "--json", "--database-url", url, "--now", NOW.isoformat(), "--current", "1h"]
    assert main([*argv, "--reference", "1d", "--no-alerts"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"run_id", "results"} and all(set(r) >= KEYS for r in out["results"])
    assert {r["decision"] for r in out["results"]} <= {"drift", "no_drift", "insufficient_data"}
    assert any(r["workload"] == "chat" and r["decision"] == "drift" for r in out["results"])
    assert main(["drift", "run", "--database-url", url, "--now", NOW.isoformat(), "--reference", "1d"]) == 0
    table = capsys.readouterr().out
    gate = ["drift", "run", "--database-url", url, "--reference", "1d", "--no-alerts", "--fail-on-drift"]
    assert main([*gate, "--now", NOW.isoformat()]) == 1  # chat dropped
    assert main([*gate, "--now", (NOW + timedelta(days=30)).isoformat()]) == 0  # nothing in the windows
    assert "drift" in table and "chat" in table
    assert main(["baseline", "pin", "--workload", "chat", "--at", "2026-03-01T12:00", "--database-url", url]) == 0
    assert "2026-03-01T12:00:00+00:00" in capsys.readouterr().out


def test_cli_rejects_a_bad_duration(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["drift", "run", "--current", "soon"])
    assert "15m, 6h or 7d" in capsys.readouterr().err


def test_low_volume_widens_the_current_window_until_it_can_decide(engine: Engine) -> None:
    """12 requests an hour: 1 h holds too few to test, 4 h enough; the result says how far back it looked."""
    now = T0 + timedelta(hours=30)
    changed = now - timedelta(hours=4)
    store(
        engine,
        window_stream(T0, changed, 26 * 12, workload="quiet", alpha=0.75)
        + window_stream(changed, now, 4 * 12, workload="quiet", alpha=0.4, seed=1),
    )
    result = run_drift(engine, None, now, current=timedelta(hours=1), reference=timedelta(hours=24))
    acceptance = next(r for r in result.results if r.test == "acceptance")
    assert acceptance.decision == "drift" and acceptance.n_cur == 48
    assert acceptance.note == "current window widened to 4h: fewer than 30 speculative requests in the last 1h"
    assert acceptance.cur_start == changed and acceptance.ref_end == changed
    assert acceptance.ref_start == changed - timedelta(hours=24)

    config = DriftSettings(current_window=timedelta(hours=1), max_current_window=timedelta(hours=1))
    unwidened = run_drift(engine, config, now, store=False)
    assert next(r for r in unwidened.results if r.test == "acceptance").decision == "insufficient_data"


class _Forgetful(dict[Any, Any]):
    """A cache that keeps nothing: every workload reads for itself, as before the run shared its reads."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


def test_a_run_reads_the_shared_fallback_and_version_windows_once(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three workloads of one pair with no holdout: each net-loss test falls back to the target's plain
    # decoding, a read across all workloads that is the same for each, as are the pair's version windows.
    populate(engine)
    store(engine, window_stream(T0, NOW, 120, workload="plain-only", alpha=0.5, mode="plain"))
    reads: list[str] = []
    real_sample, real_windows = drift_run.sample_requests, drift_windows._version_windows

    def sample(*args: Any, **kwargs: Any) -> Any:
        if args[1] is None:
            reads.append("plain")
        return real_sample(*args, **kwargs)

    def version_windows(*args: Any) -> Any:
        reads.append("versions")
        return real_windows(*args)

    monkeypatch.setattr(drift_run, "sample_requests", sample)
    monkeypatch.setattr(drift_windows, "_version_windows", version_windows)
    shared = _stateless_run(engine)
    assert reads.count("plain") == 1 and reads.count("versions") == 1
    net_loss = [r for r in shared.results if r.test == "net_loss"]
    assert len(net_loss) == 3 and all(r.n_ref for r in net_loss)  # each compared with the plain requests

    reads.clear()
    real_reads = drift_run._RunReads
    monkeypatch.setattr(drift_run, "_RunReads", lambda: real_reads(_Forgetful(), _Forgetful()))
    alone = _stateless_run(engine)
    assert reads.count("plain") == 3 and reads.count("versions") == 3
    assert [_comparable(r) for r in alone.results] == [_comparable(r) for r in shared.results]


def _stateless_run(engine: Engine) -> DriftRun:
    # Without the detectors, whose state the first run would move on for the second.
    return run_drift(engine, None, NOW, current=timedelta(hours=1), reference=timedelta(hours=24), detectors=False)


def _comparable(result: Any) -> dict[str, Any]:
    data = dict(result.to_json())
    data.pop("run_id", None)
    return data
