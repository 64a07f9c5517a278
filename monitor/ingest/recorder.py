"""The recorder: the decoder's sink, writing records to the database without slowing the request path.

``record(rec)`` validates and enqueues (a bounded queue; a few microseconds on the caller's thread). A
background thread takes batches off the queue and writes each in one transaction (see
:mod:`monitor.store.writes.writer`), through a process of its own (:mod:`monitor.ingest.writer_process`)
unless ``writer_process`` is off. When the database is unreachable a batch is appended to the spool
(:mod:`monitor.ingest.spool`) instead, and the spool is replayed in order, exactly once, when the database
is back; segments left by a crashed process are replayed on the next start. Nothing is dropped
silently: a full queue follows an explicit policy, and a record the database refuses for good (it
should never happen after validation) is written to a ``rejected-*.jsonl`` file beside the spool.

A database can hang rather than refuse (a frozen server accepts and never answers; no socket
timeout sees that). Each writer makes its database calls on a thread of its own and waits at most
``write_timeout_s`` for one: past that the database counts as hung, and batches go to the spool
until the hung call returns (its batch then commits, or spools under its own id, so that replay
never doubles it). ``record_nowait(rec)`` is the path of a caller that must never wait (the
proxy, on its event loop): a full queue hands the record to a spill thread that spools it, and
when that hand-off is full as well the record is dropped and counted (``dropped``).

A record in the queue dies with the process (a kill -9 loses about the last ``flush_interval_s`` of
them). ``record_durable(rec)`` is for a caller that must not answer before its record would survive
that (the proxy under ``recorder.spool_before_reply``): the spill thread appends it to the spool,
fsync'd together with whatever else waits, and a future says when; the writer replays the spool
within a flush interval, by the same path (and the same batch ids, so never twice) as after an outage.

>>> import tempfile; from pathlib import Path; from datetime import datetime, UTC
>>> from decoder.record import RequestRecord
>>> from monitor.store.engine import create_engine
>>> from monitor.store.migrate import upgrade
>>> from monitor.ingest.settings import RecorderSettings
>>> tmp = Path(tempfile.mkdtemp())
>>> engine = create_engine(f"sqlite:///{tmp / 'dw.db'}"); _ = upgrade(engine)
>>> t = datetime(2026, 1, 1, tzinfo=UTC)
>>> with Recorder(engine, RecorderSettings(spool_dir=tmp / "spool")) as recorder:
...     recorder.record(RequestRecord("r1", t, t, "chat", "m", "none", mode="plain", source="api"))
...     recorder.record(RequestRecord("r1", t, t, "chat", "m", "none", mode="plain", source="api"))
>>> recorder.stats().written, recorder.stats().duplicates
(1, 1)
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, NamedTuple, TypeVar

from sqlalchemy.engine import Engine

from decoder.record import RecordError, RequestRecord
from monitor.ingest.batches import BatchSink, DeadLetter, DurableHook
from monitor.ingest.settings import RecorderSettings
from monitor.ingest.spool import Spool
from monitor.ingest.writer_process import RemoteWriteError, WriterProcess
from monitor.log_safe import traceback_text
from monitor.store.engine import sqlite_path
from monitor.store.writes.rows import validate

log = logging.getLogger(__name__)

T = TypeVar("T")
# At most one warning about dropped records per this many seconds (a full hand-off drops many).
DROP_LOG_EVERY_S: Final = 10.0


class RecorderFullError(RuntimeError):
    """The queue is full and the policy is ``raise``."""


class RecorderClosedError(RuntimeError):
    """``record`` was called after :meth:`Recorder.close`."""


@dataclass(frozen=True, slots=True)
class RecorderStats:
    """The recorder's own figures (cumulative since start, except ``queued`` and ``spool_pending``)."""

    queued: int
    written: int
    spooled: int
    replayed: int
    duplicates: int
    rejected: int
    failed: int
    spool_pending: bool
    database_available: bool
    # record_nowait() with the queue and the spill hand-off both full: not stored anywhere.
    dropped: int = 0
    # A database call has run past write_timeout_s: batches go to the spool until it returns.
    database_hung: bool = False


class StoreResult(NamedTuple):
    """Outcome of :meth:`Recorder.store_batch`: every record is in exactly one of the three counts."""

    stored: int
    duplicates: int
    spooled: int


class Recorder:
    """Batched, spooled, idempotent recording of :class:`RequestRecord` into the database."""

    def __init__(self, engine: Engine, settings: RecorderSettings, *, on_durable: DurableHook | None = None) -> None:
        self.engine = engine
        self.settings = settings
        # The queue: a deque bounded by record() itself. One plain lock guards the length test and the
        # append (the caller's side: two C calls, where queue.Queue runs a Condition in Python and
        # wakes the writer on every put) and the batches the writers take. Its two conditions: _work
        # wakes a writer (only when one is idle or a batch is full), _progress tells flush() and a
        # caller blocked on a full queue that records left the deque or were written.
        self._pending: deque[RequestRecord] = deque()
        self._maxsize = settings.queue_size
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._progress = threading.Condition(self._lock)
        self._idle_writers = 0
        self._in_flight = 0  # taken off the deque by a writer, not yet written or spooled
        self._expected = 0  # announced by expect(), not yet handed over: made after the reply they belong to
        self._spool = Spool(settings.spool_dir)
        self._sink = BatchSink(engine, self._spool, DeadLetter(settings.spool_dir), on_durable)
        self._stop = threading.Event()
        self._closed = False
        self._rejected = 0
        self._count_lock = threading.Lock()
        self._retry_at = 0.0
        self._threads: list[threading.Thread] = []
        # record_nowait()'s hand-off when the queue is full, and record_durable()'s with the future it
        # waits on, spooled by the spill thread.
        self._spill: deque[tuple[RequestRecord, Future[bool] | None]] = deque()
        self._spill_ready = threading.Condition(self._lock)
        self._spilling = 0  # taken by the spill thread, not yet spooled
        self._dropped = 0
        self._drop_logged_at = -DROP_LOG_EVERY_S
        self._hung = 0  # database calls past write_timeout_s, still running

    # -- the caller's side ---------------------------------------------------------------------

    def record(self, rec: RequestRecord) -> None:
        """Queue one record; raises :class:`RecordError` (naming the field) for an invalid one."""
        self._validate(rec)
        with self._lock:  # _closed is read under the lock close() sets it under: no record after the drain
            if self._closed:
                raise RecorderClosedError("the recorder is closed")
            if len(self._pending) < self._maxsize:
                self._append(rec)
                return
        self._on_full(rec)

    __call__ = record

    def record_nowait(self, rec: RequestRecord) -> bool:
        """Queue one record and never wait, whatever the database does; False when it was dropped.

        A full queue hands the record to the spill thread, which appends it to the spool; a full
        hand-off (``queue_size`` records more) or a closed recorder drops it, counted in ``dropped``.
        Raises :class:`RecordError` (naming the field) for an invalid record.
        """
        self._validate(rec)
        with self._lock:
            if not self._closed:
                if len(self._pending) < self._maxsize:
                    self._append(rec)
                    return True
                if len(self._spill) < self._maxsize:
                    self._spill.append((rec, None))
                    self._spill_ready.notify()
                    return True
        self._drop(1)
        return False

    def record_durable(self, rec: RequestRecord) -> Future[bool]:
        """Have one record appended to the spool and fsync'd; the future is True once it is, and never raises.

        Concurrent records share one spool line and one fsync. The hand-off is not bounded: each
        caller waits for its own record, so it holds at most one record per request in flight. False
        when the recorder is closed (dropped, counted) or the spool could not be written (the record
        then goes through the queue, as ``record_nowait`` would). Raises :class:`RecordError` (naming
        the field) for an invalid record.
        """
        self._validate(rec)
        kept: Future[bool] = Future()
        with self._lock:
            if not self._closed:
                self._spill.append((rec, kept))
                self._spill_ready.notify()
                return kept
        self._drop(1)
        kept.set_result(False)
        return kept

    def _drop(self, count: int) -> None:
        with self._lock:
            self._dropped += count
            dropped, now = self._dropped, time.monotonic()
            warn = now - self._drop_logged_at >= DROP_LOG_EVERY_S
            if warn:
                self._drop_logged_at = now
        if warn:
            log.warning(
                "recorder queue and spill hand-off full (or recorder closed): %d record(s) dropped so far", dropped
            )

    def _validate(self, rec: RequestRecord) -> None:
        try:
            validate(rec)
        except RecordError:
            with self._count_lock:
                self._rejected += 1
            raise

    def _append(self, rec: RequestRecord) -> None:
        # With the lock held. A writer waits for the first record of a batch, and for a full one.
        pending = self._pending
        pending.append(rec)
        if self._idle_writers or len(pending) == self.settings.batch_size:
            self._work.notify_all()

    def _on_full(self, rec: RequestRecord) -> None:
        if self.settings.full_queue_policy == "raise":
            raise RecorderFullError(f"recorder queue is full ({self._maxsize} records)")
        if self.settings.full_queue_policy == "block_then_spool":
            deadline = time.monotonic() + self.settings.block_timeout_s
            with self._lock:
                while len(self._pending) >= self._maxsize:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._progress.wait(remaining)
                else:
                    self._append(rec)
                    return
        log.warning("recorder queue full: spooling on the caller's thread")
        self._sink.spool([rec], new_batch_id())

    def store_batch(self, records: Iterable[RequestRecord]) -> StoreResult:
        """Validate and write ``records`` now, in one transaction; spool them if the database is away.

        Returns only once the records are committed or fsync'd to the spool. Raises
        :class:`RecordError` for the first invalid record, before anything is stored.
        """
        batch = list(records)
        for index, rec in enumerate(batch):
            try:
                validate(rec)
            except RecordError as error:
                with self._count_lock:
                    self._rejected += 1
                raise RecordError(error.field, f"record {index}: {error.args[0]}") from None
        if not batch:
            return StoreResult(0, 0, 0)
        batch_id = new_batch_id()
        # A hung database would hold the caller as long as it hangs: spool at once meanwhile.
        outcome = None if self._hung else self._sink.write(batch, batch_id, origin="sync", raise_permanent=True)
        if outcome is None:
            self._sink.spool(batch, batch_id)
            return StoreResult(0, 0, len(batch))
        return StoreResult(outcome.stored, outcome.duplicates, 0)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> Recorder:
        """Claim spool segments left by dead processes and start the writer thread (which replays them)."""
        if self._threads:
            return self
        claimed = self._spool.claim_orphans()
        if claimed:
            log.info("recovering %d spool segment(s)", claimed)
        # More than one writer overlaps one batch's Python work with another's database round trip
        # (worth it on PostgreSQL; SQLite serialises writers anyway).
        for number in range(self.settings.writer_threads):
            thread = threading.Thread(
                target=self._run, args=(number,), name=f"draftwatch-recorder-{number}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        spill = threading.Thread(target=self._run_spill, name="draftwatch-recorder-spill", daemon=True)
        spill.start()
        self._threads.append(spill)
        return self

    def expect(self) -> None:
        """Announce a record on its way (the proxy makes an answer's record once the answer has gone): until
        :meth:`arrived`, :meth:`flush` waits for it as for a queued one."""
        with self._lock:
            self._expected += 1

    def arrived(self) -> None:
        """An announced record was handed over, or will not be (refused, or its making failed)."""
        with self._lock:
            self._expected -= 1
            self._progress.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued (or announced) record is committed or spooled; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._pending or self._in_flight or self._spill or self._spilling or self._expected:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._progress.wait(remaining)
        return True

    def wait_replayed(self, timeout: float) -> bool:
        """Wait until the spool is empty (the database came back and everything was replayed)."""
        deadline = time.monotonic() + timeout
        while self._spool.has_pending():
            if time.monotonic() >= deadline:
                return False
            self._retry_at = 0.0
            time.sleep(0.02)
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Stop taking records, drain the queue (to the database or the spool) and stop the thread."""
        with self._lock:
            self._closed = True
            self._stop.set()
            self._work.notify_all()  # a writer waiting for records or for a fuller batch drains now
            self._spill_ready.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.error(
                    "recorder did not drain within %.1f s; %d record(s) still queued", timeout, len(self._pending)
                )
                return
        # One last replay, so that a clean shutdown with the database up leaves no spool behind
        # (not while it hangs: the next start replays).
        if not self._hung and self._spool.has_pending() and time.monotonic() >= self._retry_at:
            self._sink.replay(self._spool, self.settings.batch_size)
        self._spool.close()
        self._sink.dispose()

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def stats(self) -> RecorderStats:
        """The figures as they stand; never waits (``/healthz`` reads them on the proxy's event loop)."""
        counts = self._sink.counts
        return RecorderStats(
            queued=len(self._pending),
            written=counts.written,
            spooled=counts.spooled,
            replayed=counts.replayed,
            duplicates=counts.duplicates,
            rejected=self._rejected,
            failed=counts.failed,
            spool_pending=self._spool.has_pending(),
            database_available=counts.database_available and not self._hung,
            dropped=self._dropped,
            database_hung=bool(self._hung),
        )

    # -- the writer thread ---------------------------------------------------------------------

    def _run(self, number: int) -> None:
        process = self._start_process()
        database = _DatabaseThread(f"draftwatch-recorder-db-{number}")
        try:
            while True:
                batch = self._take_batch()
                owned = True  # False once a hung write holds the batch: it settles it when it returns
                try:
                    self._maybe_replay(database)
                    if batch:
                        owned = self._write(batch, database, process)
                except Exception as error:  # the thread must survive anything; the batch is not lost
                    log.error(
                        "recorder writer failed on a batch of %d; spooling it\n%s", len(batch), traceback_text(error)
                    )
                    if batch:
                        self._sink.spool(batch, new_batch_id())
                finally:
                    if batch and owned:
                        self._settled(len(batch))
                if self._stop.is_set() and not self._pending:
                    break
        finally:
            stopped = database.submit(process.stop) if process is not None else None  # after a hung write
            database.stop()
            if stopped is not None:
                with contextlib.suppress(TimeoutError):  # a hung write's child ends when the write returns
                    stopped.result(self.settings.write_timeout_s)

    def _start_process(self) -> WriterProcess | None:
        url = self.engine.url
        if not self.settings.writer_process or (url.get_backend_name() == "sqlite" and sqlite_path(url) is None):
            return None
        process = WriterProcess(url)
        try:
            process.start()
        except (RemoteWriteError, OSError) as error:
            log.error("the recorder's writer process did not start (%s): writing from this process", error)
            return None
        return process

    def _settled(self, count: int) -> None:
        with self._lock:
            self._in_flight -= count
            self._progress.notify_all()

    def _run_spill(self) -> None:
        spill = self._spill
        while True:
            with self._lock:
                while not spill and not self._stop.is_set():
                    self._spill_ready.wait()
                if not spill:
                    return
                # Everything handed off so far, in one spool line and one fsync: while a slow disk syncs one
                # line the hand-off fills, and draining it a batch_size at a time dropped records the next
                # fsync would have held (the hand-off is bounded by queue_size; record_durable's by the
                # requests in flight).
                batch = list(spill)
                spill.clear()
                self._spilling += len(batch)
            # Running from here on: a caller that stops waiting cannot cancel its record out of the batch.
            waiters = [waiter for _, waiter in batch if waiter is not None and waiter.set_running_or_notify_cancel()]
            durable = True
            try:
                self._sink.spool([rec for rec, _ in batch], new_batch_id())
            except Exception as error:  # the spool's disk failed: a waited-for record goes the queue's way
                durable = False
                waited = [rec for rec, waiter in batch if waiter is not None]
                with self._lock:
                    for rec in waited:
                        self._append(rec)
                if len(waited) < len(batch):
                    self._drop(len(batch) - len(waited))
                log.error(
                    "spooling %d handed-off record(s) failed; %d dropped, %d queued instead\n%s",
                    len(batch), len(batch) - len(waited), len(waited), traceback_text(error),
                )  # fmt: skip
            finally:
                with self._lock:
                    self._spilling -= len(batch)
                    self._progress.notify_all()
                for waiter in waiters:
                    waiter.set_result(durable)

    def _take_batch(self) -> list[RequestRecord]:
        interval, size, pending = self.settings.flush_interval_s, self.settings.batch_size, self._pending
        with self._lock:
            if not pending and not self._stop.is_set():
                self._idle_writers += 1  # record() wakes an idle writer with the first record
                try:
                    self._work.wait(interval)
                finally:
                    self._idle_writers -= 1
                if not pending:
                    return []
            # A young batch waits up to flush_interval_s for company; record() wakes it when it is full.
            deadline = time.monotonic() + interval
            while len(pending) < size and not self._stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._work.wait(remaining)
            if len(pending) <= size:
                batch = list(pending)
                pending.clear()
            else:
                take = pending.popleft
                batch = [take() for _ in range(size)]
            self._in_flight += len(batch)
            self._progress.notify_all()  # room for a caller that waits on a full queue
        return batch

    def _write(self, batch: list[RequestRecord], database: _DatabaseThread, process: WriterProcess | None) -> bool:
        """Commit or spool ``batch``; False when the write hung, and settles the batch when it returns."""
        # Straight to the spool while the database was just found away or hangs (no connect attempt
        # per batch); otherwise try it. A spool backlog does not hold live batches back: replay runs
        # before every batch, and the spool's own order is what replay keeps.
        if self._hung or time.monotonic() < self._retry_at:
            self._sink.spool(batch, new_batch_id())
            return True
        job = database.submit(functools.partial(self._commit, batch, new_batch_id(), process))
        try:
            job.result(self.settings.write_timeout_s)
        except TimeoutError:
            self._hang(job, functools.partial(self._hung_batch_returned, batch))
            return False
        return True

    def _commit(self, batch: list[RequestRecord], batch_id: str, process: WriterProcess | None) -> None:
        # The spooled batch keeps its id: if the failed commit did land after all, replay skips it.
        if self._sink.write(batch, batch_id, origin="live", process=process) is None:
            self._retry_at = time.monotonic() + self.settings.retry_interval_s
            self._sink.spool(batch, batch_id)

    def _maybe_replay(self, database: _DatabaseThread) -> None:
        if self._hung or time.monotonic() < self._retry_at:
            return
        self._spool.claim_orphans()
        if not self._spool.has_pending():
            return
        progress = self._replay_progress()
        job = database.submit(functools.partial(self._sink.replay, self._spool, self.settings.batch_size))
        # A long backlog replays for longer than write_timeout_s: hung only when no group commits meanwhile.
        while True:
            try:
                replayed = job.result(self.settings.write_timeout_s)
                break
            except TimeoutError:
                if (now := self._replay_progress()) == progress:
                    self._hang(job, self._hung_replay_returned)
                    return
                progress = now
        if not replayed:
            self._retry_at = time.monotonic() + self.settings.retry_interval_s

    def _replay_progress(self) -> int:
        counts = self._sink.counts
        return counts.replayed + counts.duplicates + counts.failed

    def _hang(self, job: Future[Any], returned: Callable[[Future[Any]], None]) -> None:
        """``job`` runs past write_timeout_s: the database hangs until it returns; ``returned`` settles it then."""
        started = time.monotonic() - self.settings.write_timeout_s
        with self._lock:
            self._hung += 1
        self._sink.mark_unavailable(f"a database call has not returned within {self.settings.write_timeout_s:g} s")

        def done(finished: Future[Any]) -> None:
            # Not hung any more before the batch is settled: flush() returning means the database answers.
            with self._lock:
                self._hung -= 1
            log.warning("the hung database call returned after %.1f s", time.monotonic() - started)
            returned(finished)

        job.add_done_callback(done)  # at once, on this thread, if it returned meanwhile

    def _hung_batch_returned(self, batch: list[RequestRecord], job: Future[Any]) -> None:
        try:
            error = job.exception()
            if error is not None:
                log.error("recorder writer failed on a batch of %d; spooling it\n%s", len(batch), traceback_text(error))
                self._sink.spool(batch, new_batch_id())
        finally:
            self._settled(len(batch))

    def _hung_replay_returned(self, job: Future[Any]) -> None:
        error = job.exception()
        if error is not None:
            log.error("spool replay failed\n%s", traceback_text(error))
        if error is not None or not job.result():
            self._retry_at = time.monotonic() + self.settings.retry_interval_s


class _DatabaseThread:
    """One writer's database calls, on a daemon thread of their own: a hung call holds it, not the writer."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, call: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self._jobs.put((call, future))
        return future

    def stop(self) -> None:
        """End the thread after the call it runs, if any (a hung one returns when the database does)."""
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            call, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call()
            except BaseException as error:  # handed to the waiting writer, which logs and spools
                future.set_exception(error)
            else:
                future.set_result(result)


def new_batch_id() -> str:
    return uuid.uuid4().hex
