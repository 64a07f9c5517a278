"""benchmarks/crossover_sim.py: its truth is what its docstring says, and its traffic has the model's speeds."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from benchmarks.crossover_sim import LEVELS, PLAIN, WORKLOADS, ms, right, traffic, true_crossover, true_level


def test_the_truth_of_each_workload() -> None:
    assert {w: true_level(spec) for w, spec in WORKLOADS.items()} == {
        "chat": 3, "code": 4, "translate": 5, "extract": None, "summarize": None,
    }  # fmt: skip
    assert true_crossover(WORKLOADS["chat"]) == pytest.approx(6.0)
    assert true_crossover(WORKLOADS["summarize"]) is None  # loses at every load
    # Found one level up is right (the first level whose interval is below 1 may lie above the turn), two is not.
    assert right("chat", 4) and not right("chat", 5) and not right("chat", None)
    assert right("extract", None) and not right("extract", 5)
    assert right("summarize", 0) and right("summarize", 3) and not right("summarize", None)


def test_the_traffic_has_the_models_speeds_at_each_load() -> None:
    records = traffic(7, 30, datetime(2026, 1, 1, tzinfo=UTC))
    assert len(records) == len(WORKLOADS) * LEVELS * 2 * 30
    for workload, spec in WORKLOADS.items():
        for mode, side in (("speculative", spec), ("holdout", PLAIN)):
            mine = [r for r in records if r.workload == workload and r.mode == mode]
            loads = np.array([r.upstream_inflight for r in mine], dtype=float)
            assert loads.min() == 1 and loads.max() <= 31
            observed = np.log([r.decode_ms_per_token or 0.0 for r in mine]) - np.log([ms(side, c) for c in loads])
            assert np.median(observed) == pytest.approx(0.0, abs=0.1)  # the lognormal jitter, centred
