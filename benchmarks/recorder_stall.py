"""What the recorder's batch writes cost an event loop in the same process: the writer process against none.

    python -m benchmarks.recorder_stall [--seconds 20] [--rate 1600] [--rounds 2] [--no-write]

A sidecar's proxy answers on an asyncio loop while its recorder writes a batch every flush interval
(0.2 s). In-process, a batch's Python (rows, rollups, SQLAlchemy; about 20 ms per 330 records) takes
the interpreter lock from the loop in turns of the 5 ms switch interval; with ``recorder.writer_process``
the sidecar only pickles the batch, in slices, and a child commits it. Here one process runs an asyncio
loop that wakes every millisecond and measures how late each wake-up is, while ``record_nowait`` is
called from that loop at ``--rate`` records/s (the proxy's path) into a SQLite file. Loop lateness is
what a request arriving at that moment waits on top of its own work. Both modes run in alternating
rounds in one run, on the same machine; nothing else (no HTTP client, no upstream) competes for the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.results import write_section
from monitor.ingest.recorder import Recorder
from monitor.ingest.settings import RecorderSettings
from monitor.ingest.synthetic import synthetic_record
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade

TITLE = "Recorder stall on the event loop (benchmarks/recorder_stall.py)"
TICK_S = 0.001


async def measure(recorder: Recorder, seconds: float, rate: float, first: int) -> list[float]:
    """Lateness of each 1 ms wake-up (ms), with ``rate`` records/s recorded from the loop meanwhile."""
    loop = asyncio.get_running_loop()
    late: list[float] = []
    start = loop.time()
    sent = 0
    while (now := loop.time()) - start < seconds:
        due = int((now - start) * rate)
        while sent < due:
            recorder.record_nowait(synthetic_record(first + sent))
            sent += 1
        wake = now + TICK_S
        await asyncio.sleep(TICK_S)
        late.append((loop.time() - wake) * 1000)
    return late


def run_mode(directory: Path, writer_process: bool, seconds: float, rate: float, first: int) -> tuple[list[float], int]:
    url = f"sqlite:///{directory / f'stall-{writer_process}-{first}.db'}"
    engine = create_engine(url)
    upgrade(engine)
    settings = RecorderSettings(spool_dir=directory / "spool", writer_process=writer_process)
    with Recorder(engine, settings) as recorder:
        recorder.record(synthetic_record(first, prefix="warm"))
        assert recorder.flush(60)  # one batch written: the child, where there is one, has started
        late = asyncio.run(measure(recorder, seconds, rate, first))
        assert recorder.flush(60)
        written = recorder.stats().written - 1
    engine.dispose()
    return late, written


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[round(q * 1000) - 1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each round per mode (default 20)")
    parser.add_argument("--rate", type=float, default=1600.0, help="records/s recorded from the loop (default 1600)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per mode (default 2)")
    parser.add_argument("--no-write", action="store_true", help="print, do not write RESULTS.md")
    args = parser.parse_args(argv)
    results: dict[bool, list[float]] = {False: [], True: []}
    written: dict[bool, int] = {False: 0, True: 0}
    with tempfile.TemporaryDirectory() as tmp:
        first = 0
        for number in range(args.rounds):
            for mode in (False, True):
                print(f"round {number + 1}/{args.rounds}, writer process {'on' if mode else 'off'}: "
                      f"{args.seconds:g} s at {args.rate:g} records/s", file=sys.stderr, flush=True)  # fmt: skip
                late, stored = run_mode(Path(tmp), mode, args.seconds, args.rate, first)
                results[mode] += late
                written[mode] += stored
                first += int(args.seconds * args.rate) + 1
    rows = []
    for mode in (False, True):
        late = results[mode]
        over = sum(v > 1.0 for v in late) / len(late)
        rows.append(f"| {'writer process' if mode else 'in-process writer'} | {len(late):,} | "
                    f"{statistics.median(late):.3f} | {quantile(late, 0.99):.2f} | {quantile(late, 0.999):.2f} | "
                    f"{max(late):.1f} | {over:.2%} | {written[mode]:,} |")  # fmt: skip
    p99 = {mode: quantile(results[mode], 0.99) for mode in (False, True)}
    body = "\n".join([
        f"An asyncio loop waking every {TICK_S * 1000:g} ms while it records {args.rate:g} records/s through "
        f"`record_nowait` into a SQLite file (default recorder settings: 0.2 s flush interval); {args.rounds} "
        f"alternating rounds of {args.seconds:g} s per mode. Lateness is how long after its due time each wake-up "
        "ran: what a request arriving then would wait on top of its own work.",
        "",
        "| recorder | wake-ups | late p50 (ms) | p99 (ms) | p99.9 (ms) | max (ms) | over 1 ms | records written |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        f"p99 lateness, in-process over writer process: {p99[False] / p99[True]:.1f}x.",
    ])  # fmt: skip
    print(body)
    if not args.no_write:
        write_section(TITLE, body, ["benchmarks/recorder_stall.py", *(argv if argv is not None else sys.argv[1:])])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
