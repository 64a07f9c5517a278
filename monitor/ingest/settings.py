"""Ingest's settings: the recorder (queue, batches, full-queue policy, spool), scrape targets, the prompt sample."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from monitor.ingest.scrape.targets import ScrapeTarget, parse_targets
from monitor.settings.fields import setting
from monitor.settings.parsers import parse_bool, parse_choice, parse_int, parse_path, parse_seconds, parse_share

FULL_QUEUE_POLICIES: Final = ("block_then_spool", "spool", "raise")


@dataclass(frozen=True, slots=True, kw_only=True)
class RecorderSettings:
    queue_size: int = setting(
        "recorder.queue_size",
        parse_int(1),
        20_000,
        "records the recorder holds in memory before the full-queue policy applies",
    )
    batch_size: int = setting("recorder.batch_size", parse_int(1), 1000, "records per database transaction")
    flush_interval_s: float = setting(
        "recorder.flush_interval_s",
        parse_seconds,
        0.2,
        "longest time a record waits in the queue before its batch is written",
    )
    full_queue_policy: str = setting(
        "recorder.full_queue_policy",
        parse_choice(FULL_QUEUE_POLICIES),
        "block_then_spool",
        "what record() does when the queue is full: block_then_spool (wait up to block_timeout_s, then "
        "append to the spool on the caller's thread), spool (at once), raise (RecorderFullError); the proxy never "
        "waits: its records go to a spill thread that spools them, or are dropped and counted when that is full too",
    )
    block_timeout_s: float = setting(
        "recorder.block_timeout_s",
        parse_seconds,
        0.05,
        "how long record() waits for room under block_then_spool",
    )
    retry_interval_s: float = setting(
        "recorder.retry_interval_s",
        parse_seconds,
        1.0,
        "how often the recorder retries an unreachable database",
    )
    write_timeout_s: float = setting(
        "recorder.write_timeout_s",
        parse_seconds,
        5.0,
        "how long a database write may run before the database counts as hung: new batches go to the spool "
        "meanwhile, and the hung write still commits or spools when the database answers",
    )
    writer_threads: int = setting(
        "recorder.writer_threads",
        parse_int(1),
        1,
        "background writer threads (2 helps ingest throughput on PostgreSQL; SQLite gains nothing)",
    )
    writer_process: bool = setting(
        "recorder.writer_process",
        parse_bool,
        True,
        "each writer thread commits its batches through a Python process of its own, so that a batch's database "
        "work never takes the sidecar's interpreter from the requests it answers; off (and always for an in-memory "
        "SQLite database), the writer threads commit in this process",
    )
    spool_before_reply: bool = setting(
        "recorder.spool_before_reply",
        parse_bool,
        False,
        "proxy mode: fsync each proxied request's record to the spool before the last byte of its response is "
        "sent, so that a kill -9 loses no answered request (one fsync per request, shared by concurrent ones); "
        "off, a kill -9 loses the records of about the last flush_interval_s",
    )
    spool_dir: Path = setting(
        "recorder.spool_dir",
        parse_path,
        dataclasses.MISSING,
        "directory of the recorder's append-only spool files (default: spool/ in data_dir)",
        derive=lambda data_dir: data_dir / "spool",
    )

    def __post_init__(self) -> None:
        if self.full_queue_policy not in FULL_QUEUE_POLICIES:
            raise ValueError(f"full_queue_policy={self.full_queue_policy!r}: expected one of {FULL_QUEUE_POLICIES}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ScrapeSettings:
    targets: tuple[ScrapeTarget, ...] = setting(
        "scrape",
        parse_targets,
        (),
        "engines' /metrics endpoints to read (scrape mode): [[scrape]] tables (url, kind vllm|llamacpp|sglang, "
        "name, interval, workload, target_model, drafter, timeout_s (default: 5 or the interval if shorter), "
        "authorization or bearer_token for an engine behind auth) or a JSON list of the same",
        # The tables may hold a target's credential: a parse error must not quote them.
        secret=True,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureSettings:
    share: float = setting(
        "capture.share",
        parse_share,
        0.0,
        "share of proxied and embedded-decoder requests whose prompt may enter the prompt sample for "
        "`draftwatch evaluate`; 0 is off, since prompts are otherwise never stored",
    )
    max_per_workload: int = setting(
        "capture.max_per_workload",
        parse_int(1),
        200,
        "most prompts the sample keeps per workload, a uniform reservoir of those seen",
    )
    retention_days: int = setting(
        "capture.retention_days",
        parse_int(1),
        7,
        "days a captured prompt is kept before it is deleted",
    )
    path: Path = setting(
        "capture.path",
        parse_path,
        dataclasses.MISSING,
        "the prompt sample's own SQLite file, apart from the records (default: prompt-sample.db in data_dir)",
        derive=lambda data_dir: data_dir / "prompt-sample.db",
    )
