"""The recorder's writing half: batches to the database, to the spool, and back from the spool.

Kept apart from :mod:`monitor.ingest.recorder` (queueing, threads, lifecycle) so that each is one concept.
:class:`BatchSink` is thread-safe: the writer thread and :meth:`Recorder.store_batch` callers share it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from sqlalchemy import exc
from sqlalchemy.engine import Engine

from decoder.record import RequestRecord
from monitor.ingest.spool import Spool, SpooledBatch
from monitor.ingest.writer_process import RemoteWriteError, WriterProcess
from monitor.log_safe import describe, traceback_text
from monitor.store.writes.writer import BatchOutcome, write_batch, write_batches

log = logging.getLogger(__name__)

# Called on the writer thread (or store_batch's caller) after records became durable: "written"
# (newly committed; records already stored under their request_id are left out), "replayed"
# (newly committed from the spool) or "spooled" (fsync'd; duplicates are not known yet there).
DurableHook = Callable[[Sequence[RequestRecord], str], None]
# Records handed to the hook at a time (see BatchSink._durable).
HOOK_SLICE: Final = 32


def is_transient(error: BaseException) -> bool:
    """Whether a database error means "not reachable now" (spool and retry) rather than "bad data".

    Connection failures, server restarts, lock timeouts and deadlocks are OperationalError; a
    missing table (schema not migrated yet) is ProgrammingError on PostgreSQL: all worth a retry.
    A writer process's error says which it was.
    """
    if isinstance(error, RemoteWriteError):
        return error.transient
    if isinstance(error, exc.DBAPIError) and error.connection_invalidated:
        return True
    return isinstance(
        error, exc.OperationalError | exc.InterfaceError | exc.ProgrammingError | exc.TimeoutError | OSError
    )


@dataclass(slots=True)
class Counts:
    written: int = 0
    spooled: int = 0
    replayed: int = 0
    duplicates: int = 0
    failed: int = 0
    database_available: bool = True


class DeadLetter:
    """Records the database refused for good, kept as JSON lines for an operator (never dropped)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / f"rejected-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
        self._lock = threading.Lock()

    def add(self, rec: RequestRecord, error: BaseException) -> None:
        line = json.dumps({"error": str(error).splitlines()[0], "record": rec.to_dict()}) + "\n"
        with self._lock, self.path.open("a") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())


class BatchSink:
    """Writes batches, falls back to the spool, replays it; keeps the counts."""

    def __init__(self, engine: Engine, spool: Spool, dead_letter: DeadLetter, on_durable: DurableHook | None):
        self.engine = engine
        self.counts = Counts()
        self._spool = spool
        self._dead_letter = dead_letter
        self._on_durable = on_durable
        self._lock = threading.Lock()
        self._replay_lock = threading.Lock()

    def write(
        self,
        batch: Sequence[RequestRecord],
        batch_id: str,
        *,
        origin: str,
        raise_permanent: bool = False,
        process: WriterProcess | None = None,
    ) -> BatchOutcome | None:
        """Commit one batch (by ``process`` where given); None when the database is unreachable (the caller spools).

        A batch the database refuses is written record by record here, in this process.
        """
        try:
            outcome = process.write(batch, batch_id, origin) if process else self._commit(batch, batch_id, origin)
        except Exception as error:
            if is_transient(error):
                self._unavailable(error)
                return None
            if raise_permanent:
                raise
            log.error("database refused a batch of %d (%s); writing records one by one", len(batch), describe(error))
            return self._isolate(batch, batch_id, origin)
        with self._lock:
            self.counts.written += outcome.stored
            self.counts.duplicates += outcome.duplicates
        self._available()
        self._durable(outcome.new, "written")
        return outcome

    def spool(self, batch: Sequence[RequestRecord], batch_id: str) -> None:
        self._spool.append(batch_id, batch)
        with self._lock:
            self.counts.spooled += len(batch)
        self._durable(batch, "spooled")

    def replay(self, spool: Spool, group_size: int = 1000) -> bool:
        """Replay every sealed segment in order; False if the database went away again.

        Consecutive spool lines are committed together, up to ``group_size`` records per
        transaction: lines spooled one record at a time (full queue) would otherwise replay at one
        transaction per record.
        """
        with self._replay_lock:
            for segment in spool.seal():
                group: list[SpooledBatch] = []
                size = 0
                for spooled in spool.read(segment):
                    group.append(spooled)
                    size += len(spooled.records)
                    if size >= group_size:
                        if not self._replay_group(group):
                            return False
                        group, size = [], 0
                if group and not self._replay_group(group):
                    return False
                spool.discard(segment)
                # Per segment: an outage's end is the one line at INFO (_available), however long the spool.
                log.debug("replayed spool segment %s", segment.name)
            return True

    def _replay_group(self, group: list[SpooledBatch]) -> bool:
        try:
            with self.engine.begin() as conn:
                outcomes = write_batches(conn, [(b.batch_id, b.records) for b in group], "spool")
        except Exception as error:
            if is_transient(error):
                self._unavailable(error)
                return False
            log.error("database refused spooled batches (%s); writing records one by one", describe(error))
            return all(self._isolate(b.records, b.batch_id, "spool") is not None for b in group)
        with self._lock:
            self.counts.replayed += sum(o.stored for o in outcomes)
            self.counts.duplicates += sum(o.duplicates for o in outcomes)
        self._available()
        for outcome in outcomes:
            self._durable(outcome.new, "replayed")
        return True

    def dispose(self) -> None:
        self.engine.dispose()

    def _commit(self, batch: Sequence[RequestRecord], batch_id: str, origin: str) -> BatchOutcome:
        with self.engine.begin() as conn:
            return write_batch(conn, batch, batch_id, origin)

    def _isolate(self, batch: Sequence[RequestRecord], batch_id: str, origin: str) -> BatchOutcome | None:
        duplicates = 0
        new: list[RequestRecord] = []
        for index, rec in enumerate(batch):
            try:
                outcome = self._commit([rec], f"{batch_id}.{index}", origin)
            except Exception as error:
                if is_transient(error):
                    # Lost the database halfway: the whole batch goes to the spool; the records
                    # already committed are skipped there as duplicates by request_id.
                    self._unavailable(error)
                    return None
                log.error("database refused a record (%s); it is kept in %s", describe(error), self._dead_letter.path)
                self._dead_letter.add(rec, error)
                with self._lock:
                    self.counts.failed += 1
                continue
            new += outcome.new
            duplicates += outcome.duplicates
        with self._lock:
            self.counts.written += len(new)
            self.counts.duplicates += duplicates
        return BatchOutcome(applied=True, duplicates=duplicates, new=tuple(new))

    def _unavailable(self, error: BaseException) -> None:
        self.mark_unavailable(str(error).splitlines()[0])

    def mark_unavailable(self, reason: str) -> None:
        """The database is away (refusing, or hung: the recorder's watchdog says so); logged once per outage."""
        with self._lock:
            was_available = self.counts.database_available
            self.counts.database_available = False
        if was_available:
            log.warning("database unreachable, spooling: %s", reason)

    def _available(self) -> None:
        """The database took a write: an outage, if there was one, is over (logged once, as its start was)."""
        with self._lock:
            was_available = self.counts.database_available
            self.counts.database_available = True
        if not was_available:
            log.warning("database reachable again: writing, and replaying what was spooled")

    def _durable(self, batch: Sequence[RequestRecord], where: str) -> None:
        if self._on_durable is None or not batch:
            return
        try:
            # In slices, the interpreter lock let go between them: a whole batch's counters ran for a couple of
            # milliseconds of Python, which the proxy's event loop waited through (the lock switches every 5 ms).
            for start in range(0, len(batch), HOOK_SLICE):
                self._on_durable(batch[start : start + HOOK_SLICE], where)
                time.sleep(0)
        except Exception as error:
            log.error("on_durable hook failed\n%s", traceback_text(error))
