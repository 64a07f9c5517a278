"""Dashboard benchmark: render time of every page on a store of 1,000,000 requests.

    python benchmarks/dashboard_speed.py                    # 1,000,000 records, writes RESULTS.md
    python benchmarks/dashboard_speed.py --records 50000 --no-write
    python benchmarks/dashboard_speed.py --db /tmp/dw-dash.db   # keep (and reuse) the generated store
    python benchmarks/dashboard_speed.py --url postgresql+psycopg://postgres@127.0.0.1:5432/mydb --no-fill

The store is a SQLite file (or the database at ``--url``, any SQLAlchemy URL) filled through the
store's own batch writer with synthetic records over the last seven days (four workloads, 5 %
holdout), followed by one real drift run (``--no-fill`` renders the store as it is). Each page is
then run with Streamlit's AppTest (the same script execution the server does, without a browser) with
every cache cleared first, so the time is a cold render: all queries, charts and tables. Ranges:
the default (last 24 hours) and the widest usual one (last 7 days).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import func, make_url, select

from decoder.record import Mode
from monitor.drift.run import run_drift
from monitor.ingest.synthetic import synthetic_record
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.models import RequestRow
from monitor.store.writes.writer import write_batch

TITLE = "Dashboard (benchmarks/dashboard_speed.py)"
APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
PAGES = ("overview", "workload", "drift", "alerts", "pairs")
RANGES = ("Last 24 hours", "Last 7 days")
WORKLOADS = ("code", "chat", "summarize", "translate")
BATCH = 5000
TARGET_S = 2.0


def fill(url: str, count: int) -> float:
    """Write ``count`` synthetic records over the last seven days; returns the seconds it took."""
    engine = create_engine(url)
    upgrade(engine)
    with engine.connect() as conn:
        have = int(conn.execute(select(func.count()).select_from(RequestRow)).scalar_one())
    if have >= count:
        engine.dispose()
        return 0.0
    start = datetime.now(UTC) - timedelta(days=7)
    spacing = timedelta(days=7) / count
    t0 = time.perf_counter()
    for first in range(have, count, BATCH):
        batch = []
        for i in range(first, min(count, first + BATCH)):
            mode: Mode = "holdout" if i % 20 == 7 else "speculative"
            batch.append(
                synthetic_record(i, workload=WORKLOADS[i % 4], start=start, spacing=spacing, mode=mode, prefix="bench")
            )
        with engine.begin() as conn:
            write_batch(conn, batch, f"bench-{first}", "sync")
        if first // BATCH % 20 == 0:
            print(f"  {first + len(batch):,} records", flush=True)
    run_drift(engine, detectors=False)
    engine.dispose()
    return time.perf_counter() - t0


def render_times(url: str, repeats: int) -> dict[tuple[str, str], list[float]]:
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    os.environ["DRAFTWATCH_DATABASE_URL"] = url
    times: dict[tuple[str, str], list[float]] = {}
    for range_name in RANGES:
        for page in PAGES:
            for _ in range(repeats):
                st.cache_data.clear()
                at = AppTest.from_file(str(APP), default_timeout=120)
                at.session_state["dw_range"] = range_name
                at.session_state["dw_refresh"] = "off"
                if page != "overview":
                    at.switch_page(f"views/{page}.py")
                t0 = time.perf_counter()
                at.run()
                elapsed = time.perf_counter() - t0
                if at.exception:
                    raise RuntimeError(f"{page}: {[e.value for e in at.exception]}")
                times.setdefault((range_name, page), []).append(elapsed)
            print(f"  {range_name:14} {page:9} {statistics.median(times[(range_name, page)]):.2f} s", flush=True)
    return times


def report(
    count: int,
    fill_s: float,
    times: dict[tuple[str, str], list[float]],
    load: tuple[float, float],
    store: str = "a SQLite file",
) -> str:
    lines = [
        "| page | " + " | ".join(f"{r}: median / max s" for r in RANGES) + " |",
        "| --- | " + " | ".join("---:" for _ in RANGES) + " |",
    ]
    for page in PAGES:
        cells = [f"{statistics.median(times[(r, page)]):.2f} / {max(times[(r, page)]):.2f}" for r in RANGES]
        lines.append(f"| {page} | " + " | ".join(cells) + " |")
    worst = max(max(v) for v in times.values())
    lines += [
        "",
        f"{count:,} synthetic requests over the last 7 days (4 workloads, 5 % holdout) in {store}, plus one "
        f"drift run. Each figure is a cold render (every Streamlit cache cleared) of the whole page through "
        f"AppTest, {len(next(iter(times.values())))} runs per page. Slowest render: {worst:.2f} s "
        f"(target: under {TARGET_S:.0f} s per page). "
        + (f"Filling the store took {fill_s:.0f} s." if fill_s else "The store was reused from an earlier run."),
        "",
        f"Load average (1 min) at start / end: {load[0]:.1f} / {load[1]:.1f} (other work on this 2-core machine "
        "slows every figure).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--db", type=Path, default=None, help="SQLite file to fill (reused when it holds enough)")
    parser.add_argument("--url", default=None, help="a database URL to use instead of a SQLite file (e.g. PostgreSQL)")
    parser.add_argument("--no-fill", action="store_true", help="render the store as it is (with --url)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("streamlit").setLevel(logging.ERROR)
    if args.url:
        url, store = args.url, f"a {make_url(args.url).get_backend_name()} database"
    else:
        db = args.db or Path(tempfile.mkdtemp(prefix="dw-dash-")) / "dashboard.db"
        url, store = f"sqlite:///{db}", "a SQLite file"
    load_start = os.getloadavg()[0]
    fill_s = 0.0
    if not args.no_fill:
        print(f"filling {make_url(url).render_as_string(hide_password=True)} to {args.records:,} records", flush=True)
        fill_s = fill(url, args.records)
    times = render_times(url, args.repeats)
    body = report(args.records, fill_s, times, (load_start, os.getloadavg()[0]), store)
    print(body)
    if not args.no_write:
        from benchmarks.results import write_section

        write_section(TITLE, body, ["benchmarks/dashboard_speed.py", *(argv if argv is not None else sys.argv[1:])])
    return 0


if __name__ == "__main__":
    sys.exit(main())
