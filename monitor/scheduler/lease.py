"""Leader election through one lease row, with a fencing epoch.

APScheduler 3.x does not coordinate schedulers sharing a database, so replicas elect a leader here:
the row ``scheduler_lease(name)`` names a holder, an ``epoch`` and an expiry. A replica renews its
lease every heartbeat; any replica may take an expired lease, which increments the epoch. Jobs end
their transactions with :meth:`Lease.fence`, an UPDATE that matches only while (holder, epoch) still
own an unexpired lease: a leader that was paused (GC, SIGSTOP, a slow disk) past its TTL finds the
row changed and its transaction rolls back instead of writing stale results. On PostgreSQL the
fence's row lock also makes a takeover wait for a commit in flight. Times come from the database's
clock on PostgreSQL, so replicas on different hosts agree on expiry.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import insert, select, text, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from monitor.scheduler.models import LeaseRow

log = logging.getLogger(__name__)
L = LeaseRow


class LeaseLostError(RuntimeError):
    """This replica no longer holds the lease (another took it, or it expired)."""


def db_now(conn: Connection) -> datetime:
    """The current time by the database's clock (PostgreSQL), else this host's."""
    if conn.dialect.name == "postgresql":
        value = conn.execute(select(text("clock_timestamp()"))).scalar_one()
        return value.astimezone(UTC) if isinstance(value, datetime) else datetime.now(UTC)
    return datetime.now(UTC)


def _write_lock(conn: Connection) -> None:
    if conn.dialect.name == "sqlite":
        # Take SQLite's write lock first: a read-then-write transaction fails when another
        # replica wrote in between, and replicas race here on every heartbeat.
        conn.execute(text("UPDATE scheduler_lease SET epoch = epoch WHERE 1 = 0"))


class Lease:
    """One replica's view of the lease ``name``; ``holder`` must be unique per process."""

    def __init__(self, engine: Engine, holder: str, ttl_s: float, name: str = "scheduler") -> None:
        self.engine, self.holder, self.ttl, self.name = engine, holder, timedelta(seconds=ttl_s), name
        self.epoch: int | None = None
        self._valid_until = 0.0  # time.monotonic() deadline of the lease as last renewed

    @property
    def held(self) -> bool:
        """Whether this replica holds the lease as far as it knows (renewed within the TTL)."""
        return self.epoch is not None and time.monotonic() < self._valid_until

    def acquire_or_renew(self) -> bool:
        """Renew the lease, or take it when free or expired; True when this replica holds it after."""
        started = time.monotonic()
        try:
            with self.engine.begin() as conn:
                _write_lock(conn)
                now = db_now(conn)
                query = select(L.holder, L.epoch, L.expires_at).where(L.name == self.name)
                if conn.dialect.name == "postgresql":
                    query = query.with_for_update()
                row = conn.execute(query).first()
                values = {"holder": self.holder, "renewed_at": now, "expires_at": now + self.ttl}
                if row is None:
                    conn.execute(insert(L).values(name=self.name, epoch=1, acquired_at=now, **values))
                    epoch = 1
                elif row.holder == self.holder and row.epoch == self.epoch:
                    conn.execute(update(L).where(L.name == self.name, L.epoch == row.epoch).values(**values))
                    epoch = row.epoch
                elif row.expires_at <= now:
                    taken = conn.execute(
                        update(L)
                        .where(L.name == self.name, L.epoch == row.epoch)
                        .values(epoch=row.epoch + 1, acquired_at=now, **values)
                    )
                    if taken.rowcount != 1:
                        return self._lose()
                    epoch = row.epoch + 1
                else:
                    return self._lose()
        except IntegrityError:  # another replica inserted the first row at the same moment
            return self._lose()
        if self.epoch != epoch:
            log.warning("scheduler lease %r taken by %s (epoch %d)", self.name, self.holder, epoch)
        self.epoch = epoch
        self._valid_until = started + self.ttl.total_seconds()
        return True

    def _lose(self) -> bool:
        if self.epoch is not None:
            log.warning("scheduler lease %r lost by %s (epoch %d)", self.name, self.holder, self.epoch)
        self.epoch = None
        return False

    def fence(self, conn: Connection) -> None:
        """Raise :class:`LeaseLostError` unless this replica still holds the lease; call last in a job's transaction."""
        if self.epoch is None:
            raise LeaseLostError(f"{self.holder} does not hold the lease")
        result = conn.execute(
            update(L)
            .where(L.name == self.name, L.holder == self.holder, L.epoch == self.epoch, L.expires_at > db_now(conn))
            .values(renewed_at=L.renewed_at)
        )
        if result.rowcount != 1:
            raise LeaseLostError(f"{self.holder} lost the lease (epoch {self.epoch})")

    def release(self) -> None:
        """Give the lease up (a clean shutdown), so that a standby takes over at its next heartbeat."""
        if self.epoch is None:
            return
        with self.engine.begin() as conn:
            # Expire rather than delete: the epoch must only ever grow.
            now = db_now(conn)
            conn.execute(
                update(L)
                .where(L.name == self.name, L.holder == self.holder, L.epoch == self.epoch)
                .values(expires_at=now)
            )
        self.epoch = None
