"""Rollouts (migration 0013): a candidate drafter staged on live traffic, and every step the judge took.

A rollout belongs to one deployment (the default, ``*``, or a ``[[proxy.routes]]`` model glob)
whose sidecars have a candidate pool (``proxy.candidate_upstream``), or whose embedded decoder has
a candidate drafter (``decoder.candidate``, the default deployment). Every sidecar reads the
deployment's active rollout from here, so a whole fleet sends the same share to the candidate; the
scheduler's elected leader judges it (``monitor.proxy.rollout``) and writes each decision as a row
of ``rollout_events``: one place for the CLI, the API, the alerts and the dashboard to read.

The candidate's requests are stored under the rollout's ``drafter``; the current side's under the
names in ``current_drafters`` (migration 0015): ``upstream`` behind a proxy, the portfolio's
drafter kinds (``model``, ``ngram``) in the embedded decoder.

Statuses: ``running`` (a step's share goes to the candidate), ``promoted`` (it serves everything,
or, per workload, the workloads where it won), ``rolled_back`` and ``aborted`` (nothing any more).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final, Literal

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    case,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Mapped, mapped_column

from monitor.store.engine import read_rows
from monitor.store.models import Base, BigId, RequestRow, RollupMinuteRow

Status = Literal["running", "promoted", "rolled_back", "aborted"]
STATUSES: Final = ("running", "promoted", "rolled_back", "aborted")
ACTIVE: Final = ("running", "promoted")
EventKind = Literal["started", "advanced", "held", "kept", "rolled_back", "promoted", "aborted"]
EVENT_KINDS: Final = ("started", "advanced", "held", "kept", "rolled_back", "promoted", "aborted")
# The rollout's drafter column holds at most this many characters.
MAX_DRAFTER: Final = 256
# The drafter the proxy stores its speculative pool's requests under (what it knows of the engine's drafter).
CURRENT_DRAFTER: Final = "upstream"
# The modes of a side's requests: every one it served, drafting or not; holdout requests are the plain baseline's.
SERVED_MODES: Final = ("speculative", "plain")
# A workload's place once decided: on the candidate (promoted where it won) or kept on the current drafter.
Side = Literal["candidate", "current"]


class RolloutRow(Base):
    __tablename__ = "rollouts"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    deployment: Mapped[str] = mapped_column(String(512))
    drafter: Mapped[str] = mapped_column(String(MAX_DRAFTER))
    steps: Mapped[list[float]] = mapped_column(JSON)
    interval_s: Mapped[float] = mapped_column(Float)
    per_workload: Mapped[bool] = mapped_column(Boolean)
    status: Mapped[str] = mapped_column(String(16))
    step: Mapped[int] = mapped_column(Integer)
    holds: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime]
    step_started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    reason: Mapped[str] = mapped_column(String(1024))
    workloads: Mapped[dict[str, str]] = mapped_column(JSON)
    judgement: Mapped[dict[str, Any]] = mapped_column(JSON)
    current_drafters: Mapped[list[str]] = mapped_column(JSON, server_default=text(f"'[\"{CURRENT_DRAFTER}\"]'"))

    __table_args__ = (
        Index("ix_rollouts_status", "status"),
        # One active rollout per deployment, whoever starts it: the check before the insert cannot see a
        # concurrent start's uncommitted row, the index refuses it.
        Index("uq_rollouts_active_deployment", "deployment", unique=True,
              postgresql_where=text("status IN ('running', 'promoted')"),
              sqlite_where=text("status IN ('running', 'promoted')")),
    )  # fmt: skip


class RolloutEventRow(Base):
    __tablename__ = "rollout_events"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    rollout_id: Mapped[int] = mapped_column(BigId, ForeignKey("rollouts.id", ondelete="CASCADE"))
    ts: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(16))
    step: Mapped[int] = mapped_column(Integer)
    share: Mapped[float] = mapped_column(Float)
    workload: Mapped[str | None] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(String(1024))
    judgement: Mapped[dict[str, Any]] = mapped_column(JSON)

    __table_args__ = (
        Index("ix_rollout_events_rollout_id_ts", "rollout_id", "ts"),
        Index("ix_rollout_events_ts", "ts"),
    )


@dataclass(frozen=True, slots=True)
class Rollout:
    """One rollout as stored; ``steps`` are shares of the deployment's speculative traffic, 0 < s <= 1, rising to 1."""

    deployment: str
    drafter: str
    steps: tuple[float, ...]
    interval_s: float
    per_workload: bool
    started_at: datetime
    step_started_at: datetime
    status: Status = "running"
    step: int = 0
    holds: int = 0  # intervals the current step ended without every judged workload passing
    finished_at: datetime | None = None
    reason: str = ""
    workloads: Mapping[str, Side] = field(default_factory=dict)
    judgement: Mapping[str, Any] = field(default_factory=dict)  # the newest judgement, by workload
    current_drafters: tuple[str, ...] = (CURRENT_DRAFTER,)  # the names the current side's requests are stored under
    id: int | None = None

    @property
    def step_share(self) -> float:
        """The share the current step sends to the candidate (0 once it no longer runs or serves)."""
        if self.status == "promoted":
            return 1.0
        return self.steps[self.step] if self.status == "running" else 0.0

    def share(self, workload: str) -> float:
        """The share of ``workload``'s speculative requests the candidate serves now.

        >>> from datetime import UTC
        >>> t = datetime(2026, 1, 1, tzinfo=UTC)
        >>> r = Rollout("*", "ngram-8", (0.05, 0.5, 1.0), 60.0, True, t, t, step=1, workloads={"story": "current"})
        >>> r.share("copy"), r.share("story")
        (0.5, 0.0)
        >>> replace(r, status="promoted", workloads={"copy": "candidate"}).share("chat")
        0.0
        """
        side = self.workloads.get(workload)
        if side is not None:
            return 1.0 if side == "candidate" and self.status in ACTIVE else 0.0
        if self.status == "promoted" and self.per_workload:
            return 0.0  # per workload, only the workloads where the candidate won are its
        return self.step_share

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def of_proxy(self) -> bool:
        """Is it a proxy's rollout (its current side the ``upstream`` pool), not the embedded decoder's?"""
        return self.current_drafters == (CURRENT_DRAFTER,)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "deployment": self.deployment, "drafter": self.drafter, "status": self.status,
            "steps": list(self.steps), "step": self.step, "share": self.step_share, "interval_s": self.interval_s,
            "per_workload": self.per_workload, "holds": self.holds, "started_at": self.started_at.isoformat(),
            "step_started_at": self.step_started_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None, "reason": self.reason,
            "workloads": dict(self.workloads), "judgement": dict(self.judgement),
            "current_drafters": list(self.current_drafters),
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class RolloutEvent:
    rollout_id: int
    ts: datetime
    kind: EventKind
    step: int
    share: float
    reason: str
    workload: str | None = None
    judgement: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"rollout_id": self.rollout_id, "ts": self.ts.isoformat(), "kind": self.kind, "step": self.step,
                "share": self.share, "workload": self.workload, "reason": self.reason,
                "judgement": dict(self.judgement)}  # fmt: skip


_ROLLOUT_FIELDS: Final = tuple(name for name in Rollout.__dataclass_fields__ if name != "id")
_EVENT_FIELDS: Final = tuple(RolloutEvent.__dataclass_fields__)


def _values(rollout: Rollout) -> dict[str, Any]:
    values = {name: getattr(rollout, name) for name in _ROLLOUT_FIELDS}
    return {**values, "steps": list(rollout.steps), "workloads": dict(rollout.workloads),
            "judgement": dict(rollout.judgement), "current_drafters": list(rollout.current_drafters)}  # fmt: skip


def _rollout(row: Any) -> Rollout:
    values = {name: getattr(row, name) for name in _ROLLOUT_FIELDS}
    return Rollout(**{**values, "steps": tuple(row.steps), "current_drafters": tuple(row.current_drafters)},
                   id=row.id)  # fmt: skip


def insert_rollout(conn: Connection, rollout: Rollout) -> Rollout:
    """Store a new rollout; returns it with its id."""
    new_id = conn.execute(insert(RolloutRow).values(**_values(rollout)).returning(RolloutRow.id)).scalar_one()
    return replace(rollout, id=int(new_id))


def save_rollout(conn: Connection, rollout: Rollout) -> None:
    """Write a rollout's changed state (status, step, holds, workloads, judgement...) over its row."""
    conn.execute(update(RolloutRow).where(RolloutRow.id == rollout.id).values(**_values(rollout)))


def record_event(conn: Connection, event: RolloutEvent) -> None:
    values = {name: getattr(event, name) for name in _EVENT_FIELDS}
    conn.execute(insert(RolloutEventRow).values(**{**values, "judgement": dict(event.judgement)}))


def rollouts(engine: Engine | Connection, *, status: Sequence[str] = STATUSES, limit: int = 100) -> list[Rollout]:
    """Rollouts with one of ``status``, newest first."""
    query = select(*RolloutRow.__table__.c).where(RolloutRow.status.in_(status))
    return [_rollout(row) for row in read_rows(engine, query.order_by(RolloutRow.id.desc()).limit(limit))]


def get_rollout(engine: Engine | Connection, rollout_id: int, *, lock: bool = False) -> Rollout | None:
    """One rollout; ``lock`` (on a connection in a transaction) holds its row until the transaction ends.

    Every change of a rollout reads it locked: the judge's step and a promotion or abort by hand
    cannot then write over each other (PostgreSQL's ``FOR UPDATE``; SQLite has one writer at a time).
    """
    query = select(*RolloutRow.__table__.c).where(RolloutRow.id == rollout_id)
    rows = read_rows(engine, query.with_for_update() if lock else query)
    return _rollout(rows[0]) if rows else None


def active_rollouts(engine: Engine | Connection) -> dict[str, Rollout]:
    """The newest running or promoted rollout of each deployment, by deployment."""
    found: dict[str, Rollout] = {}
    for rollout in sorted(rollouts(engine, status=ACTIVE), key=lambda r: r.id or 0):
        found[rollout.deployment] = rollout
    return found


def rollout_events(
    engine: Engine | Connection, *, rollout_id: int | None = None, start: datetime | None = None,
    end: datetime | None = None,
) -> list[RolloutEvent]:  # fmt: skip
    """Events of one rollout, or of all in ``[start, end)``, oldest first."""
    e = RolloutEventRow
    query = select(*(getattr(e, name) for name in _EVENT_FIELDS))
    if rollout_id is not None:
        query = query.where(e.rollout_id == rollout_id)
    if start is not None:
        query = query.where(e.ts >= start)
    if end is not None:
        query = query.where(e.ts < end)
    return [RolloutEvent(*row) for row in read_rows(engine, query.order_by(e.ts, e.id))]


def timed_traffic(
    conn: Connection, drafters: Sequence[str], start: datetime, end: datetime
) -> dict[tuple[str, str], tuple[int, datetime]]:
    """Per (workload, target), the requests with a decode time the side ``drafters`` names served in ``[start,
    end)`` (what ``rollout.min_requests`` counts), and the first minute one was seen; from the minute rollups."""
    m = RollupMinuteRow
    query = (
        select(m.workload, m.target_model, func.sum(m.n_timed), func.min(m.bucket))
        .where(m.bucket >= start, m.bucket < end, m.drafter.in_(drafters), m.mode.in_(SERVED_MODES), m.n_timed > 0)
        .group_by(m.workload, m.target_model)
    )
    return {(w, target): (int(n), first) for w, target, n, first in conn.execute(query)}


def outcomes(
    conn: Connection, drafters: Sequence[str], start: datetime, end: datetime
) -> dict[tuple[str, str, str, str | None], tuple[int, int]]:
    """Per (workload, target, drafter, draft model), the requests a side served in ``[start, end)``, and its failures.

    ``drafters`` name one side of a rollout: its ``drafter`` for the candidate, its
    ``current_drafters`` for the current one. A side's requests are those of :data:`SERVED_MODES`:
    the embedded decoder's controller decodes a request plain where its drafter would not pay, and
    leaving those out would compare each side's requests selected on their outcome.
    """
    r = RequestRow
    failed = func.sum(case((r.finish_reason == "error", 1), else_=0))
    query = (
        select(r.workload, r.target_model, r.drafter, r.draft_model, func.count(), failed)
        .where(r.ts_start >= start, r.ts_start < end, r.drafter.in_(drafters), r.mode.in_(SERVED_MODES))
        .group_by(r.workload, r.target_model, r.drafter, r.draft_model)
    )
    return {(w, target, drafter, draft): (int(n), int(errors or 0))
            for w, target, drafter, draft, n, errors in conn.execute(query)}  # fmt: skip
