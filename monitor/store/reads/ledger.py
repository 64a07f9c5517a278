"""The speculation ledger's one aggregate: a pair's speculative decode tokens per recorded in-flight count.

The ratios come from bounded samples (:mod:`monitor.drift.sampling`); the tokens they are applied to
must be all of them, so they are summed in SQL, one row per distinct ``upstream_inflight`` (a few
dozen values), never read per request.

>>> from datetime import UTC, datetime
>>> from monitor.store.engine import create_engine
>>> from monitor.store.migrate import upgrade
>>> engine = create_engine("sqlite://")
>>> _ = upgrade(engine)
>>> with engine.connect() as conn:
...     speculative_tokens(conn, "chat", Pair("t", "ngram"), datetime(2026, 1, 1, tzinfo=UTC), datetime.now(UTC))
[]
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import case, func, select
from sqlalchemy.engine import Connection

from monitor.store.models import RequestRow
from monitor.store.reads.results import Pair


def speculative_tokens(
    conn: Connection, workload: str, pair: Pair, start: datetime, end: datetime
) -> list[tuple[float | None, int, int]]:
    """``(upstream_inflight or None, requests, decode tokens)`` of the pair's finished speculative requests.

    Decode tokens are the tokens after each request's first (the ones decode ms per token times),
    the tokens whose replica time speculation changes.
    """
    r = RequestRow
    draft_model = r.draft_model.is_(None) if pair.draft_model is None else r.draft_model == pair.draft_model
    rows = conn.execute(
        select(r.upstream_inflight, func.count(), func.sum(case((r.output_tokens > 1, r.output_tokens - 1), else_=0)))
        .where(
            r.workload == workload,
            r.target_model == pair.target_model,
            r.drafter == pair.drafter,
            draft_model,
            r.mode == "speculative",
            r.ts_start >= start,
            r.ts_start < end,
            r.finish_reason != "error",
        )
        .group_by(r.upstream_inflight)
    ).all()
    return [(None if inflight is None else float(inflight), int(n), int(tokens or 0)) for inflight, n, tokens in rows]
