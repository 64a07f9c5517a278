"""Webhook receivers as configured: URL, format, optional Standard Webhooks secret, name.

Parsed from ``[[webhooks]]`` TOML tables or the ``DRAFTWATCH_WEBHOOKS`` JSON list. URLs are
``http`` or ``https`` only; the repr and every error message leave the URL's path, query and the
secret out, because Slack-style URLs carry their credential in the path.

Format ``alertmanager-api`` is not a webhook but Alertmanager itself: its ``url`` is Alertmanager's
base URL, alerts are posted to ``{url}/api/v2/alerts``, and it *mirrors state* (every firing alert
on every evaluation, with ``endsAt`` ``expires_after`` ahead, and each resolution), because
Alertmanager resolves an alert nobody re-posts and silences, groups and repeats by itself.

>>> r = parse_webhooks('[{"url": "https://hooks.example.com/T0/B0/xyz", "format": "slack"}]')
>>> r[0].name, r[0].format, r[0].host, r[0]
('slack-1', 'slack', 'hooks.example.com', WebhookReceiver(name='slack-1', format='slack', url='https://hooks.example.com/***'))
>>> parse_webhooks([{"url": "ftp://x/y"}])
Traceback (most recent call last):
...
ValueError: webhook 1: url must be http:// or https:// with a host
>>> (am,) = parse_webhooks([{"url": "http://am.internal:9093/", "format": "alertmanager-api", "expires_after": "30m"}])
>>> am.name, am.endpoint, am.mirrors_state, am.expires_after
('alertmanager-api-1', 'http://am.internal:9093/api/v2/alerts', True, datetime.timedelta(seconds=1800))
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final
from urllib.parse import urlsplit

from monitor.settings.parsers import parse_duration, parse_tables

ALERTMANAGER_API: Final = "alertmanager-api"
FORMATS: Final = ("alertmanager", ALERTMANAGER_API, "slack", "json")
SECRET_PREFIX: Final = "whsec_"
# Four drift intervals (scheduler.drift_interval, 5m), as Prometheus sends four evaluation intervals:
# an alert survives three missed evaluations, and the health job (1m) re-posts far more often.
EXPIRES_AFTER: Final = timedelta(minutes=20)
_KEYS: Final = {"url", "format", "secret", "name", "expires_after"}


@dataclass(frozen=True, slots=True)
class WebhookReceiver:
    """One receiver; ``secret`` is the raw HMAC key (decoded from ``whsec_...``), or None (unsigned)."""

    name: str
    url: str
    format: str = "alertmanager"
    secret: bytes | None = None
    expires_after: timedelta = EXPIRES_AFTER

    @property
    def mirrors_state(self) -> bool:
        """Whether the receiver keeps alert state itself (Alertmanager's API) rather than taking notices."""
        return self.format == ALERTMANAGER_API

    @property
    def endpoint(self) -> str:
        """Where requests go: Alertmanager's alerts API under its base URL, else the URL as configured."""
        return self.url.rstrip("/") + "/api/v2/alerts" if self.mirrors_state else self.url

    @property
    def host(self) -> str:
        return (urlsplit(self.url).hostname or "").lower()

    @property
    def safe_url(self) -> str:
        """Scheme and host only: what logs and errors may show."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/***"

    def __repr__(self) -> str:
        return f"WebhookReceiver(name={self.name!r}, format={self.format!r}, url={self.safe_url!r})"


def decode_secret(raw: str) -> bytes:
    """The key of a ``whsec_<base64>`` secret (the prefix is optional); at least 16 bytes.

    >>> len(decode_secret("whsec_" + base64.b64encode(bytes(24)).decode()))
    24
    """
    text = raw.strip()
    text = text[len(SECRET_PREFIX) :] if text.startswith(SECRET_PREFIX) else text
    try:
        key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("secret must be whsec_ followed by base64") from None
    if len(key) < 16:
        raise ValueError("secret must decode to at least 16 bytes")
    return key


def parse_webhooks(raw: Any) -> tuple[WebhookReceiver, ...]:
    """Receivers from a JSON string (environment) or a list of tables (TOML)."""
    receivers: list[WebhookReceiver] = []
    for number, entry in enumerate(parse_tables(raw, "{url, format, secret} tables"), start=1):
        if not isinstance(entry, dict):
            raise ValueError(f"webhook {number}: expected a table with url, format, secret")
        unknown = sorted(set(entry) - _KEYS)
        if unknown:
            raise ValueError(f"webhook {number}: unknown key {unknown[0]!r}")
        url = entry.get("url")
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"webhook {number}: url must be http:// or https:// with a host")
        fmt = entry.get("format", "alertmanager")
        if fmt not in FORMATS:
            raise ValueError(f"webhook {number}: format must be one of {', '.join(FORMATS)}")
        secret = entry.get("secret")
        if secret is not None and not isinstance(secret, str):
            raise ValueError(f"webhook {number}: secret must be a string")
        if secret and fmt == ALERTMANAGER_API:
            # Alertmanager checks no signature: a secret would only look like protection.
            raise ValueError(f"webhook {number}: {ALERTMANAGER_API} takes no secret (Alertmanager checks none)")
        try:
            key = decode_secret(secret) if secret else None
            expires = _expires_after(entry, str(fmt))
        except ValueError as error:
            raise ValueError(f"webhook {number}: {error}") from None
        name = entry.get("name") or f"{fmt}-{number}"
        if not isinstance(name, str) or len(name) > 128:
            raise ValueError(f"webhook {number}: name must be a string of at most 128 characters")
        receivers.append(WebhookReceiver(name=name, url=str(url), format=str(fmt), secret=key, expires_after=expires))
    if len({r.name for r in receivers}) != len(receivers):
        raise ValueError("webhook names must be unique")
    return tuple(receivers)


def _expires_after(entry: dict[str, Any], fmt: str) -> timedelta:
    if "expires_after" not in entry:
        return EXPIRES_AFTER
    if fmt != ALERTMANAGER_API:
        raise ValueError(f"expires_after applies to format {ALERTMANAGER_API} only")
    try:
        return parse_duration(entry["expires_after"])
    except ValueError as error:
        raise ValueError(f"expires_after: {error}") from None


def parse_hosts(raw: Any) -> tuple[str, ...]:
    """An allow-list of host names: a comma-separated string or a list; empty allows every host.

    >>> parse_hosts("hooks.slack.com, Alerts.internal")
    ('hooks.slack.com', 'alerts.internal')
    """
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ValueError("expected host names, comma-separated or a list")
    return tuple(h.strip().lower() for h in items if h.strip())
