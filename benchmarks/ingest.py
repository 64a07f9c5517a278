"""Recorder ingest benchmark: sustained records/s into SQLite and PostgreSQL, and record()'s cost.

    python benchmarks/ingest.py                      # 200,000 records per backend, writes RESULTS.md
    python benchmarks/ingest.py --records 20000 --no-write
    python benchmarks/ingest.py --steady-only --backends sqlite   # record()'s cost at 1,000/s alone, prints only

For each backend, one thread calls ``record()`` as fast as it can for ``--records`` synthetic records
(the queue is sized to hold them all, so nothing takes the full-queue path) and the clock stops when
``flush()`` reports every record committed; the database is then counted to check that every record
landed exactly once. The caller's cost is measured twice: during that flood (the writer thread
competes for the GIL) and at a steady 1,000 records/s, which is closer to a serving process: only the
``record()`` call is timed, on the caller's thread, with the writer thread running beside it.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from benchmarks.results import write_section
from decoder.record import RequestRecord
from monitor.ingest.recorder import Recorder
from monitor.ingest.settings import RecorderSettings
from monitor.ingest.synthetic import synthetic_record
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.models import RequestRow, RollupMinuteRow

TITLE = "Ingest (benchmarks/ingest.py)"
STEADY_COUNT = 5000
STEADY_RATE = 1000.0  # records/s: already far above one serving process's request rate


@dataclass
class Result:
    backend: str
    records: int
    seconds: float
    flood_p50_us: float
    flood_p99_us: float
    steady_p50_us: float
    steady_p99_us: float
    stored: int

    @property
    def per_second(self) -> float:
        return self.records / self.seconds


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def make_records(count: int, prefix: str) -> list[RequestRecord]:
    workloads = ("code", "chat", "summarize", "translate")
    return [synthetic_record(i, workload=workloads[i % 4], prefix=prefix) for i in range(count)]


def flood(engine: Engine, spool: Path, records: list[RequestRecord], writers: int) -> tuple[float, list[float]]:
    costs: list[float] = []
    recorder = Recorder(
        engine, RecorderSettings(spool_dir=spool, queue_size=len(records) + 1, batch_size=1000, writer_threads=writers)
    )
    recorder.start()
    clock = time.perf_counter_ns
    start = time.perf_counter()
    for rec in records:
        t0 = clock()
        recorder.record(rec)
        costs.append((clock() - t0) / 1000)
    if not recorder.flush(600):
        raise RuntimeError("recorder did not drain within 10 minutes")
    seconds = time.perf_counter() - start
    recorder.close()
    stats = recorder.stats()
    if stats.spooled or stats.duplicates or stats.written != len(records):
        raise RuntimeError(f"unexpected recorder figures: {stats}")
    return seconds, costs


def steady(engine: Engine, spool: Path, records: list[RequestRecord], rate: float) -> list[float]:
    costs: list[float] = []
    with Recorder(engine, RecorderSettings(spool_dir=spool)) as recorder:
        clock = time.perf_counter_ns
        start = time.perf_counter()
        for n, rec in enumerate(records):
            t0 = clock()
            recorder.record(rec)
            costs.append((clock() - t0) / 1000)
            delay = start + (n + 1) / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
    return costs


def run_backend(
    backend: str, url: str, count: int, writers: int, workdir: Path, steady_count: int = STEADY_COUNT
) -> Result:
    """The flood of ``count`` records (none when 0), then ``steady_count`` at :data:`STEADY_RATE`."""
    engine = create_engine(url)
    upgrade(engine)
    seconds, flood_costs = 0.0, [0.0]
    if count:
        records = make_records(count, prefix=f"{backend}-flood")
        seconds, flood_costs = flood(engine, workdir / f"{backend}-spool", records, writers)
    steady_costs = steady(
        engine, workdir / f"{backend}-spool", make_records(steady_count, f"{backend}-steady"), STEADY_RATE
    )
    with engine.connect() as conn:
        stored = int(conn.execute(select(func.count()).select_from(RequestRow)).scalar_one())
        rolled = int(conn.execute(select(func.sum(RollupMinuteRow.n_requests))).scalar_one())
    engine.dispose()
    if stored != count + steady_count or rolled != stored:
        raise RuntimeError(f"{backend}: {stored} rows and {rolled} in rollups, expected {count + steady_count}")
    return Result(
        backend,
        count,
        seconds,
        statistics.median(flood_costs),
        percentile(flood_costs, 0.99),
        statistics.median(steady_costs),
        percentile(steady_costs, 0.99),
        stored,
    )


def report(results: list[Result], writers: int, load: tuple[float, float]) -> str:
    lines = [
        "| backend | records | seconds | records/s | record() p50 / p99 µs (flood) | record() p50 / p99 µs (1k/s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r.backend} | {r.records:,} | {r.seconds:.1f} | {r.per_second:,.0f} | "
            f"{r.flood_p50_us:.1f} / {r.flood_p99_us:.1f} | {r.steady_p50_us:.1f} / {r.steady_p99_us:.1f} |"
        )
    lines += [
        "",
        f"Batches of 1,000 records, {writers} writer thread(s) on PostgreSQL, 1 on SQLite; each record is "
        "validated on the caller's thread, written with its per-minute rollups in the same transaction, and "
        "the row count is checked afterwards (every record exactly once). SQLite is a WAL file in a temporary "
        "directory; PostgreSQL 15 runs on the same 2 cores as the benchmark, so the server and the Python "
        "process compete for the CPU.",
        "",
        f"Load average (1 min) at start / end of the run: {load[0]:.1f} / {load[1]:.1f}: other work on the "
        "machine takes CPU from both the recorder and the database, so figures from a busy machine are low.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument(
        "--pg",
        default="host=127.0.0.1 port=5432 user=postgres dbname=postgres",
        help="libpq DSN of a server where a scratch database may be created and dropped",
    )
    parser.add_argument("--pg-writers", type=int, default=2, help="writer threads on PostgreSQL")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument(
        "--steady-only",
        action="store_true",
        help="skip the flood: only record()'s p50/p99 at a steady 1,000 records/s (prints only, like --no-write)",
    )
    parser.add_argument(
        "--steady-records", type=int, default=STEADY_COUNT, help=f"records of the steady run (default {STEADY_COUNT})"
    )
    args = parser.parse_args(argv)
    count = 0 if args.steady_only else args.records
    logging.basicConfig(level=logging.WARNING)
    workdir = Path(tempfile.mkdtemp(prefix="dw-ingest-"))
    load_start = os.getloadavg()[0]
    results = []
    try:
        for backend in args.backends.split(","):
            if backend == "sqlite":
                url = f"sqlite:///{workdir / 'ingest.db'}"
                results.append(run_backend("sqlite", url, count, 1, workdir, args.steady_records))
            elif backend == "postgresql":
                name = f"dw_bench_{uuid.uuid4().hex[:8]}"
                with psycopg.connect(args.pg, autocommit=True) as conn:
                    conn.execute(f'CREATE DATABASE "{name}"')
                try:
                    info = psycopg.conninfo.conninfo_to_dict(args.pg)
                    user, host, port = (
                        info.get("user", "postgres"),
                        info.get("host", "127.0.0.1"),
                        info.get("port", 5432),
                    )
                    url = f"postgresql+psycopg://{user}@{host}:{port}/{name}"
                    results.append(run_backend("postgresql", url, count, args.pg_writers, workdir, args.steady_records))
                finally:
                    with psycopg.connect(args.pg, autocommit=True) as conn:
                        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            else:
                parser.error(f"unknown backend {backend!r}")
            r = results[-1]
            if args.steady_only:
                print(
                    f"{r.backend}: record() p50/p99 {r.steady_p50_us:.1f}/{r.steady_p99_us:.1f} µs (1k/s)", flush=True
                )
                continue
            print(
                f"{r.backend}: {r.records:,} records in {r.seconds:.1f} s = {r.per_second:,.0f} records/s; "
                f"record() p50/p99 {r.flood_p50_us:.1f}/{r.flood_p99_us:.1f} µs (flood), "
                f"{r.steady_p50_us:.1f}/{r.steady_p99_us:.1f} µs (1k/s)",
                flush=True,
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.steady_only:
        print(f"Load average (1 min) at start / end of the run: {load_start:.1f} / {os.getloadavg()[0]:.1f}")
        return 0
    body = report(results, args.pg_writers, (load_start, os.getloadavg()[0]))
    print(body)
    if not args.no_write:
        write_section(TITLE, body, ["benchmarks/ingest.py", *(argv if argv is not None else sys.argv[1:])])
    return 0


if __name__ == "__main__":
    sys.exit(main())
