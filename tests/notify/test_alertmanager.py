"""Alertmanager as a receiver (format ``alertmanager-api``): the body is the API's ``postableAlerts``, the
outbox mirrors alert state for it (every firing alert on every evaluation, each resolution, whatever
draftwatch's silences and acknowledgements say), and a real Alertmanager (Debian's
``prometheus-alertmanager``, started per test on a free loopback port) shows what the real pipeline
posts: the alert with its labels and annotations, kept active past its first ``endsAt`` by a re-post,
and gone once draftwatch resolves it. Without the binary those tests skip, except under CI=true."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from monitor.alerts.evaluate import evaluate_alerts, evaluate_signals
from monitor.alerts.queries import acknowledge, list_alerts
from monitor.alerts.silences import create_silence
from monitor.notify.delivery import deliver_pending
from monitor.notify.formats import AlertView, render
from monitor.notify.models import NotificationRow
from monitor.notify.receivers import EXPIRES_AFTER, WebhookReceiver, parse_webhooks
from tests.alerting import Receiver, make_settings, minutes, result

BINARY: Final = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
# One route to a receiver that sends nothing: the tests read Alertmanager's alert store, not its notifications.
CONFIG: Final = 'route:\n  receiver: "null"\nreceivers:\n  - name: "null"\n'
EXPIRES: Final = timedelta(seconds=4)
PAIR: Final = "qwen-1.5b/model/qwen-0.5b"


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _close(a: datetime, b: datetime) -> bool:
    return abs(a - b) < timedelta(milliseconds=2)  # Alertmanager answers in milliseconds


def test_body_is_alertmanagers_postable_alerts() -> None:
    am = WebhookReceiver("am", "http://am.internal:9093/", "alertmanager-api")
    labels = {"alertname": "acceptance_drop", "severity": "warning", "workload": "code", "pair": PAIR}
    notes = {"summary": "acceptance rate dropped", "description": "acceptance: drift, effect -0.2"}
    start, now = datetime(2026, 3, 1, 12, 5, tzinfo=UTC), datetime(2026, 3, 1, 12, 30, tzinfo=UTC)
    firing = AlertView(7, "3f2a9c0d1e4b5a69", "acceptance_drop", "warning", "firing", labels, notes, start, None, -0.2)
    done = AlertView(8, "0c1d", "acceptance_drop", "warning", "resolved", labels, notes, start, now, -0.2)
    body = json.loads(render(am, "msg_1", {"workload": "code"}, [firing, done], "http://127.0.0.1:8321", now))
    expected = {
        "labels": {"alertname": "acceptance_drop", "pair": PAIR, "severity": "warning", "source": "draftwatch",
                   "workload": "code"},
        "annotations": {"description": "acceptance: drift, effect -0.2", "summary": "acceptance rate dropped"},
        "startsAt": "2026-03-01T12:05:00.000000Z",
        "endsAt": "2026-03-01T12:50:00.000000Z",  # now + expires_after (20m)
        "generatorURL": "http://127.0.0.1:8321/v1/alerts?id=7",
    }  # fmt: skip
    resolved = {
        **expected,
        "endsAt": "2026-03-01T12:30:00.000000Z",
        "generatorURL": "http://127.0.0.1:8321/v1/alerts?id=8",
    }
    assert body == [expected, resolved]  # a list of postableAlert: exactly these five fields
    assert am.endpoint == "http://am.internal:9093/api/v2/alerts" and am.expires_after == EXPIRES_AFTER


def test_config_of_an_alertmanager_receiver() -> None:
    (am,) = parse_webhooks([{"url": "https://am.internal/prefix", "format": "alertmanager-api", "expires_after": "1h"}])
    assert (am.name, am.endpoint, am.expires_after) == ("alertmanager-api-1", "https://am.internal/prefix/api/v2/alerts",
                                                        timedelta(hours=1))  # fmt: skip
    (hook,) = parse_webhooks([{"url": "https://hooks.internal/x/api", "format": "alertmanager"}])
    assert hook.endpoint == "https://hooks.internal/x/api" and not hook.mirrors_state
    with pytest.raises(ValueError, match="expires_after applies to format alertmanager-api only"):
        parse_webhooks([{"url": "https://hooks.internal/x", "format": "json", "expires_after": "1h"}])
    with pytest.raises(ValueError, match="webhook 1: expires_after: expected a duration"):
        parse_webhooks([{"url": "https://am.internal", "format": "alertmanager-api", "expires_after": "soon"}])
    with pytest.raises(ValueError, match="takes no secret"):
        parse_webhooks([{"url": "https://am.internal", "format": "alertmanager-api", "secret": "whsec_" + "A" * 24}])


def _outbox(engine: Engine, receiver: str) -> list[tuple[datetime, Any]]:
    query = select(NotificationRow.created_at, NotificationRow.body).where(NotificationRow.receiver == receiver)
    with engine.connect() as conn:
        return [(r.created_at, json.loads(r.body)) for r in conn.execute(query.order_by(NotificationRow.id))]


def test_every_firing_alert_is_posted_on_every_evaluation_silenced_or_not(engine: Engine, tmp_path: Path) -> None:
    hooks = [{"url": "http://127.0.0.1:9", "format": "alertmanager-api", "name": "am"},
             {"url": "http://127.0.0.1:9/hook", "format": "json", "name": "hook"}]  # fmt: skip
    settings = make_settings(tmp_path, _url(engine), hooks)
    config = settings.alert_config
    for i in range(2):  # pending at 0 (nothing posted), firing at 5
        evaluate_alerts(engine, config, [result("drift", -0.2)], now=minutes(5 * i))
    (alert,) = list_alerts(engine)
    # draftwatch's own suppression: an acknowledgement and a silence of the alert's workload.
    assert acknowledge(engine, alert.id, "ada", "looking", minutes(6)) is not None
    workload = [{"name": "workload", "value": "code"}]
    create_silence(engine, workload, minutes(6), minutes(90), "ada", "deploy in progress", minutes(6))
    evaluate_signals(engine, config, "health", [], now=minutes(7))  # the health job visits every firing alert
    for i in range(2, 5):
        evaluate_alerts(engine, config, [result("drift", -0.2)], now=minutes(5 * i))
    for i in range(5, 8):  # still firing at 25 (one clear run of two), resolved at 30, then nothing
        evaluate_alerts(engine, config, [result("no_drift", 0.0)], now=minutes(5 * i))
    posts = _outbox(engine, "am")
    assert [created for created, _ in posts] == [minutes(m) for m in (5, 7, 10, 15, 20, 25, 30)]
    for created, body in posts[:-1]:
        (posted,) = body
        assert _time(posted["endsAt"]) == created + EXPIRES_AFTER and _time(posted["startsAt"]) == minutes(5)
    (last,) = posts[-1][1]
    assert _time(last["endsAt"]) == minutes(30) and last["labels"]["source"] == "draftwatch"
    # The webhook got what the state machine decided: the firing, then (silenced or not) the resolved notice.
    assert [body["status"] for _, body in _outbox(engine, "hook")] == ["firing", "resolved"]


@dataclass(frozen=True)
class Alertmanager:
    url: str

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def alerts(self) -> list[dict[str, Any]]:
        """Alertmanager's alerts from draftwatch; it never lists one whose ``endsAt`` has passed."""
        response = httpx.get(f"{self.url}/api/v2/alerts", params={"filter": 'source="draftwatch"'}, timeout=5)
        response.raise_for_status()
        alerts: list[dict[str, Any]] = response.json()
        return alerts

    def received(self) -> dict[str, float]:
        """Alerts its v2 API took, by the status they had on arrival (``firing``, ``resolved``), and ``invalid``."""
        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        counts = {m[1]: float(m[2]) for m in re.finditer(
            r'^alertmanager_alerts_received_total\{status="(\w+)",version="v2"\} (\S+)$', text, re.M)}  # fmt: skip
        invalid = re.search(r'^alertmanager_alerts_invalid_total\{version="v2"\} (\S+)$', text, re.M)
        return counts | {"invalid": float(invalid[1]) if invalid else -1.0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    if BINARY is None:
        reason = "prometheus-alertmanager is not installed (scripts/ensure-prometheus.sh installs it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; it is required under CI=true")
        pytest.skip(reason)
    (tmp_path / "alertmanager.yml").write_text(CONFIG)
    port = _free_port()
    log_path = tmp_path / "alertmanager.log"
    args = [BINARY, f"--config.file={tmp_path / 'alertmanager.yml'}", f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn"]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    am = Alertmanager(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 15
        while not am.ready():
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Alertmanager did not start on port {port}: {log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        yield am
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _sleep_until(when: datetime) -> None:
    time.sleep(max(0.0, (when - datetime.now(UTC)).total_seconds()))


def test_real_alertmanager_shows_the_alert_keeps_it_by_reposts_and_resolves_it(
    engine: Engine, tmp_path: Path, alertmanager: Alertmanager, receiver: Receiver
) -> None:
    hooks = [{"url": alertmanager.url, "format": "alertmanager-api", "name": "am",
              "expires_after": f"{EXPIRES.total_seconds():g}s"},
             {"url": receiver.url, "format": "json", "name": "hook"}]  # fmt: skip
    settings = make_settings(tmp_path, _url(engine), hooks)

    def evaluate(decision: str, effect: float) -> datetime:
        """One evaluation now through the real pipeline, then one delivery pass; returns its time."""
        now = datetime.now(UTC)
        evaluate_alerts(engine, settings.alert_config, [result(decision, effect)], now=now)
        report = deliver_pending(engine, settings.delivery)
        assert (report.dead, report.retried, report.waiting) == (0, 0, 0)
        return now

    evaluate("drift", -0.2)  # pending: nothing for anyone
    assert alertmanager.alerts() == []
    fired = evaluate("drift", -0.2)
    (ours,) = list_alerts(engine)
    (alert,) = alertmanager.alerts()
    assert alert["labels"] == {**ours.labels, "source": "draftwatch"}
    assert {"alertname": "acceptance_drop", "severity": "warning", "workload": "code", "pair": PAIR,
            "metric": "acceptance_rate"}.items() <= alert["labels"].items()  # fmt: skip
    assert alert["annotations"] == ours.annotations and set(ours.annotations) == {"summary", "description"}
    assert "acceptance: drift" in alert["annotations"]["description"]
    assert alert["status"]["state"] == "active" and alert["receivers"] == [{"name": "null"}]
    assert _close(_time(alert["startsAt"]), fired) and _close(_time(alert["endsAt"]), fired + EXPIRES)
    assert alert["generatorURL"] == f"{settings.api.url}/v1/alerts?id={ours.id}"

    time.sleep(EXPIRES.total_seconds() / 2)
    reposted = evaluate("drift", -0.2)  # still firing: the webhook hears nothing, Alertmanager gets it again
    _sleep_until(fired + EXPIRES + timedelta(seconds=0.3))
    (alert,) = alertmanager.alerts()  # past the first post's endsAt, only the re-post keeps it listed
    assert alert["status"]["state"] == "active" and _close(_time(alert["endsAt"]), reposted + EXPIRES)
    assert _close(_time(alert["startsAt"]), fired)

    clearing = evaluate("no_drift", 0.0)  # one clear run of two: still firing, posted again
    evaluate("no_drift", 0.0)  # resolved: endsAt = now
    assert alertmanager.alerts() == []
    # Before the last firing post's endsAt: the resolution took the alert away, not its expiry.
    assert datetime.now(UTC) < clearing + EXPIRES
    assert alertmanager.received() == {"firing": 3.0, "resolved": 1.0, "invalid": 0.0}
    assert [json.loads(body)["status"] for _, _, body in receiver.seen] == ["firing", "resolved"]
