"""Bearer tokens with scopes: ``ingest`` (write records, decode), ``read`` (aggregates, metrics), ``admin`` (all).

Tokens are compared as SHA-256 digests with :func:`hmac.compare_digest`, against every configured
token without stopping at the first match, so neither a token's length nor its position in the list
shows in the response time. No token configured means no authentication; ``draftwatch serve`` then
refuses to bind anything but loopback (:func:`check_bind`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Final

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from monitor.api.errors import ApiError
from monitor.config import ApiToken

SCOPES: Final = ("ingest", "read", "admin")
_CHALLENGE: Final = {"WWW-Authenticate": 'Bearer realm="draftwatch"'}

# Documents the scheme in the OpenAPI document; auto_error off so that the error body is ours.
bearer = HTTPBearer(auto_error=False, description="a token from DRAFTWATCH_API_TOKENS")


class TokenSet:
    """The configured tokens, kept as digests."""

    def __init__(self, tokens: Sequence[ApiToken]) -> None:
        self._entries = [(_digest(t.token), t.scope) for t in tokens]

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    def scopes_of(self, presented: str) -> set[str]:
        """Scopes granted to ``presented`` (empty when it matches no token)."""
        digest = _digest(presented)
        granted = set()
        for known, scope in self._entries:
            if hmac.compare_digest(known, digest):
                granted.add(scope)
        return granted


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def require(scope: str) -> Callable[[Request, HTTPAuthorizationCredentials | None], Awaitable[None]]:
    """A dependency that lets a request through with a token of ``scope`` (or ``admin``)."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")

    async def check(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
    ) -> None:
        tokens: TokenSet = request.app.state.api.tokens
        if not tokens.enabled:
            return
        if credentials is None:
            raise ApiError(401, "missing_token", "send the header Authorization: Bearer <token>", headers=_CHALLENGE)
        granted = tokens.scopes_of(credentials.credentials)
        if not granted:
            raise ApiError(401, "invalid_token", "the bearer token is not valid", headers=_CHALLENGE)
        if scope not in granted and "admin" not in granted:
            raise ApiError(403, "insufficient_scope", f"this token lacks the {scope!r} scope this endpoint needs")

    return check


def check_bind(host: str, tokens_configured: bool) -> str | None:
    """Why binding ``host`` is refused (no tokens and not loopback), or None when it is allowed.

    >>> check_bind("127.0.0.1", False) is None, check_bind("localhost", False) is None
    (True, True)
    >>> check_bind("0.0.0.0", False)[:40]
    'refusing to bind 0.0.0.0 without API tok'
    >>> check_bind("0.0.0.0", True) is None
    True
    """
    if tokens_configured or is_loopback(host):
        return None
    return (
        f"refusing to bind {host} without API tokens: anyone who can reach it could write records and run "
        "the decoder. Set DRAFTWATCH_API_TOKENS (e.g. ingest:<token>,admin:<token>) or bind 127.0.0.1."
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
