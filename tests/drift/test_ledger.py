"""The ledger on stored stand-in traffic (tests/drift/ledger_records.py): its sign and size against the truth.

The truth is computed here from the same records: per load level, the speculative decode tokens times
(mean plain ms per token - mean speculative ms per token) of the stored requests, and the design
truth (the ms per token the stand-ins were drawn at, times the jitter's mean) must lie in the
interval. Below the crossover speculation saves, above it costs; the totals add the levels.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sqlalchemy.engine import Engine

from monitor.drift.detectors.ledger import read_ledger
from monitor.drift.settings import DriftSettings
from tests.drift.conftest import store
from tests.drift.ledger_records import LOADS, crossing_ms, never_crossing_ms, plain_ms, stream

T0 = datetime(2026, 3, 1, tzinfo=UTC)
END = T0 + timedelta(hours=2)
START = END - timedelta(days=1)
PER_LEVEL = 80
JITTER_MEAN = math.exp(0.25**2 / 2)  # tests/drift/records.py draws ms per token x lognormal(0, 0.25)
PRICES = {"speculative": 3.0, "baseline": 2.0}


def measured_truth(records: list, load: int) -> tuple[int, float]:  # type: ignore[type-arg]
    """Speculative decode tokens at ``load`` and the seconds they saved, from the stored requests' own means."""
    at = [r for r in records if r.upstream_inflight == load]
    spec = [r for r in at if r.mode == "speculative"]
    tokens = sum(r.output_tokens - 1 for r in spec)
    plain_mean = np.mean([r.decode_ms_per_token for r in at if r.mode == "holdout"])
    spec_mean = np.mean([r.decode_ms_per_token for r in spec])
    return tokens, tokens * float(plain_mean - spec_mean) / 1000


def test_the_ledger_matches_the_truth_in_sign_and_size(engine: Engine) -> None:
    records = stream(T0, PER_LEVEL)
    store(engine, records)
    ledger = read_ledger(engine, DriftSettings(), START, END, PRICES)
    (chat,) = ledger.workloads
    assert chat.baseline == "holdout" and chat.curve.crossover is not None
    assert chat.curve.crossover.inflight == 4
    total_truth = 0.0
    for bill, load in zip(chat.bills, LOADS, strict=True):
        tokens, truth = measured_truth(records, load)
        design = tokens * (plain_ms(load) - crossing_ms(load)) * JITTER_MEAN / 1000
        total_truth += truth
        assert bill.tokens == tokens and bill.seconds is not None
        assert bill.seconds == pytest.approx(truth, rel=0.10), (load, bill.seconds, truth)
        assert bill.seconds_low is not None and bill.seconds_high is not None
        assert bill.seconds_low < design < bill.seconds_high, (load, bill, design)
        assert (bill.seconds > 0) == (load < 4)
        # Money: the plain time at the baseline's price less the speculative time at the speculative one's.
        plain_s = tokens * bill.level.plain_ms / 1000  # type: ignore[operator]
        expected = (plain_s * 2.0 - (plain_s - bill.seconds) * 3.0) / 3600
        assert bill.usd == pytest.approx(expected, rel=1e-9)
    assert chat.totals.seconds == pytest.approx(total_truth, rel=0.10)
    assert chat.totals.seconds is not None and chat.totals.seconds < 0  # the losses above 4 outweigh the gains
    assert chat.totals.low is not None and chat.totals.high is not None
    assert chat.totals.low < chat.totals.seconds < chat.totals.high
    assert ledger.total.seconds == chat.totals.seconds


def test_the_json_has_the_issues_shape(engine: Engine) -> None:
    store(engine, stream(T0, 40))
    found = read_ledger(engine, DriftSettings(), START, END, PRICES).to_json()
    (chat,) = found["workloads"]
    issue_level = {"inflight_low", "inflight_high", "ratio", "low", "high", "n_spec", "n_plain"}
    assert issue_level | {"gpu_seconds_saved", "usd_saved"} <= set(chat["levels"][0])
    assert {"workload", "levels", "crossover", "gpu_seconds_saved", "usd_saved"} <= set(chat)
    crossover = chat["crossover"]
    assert set(crossover) == {"inflight", "low", "high"} and crossover["inflight"] == 4
    assert crossover["low"] <= 2.8 <= crossover["high"]  # the true turn
    assert {"gpu_seconds_saved", "usd_saved"} <= set(found["total"])


def test_no_crossover_is_claimed_where_speculation_always_gains(engine: Engine) -> None:
    store(engine, stream(T0, 40, spec_ms=never_crossing_ms))
    (chat,) = read_ledger(engine, DriftSettings(), START, END).workloads
    assert chat.curve.crossover is None and chat.note.startswith("none seen up to 15 in flight")
    assert all(b.seconds is not None and b.seconds > 0 for b in chat.bills)
    assert chat.totals.usd is None  # no prices, no money


def test_without_a_baseline_nothing_is_invented(engine: Engine) -> None:
    store(engine, stream(T0, 40, holdout=False))
    (chat,) = read_ledger(engine, DriftSettings(), START, END, PRICES).workloads
    assert chat.baseline is None and chat.note.startswith("no baseline")
    assert all(b.seconds is None and b.usd is None for b in chat.bills)
    assert chat.totals.seconds is None and chat.totals.tokens_unvalued == chat.totals.tokens > 0


def test_an_empty_window_bills_nothing(engine: Engine) -> None:
    store(engine, stream(T0, 10))
    later = END + timedelta(days=3)
    found = read_ledger(engine, DriftSettings(), later - timedelta(hours=1), later, PRICES).to_json()
    assert found["workloads"] == [] and found["note"].startswith("nothing to bill")
    assert found["total"]["gpu_seconds_saved"] is None and found["total"]["call"] == "not_measured"
