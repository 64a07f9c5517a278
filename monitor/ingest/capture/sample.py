"""The prompt sample's file (:mod:`monitor.ingest.capture`): its schema, the reservoir, retention, purge and reads.

A prompt enters as one JSON line (:func:`sample_line`, what ``draftwatch evaluate`` reads back), kept
by Algorithm R per workload with the count of requests considered stored beside it, so that the
sample stays uniform across restarts and processes sharing the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from decoder.evaluation import SAMPLING_RANGES, SampleRow

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
