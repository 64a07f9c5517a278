"""A recorder writer's database work in a Python process of its own.

Why: a batch's write is mostly Python (rows built, rollups summed, SQLAlchemy compiling): about
20 ms of interpreter time per 330 records. On the recorder's thread that time is taken from the
proxy's event loop in turns of the interpreter lock, so every request answered during a flush waits
for it. In a child process it costs the sidecar only the batch's pickling (about 1 ms per 330 records).

The child is started with the sidecar's interpreter (``python -m monitor.ingest.writer_process``) and
two pipes. It reads the database URL first (never on its command line, where ``ps`` would show a
password), then jobs: ``(batch_id, origin, pid, count)`` followed by the ``count`` records in slices of
:data:`SLICE`, each record as the tuple of its fields (:data:`FIELDS`), answered with
``("ok", applied, duplicates, indexes of the new records)`` or ``("error", transient, first line)``.
``None`` or the pipe's end stops it; it ignores SIGINT and SIGTERM, so that the sidecar's own shutdown
decides when its last batch is written. A child that dies takes only its batch in flight with it,
which the caller spools under the same batch id (never doubled on replay).
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Final

from sqlalchemy.engine import URL

from decoder.record import RequestRecord
from monitor.store.writes.writer import BatchOutcome

# A child's start is an interpreter and the store's imports: about half a second on an idle core.
START_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 5.0
# Records pickled per message. Pickling is one C call that holds the interpreter lock throughout: a batch
# in one piece held the proxy's event loop for a millisecond; between pieces the pipe's write lets it run.
SLICE: Final = 32
# A record travels as the tuple of its fields, read by one C call: pickled as itself, each record ran the
# dataclass's __getstate__ in Python, twice the time (6 against 3 us a record), all of it the proxy's.
FIELDS: Final = operator.attrgetter(*(field.name for field in dataclasses.fields(RequestRecord)))


class RemoteWriteError(RuntimeError):
    """The child could not write a batch: ``transient`` as the store's own errors are (spool, retry)."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


class WriterProcess:
    """One writer's batches, written by a child process; used by one thread at a time."""

    def __init__(self, url: URL) -> None:
        self._url = url.render_as_string(hide_password=False)
        self._child: subprocess.Popen[bytes] | None = None
        self._to_child: Connection | None = None
        self._from_child: Connection | None = None

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        return self._child.pid if self._child is not None and self._child.poll() is None else None

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start the child and wait until it is ready; raises :class:`RemoteWriteError` (transient) if it is not."""
        self.stop()
        to_child_read, to_child_write = os.pipe()
        from_child_read, from_child_write = os.pipe()
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-m", __name__, str(to_child_read), str(from_child_write)],
                pass_fds=(to_child_read, from_child_write),
                stdin=subprocess.DEVNULL,
            )
        finally:
            os.close(to_child_read)
            os.close(from_child_write)
        self._to_child = Connection(to_child_write, readable=False)
        self._from_child = Connection(from_child_read, writable=False)
        try:
            self._to_child.send(self._url)
            if not self._from_child.poll(timeout):
                raise RemoteWriteError(f"the writer process was not ready within {timeout:g} s", transient=True)
            self._from_child.recv()
        except (EOFError, OSError):
            self.stop()
            raise RemoteWriteError("the writer process ended at its start", transient=True) from None
        except RemoteWriteError:
            self.stop()
            raise

    def write(self, batch: Sequence[RequestRecord], batch_id: str, origin: str) -> BatchOutcome:
        """Commit ``batch`` in the child (started again if it died); raises :class:`RemoteWriteError`."""
        if self._child is None or self._child.poll() is not None:
            self.start()
        assert self._to_child is not None and self._from_child is not None
        try:
            send = self._to_child.send
            send((batch_id, origin, os.getpid(), len(batch)))
            for start in range(0, len(batch), SLICE):
                send(list(map(FIELDS, batch[start : start + SLICE])))
            reply = self._from_child.recv()
        except (EOFError, OSError):
            code = self._child.wait() if self._child is not None else None
            self.stop()
            raise RemoteWriteError(f"the writer process ended (exit status {code})", transient=True) from None
        if reply[0] == "error":
            raise RemoteWriteError(reply[2], transient=reply[1])
        _, applied, duplicates, new = reply
        return BatchOutcome(applied=applied, duplicates=duplicates, new=tuple(batch[index] for index in new))

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Ask the child to end after its current job; kill it past ``timeout``."""
        child, self._child = self._child, None
        if self._to_child is not None:
            with contextlib.suppress(OSError):  # the child has ended already
                self._to_child.send(None)
            self._to_child.close()
            self._to_child = None
        if self._from_child is not None:
            self._from_child.close()
            self._from_child = None
        if child is not None:
            try:
                child.wait(timeout)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _serve(jobs: Connection, replies: Connection) -> None:
    # Imported here: the sidecar imports this module for WriterProcess without the child's needs.
    from monitor.ingest.batches import is_transient
    from monitor.log_safe import describe
    from monitor.store.engine import create_engine
    from monitor.store.writes.writer import write_batches

    engine = create_engine(jobs.recv())
    replies.send("ready")
    try:
        while True:
            try:
                job = jobs.recv()
            except EOFError:
                return
            if job is None:
                return
            batch_id, origin, pid, count = job
            records: list[RequestRecord] = []
            while len(records) < count:
                records += [RequestRecord(*fields) for fields in jobs.recv()]
            try:
                with engine.begin() as conn:
                    (outcome,) = write_batches(conn, [(batch_id, records)], origin, pid=pid)
            except Exception as error:
                # As the sidecar's own writes say them: an outage's first line, a refusal's classes only.
                transient = is_transient(error)
                lines = str(error).splitlines()
                said = (lines[0] if lines else type(error).__name__) if transient else describe(error)
                replies.send(("error", transient, said))
                continue
            new = {id(rec) for rec in outcome.new}
            replies.send(
                ("ok", outcome.applied, outcome.duplicates, [i for i, rec in enumerate(records) if id(rec) in new])
            )
    finally:
        engine.dispose()


def main(argv: Sequence[str]) -> None:
    """The child: ``python -m monitor.ingest.writer_process JOBS_FD REPLIES_FD``."""
    # The sidecar's shutdown (or the pipe's end, when the sidecar died) ends this process, not a signal
    # sent to the whole process group.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    jobs, replies = Connection(int(argv[0]), writable=False), Connection(int(argv[1]), readable=False)
    _serve(jobs, replies)


if __name__ == "__main__":
    main(sys.argv[1:])
