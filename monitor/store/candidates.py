"""The candidates each sidecar serves a rollout with (migration 0019), as it last announced them.

A rollout is stored for a deployment; each sidecar sends the step's share to the candidate of its
own settings (``serve --candidate-upstream``, a route's ``candidate_upstream``, the embedded
decoder's ``serve --candidate-drafter``). ``draftwatch rollout start`` runs elsewhere, with settings
of its own: so every sidecar writes here, per deployment, the candidates it serves (URLs masked),
the setting that names them and the names of the current side's requests, at its start and then
every minute (:func:`monitor.proxy.rollout.announce_candidates`), and a start without a candidate
pool of its own reads the fresh rows. One row per sidecar process and deployment; each write also
forgets the rows no process renewed for a day.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from sqlalchemy import JSON, String, delete, insert, or_, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Mapped, mapped_column

from monitor.store.engine import read_rows
from monitor.store.models import Base

# A row nobody renewed for this long is a process gone (a sidecar that stopped, a restart's old pid): deleted.
FORGET_AFTER: Final = timedelta(days=1)


class CandidatePoolRow(Base):
    __tablename__ = "candidate_pools"

    instance: Mapped[str] = mapped_column(String(255), primary_key=True)  # host:pid of the sidecar
    deployment: Mapped[str] = mapped_column(String(512), primary_key=True)
    candidates: Mapped[list[str]] = mapped_column(JSON)
    setting: Mapped[str] = mapped_column(String(128))
    current_drafters: Mapped[list[str]] = mapped_column(JSON)
    seen_at: Mapped[datetime]


@dataclass(frozen=True, slots=True)
class Announced:
    """What one sidecar serves a deployment's rollout with: its candidates (URLs masked, or the embedded
    decoder's drafter), the setting naming them, and the names the current side's requests are stored under."""

    deployment: str
    candidates: tuple[str, ...]
    setting: str
    current_drafters: tuple[str, ...]
    instance: str = ""
    seen_at: datetime | None = None


def announce(conn: Connection, instance: str, pools: Sequence[Announced], now: datetime) -> None:
    """Make ``pools`` the candidates ``instance`` serves as of ``now``, and forget the rows of processes gone."""
    row = CandidatePoolRow
    conn.execute(delete(row).where(or_(row.instance == instance, row.seen_at < now - FORGET_AFTER)))
    if pools:
        conn.execute(insert(row), [
            {"instance": instance, "deployment": p.deployment, "candidates": list(p.candidates), "setting": p.setting,
             "current_drafters": list(p.current_drafters), "seen_at": now}
            for p in pools
        ])  # fmt: skip


def announced(engine: Engine | Connection, deployment: str | None, since: datetime) -> list[Announced]:
    """The candidates the sidecars announced for ``deployment`` (None: any) at ``since`` or later, newest first."""
    row = CandidatePoolRow
    query = (
        select(row.deployment, row.candidates, row.setting, row.current_drafters, row.instance, row.seen_at)
        .where(row.seen_at >= since)
        .order_by(row.seen_at.desc(), row.instance)
    )
    if deployment is not None:
        query = query.where(row.deployment == deployment)
    rows = read_rows(engine, query)
    return [Announced(d, tuple(c), s, tuple(current), i, seen) for d, c, s, current, i, seen in rows]
