"""Scrape mode against a real llama-server: the scheduler's scrape job, and figures equal to the server's own.

llama-server runs with ``--metrics`` and smollm2-135m as its own draft; the sidecar's scheduler
scrapes it every second. The drafted and accepted tokens of the stored intervals, summed, must
equal what the server reported for each request in its ``timings``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from decoder.models.fetch import fetch_preset
from monitor.scheduler.service import SchedulerService
from monitor.store.scrape import ScrapeIntervalRow, target_health
from tests.api.conftest import make_settings
from tests.stacks.llama_server import BASE_ARGS, COMPLETION, draft_args, llama_server, require_binary

pytestmark = pytest.mark.models


def scraped_totals(engine: Engine) -> tuple[int, int]:
    s = ScrapeIntervalRow
    with engine.connect() as conn:
        drafted, accepted = conn.execute(select(func.sum(s.draft_tokens), func.sum(s.accepted_tokens))).one()
    return int(drafted or 0), int(accepted or 0)


def test_the_scrape_job_reads_what_llama_server_did(engine: Engine, tmp_path: Path, db_url: str) -> None:
    model = fetch_preset("smollm2-135m", progress=False)
    with llama_server(model, *BASE_ARGS, *draft_args(model), "--metrics", binary=require_binary()) as server:
        targets = [{"url": f"{server.url}/metrics", "kind": "llamacpp", "name": "llama", "workload": "code",
                    "target_model": "smollm2-135m", "interval": "1s", "timeout_s": 0.9}]  # fmt: skip
        env = {"DRAFTWATCH_SCRAPE": json.dumps(targets), "DRAFTWATCH_SCHEDULER_SCRAPE_INTERVAL": "1s"}
        settings = make_settings(tmp_path, db_url, DRAFTWATCH_SCHEDULER_HEARTBEAT_S="0.2", **env)
        service = SchedulerService(settings, engine).start()
        try:
            assert "scrape" in service.jobs
            deadline = time.monotonic() + 20
            while not target_health(engine) and time.monotonic() < deadline:
                time.sleep(0.2)  # the first scrape is the counters' baseline
            reported = [0, 0]
            with httpx.Client(base_url=server.url, timeout=60) as client:
                for prompt in ("The three primary colours are red, blue and", "Count: 1, 2, 3, 4,", "A B C D E"):
                    timings = client.post("/completion", json={**COMPLETION, "prompt": prompt}).json()["timings"]
                    reported[0] += timings.get("draft_n", 0)
                    reported[1] += timings.get("draft_n_accepted", 0)
            assert reported[0] > 0
            # From the last answer, not the start: under load the three requests alone can outlast a fixed deadline.
            settled = time.monotonic() + 20
            while scraped_totals(engine) != tuple(reported) and time.monotonic() < settled:
                time.sleep(0.2)
        finally:
            service.stop()
    assert scraped_totals(engine) == tuple(reported)
    (health,) = target_health(engine)
    assert (health.name, health.status, health.failures) == ("llama", "up", 0)
