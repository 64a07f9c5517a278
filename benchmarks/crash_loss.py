"""What a kill -9 of the proxy sidecar loses: answered requests without a record, spool_before_reply off and on.

    python -m benchmarks.crash_loss [--kills 10] [--seconds 10] [--rate 30] [--quick] [--no-write]

A stand-in engine (tests/proxy/engine.py, served in this process; each answer has an id of its own,
which becomes its record's request_id) behind ``draftwatch serve --upstream`` on a SQLite file, and a
client here sending ``--rate`` requests/s, every other one streamed. Each round, for each setting in
turn (each with its own database and spool): start the sidecar, load it for ``--seconds``, kill -9 it.
After the last round each sidecar is started once more and stopped cleanly, so that whatever its dead
predecessors spooled is replayed. Then, per setting, the answers the client received whole against
the records in the database:

- lost: answers without a record, per kill, and how long before the kill the client had them (ms);
- doubles: rows beyond one per request id, and rollup counts beyond the rows;
- the latency of a whole answer and to a stream's [DONE], p50/p99 (ms): what the setting costs per request.

With the setting off the bound is the records of about the last ``recorder.flush_interval_s``
(0.2 s); with it on, none. Figures go into RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy import func, select

from benchmarks.http_ingest import free_port
from benchmarks.proxy_overhead import start_sidecar
from benchmarks.results import write_section
from monitor.store.engine import create_engine
from monitor.store.models import RequestRow, RollupMinuteRow
from tests.proxy.engine import Engine
from tests.serving import serving

SETTINGS = (False, True)  # recorder.spool_before_reply
EVENT_PAUSE_S = 0.01  # between a stream's events: a stream takes a few tens of milliseconds
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@dataclass(frozen=True, slots=True)
class Answer:
    request_id: str
    streamed: bool
    received: float  # time.time() when the last byte was read
    latency_ms: float  # to the last byte of a whole answer, to the [DONE] of a stream (the engine may end it later)


@dataclass(slots=True)
class Outcome:
    """One setting's run: what the client received whole, and when each sidecar was killed."""

    answers: list[tuple[int, Answer]] = field(default_factory=list)  # (round, answer)
    kills: list[float] = field(default_factory=list)  # time.time() of each kill -9, by round


def ask(client: httpx.Client, streamed: bool) -> Answer | None:
    """One request; the answer when it was received whole, else None (the sidecar died under it)."""
    t0 = time.perf_counter()
    done = None
    try:
        if streamed:
            body = b""
            with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
                for chunk in response.iter_bytes():
                    body += chunk
                    if done is None and body.endswith(b"data: [DONE]\n\n"):
                        done = time.perf_counter()
            if response.status_code != 200 or done is None:
                return None
            first = next(line for line in body.splitlines() if line.startswith(b"data: {"))
            request_id = json.loads(first[6:])["id"]
        else:
            response = client.post("/v1/chat/completions", json=CHAT)
            if response.status_code != 200:
                return None
            request_id = response.json()["id"]
    except (httpx.HTTPError, ValueError, StopIteration):
        return None
    return Answer(request_id, streamed, time.time(), ((done or time.perf_counter()) - t0) * 1000)


def load(port: int, rate: float, seconds: float, kill: threading.Event) -> list[Answer]:
    """``rate`` requests/s, open loop (a slow answer does not slow the next request), until ``kill`` is set."""
    futures: list[Future[Answer | None]] = []
    with (
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client,
        ThreadPoolExecutor(max_workers=32) as pool,
    ):
        start = time.monotonic()
        number = 0
        while not kill.is_set() and time.monotonic() - start < seconds + 5:
            futures.append(pool.submit(ask, client, number % 2 == 1))
            number += 1
            kill.wait(max(0.0, start + number / rate - time.monotonic()))
    return [answer for future in futures if (answer := future.result()) is not None]


def run_round(number: int, spool_before_reply: bool, data: Path, upstream: int, args: argparse.Namespace,
              outcome: Outcome) -> None:  # fmt: skip
    port = free_port()
    sidecar = start_sidecar(port, upstream, data, DRAFTWATCH_RECORDER_SPOOL_BEFORE_REPLY=str(spool_before_reply))
    kill = threading.Event()
    answers: list[Answer] = []
    client = threading.Thread(target=lambda: answers.extend(load(port, args.rate, args.seconds, kill)))
    client.start()
    time.sleep(args.seconds)
    sidecar.kill()
    killed = time.time()
    sidecar.wait(30)
    kill.set()
    client.join()
    outcome.kills.append(killed)
    outcome.answers += [(number, answer) for answer in answers]


def stored(data: Path) -> tuple[list[str], int]:
    """The request ids in a setting's database, and the requests its rollups count."""
    engine = create_engine(f"sqlite:///{data / 'p.db'}")
    try:
        with engine.connect() as conn:
            ids = list(conn.execute(select(RequestRow.request_id)).scalars())
            counted = conn.execute(select(func.sum(RollupMinuteRow.n_requests))).scalar_one() or 0
    finally:
        engine.dispose()
    return ids, int(counted)


def pct(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100)[q - 1] if len(values) >= 100 else max(values)


def row(spool_before_reply: bool, outcome: Outcome, ids: list[str], counted: int, left: int) -> str:
    kept = set(ids)
    lost = [(n, a) for n, a in outcome.answers if a.request_id not in kept]
    ages = [(outcome.kills[n] - a.received) * 1000 for n, a in lost]
    doubles = (len(ids) - len(kept)) + (counted - len(ids))
    whole = [a.latency_ms for _, a in outcome.answers if not a.streamed]
    streams = [a.latency_ms for _, a in outcome.answers if a.streamed]
    kills = len(outcome.kills)
    age = f"{statistics.median(ages):.0f} / {max(ages):.0f}" if ages else "–"
    return (
        f"| {'on' if spool_before_reply else 'off'} | {kills} | {len(outcome.answers):,} | {len(lost)} | "
        f"{len(lost) / kills:.1f} | {age} | {doubles} | {left} | {pct(whole, 50):.1f} / {pct(whole, 99):.1f} | "
        f"{pct(streams, 50):.1f} / {pct(streams, 99):.1f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=10, help="kill -9 per setting (default 10)")
    parser.add_argument("--seconds", type=float, default=10.0, help="load before each kill (default 10)")
    parser.add_argument("--rate", type=float, default=30.0, help="requests/s, half streamed (default 30)")
    parser.add_argument("--quick", action="store_true", help="3 kills of 3 s per setting, to check it works")
    parser.add_argument("--no-write", action="store_true", help="print, do not write RESULTS.md")
    args = parser.parse_args(argv)
    if args.quick:
        args.kills, args.seconds = 3, 3.0
    engine = Engine()
    engine.number_answers = True
    engine.event_pause_s = EVENT_PAUSE_S
    outcomes = {setting: Outcome() for setting in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp, serving(engine.app(), log_level="warning") as upstream_url:
        upstream = int(upstream_url.rsplit(":", 1)[1])
        data = {setting: Path(tmp) / ("on" if setting else "off") for setting in SETTINGS}
        for number in range(args.kills):
            for setting in SETTINGS:  # alternating: a slow patch of the machine hits both
                run_round(number, setting, data[setting], upstream, args, outcomes[setting])
            print(f"round {number + 1}/{args.kills}: " + ", ".join(
                f"{'on' if s else 'off'} {sum(1 for n, _ in outcomes[s].answers if n == number)} answers"
                for s in SETTINGS), flush=True)  # fmt: skip
        lines = [
            "| spool_before_reply | kills | answered whole | lost | lost per kill | age of lost p50 / max (ms) | "
            "doubles | spool files left | whole answer p50 / p99 (ms) | stream to [DONE] p50 / p99 (ms) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for setting in SETTINGS:
            final = start_sidecar(free_port(), upstream, data[setting])  # claims the dead ones' spool
            final.terminate()  # a clean stop replays it
            final.wait(60)
            left = len(list((data[setting] / "spool").glob("spool-*")))
            lines.append(row(setting, outcomes[setting], *stored(data[setting]), left))
    body = "\n".join(
        [
            f"`draftwatch serve --upstream` (SQLite) in front of the stand-in engine of tests/proxy/engine.py, "
            f"{args.rate:g} requests/s (every other one a stream of 3 events {EVENT_PAUSE_S * 1000:.0f} ms apart), "
            f"kill -9 after {args.seconds:g} s of load, {args.kills} times per setting (`recorder.spool_before_reply` "
            "off and on, alternating), then a restart and a clean stop that replay the spool. Lost: answers the "
            "client received whole that have no record; their age is how long before the kill the client had "
            "them. The latency columns are the client's, under the same load: the setting's cost per request.",
            "",
            *lines,
        ]
    )
    print(body)
    if not args.no_write:
        write_section(
            "Crash loss (kill -9 under proxied load)", body, ["benchmarks/crash_loss.py", *(argv or sys.argv[1:])]
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
