"""benchmarks/rollout.py's simulation: its traffic is what it says, and a rollout it runs ends as the judge decides."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from benchmarks import rollout
from benchmarks.rollout import INTERVAL, T0, Judging, Measured, Modelled, Scenario, migrated, run_rollout, side_requests
from decoder.record import RequestRecord


def test_each_interval_holds_its_requests_with_the_stated_spread() -> None:
    records = side_requests(np.random.default_rng(1), "c", 40, 600.0, 3, Modelled(20.0, 0.25), "t")
    assert len(records) == 120 and all(r.check() is r for r in records)
    starts = np.array([(r.ts_start - T0).total_seconds() - 600.0 for r in records])
    assert np.bincount((starts // INTERVAL.total_seconds()).astype(int)).tolist() == [40, 40, 40]
    per_token = np.log([r.decode_ms_per_token or 0.0 for r in records])
    assert np.median(per_token) == pytest.approx(np.log(20.0), abs=0.08)
    assert np.std(per_token) == pytest.approx(0.25, abs=0.05)
    assert all(r.ts_end > r.ts_start and r.mode == "speculative" for r in records)


def test_measured_requests_are_drawn_whole_from_the_real_ones() -> None:
    real = side_requests(np.random.default_rng(2), "c", 5, 0.0, 1, Modelled(20.0, 0.25), "r")
    drawn = side_requests(np.random.default_rng(3), "c", 200, 0.0, 1, Measured.of(real), "d")

    def whole(r: RequestRecord) -> tuple[object, ...]:
        speed = round(r.decode_ms_per_token or 0.0, 6)
        return (speed, r.output_tokens, r.prompt_tokens, r.num_draft_tokens, r.num_accepted_tokens, r.ttft_ms)

    # Each drawn request is one real request's figures together (not a mix of several), and each real one is drawn.
    assert {whole(r) for r in drawn} == {whole(r) for r in real}
    with pytest.raises(ValueError, match="no timed request"):
        Measured.of([])


def test_a_slower_candidate_is_rolled_back_and_a_faster_one_advanced(tmp_path: Path) -> None:
    template = migrated(tmp_path)
    slow = Scenario("slow", 0.6, 600, (0.5, 1.0), 0.25, 1)
    run = run_rollout(template, tmp_path, slow, Judging(), seed=3)
    assert run.outcome == "failed" and "decode_speed fail" in run.reason
    # Judged from the first minute with 30 a side (10 requests a minute), rolled back within a few minutes.
    assert run.first_judged is not None and run.minute <= 6 and 30 <= run.candidate_served <= 60
    fast = Scenario("fast", 1.3, 60, (0.5, 1.0), 0.25, 1, ttft_spread=False)
    run = run_rollout(template, tmp_path, fast, Judging(), seed=4)
    assert run.outcome == "advanced" and 30 <= run.minute <= 35, run
    assert not list(tmp_path.glob("s*.sqlite"))  # each rollout's store is removed


def test_the_quick_run_prints_its_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert rollout.main(["--quick", "--no-write", "--jobs", "1", "--only", "20 % slower, busy"]) == 0
    out = capsys.readouterr().out
    assert "| 20 % slower, busy | 0.80× | 0.25 | 300 / 300 | 4 |" in out
    assert "interval level 0.98" in out and timedelta(minutes=30) == INTERVAL
