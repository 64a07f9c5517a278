"""Routing events (proxy mode, migration 0011): each switch of a workload to the plain baseline and back.

The scheduler decides (``monitor.proxy.decide``) from the drift run's net-loss verdicts and writes a
row per switch; the proxy reads the latest row per workload to know which workloads are routed; the
dashboard marks the switches on its timeline and the alert ``routing_changed`` reports them.

A workload routed by load (its crossover measured: speculation loses from N requests in flight,
:mod:`monitor.drift.detectors.crossover`) is a routed row with N in ``above_inflight`` (migration
0018) and a reason that says so (:func:`load_reason`), which the alert's note carries.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Boolean, Float, Index, Integer, String, func, insert, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Mapped, mapped_column

from monitor.store.engine import read_rows
from monitor.store.models import Base, BigId


class RoutingEventRow(Base):
    __tablename__ = "routing_events"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    ts: Mapped[datetime]
    workload: Mapped[str] = mapped_column(String(64))
    target_model: Mapped[str] = mapped_column(String(512))
    routed: Mapped[bool] = mapped_column(Boolean)  # True: to the plain baseline; False: back to speculation
    reason: Mapped[str] = mapped_column(String(512))
    speedup: Mapped[float | None] = mapped_column(Float)
    ci_low: Mapped[float | None] = mapped_column(Float)
    ci_high: Mapped[float | None] = mapped_column(Float)
    above_inflight: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (Index("ix_routing_events_workload_ts", "workload", "ts"),)


@dataclass(frozen=True, slots=True)
class RoutingEvent:
    ts: datetime
    workload: str
    target_model: str
    routed: bool
    reason: str
    speedup: float | None
    ci_low: float | None
    ci_high: float | None
    # Routed by load: to the baseline from this many requests in flight on the speculative replica (the request
    # included), to speculation below. None: not routed, or routed whole (every request but the probes plain).
    above_inflight: int | None = None


def load_reason(above: int, why: str) -> str:
    """The reason of a route by load from ``above`` in flight, in the words the alert's note gives."""
    return f"route above {above} in flight: {why}"


_COLUMNS = tuple(getattr(RoutingEventRow, name) for name in RoutingEvent.__dataclass_fields__)


def record_switch(conn: Connection, event: RoutingEvent) -> None:
    conn.execute(insert(RoutingEventRow).values(**{name: getattr(event, name) for name in event.__dataclass_fields__}))


def latest_routing(engine: Engine | Connection) -> dict[str, RoutingEvent]:
    """The last switch of every workload that ever switched, by workload."""
    r = RoutingEventRow
    last = select(r.workload, func.max(r.id).label("id")).group_by(r.workload).subquery()
    query = select(*_COLUMNS).join(last, r.id == last.c.id)
    return {row.workload: RoutingEvent(*row) for row in read_rows(engine, query)}


def routing_events(engine: Engine, start: datetime, end: datetime, workload: str | None = None) -> list[RoutingEvent]:
    """Switches in ``[start, end)``, oldest first."""
    r = RoutingEventRow
    query = select(*_COLUMNS).where(r.ts >= start, r.ts < end)
    if workload is not None:
        query = query.where(r.workload == workload)
    with engine.connect() as conn:
        return [RoutingEvent(*row) for row in conn.execute(query.order_by(r.ts, r.id))]
