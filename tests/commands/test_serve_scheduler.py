"""``draftwatch serve`` runs its scheduler in a child process (issue 49, item 10).

A scheduler tick on a thread of the sidecar held the proxy's event loop for its Python time (the
lease's renewal, a delivery pass, a drift run); in a child process it holds nothing of the sidecar's.
Checked on a real sidecar and a real SQLite file: the lease's holder is another process than the
sidecar, a stopped sidecar stops it (and gives the lease up), a killed one takes it along.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx

from tests.serving import ROOT, free_port, wait_for


def sidecar(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """A proxy sidecar (an upstream that answers nothing: the scheduler does not need one) on ``tmp_path``."""
    db, port = tmp_path / "d.db", free_port()
    env = {**os.environ, "DRAFTWATCH_DATA_DIR": str(tmp_path), "DRAFTWATCH_DATABASE_URL": f"sqlite:///{db}"}
    env.pop("DRAFTWATCH_API_TOKENS", None)
    command = [sys.executable, "-m", "monitor.commands", "serve", "--port", str(port),
               "--upstream", f"http://127.0.0.1:{free_port()}"]  # fmt: skip
    process = subprocess.Popen(command, env=env, cwd=ROOT, stderr=subprocess.DEVNULL)

    def ready() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(ready, "the sidecar ready", within_s=60)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process, db


def lease(db: Path) -> tuple[str, bool]:
    """The scheduler lease's holder and whether it is unexpired (UTC, as SQLite stores it), or ("", False)."""
    try:
        with sqlite3.connect(db) as conn:
            row = conn.execute("SELECT holder, expires_at FROM scheduler_lease").fetchone()
    except sqlite3.OperationalError:  # no table before the schema's upgrade
        return "", False
    if row is None:
        return "", False
    return row[0], datetime.fromisoformat(row[1]).replace(tzinfo=UTC) > datetime.now(UTC)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (an ended child no one reaped yet does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def scheduler_pid(db: Path) -> int:
    """The lease holder's process id (holders are host:pid:nonce), once the lease is taken."""
    wait_for(lambda: lease(db)[1], "the scheduler's lease taken", within_s=60)
    return int(lease(db)[0].split(":")[-2])


def test_the_scheduler_leads_from_a_child_process_and_stops_with_the_sidecar(tmp_path: Path) -> None:
    process, db = sidecar(tmp_path)
    try:
        child = scheduler_pid(db)
        assert child != process.pid
        assert Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(process.pid)
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    assert not alive(child)
    assert not lease(db)[1], "a clean stop gives the lease up"


def test_a_killed_sidecar_takes_its_scheduler_along(tmp_path: Path) -> None:
    process, db = sidecar(tmp_path)
    try:
        child = scheduler_pid(db)
    finally:
        process.kill()
        process.wait(10)
    wait_for(lambda: not alive(child), "the orphaned scheduler gone", within_s=20)
