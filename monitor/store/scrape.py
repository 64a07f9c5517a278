"""Scrape mode's tables (created by migration 0006) and the reads over them.

* ``scrape_intervals``: one row per target, series and interval between two successful scrapes:
  the counters' increase (drafts, draft tokens, accepted tokens, accepted per position) or, for an
  engine with gauges only (SGLang), the gauge read at the interval's end; ``reset`` marks an
  interval in which the engine restarted (its figure is what it counted since).
* ``scrape_targets``: one row per target: the last cumulative counters per series (so a new leader
  continues where the last one stopped), and the target's health (``up``, ``down``, ``garbage``,
  and how often and when last its counters went back), which is never read as a change of acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, Index, Integer, String, case, func, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Mapped, mapped_column

from monitor.store.models import Base, BigId


class ScrapeIntervalRow(Base):
    __tablename__ = "scrape_intervals"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    target: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16))
    workload: Mapped[str] = mapped_column(String(64))
    target_model: Mapped[str] = mapped_column(String(512))
    drafter: Mapped[str] = mapped_column(String(128))
    started_at: Mapped[datetime]
    ended_at: Mapped[datetime]
    drafts: Mapped[int | None] = mapped_column(BigInteger)
    draft_tokens: Mapped[int | None] = mapped_column(BigInteger)
    accepted_tokens: Mapped[int | None] = mapped_column(BigInteger)
    accepted_per_position: Mapped[list[int] | None] = mapped_column(JSON)
    accept_rate: Mapped[float | None] = mapped_column(Float)
    accept_length: Mapped[float | None] = mapped_column(Float)
    reset: Mapped[bool] = mapped_column(Boolean)

    __table_args__ = (
        Index("ix_scrape_intervals_workload_ended_at", "workload", "ended_at"),
        Index("ix_scrape_intervals_target_ended_at", "target", "ended_at"),
    )


class ScrapeTargetRow(Base):
    __tablename__ = "scrape_targets"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(String(300))
    failures: Mapped[int] = mapped_column(Integer)
    # Counters that went back (the engine restarted): never a drop, but part of the target's health.
    resets: Mapped[int] = mapped_column(Integer)
    reset_at: Mapped[datetime | None]
    scraped_at: Mapped[datetime]
    up_at: Mapped[datetime | None]
    # {series key: {"counters": {...}, "per_position": {...}}}, the last successful scrape's values.
    counters: Mapped[dict[str, Any]] = mapped_column(JSON)


@dataclass(frozen=True, slots=True)
class ScrapedSummary:
    """One target's series over a range: aggregate figures whose unit of evidence is the interval."""

    source: str
    target: str
    kind: str
    workload: str
    target_model: str
    drafter: str
    intervals: int
    resets: int
    drafts: int | None
    draft_tokens: int | None
    accepted_tokens: int | None
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    # SGLang's gauge (accepted / drafted of its last batch), averaged over the intervals.
    accept_rate_gauge: float | None
    last_interval_end: datetime | None


@dataclass(frozen=True, slots=True)
class TargetHealth:
    name: str
    kind: str
    status: str
    error: str | None
    failures: int
    scraped_at: datetime
    up_at: datetime | None
    resets: int
    reset_at: datetime | None


SeriesKey = tuple[str, str, str, str]  # workload, target_model, drafter, target


def scraped_summaries(
    engine: Engine, start: datetime, end: datetime, workload: str | None = None
) -> list[ScrapedSummary]:
    """Per target and series, the intervals that ended in ``[start, end)``."""
    s = ScrapeIntervalRow
    keys = (s.target, s.kind, s.workload, s.target_model, s.drafter)
    query = (
        select(
            *keys,
            func.count(),
            func.sum(case((s.reset, 1), else_=0)),
            func.sum(s.drafts),
            func.sum(s.draft_tokens),
            func.sum(s.accepted_tokens),
            func.avg(s.accept_rate),
            func.max(s.ended_at),
        )
        .where(s.ended_at >= start, s.ended_at < end)
        .group_by(*keys)
        .order_by(s.workload, s.target, s.target_model)
    )
    if workload is not None:
        query = query.where(s.workload == workload)
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    out = []
    for target, kind, wl, model, drafter, count, resets, drafts, drafted, accepted, gauge, last in rows:
        out.append(
            ScrapedSummary(
                source=f"scrape:{target}",
                target=target,
                kind=kind,
                workload=wl,
                target_model=model,
                drafter=drafter,
                intervals=int(count),
                resets=int(resets or 0),
                drafts=None if drafts is None else int(drafts),
                draft_tokens=None if drafted is None else int(drafted),
                accepted_tokens=None if accepted is None else int(accepted),
                acceptance_rate=float(accepted) / float(drafted) if drafted else None,
                mean_acceptance_length=1 + float(accepted) / float(drafts) if drafts else None,
                accept_rate_gauge=None if gauge is None else float(gauge),
                last_interval_end=_utc(last),
            )
        )
    return out


def target_health(engine: Engine) -> list[TargetHealth]:
    with engine.connect() as conn:
        rows = conn.execute(select(ScrapeTargetRow.__table__).order_by(ScrapeTargetRow.name)).all()
    return [
        TargetHealth(r.name, r.kind, r.status, r.error, r.failures, r.scraped_at, r.up_at, r.resets, r.reset_at)
        for r in rows
    ]


def interval_rates(conn: Connection, start: datetime, end: datetime) -> dict[SeriesKey, list[tuple[float, int | None]]]:
    """Per series, each interval's (acceptance, drafted tokens) in ``[start, end)``: accepted / drafted, or
    SGLang's gauge with ``None`` drafted; intervals that drafted nothing carry no evidence."""
    s = ScrapeIntervalRow
    query = select(s.workload, s.target_model, s.drafter, s.target, s.accepted_tokens, s.draft_tokens, s.accept_rate)
    found: dict[SeriesKey, list[tuple[float, int | None]]] = {}
    for workload, model, drafter, target, accepted, drafted, gauge in conn.execute(
        query.where(s.ended_at >= start, s.ended_at < end).order_by(s.ended_at)
    ):
        if drafted and accepted is not None:
            found.setdefault((workload, model, drafter, target), []).append((accepted / drafted, drafted))
        elif gauge is not None and drafted is None:
            found.setdefault((workload, model, drafter, target), []).append((float(gauge), None))
    return found


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
