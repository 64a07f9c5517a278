"""What each replica says about itself, for the causes of a drop: its build, when it started, its KV-cache use.

A watcher reads every pool member every ``proxy.engine_watch_s`` (0: never), apart from the proxied
traffic (its failures never count towards a member's health), and each proxied request's record
carries what was last read of its replica (:meth:`EngineState.fields`). Never invented: a figure the
engine does not give stays empty.

* **Version**: llama.cpp ``GET /props`` (``build_info``, e.g. ``b11434-unknown``), vLLM ``GET /version``
  (``version``), SGLang ``GET /get_server_info`` (``version``): the configured stack's first (with
  ``proxy.kind = auto`` the one the member's answers were read as), then the others until one answers;
  the one that answered is asked first from then on.
* **Start**: ``process_start_time_seconds`` of the replica's ``/metrics`` (prometheus_client's process
  collector, which vLLM and SGLang expose; ``uptime_from = process``); where it is absent (llama.cpp),
  the first time this sidecar read the replica (``first_sight``), taken again after the replica stopped
  answering or changed its version: a restart, as far as the sidecar can tell.
* **KV-cache use** (a fraction, 0-1): vLLM ``vllm:kv_cache_usage_perc`` (the mean over its engines),
  SGLang ``sglang:token_usage``. llama.cpp's ``/metrics`` has no such gauge (build 11434): empty.

A request's figures are those of the last read, at most one interval old: KV use "when the request
started" to within ``proxy.engine_watch_s``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterable, Mapping
from typing import Final

import httpx

from monitor.ingest.scrape.exposition import ExpositionError, parse
from monitor.proxy.pool import Member

log = logging.getLogger(__name__)

# Per stack: the endpoint that names its build, and the member of its JSON answer that does.
VERSIONS: Final[Mapping[str, tuple[str, str]]] = {
    "llamacpp": ("/props", "build_info"),
    "vllm": ("/version", "version"),
    "sglang": ("/get_server_info", "version"),
}
KV_GAUGES: Final = ("vllm:kv_cache_usage_perc", "sglang:token_usage")
PROCESS_START: Final = "process_start_time_seconds"
MAX_VERSION_CHARS: Final = 64
TIMEOUT_S: Final = 5.0


async def read_member(client: httpx.AsyncClient, member: Member, kind: str, now: float) -> bool:
    """Read one member's version and /metrics into ``member.engine``; False when it answered neither."""
    base = member.upstream.url.rstrip("/")
    stack = kind if kind != "auto" else member.stack
    # The endpoint that answered last, then the stack's, then the others: SGLang's OpenAI answers read as
    # vLLM's, and only its own endpoint names it.
    order = sorted(VERSIONS, key=lambda name: (name != member.engine.version_from, name != stack))
    version = None
    for name in order:
        version = await _version(client, base, name)
        if version is not None:
            member.engine.version_from = name
            break
    start, kv_use, metrics = await _metrics(client, base)
    if version is None and not metrics:
        member.engine.lost()
        return False
    member.engine.update(version, start, kv_use, now)
    return True


async def _version(client: httpx.AsyncClient, base: str, stack: str) -> str | None:
    path, key = VERSIONS[stack]
    try:
        response = await client.get(base + path)
        value = response.json().get(key) if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return value[:MAX_VERSION_CHARS] if isinstance(value, str) and value.strip() else None


async def _metrics(client: httpx.AsyncClient, base: str) -> tuple[float | None, float | None, bool]:
    """The process start and KV-cache use /metrics gives (each None where absent), and whether it answered."""
    try:
        response = await client.get(base + "/metrics")
        if response.status_code != 200:
            return None, None, False
        samples = parse(response.text)
    except (httpx.HTTPError, ExpositionError, UnicodeDecodeError):
        return None, None, False
    starts = [s.value for s in samples if s.name == PROCESS_START and math.isfinite(s.value) and s.value > 0]
    kv = [s.value for s in samples if s.name in KV_GAUGES and math.isfinite(s.value) and 0 <= s.value <= 1]
    return (min(starts) if starts else None), (sum(kv) / len(kv) if kv else None), True


async def watch(members: Iterable[tuple[Member, str]], interval_s: float) -> None:
    """Read every (member, configured kind) now and every ``interval_s`` after, until cancelled."""
    pairs = list(members)
    async with httpx.AsyncClient(timeout=TIMEOUT_S, follow_redirects=False) as client:
        while True:
            now = time.time()
            answered = await asyncio.gather(*(read_member(client, m, kind, now) for m, kind in pairs),
                                            return_exceptions=True)  # fmt: skip
            for (member, _), ok in zip(pairs, answered, strict=True):
                if isinstance(ok, Exception):  # never the end of the watch: the next read may go better
                    member.engine.lost()
                    log.warning("engine watch: reading %s failed: %s", member.upstream.netloc, type(ok).__name__)
                elif not ok:
                    log.debug("engine watch: %s answered neither its version nor /metrics", member.upstream.netloc)
            await asyncio.sleep(interval_s)
