"""Stored stand-in traffic whose plain and speculative decode speeds cross at a known load: 2.8 in flight."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime, timedelta

from decoder.record import Mode, RequestRecord
from tests.drift.records import record

LOADS = (1, 2, 4, 8)


def plain_ms(load: int) -> float:
    return 20.0 + load


def crossing_ms(load: int) -> float:
    return 6.0 + 6.0 * load


def never_crossing_ms(load: int) -> float:
    return 10.0 + 0.5 * load


def stream(
    start: datetime,
    per_level: int,
    *,
    workload: str = "chat",
    spec_ms: Callable[[int], float] = crossing_ms,
    holdout: bool = True,
    loads: tuple[int, ...] = LOADS,
    target: str = "qwen-coder-1.5b",
) -> list[RequestRecord]:
    """``per_level`` speculative (and, with ``holdout``, as many holdout) requests per load, over one hour."""
    out: list[RequestRecord] = []
    step = timedelta(hours=1) / (2 * per_level * len(loads))
    index = 0
    sides: list[tuple[Mode, Callable[[int], float]]] = [("speculative", spec_ms)]
    sides += [("holdout", plain_ms)] if holdout else []
    for load in loads:
        for mode, ms in sides:
            for _ in range(per_level):
                r = record(index, start + step * index, workload=workload, alpha=0.6, ms_per_token=ms(load), mode=mode)
                out.append(dataclasses.replace(r, upstream_inflight=load, target_model=target))
                index += 1
    return out
