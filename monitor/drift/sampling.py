"""Bounded reads for a drift run: counts aggregated in SQL, per-request samples capped per window.

Counts come from ``rollup_minute`` (one row per minute, workload, pair and mode), so they cost
the same over a thousand requests as over millions. Per-request values come from ``requests``,
at most ``limit`` per window, workload and pair, chosen by a fixed hash of the row id
(``(id mod P) · K mod P`` with K ≈ P·(√5 − 1)/2, Fibonacci hashing): the choice ignores every
measured value, so the sample is unbiased for the tests, consecutive ids scatter evenly over the
window (no bias towards its start), and the same data always gives the same sample, in id order
whatever the plan or the table's layout (partitioned or not). The ids are
picked in a subquery; when a workload has a single pair, that subquery only touches the
``(workload, ts_start)`` index, so the database reads ``limit`` rows, not the whole window.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import numpy as np
from sqlalchemy import case, func, select
from sqlalchemy.engine import Connection

from monitor.drift.stats import FloatArray
from monitor.store.models import RequestRow, RollupMinuteRow
from monitor.store.reads.results import Pair
from monitor.store.rollups import minute_of

HASH_MODULUS: Final = 2_147_483_647  # 2**31 - 1, prime; products stay below 2**62 (BIGINT-safe)
HASH_MULTIPLIER: Final = 1_327_217_884  # round(P * 0.6180339887)


@dataclass(frozen=True, slots=True)
class WindowCounts:
    """Requests per (workload, pair) and mode in the reference and the current window."""

    ref: dict[tuple[str, Pair], dict[str, int]]
    cur: dict[tuple[str, Pair], dict[str, int]]

    def mix(self, which: str) -> dict[str, int]:
        per_workload: dict[str, int] = defaultdict(int)
        for (workload, _pair), modes in getattr(self, which).items():
            per_workload[workload] += sum(modes.values())
        return dict(per_workload)


def window_counts(conn: Connection, ref_start: datetime, cur_start: datetime, cur_end: datetime) -> WindowCounts:
    """One grouped query over the rollups for both windows (``[ref_start, cur_start)``, ``[cur_start, cur_end)``)."""
    m = RollupMinuteRow
    is_cur = case((m.bucket >= minute_of(cur_start), 1), else_=0)
    rows = conn.execute(
        select(is_cur, m.workload, m.target_model, m.drafter, m.draft_model, m.mode, func.sum(m.n_requests))
        .where(m.bucket >= minute_of(ref_start), m.bucket < cur_end)
        .group_by(is_cur, m.workload, m.target_model, m.drafter, m.draft_model, m.mode)
    )
    ref: dict[tuple[str, Pair], dict[str, int]] = defaultdict(dict)
    cur: dict[tuple[str, Pair], dict[str, int]] = defaultdict(dict)
    for flag, workload, target, drafter, draft_model, mode, n in rows:
        key = (workload, Pair(target, drafter, draft_model or None))
        (cur if flag else ref)[key][mode] = int(n)
    return WindowCounts(dict(ref), dict(cur))


@dataclass(frozen=True, slots=True)
class Sample:
    """Per-request columns of a window sample, as arrays aligned by request."""

    mode: np.ndarray[Any, np.dtype[np.str_]]
    drafted: FloatArray
    accepted: FloatArray
    output_tokens: FloatArray
    prompt_tokens: FloatArray
    latency_ms: FloatArray  # NaN when unknown
    ttft_ms: FloatArray
    decode_ms: FloatArray
    upstream_inflight: FloatArray  # NaN outside proxy mode

    def __len__(self) -> int:
        return len(self.mode)

    @property
    def context_tokens(self) -> FloatArray:
        """Prompt plus output tokens: the context a request's last token was decoded in."""
        return self.prompt_tokens + self.output_tokens

    @property
    def decode_ms_per_token(self) -> FloatArray:
        """Per request, :func:`decode_ms_per_token_of`; NaN where it is undefined."""
        return decode_ms_per_token_of(self.latency_ms, self.ttft_ms, self.output_tokens, self.decode_ms)

    def where(self, mask: np.ndarray[Any, np.dtype[np.bool_]]) -> Sample:
        index = np.flatnonzero(mask)
        return Sample(**{name: getattr(self, name)[index] for name in self.__dataclass_fields__})


def decode_ms_per_token_of(
    latency_ms: FloatArray, ttft_ms: FloatArray, output_tokens: FloatArray, decode_ms: FloatArray
) -> FloatArray:
    """:func:`decoder.record.decode_ms_per_token` over whole arrays (NaN for an unknown figure); NaN where undefined.

    >>> nan = float("nan")
    >>> ms = decode_ms_per_token_of(*(np.array(v) for v in ([100.0, 50.0, 100.0, nan], [60.0, 80.0, 60.0, 10.0],
    ...                                                        [9.0, 9.0, 1.0, 9.0], [nan, nan, nan, 16.0])))
    >>> [None if np.isnan(v) else float(v) for v in ms]
    [5.0, 0.0, None, 2.0]
    >>> from decoder.record import decode_ms_per_token  # the same figure, request by request
    >>> [decode_ms_per_token(100.0, 60.0, 9), decode_ms_per_token(50.0, 80.0, 9)]
    [5.0, 0.0]
    """
    tokens = output_tokens - 1
    spent = np.where(np.isnan(decode_ms), np.maximum(latency_ms - ttft_ms, 0.0), decode_ms)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(np.where(tokens >= 1, spent / tokens, np.nan), dtype=float)


_COLUMNS = (
    RequestRow.mode,
    RequestRow.num_draft_tokens,
    RequestRow.num_accepted_tokens,
    RequestRow.output_tokens,
    RequestRow.prompt_tokens,
    RequestRow.latency_ms,
    RequestRow.ttft_ms,
    RequestRow.decode_ms,
    RequestRow.upstream_inflight,
)


def sample_requests(
    conn: Connection,
    workload: str | None,
    pair: Pair,
    start: datetime,
    end: datetime,
    limit: int,
    *,
    mode: str | tuple[str, ...] | None = None,
    any_drafter: bool = False,
    only_pair: bool = False,
) -> Sample:
    """Up to ``limit`` finished (non-error) requests of one workload and pair in ``[start, end)``.

    ``workload`` None reads every workload. ``any_drafter`` matches the target model only (holdout
    and plain traffic may be recorded with drafter ``none``). ``mode`` is one mode or several.
    ``only_pair`` says the caller knows this is the workload's only pair and no mode is asked for:
    the ids are then picked from the ``(workload, ts_start)`` index alone (on SQLite a covering
    index scan, several times faster than visiting every row of the window). A mode asked for
    leaves out plain requests whose mode was inferred (``mode_inferred``). Error requests are
    dropped after the pick, so the sample can fall short of ``limit`` by their share.
    """
    r = RequestRow
    hashed = ((r.id % HASH_MODULUS) * HASH_MULTIPLIER) % HASH_MODULUS
    inner = select(r.id).where(r.ts_start >= start, r.ts_start < end)
    if workload is not None:
        inner = inner.where(r.workload == workload)
    if not (only_pair and mode is None and workload is not None):
        inner = inner.where(r.target_model == pair.target_model)
        if not any_drafter:
            inner = inner.where(
                r.drafter == pair.drafter,
                r.draft_model.is_(None) if pair.draft_model is None else r.draft_model == pair.draft_model,
            )
        if isinstance(mode, str):
            inner = inner.where(r.mode == mode)
        elif mode is not None:
            inner = inner.where(r.mode.in_(mode))
        if mode is not None:
            # A mode asked for is a population of its own: a plain one holds no request merely read as plain.
            inner = inner.where(r.mode_inferred.is_(False))
    inner = inner.order_by(hashed).limit(limit)
    # The window again outside the ids: on partitioned PostgreSQL the rows are then read from the window's
    # partitions only, where ids alone would be looked up in every partition (the same rows either way). In id
    # order: the tests' resampling depends on it, and the order of a plan's join (which differs between the
    # layouts and with the table's size) must not.
    query = (
        select(*_COLUMNS)
        .where(r.id.in_(inner.scalar_subquery()), r.ts_start >= start, r.ts_start < end, r.finish_reason != "error")
        .order_by(r.id)
    )
    rows = conn.execute(query).all()
    numeric_names = [name for name in Sample.__dataclass_fields__ if name != "mode"]
    if not rows:
        empty = {name: np.zeros(0) for name in numeric_names}
        return Sample(mode=np.array([], dtype=str), **empty)
    cols = list(zip(*rows, strict=True))
    numeric = {
        name: np.array([np.nan if v is None else v for v in col], dtype=float)
        for name, col in zip(numeric_names, cols[1:], strict=True)
    }
    return Sample(mode=np.array(cols[0], dtype=str), **numeric)
