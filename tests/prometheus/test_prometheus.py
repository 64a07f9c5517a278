"""The Grafana dashboard and the Prometheus rules against a real Prometheus scraping a real ``draftwatch serve``.

The sidecar runs on a SQLite file and gets records through ``POST /v1/events``: a day of reference
traffic and an hour in which workload ``code`` changed (acceptance down, decode time doubled, longer
prompts, holdout faster than speculation, ``chat`` nearly gone). The scheduler's real jobs then run
here on the same database: two drift runs (the alerts fire), a delivery pass to a receiver outside
``delivery.allowed_hosts`` (a dead letter) and three failing runs of a job; another recorder on
the host has been spooling for two minutes; the sidecar's drift interval is 1 s, so its drift runs
go stale. Prometheus scrapes every second and evaluates the rule file; every expression
of the dashboard and of the rules must then return data. ``promtool`` checks and unit-tests the rules.

Without the binaries the tests skip (``bash scripts/ensure-prometheus.sh`` installs them), except
under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import insert
from sqlalchemy.engine import Engine

from decoder.record import RequestRecord
from monitor.alerts.rules import DEFAULT_RULES
from monitor.config import Settings
from monitor.ingest.scrape.run import scrape_due
from monitor.ingest.scrape.targets import parse_targets
from monitor.ingest.spool import Spool
from monitor.scheduler.health import SCRAPE_FAILURES
from monitor.scheduler.jobs import delivery_job, drift_job, run_tick
from monitor.scheduler.lease import Lease
from monitor.store.engine import create_engine
from monitor.store.rollouts import Rollout, RolloutEvent, insert_rollout, record_event, save_rollout
from monitor.store.routing import RoutingEvent, record_switch
from monitor.store.scrape import ScrapeIntervalRow
from monitor.store.types import Fence
from tests.api.conftest import INGEST, READ, TOKENS, auth, bodies
from tests.drift.records import window_stream
from tests.serving import free_port, serve_process, wait_for

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs/grafana/draftwatch.json"
RULES = ROOT / "docs/prometheus/draftwatch-rules.yml"
RULE_TESTS = ROOT / "docs/prometheus/draftwatch-rules.test.yml"
# The values the dashboard's variables take: the workload whose traffic has every mode.
CHOSEN = {"workload": "code"}
RATE_INTERVAL = "1m"
LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>\w+)\)$")


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        reason = f"{name} is not installed (bash scripts/ensure-prometheus.sh installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return path


@dataclass(frozen=True)
class Prometheus:
    url: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def get(self, path: str, **params: Any) -> Any:
        response = httpx.get(f"{self.url}{path}", params=params, timeout=10)
        assert response.status_code == 200, response.text
        return response.json()["data"]


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expression) of every target of every panel of the dashboard."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(panel["title"], target["expr"]) for panel in panels for target in panel.get("targets", [])]


def rule_queries() -> list[tuple[str, str]]:
    """(rule name, expression) of every recording and alerting rule of the rule file."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [(rule.get("alert") or rule["record"], rule["expr"]) for group in groups for rule in group["rules"]]


def alerting_rules() -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with Grafana's variables replaced by concrete values; fails on one left over."""
    for name, value in {**values, "__rate_interval": RATE_INTERVAL}.items():
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in expr, f"a Grafana variable without a value: {expr}"
    return expr


def variable_values(prometheus: Prometheus) -> dict[str, str]:
    """A value for each of the dashboard's query variables, read through their own ``label_values`` query."""
    chosen: dict[str, str] = {}
    for variable in json.loads(DASHBOARD.read_text())["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = LABEL_VALUES.match(variable["query"]["query"])
        assert match, variable
        params = {"match[]": substitute(match["selector"], chosen)} if match["selector"] else {}
        values = prometheus.get(f"/api/v1/label/{match['label']}/values", **params)
        assert values, f"variable {variable['name']} has no values"
        chosen[variable["name"]] = CHOSEN.get(variable["name"], values[0])
        assert chosen[variable["name"]] in values
    return chosen


def fail_job(engine: Engine, settings: Settings, tick: datetime, fence: Fence) -> Mapping[str, Any]:
    raise RuntimeError("the disk is full")


def history(now: datetime) -> list[RequestRecord]:
    """A day of reference traffic, then an hour in which ``code`` changed and ``chat`` almost stopped."""
    cur, end = now - timedelta(hours=1), now - timedelta(minutes=2)
    ref = cur - timedelta(days=1)
    changed = {"workload": "code", "alpha": 0.4, "ms_per_token": 40.0, "prompt_tokens": 1500, "seed": 1}
    return [
        *window_stream(ref, cur, 150, workload="code", alpha=0.8, ms_per_token=20.0),
        *window_stream(ref, cur, 150, workload="chat", alpha=0.6, ms_per_token=20.0),
        *window_stream(cur, end, 150, **changed),  # type: ignore[arg-type]
        *window_stream(cur, end, 60, **{**changed, "ms_per_token": 20.0, "mode": "holdout", "seed": 2}),  # type: ignore[arg-type]
        *window_stream(cur, end, 10, workload="chat", alpha=0.6, ms_per_token=20.0, seed=1),
    ]


def live(now: datetime, seed: int) -> list[RequestRecord]:
    """Traffic of the last seconds, so that rates have something to show."""
    start = now - timedelta(seconds=5)
    return [
        *window_stream(start, now, 20, workload="code", alpha=0.4, ms_per_token=40.0, seed=seed),
        *window_stream(start, now, 10, workload="code", alpha=0.4, ms_per_token=20.0, mode="holdout", seed=seed + 1),
        *window_stream(start, now, 10, workload="chat", alpha=0.6, ms_per_token=20.0, seed=seed),
    ]


def post(sidecar: str, records: list[RequestRecord]) -> None:
    response = httpx.post(f"{sidecar}/v1/events", json={"events": bodies(records)}, headers=auth(INGEST), timeout=30)
    assert response.status_code == 202 and response.json()["stored"] == len(records), response.text


def run_the_scheduler_jobs(db_url: str, env: dict[str, str]) -> None:
    """The scheduler's jobs on the sidecar's database, as its leader would run them."""
    settings = Settings.from_env(env, None)
    engine = create_engine(db_url)
    try:
        lease = Lease(engine, "prometheus-test", ttl_s=120)
        assert lease.acquire_or_renew()
        tick = datetime.now(UTC).replace(microsecond=0)
        # Two drift runs: the drift alerts go pending, then fire, and notify the receiver...
        for n in range(2):
            assert run_tick(engine, settings, lease, "drift", tick + timedelta(seconds=n), drift_job) == "ok"
        # ... whose host is not allowed: dead letters at once.
        assert run_tick(engine, settings, lease, "delivery", tick, delivery_job) == "ok"
        for n in range(settings.scheduler.failure_alert_after):
            assert run_tick(engine, settings, lease, "retention", tick + timedelta(seconds=n), fail_job) == "failed"
        # A [[scrape]] target nobody answers at, scraped as often as it takes to count as down.
        (down,) = parse_targets([{"url": f"http://127.0.0.1:{free_port()}/metrics", "kind": "vllm", "name": "gone"}])
        for n in range(SCRAPE_FAILURES):
            scrape_due(engine, [down], tick + down.interval * n)
        # ... and one that answers: an interval of its counters, ending now.
        with engine.begin() as conn:
            conn.execute(insert(ScrapeIntervalRow).values(
                target="vllm-a", kind="vllm", workload="code", target_model="llama-8b", drafter="eagle",
                started_at=tick - timedelta(seconds=30), ended_at=tick, drafts=100, draft_tokens=300,
                accepted_tokens=210, accepted_per_position=[100, 70, 40], reset=False,
            ))  # fmt: skip
    finally:
        engine.dispose()


def spool_for_two_minutes(directory: Path, record: RequestRecord) -> Spool:
    """A recorder of another process on this host that has been spooling for two minutes (its database away).

    It holds its segment (a lock), so the sidecar's recorder leaves it alone; the recorder_spool
    check finds a segment older than a minute.
    """
    spool = Spool(directory)
    spool.append("stuck-batch", [record])
    old = time.time() - 120
    for segment in directory.glob("spool-*.jsonl"):
        os.utime(segment, (old, old))
    return spool


def start_prometheus(tmp: Path, sidecar_port: int) -> tuple[subprocess.Popen[bytes], Prometheus]:
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "draftwatch",
                "authorization": {"credentials": READ},
                "static_configs": [{"targets": [f"127.0.0.1:{sidecar_port}"]}],
            }
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    process = subprocess.Popen(
        [
            binary("prometheus"),
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "prometheus.log").open("wb"),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        assert process.poll() is None, (tmp / "prometheus.log").read_text()
        try:
            if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                return process, Prometheus(url)
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "prometheus did not become ready"
        time.sleep(0.1)


def seen(prom: Prometheus, query: str, what: str) -> None:
    wait_for(lambda: prom.query(query), f"Prometheus never saw {what}", every_s=0.25)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    binary("prometheus")
    tmp = tmp_path_factory.mktemp("prometheus")
    db_url = f"sqlite:///{tmp / 'draftwatch.db'}"
    env = {
        "HOME": str(tmp),
        "DRAFTWATCH_DATA_DIR": str(tmp / "data"),
        "DRAFTWATCH_DATABASE_URL": db_url,
        "DRAFTWATCH_API_TOKENS": TOKENS,
        # Drift runs are due every second: once the jobs below stop, the sidecar finds them stale.
        "DRAFTWATCH_SCHEDULER_DRIFT_INTERVAL": "1s",
        "DRAFTWATCH_WEBHOOKS": json.dumps([{"url": "http://127.0.0.1:9/hook", "format": "json"}]),
        "DRAFTWATCH_DELIVERY_ALLOWED_HOSTS": "hooks.example.com",
    }
    port = free_port()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DRAFTWATCH_SCHEDULER_DRIFT_INTERVAL", env["DRAFTWATCH_SCHEDULER_DRIFT_INTERVAL"])
        server = serve_process(tmp, db_url, port)
    sidecar = f"http://127.0.0.1:{port}"
    process, prom = start_prometheus(tmp, port)
    stuck = None
    try:
        post(sidecar, history(datetime.now(UTC)))
        run_the_scheduler_jobs(db_url, env)
        route_a_workload_to_plain(db_url)
        stage_rollouts(db_url)
        stuck = spool_for_two_minutes(tmp / "data" / "spool", live(datetime.now(UTC), seed=20)[0])
        post(sidecar, live(datetime.now(UTC), seed=10))
        seen(prom, "sum(draftwatch_requests_total) > 500", "the first live records")
        post(sidecar, live(datetime.now(UTC), seed=12))
        seen(prom, "sum(draftwatch_requests_total) >= 600", "the second live records")
        # Every health check active: failures, stale drift runs, dead letters, the old spool segment, the scrape,
        # a workload routed to plain, a rollout's step and kept workload, another's promotion.
        seen(prom, "count(draftwatch_health_signal == 1) == 9", "every health check active")
        yield prom
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        if stuck is not None:
            stuck.close()


def route_a_workload_to_plain(db_url: str) -> None:
    """A switch as the scheduler writes it under proxy.on_net_loss = route (monitor/proxy/decide.py)."""
    engine = create_engine(db_url)
    event = RoutingEvent(datetime.now(UTC), "qa", "qwen-coder-1.5b", True, "net loss established", 0.45, 0.38, 0.53)
    with engine.begin() as conn:
        record_switch(conn, event)
    engine.dispose()


def stage_rollouts(db_url: str) -> None:
    """Two rollouts as the scheduler's rollout job leaves them (monitor/proxy/rollout.py): on the default
    deployment one at its second step that kept workload qa on the current drafter, judged on code; on
    qwen* one promoted."""
    engine = create_engine(db_url)
    now = datetime.now(UTC)
    code = {"outcome": "pass", "score": 100, "reason": "decode_speed pass: 1.20x [1.10, 1.30]", "n_candidate": 40,
            "n_current": 40, "metrics": [{"metric": "decode_speed", "outcome": "pass", "candidate": 8.0,
                                          "current": 9.6, "ratio": 1.2, "ci": [1.1, 1.3]}]}  # fmt: skip
    judgement = {"interval": [now.isoformat(), now.isoformat()], "workloads": {"code": code}, "judged": ["code"]}
    with engine.begin() as conn:
        running = insert_rollout(conn, Rollout("*", "eagle3-v2", (0.05, 0.25, 1.0), 1800.0, True, now, now))
        assert running.id is not None
        record_event(conn, RolloutEvent(running.id, now, "started", 0, 0.05, "started"))
        running = replace(running, workloads={"qa": "current"})
        kept = "qa kept on the current drafter (failed): decode_speed fail"
        record_event(conn, RolloutEvent(running.id, now, "kept", 0, 0.05, kept, "qa"))
        running = replace(running, step=1, judgement=judgement)
        record_event(conn, RolloutEvent(running.id, now, "advanced", 1, 0.25, "step 2 of 3: every judged workload "
                                        "passed (scores code 100)", judgement=judgement))  # fmt: skip
        save_rollout(conn, running)
        promoted = insert_rollout(conn, Rollout("qwen*", "ngram", (0.5, 1.0), 1800.0, False, now, now,
                                                status="promoted", step=1, reason="promoted: code 100"))  # fmt: skip
        assert promoted.id is not None
        record_event(conn, RolloutEvent(promoted.id, now, "promoted", 1, 1.0, promoted.reason))
    engine.dispose()


def alert_states(prometheus: Prometheus) -> dict[str, str]:
    rules = [rule for group in prometheus.get("/api/v1/rules")["groups"] for rule in group["rules"]]
    return {rule["name"]: rule["state"] for rule in rules if rule["type"] == "alerting"}


def test_every_dashboard_expression_returns_data(prometheus: Prometheus) -> None:
    values = variable_values(prometheus)
    queries = dashboard_queries()
    assert len(queries) >= 20
    empty = [(title, expr) for title, expr in queries if not prometheus.query(substitute(expr, values))]
    assert empty == []


def test_every_rule_expression_returns_data_and_every_alert_is_active(prometheus: Prometheus) -> None:
    queries = rule_queries()
    empty = [name for name, expr in queries if not prometheus.query(expr)]
    assert empty == []
    groups = prometheus.get("/api/v1/rules")["groups"]
    loaded = {rule["name"]: rule for group in groups for rule in group["rules"]}
    assert set(loaded) == {name for name, _ in queries}
    assert [name for name, rule in loaded.items() if rule["health"] != "ok"] == []
    # The drift rules wait for 5m (pending); the scheduler and dead-letter rules fire at once.
    expected = {
        "acceptance_drop": "pending",
        "latency_regression": "pending",
        "net_loss": "pending",
        "traffic_mix_shift": "pending",
        "recorder_spooling": "pending",
        "scheduler": "firing",
        "webhook_dead_letters": "firing",
        "scrape_target_down": "firing",
        "routing_changed": "firing",
        "rollout_advanced": "firing",
        "rollout_rolled_back": "firing",
        "rollout_promoted": "firing",
    }
    deadline = time.monotonic() + 10  # the rules are evaluated every second
    while (states := alert_states(prometheus)) != expected and time.monotonic() < deadline:
        time.sleep(0.25)
    assert states == expected
    acceptance = prometheus.query("ALERTS{alertname='acceptance_drop'}")
    assert [a["metric"]["workload"] for a in acceptance] == ["code"]


def test_the_alerts_are_the_default_rules() -> None:
    alerts = alerting_rules()
    assert {name: rule["labels"]["severity"] for name, rule in alerts.items()} == {
        rule.name: rule.severity for rule in DEFAULT_RULES
    }


def test_the_drift_alerts_read_the_tests_their_default_rules_read() -> None:
    """A drift test missing from an alert's matcher is a drop that Prometheus never alerts on."""
    alerts = alerting_rules()
    for rule in DEFAULT_RULES:
        if rule.source != "drift":
            continue
        (matcher,) = re.findall(r'test=~?"([^"]+)"', alerts[rule.name]["expr"])
        assert set(matcher.split("|")) == set(rule.tests), rule.name


def test_the_docs_count_the_rules() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    alerts = sum("alert" in rule for group in groups for rule in group["rules"])
    recorded = sum("record" in rule for group in groups for rule in group["rules"])
    assert alerts == len(DEFAULT_RULES)
    words = {3: "three", 5: "five", 8: "eight", 9: "nine", 12: "twelve"}
    for doc, text in (
        ("rule file", RULES.read_text().split("groups:", 1)[0]),
        ("api.md", (ROOT / "docs/api.md").read_text()),
    ):
        flat = " ".join(text.replace("#", " ").split()).lower()
        assert f"{words[alerts]} default" in flat and f"{words[recorded]} recording rules" in flat, doc
    # docs/alerts.md names every default rule in its overview.
    overview = " ".join((ROOT / "docs/alerts.md").read_text().split())
    listed = overview.split("through rules (defaults: ", 1)[1].split(")", 1)[0]
    assert len(listed.split(",")) == len(DEFAULT_RULES), listed


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [binary("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_promtool_unit_tests_every_alert_firing_and_not() -> None:
    cases = [case for test in yaml.safe_load(RULE_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    for alert in alerting_rules():
        expected = [case["exp_alerts"] for case in cases if case["alertname"] == alert]
        assert [] in expected and any(expected), f"{alert}: the unit tests need a case that fires and one that does not"
    done = subprocess.run(
        [binary("promtool"), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_the_dashboard_imports_as_is() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert dashboard["id"] is None and dashboard["uid"] and dashboard["schemaVersion"] >= 36
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        for item in (panel, *panel["targets"]):
            assert item["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
