"""The sidecar's scheduler in a Python process of its own.

Why: a scheduler tick is Python from end to end (the lease's renewal, a delivery pass, a scrape, a
drift run's statistics). On a thread of the sidecar it takes that time from the proxy's event loop in
turns of the interpreter lock, so a request answered during a tick waits for it: on a 2-core machine
those waits made most of the proxy's added p99. In a child process the proxy pays nothing for them.

``draftwatch serve`` starts the child with its own interpreter (``python -m
monitor.commands.scheduler_process FD``) and one pipe, and sends it the resolved settings and the log
level (never on its command line, where ``ps`` would show a password); the child runs
:class:`monitor.scheduler.service.SchedulerService` until the pipe says ``None`` or ends (the sidecar
stopped or died). It ignores SIGINT and SIGTERM, so that a signal sent to the whole process group does
not cut a tick short: the sidecar's own shutdown decides when the scheduler stops, after its last tick.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Final

from monitor.config import Settings

# A tick in progress ends before the child does: a drift run on a large window takes seconds. Past this
# the child is killed; the run it left is abandoned by the next leader (monitor.scheduler.jobs).
STOP_TIMEOUT_S: Final = 30.0

log = logging.getLogger(__name__)


class SchedulerProcess:
    """A child process running the scheduler with ``settings``; started and stopped by one thread."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._child: subprocess.Popen[bytes] | None = None
        self._to_child: Connection | None = None

    def start(self) -> SchedulerProcess:
        """Start the child; its scheduler waits for the database and the schema by itself."""
        read_end, write_end = os.pipe()
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-m", __name__, str(read_end)], pass_fds=(read_end,), stdin=subprocess.DEVNULL
            )
        finally:
            os.close(read_end)
        self._to_child = Connection(write_end, readable=False)
        self._to_child.send((self._settings, logging.getLogger().level))
        return self

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Ask the child to stop after its current tick; kill it past ``timeout``."""
        child, self._child = self._child, None
        if self._to_child is not None:
            with contextlib.suppress(OSError):  # the child has ended already
                self._to_child.send(None)
            self._to_child.close()
            self._to_child = None
        if child is None:
            return
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("the scheduler process had not stopped after %g s; killed", timeout)
            child.kill()
            child.wait()


def main(argv: Sequence[str]) -> None:
    """The child: ``python -m monitor.commands.scheduler_process FD``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    orders = Connection(int(argv[0]), writable=False)
    settings, level = orders.recv()
    # Imported here: monitor.commands.main imports serve, which imports this module for SchedulerProcess.
    from monitor.commands.main import configure_logging
    from monitor.scheduler.service import SchedulerService

    configure_logging(logging.getLevelName(level))
    service = SchedulerService(settings).start()
    try:
        with contextlib.suppress(EOFError, OSError):  # the pipe's end: the sidecar is gone
            while orders.recv() is not None:
                pass
    finally:
        service.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
