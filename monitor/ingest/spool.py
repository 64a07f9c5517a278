"""The recorder's spool: append-only, fsync'd JSON-lines segment files for when the database is away.

Each line is one batch: ``<crc32 as 8 hex digits> <json>\\n`` with ``{"batch_id": ..., "records":
[...]}``. A line counts as spooled only once ``fsync`` returned; a torn last line (the process died
mid-write) fails its checksum and is ignored, since nobody was told it was spooled.

Segments are named ``spool-<time_ns>-<pid>-<random>.jsonl`` so that sorting by name is sorting by
age. A process holds an exclusive ``flock`` on every segment it writes or replays, until it has
replayed and deleted it; a segment nobody holds belonged to a process that died, and the next
recorder to look claims it (:meth:`Spool.claim_orphans`). Replay is exactly-once because each batch
id is written to the database in the batch's own transaction (see :mod:`monitor.store.writes.writer`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
import uuid
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

from decoder.record import RecordError, RequestRecord

log = logging.getLogger(__name__)

PREFIX: Final = "spool-"
SUFFIX: Final = ".jsonl"


@dataclass(frozen=True, slots=True)
class SpooledBatch:
    batch_id: str
    records: list[RequestRecord]


@dataclass(slots=True)
class Segment:
    """A spool file this process holds the lock on."""

    path: Path
    handle: IO[bytes]
    bad_lines: int = field(default=0)

    @property
    def name(self) -> str:
        return self.path.name


def encode_line(batch_id: str, records: Sequence[RequestRecord]) -> bytes:
    """One spool line, checksum first.

    >>> encode_line("b1", [])
    b'd8618dff {"batch_id":"b1","records":[]}\\n'
    """
    payload = json.dumps(
        {"batch_id": batch_id, "records": [r.to_dict() for r in records]}, separators=(",", ":")
    ).encode()
    return b"%08x %s\n" % (zlib.crc32(payload), payload)


def decode_line(line: bytes) -> SpooledBatch | None:
    """The batch on a line, or None when the line is torn or corrupt."""
    if not line.endswith(b"\n") or len(line) < 10 or line[8:9] != b" ":
        return None
    payload = line[9:-1]
    try:
        if int(line[:8], 16) != zlib.crc32(payload):
            return None
        data = json.loads(payload)
        return SpooledBatch(data["batch_id"], [RequestRecord.from_dict(r) for r in data["records"]])
    except (ValueError, KeyError, TypeError, RecordError):
        return None


class Spool:
    """Append-only spool segments in one directory; safe to share the directory between processes."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._active: Segment | None = None
        self._sealed: list[Segment] = []
        # Whether any segment is held, republished under the lock after every change and read without
        # it: the lock is held across fsync, and a reader on the event loop (/healthz, /metrics) must
        # never wait for a disk.
        self._pending = False

    def append(self, batch_id: str, records: Sequence[RequestRecord]) -> None:
        """Append one batch and fsync it; when this returns, the batch survives a crash."""
        line = encode_line(batch_id, records)
        with self._lock:
            if self._active is None:
                self._active = self._create_segment()
                self._publish()
            handle = self._active.handle
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())

    def has_pending(self) -> bool:
        """Whether segments wait for replay; never waits (not on the lock an fsync holds)."""
        return self._pending

    def claim_orphans(self) -> int:
        """Take over segments no live process holds (their writer died); returns how many."""
        claimed = 0
        with self._lock:
            held = {s.name for s in self._sealed}
            if self._active is not None:
                held.add(self._active.name)
            for path in sorted(self.directory.glob(f"{PREFIX}*{SUFFIX}")):
                if path.name in held:
                    continue
                segment = _try_lock(path)
                if segment is not None:
                    log.info("claimed spool segment %s left by an earlier process", path.name)
                    self._sealed.append(segment)
                    claimed += 1
            self._sealed.sort(key=lambda s: s.name)
            self._publish()
        return claimed

    def seal(self) -> list[Segment]:
        """Close the active segment to new appends; returns every segment to replay, oldest first."""
        with self._lock:
            if self._active is not None:
                self._sealed.append(self._active)
                self._active = None
            self._sealed.sort(key=lambda s: s.name)
            return list(self._sealed)

    def read(self, segment: Segment) -> Iterator[SpooledBatch]:
        """The segment's batches in order; torn or corrupt lines are logged and skipped."""
        with segment.path.open("rb") as handle:
            for number, line in enumerate(handle, start=1):
                batch = decode_line(line)
                if batch is None:
                    segment.bad_lines += 1
                    torn = not line.endswith(b"\n")
                    log.log(
                        logging.WARNING if torn else logging.ERROR,
                        "spool %s line %d: %s, skipped",
                        segment.name,
                        number,
                        "torn write (never reported spooled)" if torn else "corrupt",
                    )
                    continue
                yield batch

    def discard(self, segment: Segment) -> None:
        """Delete a fully replayed segment; one with corrupt lines is kept as ``*.corrupt``."""
        with self._lock:
            if segment in self._sealed:
                self._sealed.remove(segment)
            self._publish()
        if segment.bad_lines and not _only_torn_tail(segment.path):
            target = segment.path.with_suffix(".corrupt")
            log.error("spool %s had corrupt lines; kept as %s for inspection", segment.name, target.name)
            segment.path.rename(target)
        else:
            segment.path.unlink(missing_ok=True)
        segment.handle.close()
        _fsync_dir(self.directory)

    def close(self) -> None:
        """Release the locks; segments left on disk are replayed by the next recorder."""
        with self._lock:
            segments = list(self._sealed)
            if self._active is not None:
                segments.append(self._active)
            self._active = None
            self._sealed = []
            self._publish()
        for segment in segments:
            segment.handle.close()

    def _publish(self) -> None:
        # With the lock held: one plain store, which a reader sees whole without the lock.
        self._pending = self._active is not None or bool(self._sealed)

    def _create_segment(self) -> Segment:
        name = f"{PREFIX}{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}{SUFFIX}"
        path = self.directory / name
        # Lock under a private name, then rename: another process scanning for orphans must never
        # see (and claim) a segment before its writer holds the lock.
        staging = self.directory / f".new-{name}"
        handle = staging.open("ab")
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        staging.rename(path)
        _fsync_dir(self.directory)  # the new name must survive a crash along with its contents
        return Segment(path, handle)


def _try_lock(path: Path) -> Segment | None:
    try:
        handle = path.open("ab")
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    if not path.exists():  # replayed and deleted by its owner between our open and our lock
        handle.close()
        return None
    return Segment(path, handle)


def _only_torn_tail(path: Path) -> bool:
    with path.open("rb") as handle:
        lines = handle.readlines()
    return all(decode_line(line) is not None for line in lines[:-1]) and bool(lines) and (not lines[-1].endswith(b"\n"))


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
