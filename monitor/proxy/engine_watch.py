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
* **Drafter** (the record's ``draft_version``, so that a drafter changed on one replica reads as a
  version, not as that replica's health): SGLang's server arguments beside its version
  (``speculative_algorithm``, the draft model's name and revision, steps, top-k, draft tokens);
  llama.cpp ``GET /slots``, a speculating slot's ``speculative.types`` (``ngram-simple``, ``draft``, ...;
  known once a slot has served a request, and blind to the types' sizes, which build 11434 does not
  show); vLLM names its speculative configuration on no endpoint: empty.

A request's figures are those of the last read, at most one interval old: KV use "when the request
started" to within ``proxy.engine_watch_s``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

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
    version = drafter = None
    for name in order:
        path, key = VERSIONS[name]
        answer = await _json(client, base + path)
        version = _text(answer.get(key)) if isinstance(answer, dict) else None
        if version is not None:
            member.engine.version_from = name
            drafter = await _drafter(client, base, name, answer)
            break
    start, kv_use, metrics = await _metrics(client, base)
    if version is None and not metrics:
        member.engine.lost()
        return False
    member.engine.update(version, start, kv_use, now, drafter=drafter)
    return True


async def _json(client: httpx.AsyncClient, url: str) -> Any:
    """The JSON a GET of ``url`` answers with 200; None for anything else."""
    try:
        response = await client.get(url)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _text(value: Any) -> str | None:
    return value[:MAX_VERSION_CHARS] if isinstance(value, str) and value.strip() else None


async def _drafter(client: httpx.AsyncClient, base: str, stack: str, info: Mapping[str, Any]) -> str | None:
    """The drafter the replica runs, as its stack names it (``info``: the answer that named its version)."""
    if stack == "sglang":
        return sglang_drafter(info)
    if stack == "llamacpp":
        slots = await _json(client, base + "/slots")
        for slot in slots if isinstance(slots, list) else ():
            params = slot.get("params") if isinstance(slot, dict) and slot.get("speculative") else None
            types = params.get("speculative.types") if isinstance(params, dict) else None
            # Build 11434 lists its types after a "none": "none,ngram-simple".
            named = [t for t in types.split(",") if t.strip() not in ("", "none")] if isinstance(types, str) else []
            if named:
                return _text(",".join(named))
    return None


def sglang_drafter(info: Mapping[str, Any]) -> str | None:
    """SGLang's speculative server arguments in one value; None where it does not speculate.

    >>> sglang_drafter({"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/m/eagle3-llama",
    ...                 "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4})
    'EAGLE3 eagle3-llama steps=3 topk=1 draft=4'
    >>> sglang_drafter({"speculative_algorithm": None}) is None
    True
    """
    algorithm = info.get("speculative_algorithm")
    if not isinstance(algorithm, str) or not algorithm:
        return None
    path, revision = info.get("speculative_draft_model_path"), info.get("speculative_draft_model_revision")
    parts = [algorithm]
    if isinstance(path, str) and path:
        name = path.rstrip("/").rsplit("/", 1)[-1]
        pinned = isinstance(revision, str) and revision not in ("", "main")
        parts.append(f"{name}@{revision}" if pinned else name)
    for key, name in (("speculative_num_steps", "steps"), ("speculative_eagle_topk", "topk"),
                      ("speculative_num_draft_tokens", "draft")):  # fmt: skip
        if isinstance(info.get(key), int):
            parts.append(f"{name}={info[key]}")
    return _text(" ".join(parts))


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
