"""A recording process for the failure tests: ``python -m tests.ingest.recorder_child URL SPOOL ...``.

It records ``--count`` synthetic records (ids ``<prefix>-<n>`` from ``--first``), appends every id
the recorder reports durable (written, replayed or spooled) to ``--progress``, and prints its
stats as JSON when done. Nothing runs on import (pytest imports every module for doctests).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from decoder.record import RequestRecord
from monitor.ingest.recorder import Recorder
from monitor.ingest.settings import RecorderSettings
from monitor.ingest.synthetic import synthetic_record
from monitor.store.engine import create_engine


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("spool", type=Path)
    parser.add_argument("--progress", type=Path, required=True)
    parser.add_argument("--prefix", default="child")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=0.0, help="records per second, 0 = as fast as possible")
    args = parser.parse_args(argv)
    progress = args.progress.open("a")

    def durable(batch: Sequence[RequestRecord], where: str) -> None:
        progress.write("".join(f"{rec.request_id}\n" for rec in batch))
        progress.flush()  # the page cache survives kill -9 of this process

    recorder = Recorder(
        create_engine(args.url),
        RecorderSettings(spool_dir=args.spool, batch_size=200, flush_interval_s=0.05, retry_interval_s=0.2),
        on_durable=durable,
    ).start()
    start = time.monotonic()
    for n in range(args.first, args.first + args.count):
        recorder.record(synthetic_record(n, prefix=args.prefix, workload=("code", "chat")[n % 2]))
        if args.rate:
            delay = start + (n - args.first + 1) / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    recorder.close()
    print(json.dumps(asdict(recorder.stats())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
