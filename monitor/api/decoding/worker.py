"""The single decoder worker behind HTTP: a bounded queue, one thread, results streamed back to the event loop.

The model is not re-entrant and a CPU gains nothing from decoding two requests at once, so one
thread runs them in arrival order. The queue is bounded: :meth:`DecodeWorker.submit` raises
:class:`QueueFullError` at once when it is full (the API answers 503 with Retry-After), never
waits. A job whose client went away is cancelled between decoding steps.

Each request's mode and gamma come from the decoder's speculation controller: per workload it
speculates as far as pays, switches speculation off where it would be a net loss (``plain``), and
holds out a seeded share of requests as control traffic (``holdout``). Its state is saved after
every request, so a restarted sidecar resumes where it left off.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from decoder.holdout import HoldoutPolicy
from decoder.record import RequestRecord
from decoder.speculation.controller import SpeculationController
from monitor.api.decoding.controller_state import load_controller, save_controller

if TYPE_CHECKING:
    from decoder.speculation.speculative import Prompt, SpeculativeDecoder

log = logging.getLogger(__name__)

_DONE: Final = object()


class QueueFullError(RuntimeError):
    """The decode queue is full; ``retry_after_s`` is an estimate of when a place frees up."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"the decode queue is full; retry in about {retry_after_s} s")
        self.retry_after_s = retry_after_s


@dataclass(slots=True)
class Job:
    prompt: Prompt
    options: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[object] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def emit(self, item: object) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, item)

    async def items(self) -> AsyncIterator[str | RequestRecord]:
        """Text pieces, then the record; re-raises the decoder's exception. Cancels the job if abandoned."""
        try:
            while True:
                item = await self.out.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, str | RequestRecord)
                yield item
        finally:
            self.cancelled.set()


class DecodeWorker:
    def __init__(
        self,
        decoder: SpeculativeDecoder,
        *,
        queue_size: int,
        holdout: HoldoutPolicy,
        seed: int = 0,
        state_path: Path | None = None,
    ) -> None:
        self.decoder = decoder
        self.state_path = state_path
        if decoder.drafter is not None and decoder.controller is None:
            decoder.controller = (
                load_controller(state_path, holdout, seed)
                if state_path is not None
                else SpeculationController(holdout=holdout, seed=seed)
            )
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._run, name="draftwatch-decoder", daemon=True)
        self._mean_job_s = 1.0
        self.rejected = 0
        self.completed = 0

    def start(self) -> DecodeWorker:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        # Waiting jobs are cancelled; the running one stops at its next step.
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancelled.set()
                job.emit(RuntimeError("the server is shutting down"))
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    def submit(self, prompt: Prompt, options: dict[str, Any]) -> Job:
        """Queue a request (``options`` are :meth:`SpeculativeDecoder.stream`'s); raises :class:`QueueFullError`."""
        job = Job(prompt=prompt, options=dict(options), loop=asyncio.get_running_loop())
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self.rejected += 1
            raise QueueFullError(max(1, round(self._mean_job_s * (self._queue.maxsize + 1)))) from None
        return job

    def _run(self) -> None:
        self._calibrate()
        while True:
            job = self._queue.get()
            if job is None:
                return
            if job.cancelled.is_set():
                continue
            started = time.monotonic()
            try:
                stream = self.decoder.stream(job.prompt, **job.options)
                for item in stream:
                    if job.cancelled.is_set():
                        # Closing the generator stops decoding; no record for an abandoned request.
                        stream.close()  # type: ignore[attr-defined]
                        break
                    job.emit(item)
            except Exception as error:  # handed to the request; the worker lives on
                job.emit(error)
            finally:
                job.emit(_DONE)
                elapsed = time.monotonic() - started
                self._mean_job_s = 0.8 * self._mean_job_s + 0.2 * elapsed
                self.completed += 1
                if self.decoder.controller is not None and self.state_path is not None:
                    save_controller(self.decoder.controller, self.state_path)

    def _calibrate(self) -> None:
        """Time the model pair before the first request, not during it; a restored controller knows it already."""
        try:
            timed = self.decoder.calibrate_if_needed()
        except Exception:  # the worker must live on; the first request will try again and report the error
            log.exception("timing the model pair before the first request failed")
            return
        if timed and self.decoder.controller is not None and self.state_path is not None:
            save_controller(self.decoder.controller, self.state_path)


def stop_list(stop: str | Sequence[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)
