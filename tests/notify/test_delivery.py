"""Webhook delivery against real HTTP receivers: Standard Webhooks signatures checked with the official
``standardwebhooks`` package, the Alertmanager payload parsed, failures retried until every
notification arrives once per webhook-id and in order per alert."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine
from standardwebhooks.webhooks import Webhook

from monitor.alerts.evaluate import evaluate_alerts
from monitor.commands.main import main
from monitor.notify.delivery import deliver_pending
from monitor.notify.models import NotificationRow
from monitor.notify.receivers import parse_webhooks
from tests.alerting import SECRET, Receiver, make_settings, minutes, result


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def _fire(engine: Engine, settings: object, workload: str = "code", start: float = 0) -> None:
    for i in range(2):
        evaluate_alerts(engine, settings.alert_config, [result("drift", -0.2, workload)], now=minutes(start + 5 * i))  # type: ignore[arg-type]


def _resolve(engine: Engine, settings: object, workload: str = "code", start: float = 20) -> None:
    for i in range(2):
        evaluate_alerts(engine, settings.alert_config, [result("no_drift", 0.0, workload)], now=minutes(start + 5 * i))  # type: ignore[arg-type]


def test_signed_alertmanager_slack_and_json(engine: Engine, tmp_path: Path, receiver: Receiver) -> None:
    hooks = [
        {"url": receiver.url, "format": "alertmanager", "secret": SECRET, "name": "am"},
        {"url": receiver.url, "format": "slack", "name": "slack"},
        {"url": receiver.url, "format": "json", "secret": SECRET, "name": "own"},
    ]
    settings = make_settings(tmp_path, _url(engine), hooks)
    _fire(engine, settings)
    report = deliver_pending(engine, settings.delivery)
    assert (report.delivered, report.dead) == (3, 0)
    by_format: dict[str, tuple[dict[str, str], bytes]] = {}
    for _, headers, body in receiver.seen:
        doc = json.loads(body)
        kind = "am" if doc.get("version") == "4" else "slack" if "blocks" in doc else "own"
        by_format[kind] = (headers, body)
    verifier = Webhook(SECRET)
    am_headers, am_body = by_format["am"]
    payload = verifier.verify(am_body, am_headers)  # raises unless the signature is valid
    assert payload["version"] == "4" and payload["status"] == "firing" and payload["receiver"] == "am"
    assert payload["groupLabels"] == {"workload": "code"}
    (alert,) = payload["alerts"]
    assert alert["labels"]["alertname"] == "acceptance_drop" and alert["endsAt"] == "0001-01-01T00:00:00Z"
    assert {"startsAt", "generatorURL", "fingerprint", "annotations"} <= set(alert)
    assert verifier.verify(by_format["own"][1], by_format["own"][0])["alerts"][0]["status"] == "firing"
    with pytest.raises(Exception, match="signature|Signature"):
        tampered = by_format["am"][1].replace(b"firing", b"resolved")
        verifier.verify(tampered, am_headers)
    slack_headers, slack_body = by_format["slack"]
    assert "webhook-signature" not in slack_headers and "webhook-id" in slack_headers
    assert "FIRING" in json.loads(slack_body)["text"]


def test_receiver_outage_every_notification_arrives_once_in_order(
    engine: Engine, tmp_path: Path, receiver: Receiver
) -> None:
    settings = make_settings(tmp_path, _url(engine), [{"url": receiver.url, "secret": SECRET}],
                             DRAFTWATCH_DELIVERY_MAX_ATTEMPTS="50")  # fmt: skip
    # firing and resolved for "code", firing for "chat": three notifications, two groups.
    _fire(engine, settings, "code")
    _fire(engine, settings, "chat", start=1)
    _resolve(engine, settings, "code")
    # Phase 1: 500s and a 429; phase 2: timeouts (the receiver got them, the sender cannot know).
    receiver.script = [500, 500, 429, 503, "timeout", "timeout"]
    deadline = time.monotonic() + 30
    while receiver.script and time.monotonic() < deadline:
        deliver_pending(engine, settings.delivery)
        time.sleep(0.02)
    assert not receiver.script
    # Phase 3: connection refused.
    port = receiver.port
    receiver.stop()
    for _ in range(3):
        report = deliver_pending(engine, settings.delivery)
        assert report.delivered == 0
        time.sleep(0.06)
    # Phase 4: the receiver is back on the same port.
    receiver.port = port
    receiver.start()
    while time.monotonic() < deadline:
        deliver_pending(engine, settings.delivery)
        with engine.connect() as conn:
            statuses = conn.execute(select(NotificationRow.status)).scalars().all()
        if set(statuses) == {"delivered"}:
            break
        time.sleep(0.05)
    with engine.connect() as conn:
        rows = conn.execute(select(NotificationRow.notification_id, NotificationRow.status, NotificationRow.alerts,
                                   NotificationRow.attempts).order_by(NotificationRow.id)).all()  # fmt: skip
    assert [r.status for r in rows] == ["delivered"] * 3
    assert any(r.attempts > 1 for r in rows)
    assert set(receiver.processed) == {r.notification_id for r in rows}
    assert len(receiver.seen) > len(receiver.processed)  # retries happened, duplicates were dropped by id
    verifier = Webhook(SECRET)
    for webhook_id, headers, body in receiver.seen:
        assert verifier.verify(body, headers)["groupKey"]
        assert headers["webhook-id"] == webhook_id
    # Per alert, the receiver processed firing before resolved.
    order: dict[str, list[str]] = {}
    first_seen = list(dict.fromkeys(w for w, _, _ in receiver.seen))
    for webhook_id in first_seen:
        for alert in json.loads(receiver.processed[webhook_id])["alerts"]:
            order.setdefault(alert["fingerprint"], []).append(alert["status"])
    assert sorted(order.values()) == [["firing"], ["firing", "resolved"]]


def test_permanent_failures_and_limits_dead_letter(
    engine: Engine, tmp_path: Path, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(tmp_path, _url(engine), [{"url": receiver.url}], DRAFTWATCH_DELIVERY_MAX_ATTEMPTS="2")
    _fire(engine, settings)
    receiver.script = [404]
    assert deliver_pending(engine, settings.delivery).dead == 1  # 4xx other than 408/429: permanent at once
    _fire(engine, settings, "chat", start=1)
    receiver.script = [500, 500]
    deliver_pending(engine, settings.delivery)
    time.sleep(0.06)
    assert deliver_pending(engine, settings.delivery).dead == 1  # after max_attempts
    with engine.connect() as conn:
        errors = conn.execute(select(NotificationRow.last_error).where(NotificationRow.status == "dead")).scalars()
        assert sorted(errors) == ["HTTP 404", "gave up after 2 attempt(s): HTTP 500"]
    # An allow-list that does not name the receiver's host: dead, never sent.
    only = {"DRAFTWATCH_DELIVERY_ALLOWED_HOSTS": "hooks.example.com"}
    blocked = make_settings(tmp_path, _url(engine), [{"url": receiver.url}], **only)
    _resolve(engine, blocked, "code")
    seen = len(receiver.seen)
    with caplog.at_level(logging.WARNING):
        assert deliver_pending(engine, blocked.delivery).dead == 1 and len(receiver.seen) == seen
    (warning,) = [r.getMessage() for r in caplog.records if "host not allowed" in r.getMessage()]
    assert f"127.0.0.1:{receiver.port}" in warning and "/hook" not in warning  # the host, never the path


@pytest.fixture
def http_log_levels() -> Iterator[None]:
    """Give back the levels ``draftwatch``'s logging setup gives the HTTP client's loggers."""
    saved = {name: logging.getLogger(name).level for name in ("httpx", "httpcore")}
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.usefixtures("http_log_levels")
def test_info_logs_never_show_a_webhook_path(
    engine: Engine,
    tmp_path: Path,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A Slack URL's path is its credential; httpx logs each request's full URL at INFO.
    hooks = [{"url": f"http://127.0.0.1:{receiver.port}/services/T000/B000/path-secret-9c2", "format": "slack"}]
    env = {
        "HOME": str(tmp_path),
        "DRAFTWATCH_DATA_DIR": str(tmp_path / "data"),
        "DRAFTWATCH_DATABASE_URL": _url(engine),
    }
    for name, value in {**env, "DRAFTWATCH_WEBHOOKS": json.dumps(hooks)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DRAFTWATCH_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    _fire(engine, make_settings(tmp_path, _url(engine), hooks))
    with caplog.at_level(logging.INFO):
        assert main(["--log-level", "INFO", "alerts", "deliver"]) == 0
    assert len(receiver.seen) == 1
    assert "path-secret-9c2" not in caplog.text and "/services/" not in caplog.text


def test_config_refuses_bad_receivers_and_hides_secrets() -> None:
    with pytest.raises(ValueError, match="http:// or https://"):
        parse_webhooks([{"url": "file:///etc/passwd"}])
    with pytest.raises(ValueError, match="format must be"):
        parse_webhooks([{"url": "https://x.example/h", "format": "xml"}])
    (hook,) = parse_webhooks([{"url": "https://user:pw@hooks.example.com/services/T0/B0/secretpath", "secret": SECRET}])
    assert "secretpath" not in repr(hook) and "pw" not in repr(hook) and SECRET not in repr(hook)


def test_a_pass_with_nothing_to_deliver_makes_no_client(
    engine: Engine, tmp_path: Path, receiver: Receiver, counted_clients: list[httpx.Client]
) -> None:
    """A client loads the CA bundle: tens of milliseconds that hold the GIL away from a sidecar's event loop, every
    scheduler.delivery_interval. A pass makes one only for something to send (the real one, counted)."""
    made = counted_clients
    settings = make_settings(tmp_path, _url(engine), [{"url": receiver.url, "format": "json", "name": "own"}])
    assert deliver_pending(engine, settings.delivery).attempted == 0
    assert made == []
    _fire(engine, settings)
    assert deliver_pending(engine, settings.delivery).delivered == 1
    assert len(made) == 1 and made[0].is_closed
