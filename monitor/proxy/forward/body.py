"""A proxied request's body as the proxy reads it, and as it goes upstream when the proxy adds to it.

A small body (up to :data:`INLINE_BODY_BYTES`, not compressed) is parsed whole on the event loop,
the fast path. A larger one, and every compressed one (a small body may inflate a thousandfold), is
read in a worker thread, and only for its small members (:mod:`monitor.proxy.forward.sparse`): what
the proxy needs of it (the model, the stream flags, ``metadata.workload``, the user, the sampling
settings, SGLang's flags) is small, and a large value's parse would hold the GIL, and with it every
other request, for its whole length. Where the proxy adds a member (``stream_options``, SGLang's
flags), a large body is spliced, every other byte as the client sent it, rather than re-serialised.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from monitor.proxy.encoding import bounded
from monitor.proxy.forward.events import json_object
from monitor.proxy.forward.sparse import Sparse, read_object, spliced

# Bodies up to this size are parsed whole on the event loop.
INLINE_BODY_BYTES: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class Body:
    """A request's body: as sent, and what the proxy read of it."""

    raw: bytes  # as the client sent it, which goes upstream unless the proxy adds to it
    # What was read: a small body whole, a large one's small members; None: not one JSON object in UTF-8.
    payload: dict[str, Any] | None
    text: bytes | None  # the body without its content codings (None: a coding not read here)
    sparse: Sparse | None  # a large body as read: rewritten by splicing

    def rewritten(self, changes: Mapping[str, Any]) -> bytes:
        """The body as JSON with ``changes`` set as top-level members (as identity, whatever its coding was)."""
        if self.sparse is None or self.text is None:
            return json.dumps({**(self.payload or {}), **changes}).encode()
        return spliced(self.text, self.sparse, changes)


async def read_body(raw: bytes, content_encoding: str, limit: int) -> Body:
    """The body read: :class:`~monitor.proxy.encoding.TooLargeError` when it decodes past ``limit``."""
    if not content_encoding and len(raw) <= INLINE_BODY_BYTES:
        return Body(raw, json_object(raw), raw, None)
    return await asyncio.to_thread(_read, raw, content_encoding, limit)


def _read(raw: bytes, content_encoding: str, limit: int) -> Body:
    # zlib lets go of the GIL while it inflates, and the sparse read holds it a window at a time.
    text = bounded(raw, content_encoding, limit) if content_encoding else raw
    if text is None or len(text) <= INLINE_BODY_BYTES:
        return Body(raw, None if text is None else json_object(text), text, None)
    sparse = read_object(text)
    return Body(raw, None if sparse is None else sparse.members, text, sparse)
