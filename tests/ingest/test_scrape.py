"""Scrape mode against a real HTTP /metrics endpoint serving each engine's exposition (tests/fixtures/scrape/)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from monitor.alerts.queries import list_alerts
from monitor.config import ConfigError, Settings
from monitor.ingest.scrape.run import scrape_due
from monitor.ingest.scrape.targets import ScrapeTarget, parse_targets
from monitor.scheduler.health import evaluate_health
from monitor.scheduler.service import SchedulerService
from monitor.store.scrape import ScrapeIntervalRow, scraped_summaries, target_health
from tests.store.schema import assert_migrated_as_declared

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "scrape"
T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


class Exposition:
    """A /metrics endpoint whose body (and status) a test sets between scrapes."""

    def __init__(self) -> None:
        self.body = b""
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(outer.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def serve(self, name: str) -> None:
        self.body, self.status = (FIXTURES / name).read_bytes(), 200


@pytest.fixture
def exposition() -> Iterator[Exposition]:
    endpoint = Exposition()
    thread = threading.Thread(target=endpoint.server.serve_forever, daemon=True)
    thread.start()
    yield endpoint
    endpoint.server.shutdown()
    endpoint.server.server_close()


def target(url: str, kind: str, **fields: Any) -> ScrapeTarget:
    (parsed,) = parse_targets([{"url": url, "kind": kind, "name": "engine-a", **fields}])
    return parsed


def intervals(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(ScrapeIntervalRow.__table__).order_by(ScrapeIntervalRow.id)))


def scrape_at(engine: Engine, t: ScrapeTarget, minutes: float) -> Any:
    return scrape_due(engine, [t], T0 + timedelta(minutes=minutes))


def test_llama_cpp_counters_become_intervals_and_a_restart_is_a_reset(engine: Engine, exposition: Exposition) -> None:
    t = target(exposition.url, "llamacpp", workload="code", target_model="smollm2-135m", drafter="self")
    exposition.serve("llamacpp-b11434-after-1-request.txt")
    assert scrape_at(engine, t, 0).intervals == 0  # the first sight of a counter is its baseline
    exposition.serve("llamacpp-b11434-after-3-requests.txt")
    assert scrape_at(engine, t, 1).intervals == 1
    exposition.serve("llamacpp-b11434-restarted-after-1-request.txt")
    assert scrape_at(engine, t, 2).intervals == 1
    grown, restarted = intervals(engine)
    # 6 -> 22 drafts, 17 -> 63 draft tokens, 17 -> 61 accepted; positions 6,6,5 -> 21,21,19.
    assert (grown.drafts, grown.draft_tokens, grown.accepted_tokens) == (16, 46, 44)
    assert (grown.accepted_per_position, grown.reset) == ([15, 15, 14], False)
    # After the restart the counters start again: the interval counts what the new process did, never a negative.
    assert (restarted.drafts, restarted.draft_tokens, restarted.accepted_tokens, restarted.reset) == (4, 11, 11, True)
    assert (grown.workload, grown.target_model, grown.drafter, grown.target) == (
        "code",
        "smollm2-135m",
        "self",
        "engine-a",
    )
    assert grown.started_at == T0 and grown.ended_at == T0 + timedelta(minutes=1)
    # The restart is part of the target's health, not of its acceptance.
    (health,) = target_health(engine)
    assert (health.status, health.resets, health.reset_at) == ("up", 1, T0 + timedelta(minutes=2))


def test_vllm_engines_of_a_model_are_summed_and_models_kept_apart(engine: Engine, exposition: Exposition) -> None:
    t = target(exposition.url, "vllm", workload="chat")
    exposition.serve("vllm-v1-scrape-1.txt")
    scrape_at(engine, t, 0)
    exposition.serve("vllm-v1-scrape-2.txt")
    scrape_at(engine, t, 1)
    found = {row.target_model: row for row in intervals(engine)}
    llama = found["meta-llama/Llama-3.1-8B-Instruct"]  # engines 0 and 1: x1 and x2 of the base counts
    assert (llama.drafts, llama.draft_tokens, llama.accepted_tokens) == (300, 900, 630)
    assert llama.accepted_per_position == [300, 210, 120]
    qwen = found["Qwen/Qwen2.5-7B-Instruct"]
    assert (qwen.drafts, qwen.draft_tokens, qwen.accepted_tokens) == (200, 600, 420)
    (summary,) = [
        s for s in scraped_summaries(engine, T0, T0 + timedelta(hours=1)) if s.target_model == llama.target_model
    ]
    assert summary.acceptance_rate == pytest.approx(630 / 900) and summary.mean_acceptance_length == pytest.approx(3.1)
    assert (summary.source, summary.intervals, summary.drafter) == ("scrape:engine-a", 1, "vllm-spec")


def test_sglang_gauges_are_read_per_interval(engine: Engine, exposition: Exposition) -> None:
    t = target(exposition.url, "sglang")
    exposition.serve("sglang-scrape-1.txt")
    scrape_at(engine, t, 0)
    exposition.serve("sglang-scrape-2.txt")
    scrape_at(engine, t, 1)
    (row,) = intervals(engine)
    assert (row.accept_rate, row.accept_length, row.draft_tokens) == (0.37, 2.1, None)


def test_faults_are_health_never_acceptance(engine: Engine, exposition: Exposition, tmp_path: Path) -> None:
    t = target(exposition.url, "llamacpp")
    exposition.serve("llamacpp-b11434-after-1-request.txt")
    scrape_at(engine, t, 0)
    exposition.body = b"<html>502 Bad Gateway</html>"
    report = scrape_at(engine, t, 1)
    assert report.failed == {"engine-a": "line 1 is not a Prometheus sample"}
    exposition.status, exposition.body = 503, b""
    scrape_at(engine, t, 2)
    exposition.serve("vllm-v1-scrape-1.txt")  # an answer, but not this engine's: no llamacpp: series
    assert "no llamacpp:spec_* series" in scrape_at(engine, t, 3).failed["engine-a"]
    (health,) = target_health(engine)
    assert (health.status, health.failures) == ("garbage", 3)
    assert intervals(engine) == []
    # Three failed scrapes in a row raise the target's own health alert.
    settings = Settings.from_env({"HOME": str(tmp_path), "DRAFTWATCH_DATA_DIR": str(tmp_path)})
    evaluate_health(engine, settings, now=T0 + timedelta(minutes=3))
    firing = [a for a in list_alerts(engine) if a.rule == "scrape_target_down"]
    assert [(a.state, a.labels["target"]) for a in firing] == [("firing", "engine-a")]
    # Back up: the first interval spans the outage and counts all the engine did meanwhile.
    exposition.serve("llamacpp-b11434-after-3-requests.txt")
    scrape_at(engine, t, 4)
    (row,) = intervals(engine)
    assert (row.started_at, row.ended_at, row.draft_tokens) == (T0, T0 + timedelta(minutes=4), 46)
    evaluate_health(engine, settings, now=T0 + timedelta(minutes=4))
    assert [a.state for a in list_alerts(engine) if a.rule == "scrape_target_down"] == ["resolved"]


def test_a_target_is_scraped_once_per_its_interval(
    engine: Engine, exposition: Exposition, counted_clients: list[httpx.Client]
) -> None:
    # A pass with no target due makes no client: one loads the CA bundle, tens of milliseconds of the GIL that a
    # sidecar's event loop waits for (the real client, counted).
    made = counted_clients
    t = target(exposition.url, "llamacpp", interval="1m")
    exposition.serve("llamacpp-b11434-after-1-request.txt")
    assert scrape_at(engine, t, 0).scraped == 1
    assert scrape_at(engine, t, 0.5).scraped == 0
    assert len(made) == 1
    assert scrape_at(engine, t, 1).scraped == 1
    assert len(made) == 2 and all(client.is_closed for client in made)


def test_targets_come_from_the_config_file_and_the_job_runs_only_with_targets(tmp_path: Path) -> None:
    config = tmp_path / "draftwatch.toml"
    config.write_text(
        '[[scrape]]\nurl = "http://10.0.0.5:8000/metrics"\nkind = "vllm"\nworkload = "chat"\ninterval = "1m"\n'
    )
    home = {"HOME": str(tmp_path), "DRAFTWATCH_DATA_DIR": str(tmp_path)}
    settings = Settings.from_env(home, config)
    (t,) = settings.scrape.targets
    assert (t.name, t.kind, t.interval, t.workload) == ("10.0.0.5:8000", "vllm", timedelta(minutes=1), "chat")
    assert "scrape" in SchedulerService(settings, jobs=None).jobs
    assert "scrape" not in SchedulerService(Settings.from_env(home), jobs=None).jobs
    config.write_text('[[scrape]]\nurl = "http://h/metrics"\nkind = "vllm"\ntimeout_s = 90\n')
    with pytest.raises(ConfigError, match=r"scrape target 1: timeout_s 90 is longer than the interval \(30 s\)"):
        Settings.from_env(home, config)


@pytest.mark.parametrize(
    ("fields", "timeout_s"),
    [
        ({}, 5.0),
        ({"interval": "2s"}, 2.0),  # the default follows a shorter interval rather than refusing it
        ({"interval": "0.5s"}, 0.5),
        ({"interval": "2s", "timeout_s": 1}, 1.0),
        ({"interval": "2s", "timeout_s": 2}, 2.0),
    ],
)
def test_the_default_timeout_is_the_interval_when_that_is_shorter(fields: dict[str, Any], timeout_s: float) -> None:
    assert target("http://h/metrics", "vllm", **fields).timeout_s == timeout_s


def test_an_explicit_timeout_longer_than_the_interval_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match=r"timeout_s 3 is longer than the interval \(2 s\)"):
        target("http://h/metrics", "vllm", interval="2s", timeout_s=3)
    with pytest.raises(ValueError, match="timeout_s 0: expected more than 0"):
        target("http://h/metrics", "vllm", timeout_s=0)


def test_the_workloads_read_shows_scraped_series_and_target_health(
    engine: Engine, exposition: Exposition, tmp_path: Path, db_url: str
) -> None:
    from fastapi.testclient import TestClient

    from monitor.api.app import create_app
    from tests.api.conftest import READ, auth, make_settings

    now = datetime.now(UTC)
    t = target(exposition.url, "llamacpp", workload="code", target_model="smollm2-135m")
    exposition.serve("llamacpp-b11434-after-1-request.txt")
    scrape_due(engine, [t], now - timedelta(minutes=2))
    exposition.serve("llamacpp-b11434-after-3-requests.txt")
    scrape_due(engine, [t], now - timedelta(minutes=1))
    with TestClient(create_app(make_settings(tmp_path, db_url))) as client:
        body = client.get("/v1/workloads", headers=auth(READ)).json()
    (series,) = body["scraped"]
    assert (series["source"], series["workload"], series["intervals"]) == ("scrape:engine-a", "code", 1)
    assert (series["draft_tokens"], series["accepted_tokens"]) == (46, 44)
    assert [(h["name"], h["status"], h["failures"]) for h in body["scrape_targets"]] == [("engine-a", "up", 0)]


def test_the_migration_creates_the_tables_the_models_declare(engine: Engine) -> None:
    assert_migrated_as_declared(engine, {"scrape_intervals", "scrape_targets"})


def test_sglang_ranks_of_one_model_are_averaged_evenly() -> None:
    from monitor.ingest.scrape.engines import read
    from monitor.ingest.scrape.exposition import parse

    text = "".join(
        f'sglang:spec_accept_rate{{model_name="m",tp_rank="{r}"}} {v}\n' for r, v in enumerate((0.6, 0.6, 0.3))
    )
    # A pairwise running average gave 0.45, weighing the last rank as half of the model.
    assert read("sglang", parse(text))["m"].accept_rate == pytest.approx(0.5)
