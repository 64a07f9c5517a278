"""The opt-in prompt sample (``capture.*``): real prompts per workload, kept for ``draftwatch evaluate``.

Prompts are otherwise never stored: a record carries only a hash of its prompt. With
``capture.share`` above 0 the sidecar keeps, per workload, a uniform sample of the prompts it sees
(proxied OpenAI-compatible requests, the embedded decoder's ``/v1/generate`` and
``/v1/chat/completions``), so that a candidate pairing can be tried on the traffic it would serve.

Sampling is two steps. A Bernoulli(``share``) gate on the request's own thread decides whether the
request is considered at all; then, in a writer thread, Algorithm R keeps it in its workload's
reservoir of ``max_per_workload`` slots: the n-th request considered fills slot n - 1 while there
is room, and afterwards replaces a uniformly chosen slot with probability cap / n. The count n is
kept per workload in the file, so that after a restart (and across processes sharing the file) the
kept prompts stay a uniform sample of all that were considered. Both random draws are seeded once
per process.

Where: a SQLite file of its own (``capture.path``, ``prompt-sample.db`` in the data directory),
never the records' database. So a backup, replica or export of the records never carries a
prompt, the sample has its own owner-only file mode and lifetime, deleting the file deletes every
prompt, and it works the same whether the records live in SQLite or PostgreSQL. The file is made
on the first kept prompt: with the default share of 0 it never exists. Deletion overwrites what it
deletes (SQLite's ``secure_delete``).

Retention: a prompt older than ``retention_days`` is deleted on every write, every minute while
the sidecar runs, and by each ``draftwatch capture`` command before it reads. The pruning belongs
to the process that holds the file, not to the scheduler's retention job: the scheduler's lease
elects one leader among replicas, and each replica keeps its own file in its own data directory.
What is left after pruning is still uniform over the newer prompts considered, each kept with the
same probability, only fewer; a purge restarts a workload's count.

Capture never fails or slows a request: the gate is one random draw, a prompt goes onto a bounded
queue (full: dropped and counted), and what goes wrong is counted and logged by the error's kind
only, never with a prompt (:mod:`monitor.log_safe`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from decoder.evaluation import SAMPLING_RANGES, SampleRow
from monitor.ingest.settings import CaptureSettings
from monitor.log_safe import describe

log = logging.getLogger(__name__)

QUEUE_SIZE: Final = 1000  # prompts waiting for the writer; past it a considered prompt is dropped and counted
BATCH_SIZE: Final = 200  # prompts per write transaction
PRUNE_EVERY_S: Final = 60.0
DAY_S: Final = 86_400.0
SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS workloads (
    workload TEXT PRIMARY KEY,
    seen INTEGER NOT NULL,
    since REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS prompts (
    workload TEXT NOT NULL,
    slot INTEGER NOT NULL,
    captured_at REAL NOT NULL,
    sample TEXT NOT NULL,
    PRIMARY KEY (workload, slot)
);
CREATE INDEX IF NOT EXISTS prompts_by_time ON prompts (captured_at);
"""


def sample_line(row: SampleRow) -> str | None:
    """``row`` as the JSON line ``read_sample`` reads, or None when it could not read it back.

    >>> sample_line(SampleRow("code", "Write a parser", temperature=0.7))
    '{"workload": "code", "prompt": "Write a parser", "temperature": 0.7, "top_p": 1.0}'
    >>> sample_line(SampleRow("code", "raw text", chat=False, max_new_tokens=64))
    '{"workload": "code", "prompt": "raw text", "chat": false, "temperature": 0.0, "top_p": 1.0, "max_new_tokens": 64}'
    >>> sample_line(SampleRow("code", "", temperature=0.7)) is None
    True
    """
    line: dict[str, Any] = {"workload": row.workload}
    if isinstance(row.prompt, str):
        if not row.prompt.strip():
            return None
        line["prompt"] = row.prompt
        if not row.chat:
            line["chat"] = False
    else:
        messages = list(row.prompt)
        if not messages:
            return None
        line["messages"] = [{"role": m["role"], "content": m["content"]} for m in messages]
    line |= {"temperature": row.temperature, "top_p": row.top_p}
    if row.max_new_tokens is not None:
        line["max_new_tokens"] = row.max_new_tokens
    # A request outside the ranges read_sample accepts is not captured: every exported line reads back.
    for key, (_, low, high) in SAMPLING_RANGES.items():
        if key in line and not low <= line[key] <= high:
            return None
    text = json.dumps(line, ensure_ascii=False)
    try:  # a lone surrogate ("\ud800" in a JSON body) parses, but no file can hold it as UTF-8
        text.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return text


@dataclass(frozen=True, slots=True)
class WorkloadSample:
    """One workload's part of the sample: prompts kept, requests considered, and since when."""

    workload: str
    kept: int
    seen: int
    oldest: datetime | None
    since: datetime


class PromptSample:
    """The sample's SQLite file: the reservoir, retention, purge and the reads of the commands."""

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        self._conn = connection
        self.path = path

    @classmethod
    def open(cls, path: Path) -> PromptSample:
        """Open the file, making it (owner-only) when it does not exist."""
        path.parent.mkdir(parents=True, exist_ok=True)
        # Made before SQLite first opens it: its -wal and -shm files take the database file's mode.
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
        conn = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        # A deleted or replaced prompt is overwritten in the file, not left in a free page.
        conn.execute("PRAGMA secure_delete=ON")
        conn.executescript(SCHEMA)
        return cls(conn, path)

    @classmethod
    def existing(cls, path: Path) -> PromptSample | None:
        """The file if it exists: a command that only reads or purges never makes one."""
        return cls.open(path) if path.exists() else None

    def close(self) -> None:
        self._conn.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        # IMMEDIATE: the count is read and written under the write lock, so that two processes
        # sharing the file do not both take the same n.
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def keep(self, items: Iterable[tuple[str, str, float]], cap: int, rng: random.Random) -> int:
        """Offer (workload, sample line, time) to its workload's reservoir (Algorithm R); returns how many it kept."""
        kept = 0
        with self._transaction() as conn:
            for workload, line, at in items:
                found = conn.execute("SELECT seen FROM workloads WHERE workload = ?", (workload,)).fetchone()
                n = (found[0] if found else 0) + 1
                if found:
                    conn.execute("UPDATE workloads SET seen = ? WHERE workload = ?", (n, workload))
                else:
                    conn.execute("INSERT INTO workloads (workload, seen, since) VALUES (?, 1, ?)", (workload, at))
                slot = n - 1 if n <= cap else rng.randrange(n)
                if slot < cap:
                    conn.execute(
                        "INSERT OR REPLACE INTO prompts (workload, slot, captured_at, sample) VALUES (?, ?, ?, ?)",
                        (workload, slot, at, line),
                    )
                    kept += 1
        return kept

    def fit(self, cap: int, rng: random.Random) -> None:
        """After ``max_per_workload`` was lowered: keep a uniform ``cap`` of each reservoir, in slots 0..cap-1.

        A uniform subset of a uniform sample is a uniform sample, so Algorithm R goes on from there.
        """
        with self._transaction() as conn:
            over = [w for (w,) in conn.execute("SELECT DISTINCT workload FROM prompts WHERE slot >= ?", (cap,))]
            for workload in over:
                rows = conn.execute(
                    "SELECT captured_at, sample FROM prompts WHERE workload = ? ORDER BY slot", (workload,)
                ).fetchall()
                conn.execute("DELETE FROM prompts WHERE workload = ?", (workload,))
                chosen = rng.sample(rows, min(cap, len(rows)))
                conn.executemany(
                    "INSERT INTO prompts (workload, slot, captured_at, sample) VALUES (?, ?, ?, ?)",
                    [(workload, slot, at, line) for slot, (at, line) in enumerate(chosen)],
                )

    def prune(self, retention_days: int, now: float) -> int:
        """Delete the prompts older than ``retention_days``; returns how many."""
        with self._transaction() as conn:
            cursor = conn.execute("DELETE FROM prompts WHERE captured_at < ?", (now - retention_days * DAY_S,))
        return int(cursor.rowcount or 0)

    def purge(self, workload: str | None = None) -> int:
        """Delete the prompts (of ``workload``, else all) and restart their counts; returns how many prompts."""
        where, args = ("WHERE workload = ?", (workload,)) if workload is not None else ("", ())
        with self._transaction() as conn:
            cursor = conn.execute(f"DELETE FROM prompts {where}", args)
            conn.execute(f"DELETE FROM workloads {where}", args)
        # The write-ahead log holds copies of the deleted pages until a checkpoint writes it back.
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return int(cursor.rowcount or 0)

    def status(self) -> list[WorkloadSample]:
        """Per workload, by name: prompts kept, requests considered, the oldest kept prompt, the count's start."""
        rows = self._conn.execute(
            "SELECT w.workload, COUNT(p.slot), w.seen, MIN(p.captured_at), w.since FROM workloads w "
            "LEFT JOIN prompts p ON p.workload = w.workload GROUP BY w.workload ORDER BY w.workload"
        ).fetchall()
        return [WorkloadSample(w, kept, seen, _time(oldest), _time(since)) for w, kept, seen, oldest, since in rows]

    def lines(self, workload: str | None = None) -> list[str]:
        """The kept prompts as ``read_sample``'s JSON lines, per workload oldest first.

        ``draftwatch evaluate`` learns on the first half of a workload's lines and measures on the
        second: the newer half is what is measured.
        """
        where, args = ("WHERE workload = ?", (workload,)) if workload is not None else ("", ())
        query = f"SELECT sample FROM prompts {where} ORDER BY workload, captured_at, slot"
        return [line for (line,) in self._conn.execute(query, args)]


def _time(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


@dataclass(frozen=True, slots=True)
class CaptureStats:
    """Cumulative counts of one process's capture, for ``/metrics``."""

    considered: int  # passed the share gate
    kept: int  # entered a reservoir (some of them replaced later)
    unusable: int  # no text prompt, or sampling settings read_sample refuses
    dropped: int  # the writer's queue was full
    failed: int  # an error while reading the request or writing the file


class PromptCapture:
    """The sidecar's side of the sample: the gate on the request's thread, a writer thread for the file."""

    def __init__(
        self, settings: CaptureSettings, *, seed: int | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        base = int.from_bytes(os.urandom(8), "big") if seed is None else seed
        self._gate = random.Random(f"{base}:gate")
        self._reservoir = random.Random(f"{base}:reservoir")
        self._clock = clock
        self._queue: queue.Queue[tuple[str, str, float] | None] = queue.Queue(QUEUE_SIZE)
        self._thread: threading.Thread | None = None
        self._sample: PromptSample | None = None
        # Each count has one writer: the request's thread or the writer thread, never both.
        self._counts = {"considered": 0, "kept": 0, "unusable": 0, "dropped": 0, "unreadable": 0, "unwritten": 0}
        self._last_prune = 0.0

    def offer(self, make: Callable[[], SampleRow | None]) -> None:
        """Consider one request: ``make`` builds its row (None: nothing usable) only past the gate; never raises."""
        if self._gate.random() >= self.settings.share:
            return
        self._counts["considered"] += 1
        try:
            row = make()
            line = sample_line(row) if row is not None else None
        except Exception as error:  # a request's capture must not fail the request
            self._counts["unreadable"] += 1
            log.warning("prompt sample: a request's prompt could not be read (%s)", describe(error))
            return
        if row is None or line is None:
            self._counts["unusable"] += 1
            return
        try:
            self._queue.put_nowait((row.workload, line, self._clock()))
        except queue.Full:
            self._counts["dropped"] += 1

    def stats(self) -> CaptureStats:
        counts = dict(self._counts)
        return CaptureStats(
            considered=counts["considered"],
            kept=counts["kept"],
            unusable=counts["unusable"],
            dropped=counts["dropped"],
            failed=counts["unreadable"] + counts["unwritten"],
        )

    def start(self) -> PromptCapture:
        self._thread = threading.Thread(target=self._run, name="draftwatch-capture", daemon=True)
        self._thread.start()
        return self

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued prompt is written (or failed); False when ``timeout_s`` passed first."""
        with self._queue.all_tasks_done:
            return self._queue.all_tasks_done.wait_for(lambda: self._queue.unfinished_tasks == 0, timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, stop the writer, close the file."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout_s)
            if self._thread.is_alive():  # mid-write (the file locked by a command): leave it its connection
                log.warning("prompt sample: the writer did not finish within %.0f s; %d prompts still queued",
                            timeout_s, self._queue.qsize())  # fmt: skip
                return
            self._thread = None
        if self._sample is not None:
            self._sample.close()
            self._sample = None

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=PRUNE_EVERY_S)
            except queue.Empty:
                self._write([])
                continue
            batch = [first]
            while first is not None and len(batch) < BATCH_SIZE:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            items = [item for item in batch if item is not None]
            try:
                self._write(items)
            finally:
                for _ in batch:
                    self._queue.task_done()
            if len(items) < len(batch):
                return

    def _write(self, items: Sequence[tuple[str, str, float]]) -> None:
        now = self._clock()
        try:
            # Nothing kept by this process yet: prune a file an earlier one left, but never make one.
            unopened = self._sample is None and not items
            if unopened and (now - self._last_prune < PRUNE_EVERY_S or not self.settings.path.exists()):
                return
            if self._sample is None:
                self._sample = PromptSample.open(self.settings.path)
                self._sample.fit(self.settings.max_per_workload, self._reservoir)
            if items:
                self._counts["kept"] += self._sample.keep(items, self.settings.max_per_workload, self._reservoir)
            if items or now - self._last_prune >= PRUNE_EVERY_S:
                self._sample.prune(self.settings.retention_days, now)
                self._last_prune = now
        except Exception as error:  # the sidecar goes on serving; the next write opens the file again
            self._counts["unwritten"] += len(items)
            log.warning("prompt sample: %d prompts not written to %s (%s)", len(items), self.settings.path,
                        describe(error))  # fmt: skip
            if self._sample is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._sample.close()
                self._sample = None
