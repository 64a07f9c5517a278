"""HTTP ingest throughput of ``draftwatch serve``: records/s and request latency for batches of 100 and 1,000.

Starts a real ``draftwatch serve`` (uvicorn) on a free port against a fresh database (SQLite by
default, or ``--database-url``), then drives ``POST /v1/events`` from client threads on this same
machine with persistent connections. Bodies are encoded once per batch size and only the request
ids change, so the load generator spends its CPU on HTTP, not on building JSON. Every request must
be answered 202 with every record stored.

    .venv/bin/python -m benchmarks.http_ingest [--seconds 10] [--database-url URL] [--write]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from benchmarks.results import write_section
from monitor.ingest.synthetic import synthetic_record

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-ingest-token-0123456789"
MARK = b"BATCHMARK"
TITLE = "HTTP ingest (benchmarks/http_ingest.py)"


@dataclass(frozen=True)
class Run:
    batch: int
    clients: int
    requests: int
    records: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def template(batch: int) -> bytes:
    """A batch body whose request ids all contain MARK, to be replaced per request."""
    start = datetime.now(UTC) - timedelta(minutes=5)
    events = []
    for i in range(batch):
        rec = synthetic_record(i, workload=("code", "chat", "summarize")[i % 3], start=start, spacing=timedelta(0))
        data = rec.to_dict()
        data["request_id"] = f"{MARK.decode()}-{i}"
        events.append(data)
    return json.dumps({"events": events}, separators=(",", ":")).encode()


def serve(port: int, database_url: str, data_dir: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DRAFTWATCH_DATA_DIR": str(data_dir),
        "DRAFTWATCH_DATABASE_URL": database_url,
        "DRAFTWATCH_API_TOKENS": f"ingest:{TOKEN}",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "monitor.commands", "serve", "--port", str(port), "--no-scheduler"], env=env, cwd=ROOT
    )
    wait_ready(port, process)
    return process


def wait_ready(port: int, process: subprocess.Popen[bytes]) -> None:
    """Until the sidecar on ``port`` answers ``/readyz`` with 200; kills it after two minutes without."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit(f"draftwatch serve on port {port} did not become ready")


def drive(port: int, batch: int, clients: int, seconds: float, prefix: str) -> Run:
    body = template(batch)
    latencies: list[float] = []
    counter = iter(range(10**9))
    lock = threading.Lock()
    failures: list[str] = []
    deadline = time.perf_counter() + seconds

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        while time.perf_counter() < deadline:
            with lock:
                number = next(counter)
            payload = body.replace(MARK, f"{prefix}{number:08d}".encode())
            sent = time.perf_counter()
            conn.request("POST", "/v1/events", payload, headers)
            response = conn.getresponse()
            answer = response.read()
            elapsed = time.perf_counter() - sent
            if response.status != 202 or json.loads(answer)["stored"] != batch:
                failures.append(f"{response.status} {answer[:200]!r}")
                return
            with lock:
                latencies.append(elapsed)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    if failures:
        raise SystemExit(f"ingest failed: {failures[0]}")
    ordered = sorted(latencies)
    return Run(
        batch=batch,
        clients=clients,
        requests=len(ordered),
        records=len(ordered) * batch,
        seconds=wall,
        p50_ms=statistics.median(ordered) * 1000,
        p99_ms=ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
    )


def table(runs: list[Run], database: str) -> str:
    lines = [
        f"Database: {database}. Server and load generator share the machine.",
        "",
        "| batch | clients | requests | records/s | p50 ms | p99 ms |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in runs:
        lines.append(
            f"| {r.batch:,} | {r.clients} | {r.requests:,} | {r.records_per_s:,.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per batch size (default: 10)")
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file in a temporary directory")
    parser.add_argument("--clients", type=int, default=4, help="client threads for batches of 100 (default: 4)")
    parser.add_argument("--write", action="store_true", help="write the figures into benchmarks/RESULTS.md")
    args = parser.parse_args(argv)
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'bench.db'}"
        port = free_port()
        server = serve(port, url, Path(tmp))
        try:
            drive(port, 100, args.clients, 2.0, "warm")  # connections, caches, SQLite pages
            runs = [
                drive(port, 100, args.clients, args.seconds, "b100-"),
                drive(port, 1000, max(1, args.clients // 2), args.seconds, "b1000-"),
            ]
        finally:
            server.terminate()
            server.wait(60)
    database = "SQLite (WAL) file" if args.database_url is None else url.split("://", 1)[0]
    text = table(runs, database) + (
        f"\n\nLoad average (1 min) at start / end: {load_start:.1f} / {os.getloadavg()[0]:.1f}; other work on the "
        "machine takes CPU from the server and the load generator alike."
    )
    print(text)
    if args.write:
        write_section(TITLE, text, ["-m", "benchmarks.http_ingest", *(argv if argv is not None else sys.argv[1:])])
    return 0


if __name__ == "__main__":
    sys.exit(main())
