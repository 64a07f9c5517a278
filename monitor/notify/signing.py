"""Standard Webhooks signatures: ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``.

The signed content is ``{id}.{timestamp}.{body}``; the signature is ``v1,`` plus the base64 of its
HMAC-SHA256 under the secret's key (the bytes after ``whsec_``, base64-decoded). The timestamp is
the attempt's, so a retry is signed afresh while the id stays the same.

>>> key = bytes(range(24))
>>> headers("msg_1", 1700000000, '{"a":1}', key)["webhook-signature"]
'v1,YOREwC5BRUvI4ezImQEgEteB7JbPr/Iy2YCZe049/5g='
>>> sorted(headers("msg_1", 1700000000, "{}", None))
['content-type', 'user-agent', 'webhook-id', 'webhook-timestamp']
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Final

USER_AGENT: Final = "draftwatch-webhooks/1"


def signature(key: bytes, msg_id: str, timestamp: int, body: str) -> str:
    """``v1,<base64 HMAC-SHA256>`` of ``{msg_id}.{timestamp}.{body}``."""
    digest = hmac.new(key, f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def headers(msg_id: str, timestamp: int, body: str, key: bytes | None) -> dict[str, str]:
    """The request headers of one attempt; unsigned (no ``webhook-signature``) without a key."""
    out = {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
    }
    if key is not None:
        out["webhook-signature"] = signature(key, msg_id, timestamp, body)
    return out
