"""``draftwatch serve`` with a hung database starts after one wait, not two in a row (issue 37, item 6).

Two start-up steps ask the database and wait for it: the scheduler's first lease request and the
schema upgrade on start, each up to the connect timeout (5 s) against a frozen server (SIGSTOP: it
accepts and never answers). One after the other they made a proxy take 13 s to start. The bound
is taken against the same start with a database that refuses at once, so that the process's own
start-up time (imports, a loaded machine) cancels out: one wait passes, two do not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from monitor.store.engine import POSTGRES_CONNECT_TIMEOUT_S
from tests.api.conftest import TOKENS
from tests.private_pg import PrivatePostgres
from tests.proxy.upstream import Upstream
from tests.serving import ROOT, free_port

BOUND_S = 1.5 * POSTGRES_CONNECT_TIMEOUT_S  # one wait and some slack; two waits are 10 s


def start(tmp_path: Path, db_url: str, upstream_url: str) -> tuple[float, str]:
    """Seconds from launching ``draftwatch serve`` (proxy mode, the scheduler in the process) to its first
    ready answer, and what it logged."""
    port = free_port()
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "DRAFTWATCH_DATA_DIR": str(tmp_path / "data"),
        "DRAFTWATCH_DATABASE_URL": db_url,
        "DRAFTWATCH_API_TOKENS": TOKENS,
        "DRAFTWATCH_PROXY_UPSTREAM": upstream_url,
    }
    began = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "monitor.commands", "serve", "--port", str(port)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        while True:
            assert process.poll() is None, "draftwatch serve exited"
            assert time.monotonic() - began < 60, "draftwatch serve did not become ready"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        ready_s = time.monotonic() - began
    finally:
        process.terminate()
        output = process.communicate(timeout=60)[0].decode()
    return ready_s, output


def test_serve_with_a_hung_database_is_ready_after_one_wait_not_two(
    tmp_path: Path, running_pg: PrivatePostgres, upstream: tuple[Upstream, str]
) -> None:
    _, upstream_url = upstream
    refusing = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/draftwatch"
    quick_s, _ = start(tmp_path / "refused", refusing, upstream_url)
    running_pg.freeze()
    hung_s, log = start(tmp_path / "hung", running_pg.url, upstream_url)
    assert hung_s - quick_s < BOUND_S, (hung_s, quick_s)
    assert "the database is not answering" in log and "records spool until it answers" in log, log[-2000:]
