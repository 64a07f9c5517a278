"""The ``[[scrape]]`` targets: which engine's ``/metrics`` to read, how often, and what to call its series.

>>> (t,) = parse_targets('[{"url": "http://10.0.0.5:8000/metrics", "kind": "vllm", "workload": "chat"}]')
>>> t.name, t.interval.total_seconds(), t.workload, t.drafter
('10.0.0.5:8000', 30.0, 'chat', 'vllm-spec')
>>> parse_targets([{"url": "http://h/metrics", "kind": "tgi"}])
Traceback (most recent call last):
...
ValueError: scrape target 1: kind 'tgi': expected one of vllm, llamacpp, sglang
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final
from urllib.parse import urlsplit

from decoder.record import WORKLOAD_PATTERN
from monitor.ingest.scrape.engines import KINDS, Kind
from monitor.settings.parsers import parse_duration, parse_seconds, parse_tables

_KEYS: Final = {"url", "kind", "name", "interval", "workload", "target_model", "drafter", "timeout_s"}
DEFAULT_INTERVAL: Final = timedelta(seconds=30)


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
    timeout_s: float = 5.0

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
        timeout = parse_seconds(entry.get("timeout_s", 5.0))
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    if timeout <= 0 or timeout >= interval.total_seconds():
        raise ValueError(f"{where}: timeout_s {timeout:g}: expected more than 0 and less than the interval")
    return ScrapeTarget(
        name=texts["name"] or parts.netloc.rpartition("@")[2],
        url=url,  # type: ignore[arg-type]
        kind=kind,
        interval=interval,
        workload=workload,
        target_model=texts["target_model"],
        drafter=texts["drafter"] or f"{kind}-spec",
        timeout_s=timeout,
    )
