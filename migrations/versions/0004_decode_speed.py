"""Rollups' ms per token becomes the decode phase: (latency - TTFT) / (output tokens - 1).

Before, ``rollup_minute.n_timed`` / ``sum_ms_per_token`` and the ``ms_per_token`` bins of
``rollup_bins`` held latency / output tokens, which counts prompt reading as decoding. This
revision recomputes them from ``requests``, so stored history and new writes share one meaning.
Downgrade recomputes the old meaning the same way.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out, not imported: a migration is a frozen snapshot of the definitions of its day.
KEY = ("bucket", "workload", "target_model", "drafter", "draft_model", "mode")
METRIC = "ms_per_token"
BASE_MS, PER_DOUBLING, NUM_BINS = 0.01, 8, 241
BATCH = 5000

requests = sa.table(
    "requests",
    sa.column("id", sa.BigInteger()),
    sa.column("ts_start", sa.DateTime(timezone=True)),
    *(sa.column(name, sa.String()) for name in KEY[1:]),
    sa.column("latency_ms", sa.Float()),
    sa.column("ttft_ms", sa.Float()),
    sa.column("output_tokens", sa.Integer()),
)
minutes = sa.table(
    "rollup_minute",
    sa.column("bucket", sa.DateTime(timezone=True)),
    *(sa.column(name, sa.String()) for name in KEY[1:]),
    sa.column("n_timed", sa.BigInteger()),
    sa.column("sum_ms_per_token", sa.Float()),
)
bins = sa.table(
    "rollup_bins",
    sa.column("bucket", sa.DateTime(timezone=True)),
    *(sa.column(name, sa.String()) for name in KEY[1:]),
    sa.column("metric", sa.String()),
    sa.column("bin", sa.Integer()),
    sa.column("count", sa.BigInteger()),
)

Speed = Callable[[float | None, float | None, int], float | None]


def _decode(latency: float | None, ttft: float | None, output: int) -> float | None:
    if latency is None or ttft is None or output < 2:
        return None
    return max(latency - ttft, 0.0) / (output - 1)


def _whole(latency: float | None, ttft: float | None, output: int) -> float | None:
    return None if latency is None or output <= 0 else latency / output


def _value_bin(value: float) -> int:
    if value < BASE_MS:
        return 0
    return min(max(1 + math.floor(PER_DOUBLING * math.log2(value / BASE_MS)), 1), NUM_BINS - 1)


def _minute(ts: datetime) -> datetime:
    ts = ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)
    return ts.replace(second=0, microsecond=0)


def _recompute(speed: Speed) -> None:
    conn = op.get_bind()
    sums: dict[tuple[object, ...], list[float]] = defaultdict(lambda: [0, 0.0])
    counts: dict[tuple[object, ...], int] = defaultdict(int)
    r = requests.c
    last = None
    while True:
        query = sa.select(r.id, r.ts_start, *(r[name] for name in KEY[1:]), r.latency_ms, r.ttft_ms, r.output_tokens)
        if last is not None:
            query = query.where(r.id > last)
        rows = conn.execute(query.order_by(r.id).limit(BATCH)).all()
        if not rows:
            break
        last = rows[-1][0]
        for _, ts, workload, target, drafter, draft_model, mode, latency, ttft, output in rows:
            value = speed(latency, ttft, output)
            if value is None:
                continue
            key = (_minute(ts), workload, target, drafter, draft_model or "", mode)
            sums[key][0] += 1
            sums[key][1] += value
            counts[(*key, _value_bin(value))] += 1
    conn.execute(sa.update(minutes).values(n_timed=0, sum_ms_per_token=0.0))
    m = minutes.c
    for key, (n, total) in sums.items():
        where = [m[name] == value for name, value in zip(KEY, key, strict=True)]
        conn.execute(sa.update(minutes).where(*where).values(n_timed=n, sum_ms_per_token=total))
    conn.execute(sa.delete(bins).where(bins.c.metric == METRIC))
    rows = [{**dict(zip(KEY, key[:-1], strict=True)), "metric": METRIC, "bin": key[-1], "count": n}
            for key, n in sorted(counts.items(), key=lambda item: tuple(map(str, item[0])))]  # fmt: skip
    for start in range(0, len(rows), BATCH):
        conn.execute(sa.insert(bins), rows[start : start + BATCH])


def upgrade() -> None:
    _recompute(_decode)


def downgrade() -> None:
    _recompute(_whole)
