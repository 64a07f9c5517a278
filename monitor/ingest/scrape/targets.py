"""The ``[[scrape]]`` targets: which engine's ``/metrics`` to read, how often, and what to call its series.

>>> (t,) = parse_targets('[{"url": "http://10.0.0.5:8000/metrics", "kind": "vllm", "workload": "chat"}]')
>>> t.name, t.interval.total_seconds(), t.workload, t.drafter
('10.0.0.5:8000', 30.0, 'chat', 'vllm-spec')
>>> parse_targets([{"url": "http://h/metrics", "kind": "tgi"}])
Traceback (most recent call last):
...
ValueError: scrape target 1: kind 'tgi': expected one of vllm, llamacpp, sglang

An engine behind authentication takes ``authorization`` (the header's whole value) or
``bearer_token``; the value is sent to that target only and never shown:

>>> (t,) = parse_targets([{"url": "http://h/metrics", "kind": "vllm", "bearer_token": "s3cret"}])
>>> t.authorization
Secret('***')
>>> t.headers["Authorization"] == "Bearer s3cret"
True
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final
from urllib.parse import urlsplit

from decoder.record import WORKLOAD_PATTERN
from monitor.ingest.scrape.engines import KINDS, Kind
from monitor.settings.parsers import parse_duration, parse_seconds, parse_tables

_KEYS: Final = {
    "url",
    "kind",
    "name",
    "interval",
    "workload",
    "target_model",
    "drafter",
    "timeout_s",
    "authorization",
    "bearer_token",
}
DEFAULT_INTERVAL: Final = timedelta(seconds=30)
# Prometheus' habit: the default timeout is this or the interval, whichever is shorter.
DEFAULT_TIMEOUT_S: Final = 5.0


class Secret:
    """A credential that shows as ``***`` wherever it is printed, logged, compared in a test or copied.

    Not a dataclass, so that :func:`dataclasses.asdict` of a target copies it masked rather than
    turning it into a dict that holds the value.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash(Secret)


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    """One engine's metrics endpoint; its series are named ``workload`` and ``target_model`` (else its model)."""

    name: str
    url: str
    kind: Kind
    interval: timedelta = DEFAULT_INTERVAL
    workload: str = "default"
    # None: the series' own model_name label (vLLM, SGLang), else the target's name.
    target_model: str | None = None
    drafter: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S
    # The Authorization header's value, sent with this target's scrapes only.
    authorization: Secret | None = None

    @property
    def headers(self) -> dict[str, str]:
        """The scrape request's headers: the exposition, and the target's own credential if it has one."""
        headers = {"Accept": "text/plain"}
        if self.authorization is not None:
            headers["Authorization"] = self.authorization.reveal()
        return headers

    @property
    def safe_url(self) -> str:
        """Scheme, host and path: a metrics URL carries no credential except in its user part or query."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


def parse_targets(raw: Any) -> tuple[ScrapeTarget, ...]:
    """Targets from a JSON string (environment) or a list of tables (TOML ``[[scrape]]``)."""
    tables = parse_tables(raw, "{url, kind, ...} tables")
    targets = [_target(number, entry) for number, entry in enumerate(tables, start=1)]
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise ValueError(f"scrape targets need distinct names (give each a name): {sorted(names)}")
    return tuple(targets)


def _target(number: int, entry: Any) -> ScrapeTarget:
    where = f"scrape target {number}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a table with url and kind")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})")
    url = entry.get("url")
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{where}: url: expected an http(s) URL of a /metrics endpoint")
    kind = entry.get("kind")
    if kind not in KINDS:
        raise ValueError(f"{where}: kind {kind!r}: expected one of {', '.join(KINDS)}")
    workload = entry.get("workload", "default")
    if not isinstance(workload, str) or not WORKLOAD_PATTERN.fullmatch(workload):
        raise ValueError(f"{where}: workload {workload!r}: expected a workload tag (letters, digits, . _ -)")
    texts = {key: entry.get(key) for key in ("name", "target_model", "drafter")}
    for key, value in texts.items():
        if value is not None and (not isinstance(value, str) or not value.strip() or len(value) > 128):
            raise ValueError(f"{where}: {key}: expected a non-empty string of at most 128 characters")
    try:
        interval = parse_duration(entry.get("interval", "30s"))
        timeout = parse_seconds(entry["timeout_s"]) if "timeout_s" in entry else None
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    if timeout is None:
        # A short interval shortens the default timeout rather than refusing the target.
        timeout = min(DEFAULT_TIMEOUT_S, interval.total_seconds())
    elif timeout <= 0:
        raise ValueError(f"{where}: timeout_s {timeout:g}: expected more than 0")
    elif timeout > interval.total_seconds():
        raise ValueError(
            f"{where}: timeout_s {timeout:g} is longer than the interval ({interval.total_seconds():g} s): "
            "expected at most the interval"
        )
    authorization = _authorization(where, entry, parts.username is not None)
    return ScrapeTarget(
        name=texts["name"] or parts.netloc.rpartition("@")[2],
        url=url,  # type: ignore[arg-type]
        kind=kind,
        interval=interval,
        workload=workload,
        target_model=texts["target_model"],
        drafter=texts["drafter"] or f"{kind}-spec",
        timeout_s=timeout,
        authorization=authorization,
    )


def _authorization(where: str, entry: dict[str, Any], url_has_user: bool) -> Secret | None:
    """The header's value from ``authorization`` or ``bearer_token``; errors never quote it."""
    given = [key for key in ("authorization", "bearer_token") if key in entry]
    if not given:
        return None
    if len(given) > 1:
        raise ValueError(f"{where}: give authorization or bearer_token, not both")
    if url_has_user:
        # httpx would send the URL's user part as Basic auth in place of the configured header.
        raise ValueError(f"{where}: {given[0]}: the url carries a user part too; give one credential")
    value = entry[given[0]]
    # A line break would let the value add headers of its own to the request.
    if not isinstance(value, str) or not value.strip() or value != value.strip() or any(c in value for c in "\r\n\0"):
        raise ValueError(f"{where}: {given[0]}: expected a non-empty string on one line (value not shown)")
    if given[0] == "bearer_token":
        if any(c.isspace() for c in value):
            raise ValueError(f"{where}: bearer_token: expected the token alone, without spaces (value not shown)")
        value = f"Bearer {value}"
    return Secret(value)
