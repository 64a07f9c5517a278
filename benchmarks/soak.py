"""A soak: steady ingest, a drift run every minute, deliveries to a flaky receiver, one database restart.

    python -m benchmarks.soak                        # 10 minutes, writes RESULTS.md
    python -m benchmarks.soak --minutes 3 --no-write

One real ``draftwatch serve`` (with its scheduler) on a private PostgreSQL server of its own (initdb
in a temporary directory, never the shared one), fed at a steady rate from this process. At 40 % of
the run workload ``code`` changes (its acceptance falls from 0.8 to 0.3), so the drift run finds it
and an alert goes out; at 60 % the database is stopped for 20 s and started again, so the recorder
spools and replays. The webhook receiver answers 503 to a third of the attempts (seeded). Every
15 s it samples the sidecar's and the database's memory and the recorder's queue and spool from
``/metrics``. Afterwards it checks that every acknowledged record is stored once and every
notification the outbox calls delivered reached the receiver, and reports how many arrived twice.
Loopback only, bounded in time; it stops and removes everything it started.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.http_ingest import free_port, wait_ready
from benchmarks.results import write_section
from monitor.ingest.synthetic import synthetic_record
from tests.private_pg import PrivatePostgres

ROOT = Path(__file__).resolve().parents[1]
TITLE = "Soak (benchmarks/soak.py)"
TOKEN = "soak-ingest-token-0123456789"
BATCH = 40
FAIL_SHARE = 1 / 3  # of delivery attempts answered 503
OUTAGE_S = 20.0
GAUGES = ("draftwatch_recorder_queued_records", "draftwatch_recorder_spool_pending")


@dataclass
class FlakyReceiver:
    """A webhook receiver that refuses a share of attempts (seeded) and counts what it accepted."""

    seed: int = 7
    accepted: Counter[str] = field(default_factory=Counter)  # webhook-id -> deliveries accepted
    refused: int = 0

    def start(self) -> FlakyReceiver:
        rng, lock, receiver = random.Random(self.seed), threading.Lock(), self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    refuse = rng.random() < FAIL_SHARE
                    if refuse:
                        receiver.refused += 1
                    else:
                        receiver.accepted[self.headers.get("webhook-id", "")] += 1
                self.send_response(503 if refuse else 204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"


@dataclass
class Sample:
    at_s: float
    sidecar_mb: float
    database_mb: float
    queued: float
    spool_pending: float
    acknowledged: int


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        total += int(found.group(1)) if found else 0
    return total / 1024


def postgres_pids(data_dir: Path) -> list[int]:
    """The private server's processes: the postmaster (its pid file) and its children."""
    try:
        postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return []
    pids = [postmaster]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                    pids.append(int(entry.name))
            except (OSError, ValueError):
                continue
    return pids


def gauges(port: int) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    text = conn.getresponse().read().decode()
    values = {}
    for name in GAUGES:
        found = re.search(rf"^{name} (\S+)$", text, re.M)
        values[name] = float(found.group(1)) if found else float("nan")
    return values


def batch_body(number: int, changed: bool) -> bytes:
    now = datetime.now(UTC)
    events = []
    for i in range(BATCH):
        workload = ("code", "chat", "summarize")[i % 3]
        # After the change, code's requests draft like translate's (acceptance 0.3 instead of 0.8).
        drawn = "translate" if changed and workload == "code" else workload
        record = synthetic_record(number * BATCH + i, workload=drawn, start=now, spacing=timedelta(0), prefix="soak")
        events.append(dataclasses.replace(record, workload=workload).to_dict())
    return json.dumps({"events": events}, separators=(",", ":")).encode()


def sidecar_env(database_url: str, data_dir: Path, port: int, receiver: FlakyReceiver) -> dict[str, str]:
    return {
        **os.environ,
        "DRAFTWATCH_DATA_DIR": str(data_dir),
        "DRAFTWATCH_DATABASE_URL": database_url,
        "DRAFTWATCH_API_TOKENS": f"admin:{TOKEN}",
        "DRAFTWATCH_API_PORT": str(port),
        "DRAFTWATCH_SCHEDULER_DRIFT_INTERVAL": "1m",
        "DRAFTWATCH_SCHEDULER_DELIVERY_INTERVAL": "5s",
        "DRAFTWATCH_SCHEDULER_HEALTH_INTERVAL": "30s",
        "DRAFTWATCH_DRIFT_CURRENT_WINDOW": "2m",
        "DRAFTWATCH_DRIFT_MAX_CURRENT_WINDOW": "2m",
        "DRAFTWATCH_DRIFT_REFERENCE_WINDOW": "10m",
        "DRAFTWATCH_ALERTS_FOR_RUNS": "1",
        "DRAFTWATCH_DELIVERY_BACKOFF_BASE_S": "2",
        "DRAFTWATCH_DELIVERY_BACKOFF_MAX_S": "10",
        "DRAFTWATCH_WEBHOOKS": json.dumps([{"url": receiver.url, "format": "json", "name": "flaky"}]),
    }


def soak(minutes: float, rate: float) -> tuple[list[Sample], dict[str, Any]]:
    receiver = FlakyReceiver().start()
    pg = PrivatePostgres()
    pg.start()
    port = free_port()
    scratch = Path(tempfile.mkdtemp(prefix="draftwatch-soak-"))
    env = sidecar_env(pg.url, scratch, port, receiver)
    sidecar = subprocess.Popen([sys.executable, "-m", "monitor.commands", "serve"], env=env, cwd=ROOT,
                               stdout=(scratch / "sidecar.log").open("wb"), stderr=subprocess.STDOUT)  # fmt: skip
    acknowledged: list[int] = []
    samples: list[Sample] = []
    try:
        wait_ready(port, sidecar)
        duration = minutes * 60
        began = time.monotonic()
        change_at, outage_at = began + 0.4 * duration, began + 0.6 * duration
        outage_done = threading.Event()

        def outage() -> None:
            time.sleep(max(0.0, outage_at - time.monotonic()))
            print(f"soak: stopping the database for {OUTAGE_S:.0f} s", file=sys.stderr, flush=True)
            pg.stop()
            time.sleep(OUTAGE_S)
            pg.start()
            print("soak: database started again", file=sys.stderr, flush=True)
            outage_done.set()

        threading.Thread(target=outage, daemon=True).start()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        interval, number, next_sample = BATCH / rate, 0, began
        while (now := time.monotonic()) < began + duration:
            if now >= next_sample:
                samples.append(sample(now - began, port, sidecar.pid, pg.data, len(acknowledged) * BATCH))
                next_sample += 15.0
            conn.request("POST", "/v1/events", batch_body(number, now >= change_at), headers)
            response = conn.getresponse()
            answer = response.read()
            if response.status != 202:
                raise SystemExit(f"ingest failed: {response.status} {answer[:200]!r}")
            acknowledged.append(number)
            number += 1
            time.sleep(max(0.0, began + number * interval - time.monotonic()))
        outage_done.wait(OUTAGE_S + 60)
        drained = drain(port, pg, began)
        samples.append(sample(time.monotonic() - began, port, sidecar.pid, pg.data, len(acknowledged) * BATCH))
        return samples, check(pg, acknowledged, receiver, drained)
    finally:
        sidecar.send_signal(signal.SIGTERM)
        try:
            sidecar.wait(60)
        except subprocess.TimeoutExpired:
            sidecar.kill()
        receiver.server.shutdown()
        pg.destroy()


def sample(at_s: float, port: int, sidecar_pid: int, data_dir: Path, acknowledged: int) -> Sample:
    values = gauges(port)
    return Sample(at_s, rss_mb([sidecar_pid]), rss_mb(postgres_pids(data_dir)), values[GAUGES[0]],
                  values[GAUGES[1]], acknowledged)  # fmt: skip


def drain(port: int, pg: PrivatePostgres, began: float) -> float:
    """Seconds after the load stopped until the queue and spool are empty and no notification is pending."""
    stopped = time.monotonic()
    url = pg.url.replace("postgresql+psycopg", "postgresql")
    while time.monotonic() - stopped < 180:
        values = gauges(port)
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM notifications WHERE status = 'pending'").fetchone()
        if values[GAUGES[0]] == 0 and values[GAUGES[1]] == 0 and row is not None and row[0] == 0:
            return time.monotonic() - stopped
        time.sleep(1.0)
    raise SystemExit(f"not drained within 3 minutes of the load's end ({time.monotonic() - began:.0f} s in)")


def check(pg: PrivatePostgres, acknowledged: list[int], receiver: FlakyReceiver, drained_s: float) -> dict[str, Any]:
    with psycopg.connect(pg.url.replace("postgresql+psycopg", "postgresql")) as conn:
        stored = {str(row[0]) for row in conn.execute("SELECT request_id FROM requests")}
        rows = conn.execute("SELECT notification_id, status, attempts FROM notifications").fetchall()
        alerts = [str(r[0]) for r in conn.execute("SELECT rule FROM alerts WHERE fired_at IS NOT NULL")]
    wanted = {f"soak-{n * BATCH + i}" for n in acknowledged for i in range(BATCH)}
    delivered = [str(r[0]) for r in rows if r[1] == "delivered"]
    return {
        "acknowledged": len(wanted),
        "stored": len(stored),
        "lost": len(wanted - stored),
        "notifications": len(rows),
        "delivered": len(delivered),
        "dead": sum(r[1] == "dead" for r in rows),
        "not_received": sum(receiver.accepted[n] == 0 for n in delivered),
        "received_twice": sum(count > 1 for count in receiver.accepted.values()),
        "attempts": sum(int(r[2]) for r in rows),
        "refused": receiver.refused,
        "alerts": sorted(set(alerts)),
        "drained_s": drained_s,
    }


def report(samples: list[Sample], checks: dict[str, Any], minutes: float, rate: float) -> str:
    lines = [
        f"{minutes:.0f} minutes at {rate:.0f} records/s (batches of {BATCH}) into one sidecar on a private "
        f"PostgreSQL; workload `code` changes at 40 %, the database is down for {OUTAGE_S:.0f} s at 60 %; the "
        f"receiver refuses {FAIL_SHARE:.0%} of attempts.",
        "",
        "| s | sidecar RSS MB | PostgreSQL RSS MB | queued records | spool pending | acknowledged |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {s.at_s:.0f} | {s.sidecar_mb:.0f} | {s.database_mb:.0f} | {s.queued:.0f} | {s.spool_pending:.0f} | "
        f"{s.acknowledged:,} |"
        for s in samples
    ]
    c = checks
    lines += [
        "",
        f"Records: {c['acknowledged']:,} acknowledged, {c['stored']:,} stored, {c['lost']} lost "
        f"(queue and spool empty and nothing pending {c['drained_s']:.0f} s after the load stopped).  ",
        f"Notifications: {c['notifications']} written, {c['delivered']} delivered in {c['attempts']} attempts "
        f"({c['refused']} refused by the receiver), {c['dead']} dead, {c['not_received']} marked delivered but "
        f"not received, {c['received_twice']} received twice.  ",
        f"Alerts that fired: {', '.join(c['alerts']) or 'none'}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the run (default: 10)")
    parser.add_argument("--rate", type=float, default=400.0, help="records per second (default: 400)")
    parser.add_argument("--no-write", action="store_true", help="print only; do not update RESULTS.md")
    args = parser.parse_args(argv)
    samples, checks = soak(args.minutes, args.rate)
    text = report(samples, checks, args.minutes, args.rate)
    print(text)
    if not args.no_write:
        write_section(TITLE, text, ["-m", "benchmarks.soak", *(argv if argv is not None else sys.argv[1:])])
    failed = checks["lost"] or checks["not_received"] or checks["dead"] or "acceptance_drop" not in checks["alerts"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
