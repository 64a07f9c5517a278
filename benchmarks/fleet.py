"""Several sidecars on one PostgreSQL: ingest throughput, the scheduler's lease, and kill -9 of the leader.

    python -m benchmarks.fleet                     # 1, 2, 4 and 8 sidecars, 20 s each, both layouts, writes RESULTS.md
    python -m benchmarks.fleet --sidecars 2 --seconds 10 --layouts partitioned --no-write

For each fleet size N: a fresh database on the PostgreSQL server (``--pg``, default the local one),
N real ``draftwatch serve`` processes with their schedulers (lease TTL 6 s, heartbeat 1 s, drift
every 5 s), and per sidecar two client threads of this process posting batches of 500 records over
persistent connections (bodies encoded once; only the request ids change). With N >= 2 the lease
holder is killed with SIGKILL halfway through; its clients stop at their first failed request.
Reported per N: records/s in all and per sidecar, a batch's p99, the CPU share of the PostgreSQL
server and of the sidecars, who led before and after the kill and how long the takeover took, and
the checks: every acknowledged record stored once, no job tick run twice. Loopback only, bounded
in time; every process it starts is stopped and every database it creates is dropped.

Each size runs on each ``--layouts``: ``partitioned`` is ``requests`` as a new installation makes it
(a partition per day, migration 0014), ``plain`` the single table before partitioning (the database
is migrated, then converted back with ``draftwatch db unpartition``'s code before the sidecars start).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from benchmarks.http_ingest import MARK, free_port, template, wait_ready
from benchmarks.results import write_section
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.partitions import is_partitioned
from monitor.store.repartition import convert

ROOT = Path(__file__).resolve().parents[1]
TITLE = "Fleet: sidecars on one PostgreSQL (benchmarks/fleet.py)"
TOKEN = "fleet-ingest-token-0123456789"
BATCH = 500
CLIENTS = 2  # per sidecar
LEASE_TTL_S = 6.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Sidecar:
    port: int
    process: subprocess.Popen[bytes]
    latencies: list[float] = field(default_factory=list)
    acknowledged: list[str] = field(default_factory=list)  # request-id prefixes of 202 batches
    failures: int = 0


@dataclass
class Outcome:
    layout: str
    sidecars: int
    seconds: float
    records: int
    p99_ms: float
    per_sidecar: list[float]
    pg_share: float
    sidecar_share: float
    wal_bytes: int  # written by the whole server during the load (the database is the only one written)
    leader_before: str
    leader_after: str
    takeover_s: float | None
    missing: int
    stored: int
    twice_run_ticks: int
    runs_by_leader: dict[str, int]


def cpu_seconds(pids: list[int], *, children: bool = False) -> float:
    """CPU seconds the processes used, with (``children``) those of their children that have exited."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
        if children:
            total += int(fields[13]) + int(fields[14])  # cutime, cstime
    return total / CLOCK_TICKS


def postgres_cpu_seconds() -> float:
    """CPU seconds of the PostgreSQL server: the live processes, and the backends that have exited
    (counted in their parent's children's time), so connections opened or closed meanwhile count."""
    pids, parents = [], []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "postgres":
                continue
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            parent_comm = Path(f"/proc/{parent}/comm").read_text().strip()
        except OSError:
            continue
        (pids if parent_comm == "postgres" else parents).append(int(entry.name))
    return cpu_seconds(pids) + cpu_seconds(parents, children=True)


def start_sidecar(url: str, data_dir: Path) -> Sidecar:
    port = free_port()
    env = {
        **os.environ,
        "DRAFTWATCH_DATA_DIR": str(data_dir / str(port)),
        "DRAFTWATCH_DATABASE_URL": url,
        "DRAFTWATCH_API_TOKENS": f"ingest:{TOKEN}",
        "DRAFTWATCH_SCHEDULER_LEASE_TTL_S": str(LEASE_TTL_S),
        "DRAFTWATCH_SCHEDULER_HEARTBEAT_S": "1",
        "DRAFTWATCH_SCHEDULER_DRIFT_INTERVAL": "5s",
        "DRAFTWATCH_SCHEDULER_HEALTH_INTERVAL": "5s",
    }
    process = subprocess.Popen([sys.executable, "-m", "monitor.commands", "serve", "--port", str(port)], env=env,
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return Sidecar(port, process)


def load(sidecar: Sidecar, body: bytes, prefix: str, deadline: float, lock: threading.Lock) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", sidecar.port, timeout=60)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    number = 0
    while time.perf_counter() < deadline:
        mark = f"{prefix}{number:07d}"
        number += 1
        sent = time.perf_counter()
        try:
            conn.request("POST", "/v1/events", body.replace(MARK, mark.encode()), headers)
            response = conn.getresponse()
            answer = response.read()
        except OSError:  # the sidecar was killed under us
            with lock:
                sidecar.failures += 1
            return
        if response.status != 202 or json.loads(answer)["received"] != BATCH:
            raise SystemExit(f"ingest failed: {response.status} {answer[:200]!r}")
        with lock:
            sidecar.latencies.append(time.perf_counter() - sent)
            sidecar.acknowledged.append(mark)


def lease(conn: psycopg.Connection[tuple[object, ...]]) -> tuple[str, int] | None:
    row = conn.execute("SELECT holder, epoch FROM scheduler_lease").fetchone()
    return None if row is None else (str(row[0]), int(str(row[1])))


def pid_of(holder: str) -> int:
    return int(holder.split(":")[1])  # hostname:pid:nonce


def lay_out(url: str, layout: str) -> None:
    """Migrate the new database, then give ``requests`` the ``layout`` asked for."""
    engine = create_engine(url)
    try:
        upgrade(engine)
        if layout == "plain":
            convert(engine, partitioned=False)
        with engine.connect() as conn:
            if is_partitioned(conn) != (layout == "partitioned"):
                raise SystemExit(f"requests is not {layout} after the migration")
    finally:
        engine.dispose()


def run_fleet(admin: str, size: int, seconds: float, layout: str) -> Outcome:
    name = f"dw_fleet_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    info = psycopg.conninfo.conninfo_to_dict(admin)
    host, port = info.get("host", "127.0.0.1"), info.get("port", 5432)
    url = f"postgresql+psycopg://{info.get('user', 'postgres')}@{host}:{port}/{name}"
    target = psycopg.conninfo.make_conninfo(admin, dbname=name)
    sidecars: list[Sidecar] = []
    try:
        lay_out(url, layout)
        with tempfile.TemporaryDirectory(prefix="draftwatch-fleet-") as scratch:
            sidecars = [start_sidecar(url, Path(scratch))]
            wait_ready(
                sidecars[0].port, sidecars[0].process
            )  # the first one migrates the schema; the others find it current
            sidecars += [start_sidecar(url, Path(scratch)) for _ in range(size - 1)]
            for sidecar in sidecars[1:]:
                wait_ready(sidecar.port, sidecar.process)
            return drive(sidecars, target, size, seconds, layout)
    finally:
        for sidecar in sidecars:
            if sidecar.process.poll() is None:
                sidecar.process.send_signal(signal.SIGTERM)
        for sidecar in sidecars:
            try:
                sidecar.process.wait(30)
            except subprocess.TimeoutExpired:
                sidecar.process.kill()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def drive(sidecars: list[Sidecar], target: str, size: int, seconds: float, layout: str) -> Outcome:
    body = template(BATCH)
    lock = threading.Lock()
    with psycopg.connect(target, autocommit=True) as conn:
        deadline = time.monotonic() + 2 * LEASE_TTL_S
        while (held := lease(conn)) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if held is None:
            raise SystemExit("no sidecar took the scheduler lease")
        leader_before = held[0]
        own = [s.process.pid for s in sidecars]
        pg_cpu, own_cpu = postgres_cpu_seconds(), cpu_seconds(own)
        (lsn_start,) = conn.execute("SELECT pg_current_wal_lsn()").fetchone() or ("0/0",)
        began = time.perf_counter()
        stop_at = began + seconds
        threads = [
            threading.Thread(target=load, args=(s, body, f"f{size}s{i}c{c}-", stop_at, lock))
            for i, s in enumerate(sidecars)
            for c in range(CLIENTS)
        ]
        for thread in threads:
            thread.start()
        takeover_s = None
        leader_after = leader_before
        if size >= 2:
            time.sleep(seconds / 2)
            os.kill(pid_of(leader_before), signal.SIGKILL)
            killed = time.perf_counter()
            while time.perf_counter() - killed < 3 * LEASE_TTL_S:
                now = lease(conn)
                if now is not None and now[0] != leader_before:
                    takeover_s, leader_after = time.perf_counter() - killed, now[0]
                    break
                time.sleep(0.1)
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - began
        (wal,) = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn_start,)).fetchone() or (0,)
        pg_share = (postgres_cpu_seconds() - pg_cpu) / wall / (os.cpu_count() or 1)
        sidecar_share = (cpu_seconds(own) - own_cpu) / wall / (os.cpu_count() or 1)
        stored_ids = {row[0] for row in conn.execute("SELECT request_id FROM requests")}
        twice = conn.execute(
            "SELECT count(*) FROM (SELECT job, tick FROM job_runs GROUP BY job, tick HAVING count(*) > 1) t"
        ).fetchone()
        runs = dict(conn.execute("SELECT holder, count(*) FROM job_runs GROUP BY holder").fetchall())
    acknowledged = {f"{mark}-{i}" for s in sidecars for mark in s.acknowledged for i in range(BATCH)}
    latencies = sorted(x for s in sidecars for x in s.latencies)
    return Outcome(
        layout=layout,
        sidecars=size,
        seconds=wall,
        records=sum(len(s.acknowledged) for s in sidecars) * BATCH,
        p99_ms=latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000 if latencies else 0.0,
        per_sidecar=[len(s.acknowledged) * BATCH / wall for s in sidecars],
        pg_share=pg_share,
        sidecar_share=sidecar_share,
        wal_bytes=int(wal),
        leader_before=leader_before,
        leader_after=leader_after,
        takeover_s=takeover_s,
        missing=len(acknowledged - stored_ids),
        stored=len(stored_ids),
        twice_run_ticks=int(str(twice[0])) if twice else 0,
        runs_by_leader={str(k): int(str(v)) for k, v in runs.items()},
    )


def report(outcomes: list[Outcome]) -> str:
    rates = {(o.layout, o.sidecars): o.records / o.seconds for o in outcomes}
    lines = [
        f"Batches of {BATCH} records, {CLIENTS} client threads per sidecar in the benchmark's process; the sidecars "
        "(with their schedulers), the clients and PostgreSQL share this machine's cores. With 2 or more sidecars the "
        "lease holder is killed (SIGKILL) halfway through; its records/s count until then. `vs 1`: against one "
        "sidecar on the same layout; `vs plain`: against the same fleet on the unpartitioned table, run in turn.",
        "",
        "| layout | sidecars | records/s | vs 1 | vs plain | per sidecar | batch p99 ms | PostgreSQL CPU |"
        " records/s per PostgreSQL core | WAL bytes per record | sidecars' CPU | takeover |"
        " acknowledged, not stored | ticks run twice |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    cores = os.cpu_count() or 1
    for o in outcomes:
        rate = rates[(o.layout, o.sidecars)]
        single, plain = rates.get((o.layout, 1)), rates.get(("plain", o.sidecars))
        ratio = f"{rate / single:.2f}x" if single else "n/a"
        versus = f"{rate / plain:.2f}x" if plain and o.layout != "plain" else "n/a"
        per = " / ".join(f"{r:,.0f}" for r in o.per_sidecar)
        takeover = "no kill" if o.sidecars < 2 else ("none" if o.takeover_s is None else f"{o.takeover_s:.1f} s")
        per_core = f"{rate / (o.pg_share * cores):,.0f}" if o.pg_share > 0 else "n/a"
        wal = f"{o.wal_bytes / o.records:,.0f}" if o.records else "n/a"
        lines.append(
            f"| {o.layout} | {o.sidecars} | {rate:,.0f} | {ratio} | {versus} | {per} | {o.p99_ms:.0f} | "
            f"{o.pg_share:.0%} | {per_core} | {wal} | {o.sidecar_share:.0%} | {takeover} | "
            f"{o.missing} of {o.records:,} | {o.twice_run_ticks} |"
        )
    lines.append("")
    for o in outcomes:
        if o.sidecars >= 2:
            names = {o.leader_before: "killed leader", o.leader_after: "new leader"}
            runs = ", ".join(f"{names.get(holder, holder)} {n}" for holder, n in o.runs_by_leader.items())
            lines.append(f"{o.layout}, {o.sidecars} sidecars: job runs by holder: {runs}; the lease TTL is "
                         f"{LEASE_TTL_S:.0f} s.")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sidecars", default="1,2,4,8", help="fleet sizes, comma-separated (default: 1,2,4,8)")
    parser.add_argument("--layouts", default="partitioned,plain",
                        help="layouts of requests, comma-separated: partitioned (a new installation's), plain "
                        "(unpartitioned, before migration 0014) (default: partitioned,plain)")  # fmt: skip
    parser.add_argument("--seconds", type=float, default=20.0, help="load per fleet size (default: 20)")
    parser.add_argument("--pg", default="host=127.0.0.1 port=5432 user=postgres dbname=postgres",
                        help="libpq connection string of a role that may create databases")  # fmt: skip
    parser.add_argument("--no-write", action="store_true", help="print only; do not update RESULTS.md")
    args = parser.parse_args(argv)
    layouts = [name.strip() for name in args.layouts.split(",")]
    if unknown := sorted(set(layouts) - {"partitioned", "plain"}):
        parser.error(f"--layouts={args.layouts!r}: unknown layout {unknown[0]!r}; expected partitioned and/or plain")
    outcomes = []
    for size in (int(n) for n in args.sidecars.split(",")):
        for layout in layouts:
            print(f"fleet of {size}, {layout}: starting, then {args.seconds:.0f} s of load", file=sys.stderr,
                  flush=True)  # fmt: skip
            outcomes.append(run_fleet(args.pg, size, args.seconds, layout))
    text = report(outcomes)
    print(text)
    if not args.no_write:
        write_section(TITLE, text, ["-m", "benchmarks.fleet", *(argv if argv is not None else sys.argv[1:])])
    bad = [o for o in outcomes if o.missing or o.twice_run_ticks or (o.sidecars >= 2 and o.takeover_s is None)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
