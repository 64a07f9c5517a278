"""The serving process's side of the prompt sample (:mod:`monitor.ingest.capture`): the gate and the writer.

The gate is one random draw on the request's thread; what passes goes onto a bounded queue (full:
dropped and counted) that one writer thread drains into the file (:class:`PromptSample`), pruning
it every minute, so that capture never fails or slows a request.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from decoder.evaluation import SampleRow
from monitor.ingest.capture.sample import PromptSample, sample_line
from monitor.ingest.settings import CaptureSettings
from monitor.log_safe import describe

log = logging.getLogger(__name__)

QUEUE_SIZE: Final = 1000  # prompts waiting for the writer; past it a considered prompt is dropped and counted
BATCH_SIZE: Final = 200  # prompts per write transaction
PRUNE_EVERY_S: Final = 60.0


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
