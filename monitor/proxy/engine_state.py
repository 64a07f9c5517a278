"""What the sidecar last read of one replica about itself (monitor/proxy/engine_watch.py reads it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

UptimeFrom = Literal["process", "first_sight"]


@dataclass(slots=True)
class EngineState:
    """The last read of one replica; all None until it answered once."""

    version: str | None = None
    started: float | None = None  # the replica's start, seconds since the epoch
    started_from: UptimeFrom | None = None
    kv_use: float | None = None
    drafter: str | None = None  # as the engine names its speculative configuration
    answering: bool = False
    # The stack whose endpoint named the version last: asked first next time, not after the others' 404s.
    version_from: str | None = None

    def fields(self, at: float) -> dict[str, Any]:
        """The record's fields for a request that started at ``at`` (seconds since the epoch)."""
        uptime = max(0.0, at - self.started) if self.started is not None else None
        return {
            "engine_version": self.version,
            "replica_uptime_s": uptime,
            "uptime_from": self.started_from if uptime is not None else None,
            "kv_cache_use": self.kv_use,
            "draft_version": self.drafter,
        }

    def update(
        self, version: str | None, process_start: float | None, kv_use: float | None, now: float,
        drafter: str | None = None,
    ) -> None:  # fmt: skip
        """A successful read: a process start when the engine gives one, else first sight, taken anew on a restart.

        A drafter not named this time (llama.cpp's, until a slot has served) is the last one named, unless the
        replica restarted: then it is unknown until named again.
        """
        restarted = not self.answering or (version is not None and self.version not in (None, version))
        if drafter is not None or restarted:
            self.drafter = drafter
        if process_start is not None:
            self.started, self.started_from = process_start, "process"
        elif restarted or self.started_from != "first_sight":
            self.started, self.started_from = now, "first_sight"
        self.version = version if version is not None else self.version
        self.kv_use = kv_use
        self.answering = True

    def lost(self) -> None:
        """The replica did not answer the read: its KV use is unknown now, and an answer later is a new sight."""
        self.answering = False
        self.kv_use = None
