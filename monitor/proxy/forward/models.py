"""``GET /v1/models`` with several deployments (``[[proxy.routes]]``): one list, merged from each of them.

A client that asks the proxy which models it serves should see every model it can route, not only
the default deployment's. Each deployment's speculative pool is asked once (its healthiest
replica, as a request would be; a plain baseline serves the same models); the ``data`` lists are
joined by ``id``, the first deployment that names a model wins, in route order with the default
last, and the answer is OpenAI's list shape. A deployment that fails is skipped and logged; when
all do, the caller answers 502. With one deployment the route is a pass-through, byte for byte.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any, Final

from monitor.proxy.encoding import decoded
from monitor.proxy.routing import Deployment
from monitor.proxy.upstream import Headers, UpstreamError, UpstreamResponse

log = logging.getLogger(__name__)

MODELS_PATH: Final = b"/v1/models"
# The lists are read here: asked uncompressed (an upstream that compresses anyway is decoded).
_IDENTITY: Final = (b"accept-encoding", b"identity")


async def merged_models(deployments: Sequence[Deployment], headers: Headers, limit: int) -> dict[str, Any] | None:
    """The union of every deployment's model list by ``id`` (first wins); None when no deployment answered."""
    sent = [(k, v) for k, v in headers if k.lower() != b"accept-encoding"] + [_IDENTITY]
    answers = await asyncio.gather(*(_models_of(d, sent, limit) for d in deployments))
    if all(answer is None for answer in answers):
        return None
    merged: dict[str, Any] = {}
    for answer in answers:
        for model in answer or ():
            merged.setdefault(model["id"], model)
    return {"object": "list", "data": list(merged.values())}


async def _models_of(deployment: Deployment, headers: Headers, limit: int) -> list[dict[str, Any]] | None:
    """One deployment's ``data`` list (entries with an ``id``), or None when it cannot be had."""
    member = deployment.speculative.pick()
    member.acquire()
    try:
        response = await member.send("GET", MODELS_PATH, headers, b"")
        try:
            content = await _held(response, limit)
        finally:
            response.close()
    except UpstreamError as error:
        log.warning("/v1/models: upstream %s skipped: %s", member.upstream.netloc, error)
        return None
    finally:
        member.release()
    if content is None:
        log.warning("/v1/models: upstream %s skipped: its answer exceeds proxy.max_body_bytes (%d bytes)",
                    member.upstream.netloc, limit)  # fmt: skip
        return None
    readable = decoded(content, response.header("content-encoding"), limit) if response.status == 200 else None
    try:
        data = json.loads(readable)["data"] if readable is not None else None
    except (ValueError, TypeError, KeyError):
        data = None
    if not isinstance(data, list):
        log.warning("/v1/models: upstream %s skipped: status %d, no model list", member.upstream.netloc,
                    response.status)  # fmt: skip
        return None
    return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


async def _held(response: UpstreamResponse, limit: int) -> bytes | None:
    """The answer's body, or None once it passes ``limit`` bytes (read no further)."""
    pieces = []
    size = 0
    async for chunk in response.chunks():
        size += len(chunk)
        if size > limit:
            return None
        pieces.append(chunk)
    return b"".join(pieces)
