"""benchmarks/rollout_pair.py without a model: its replay and its rows on records of a known speed.

The records stand in for the Qwen pair's: the current side under the portfolio's kinds, the candidate
under the rollout's name, as the embedded decoder stores them.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np

from benchmarks.rollout import Modelled, side_requests
from benchmarks.rollout_pair import NAME, replay, scenarios
from decoder.candidate import Candidate
from decoder.record import Mode, RequestRecord


def requests(seed: int, workload: str, drafter: str, ms: float, mode: Mode = "speculative") -> list[RequestRecord]:
    made = side_requests(np.random.default_rng(seed), drafter, 40, 0.0, 1, Modelled(ms, 0.15, False), workload)
    return [replace(r, workload=workload, mode=mode, source="embedded", upstream_inflight=None) for r in made]


RECORDS = [
    *requests(1, "extract", "ngram", 20.0),
    *requests(2, "extract", NAME, 30.0),  # the candidate 1.5x the ms per token: it loses
    *requests(3, "prose", "model", 20.0),
    *requests(4, "prose", NAME, 16.0),  # and wins here
    *requests(5, "prose", "ngram", 20.0, mode="holdout"),  # on neither side
]


def test_the_replay_keeps_the_losing_workload_and_promotes_the_winning_one() -> None:
    lines = replay(RECORDS, Candidate("model", model="qwen-coder-0.5b"), timedelta(minutes=10))
    kinds = [line.split("**")[1] for line in lines]
    assert "kept" in kinds and kinds[-1] == "promoted", lines
    kept = next(line for line in lines if "**kept**" in line)
    assert "extract" in kept and "decode_speed fail" in kept
    # The promotion comes at an interval end, after the kept workload, and gives the candidate prose alone.
    assert "prose" in lines[-1] and lines.index(kept) < len(lines) - 1


def test_the_rows_hold_each_side_of_a_workload() -> None:
    rows = scenarios(RECORDS, ["extract", "prose"], "model:qwen-coder-0.5b", runs=3)
    assert [r.name for r in rows] == ["extract: A/A", "extract: model:qwen-coder-0.5b", "prose: A/A",
                                      "prose: model:qwen-coder-0.5b"]  # fmt: skip
    aa, losing = rows[0], rows[1]
    assert aa.measured is not None and aa.measured[0] is aa.measured[1] and aa.speed == 1.0
    assert losing.measured is not None and len(losing.measured[0].per_token) == 40
    assert abs(losing.speed - 20.0 / 30.0) < 0.05
    assert all(len(r.measured[1].per_token) == 40 for r in rows if r.measured)  # the holdout on neither side
