"""Where notifications go (the webhook receivers) and how hard delivery tries."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from monitor.notify.receivers import WebhookReceiver, parse_hosts, parse_webhooks
from monitor.settings.fields import setting
from monitor.settings.parsers import parse_duration, parse_int, parse_seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliverySettings:
    receivers: tuple[WebhookReceiver, ...] = setting(
        "webhooks",
        parse_webhooks,
        (),
        "webhook receivers: [[webhooks]] tables (url, format alertmanager|alertmanager-api|slack|json, secret "
        "whsec_..., name, expires_after for alertmanager-api) or a JSON list of the same in the environment",
        secret=True,
    )
    allowed_hosts: tuple[str, ...] = setting(
        "delivery.allowed_hosts",
        parse_hosts,
        (),
        "hosts webhooks may be sent to, comma-separated; empty allows any",
    )
    timeout_s: float = setting(
        "delivery.timeout_s",
        parse_seconds,
        10.0,
        "timeout of one webhook request, connect and read",
    )
    max_attempts: int = setting(
        "delivery.max_attempts",
        parse_int(1),
        12,
        "attempts before a notification becomes a dead letter",
    )
    max_age: timedelta = setting(
        "delivery.max_age",
        parse_duration,
        timedelta(days=1),
        "age after which an undelivered notification becomes a dead letter",
    )
    backoff_base_s: float = setting(
        "delivery.backoff_base_s",
        parse_seconds,
        5.0,
        "first retry delay; doubles per attempt, with jitter",
    )
    backoff_max_s: float = setting(
        "delivery.backoff_max_s",
        parse_seconds,
        900.0,
        "longest retry delay, also the cap on a receiver's Retry-After",
    )
