"""Bearer tokens with scopes: ``ingest`` (write records, decode), ``read`` (aggregates, metrics), ``admin`` (all).

Tokens are compared as SHA-256 digests with :func:`hmac.compare_digest`, against every configured
token without stopping at the first match, so neither a token's length nor its position in the list
shows in the response time. No token configured means no authentication; ``draftwatch serve`` then
refuses to bind anything but loopback (:func:`check_bind`). A token left at an example value (deploy/'s
Secret ships them) is refused outright (:func:`check_tokens`): anyone who has read the repository holds it.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Callable, Coroutine, Sequence
from typing import Annotated, Any, Final

from fastapi import Depends, Request, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param

from monitor.api.errors import ApiError, described
from monitor.api.settings import API_SCOPES, ApiToken

# What every example token in the repository begins with (deploy/base/secret.yaml): a value to replace.
PLACEHOLDER_PREFIX: Final = "replace-me"
_CHALLENGE: Final = {"WWW-Authenticate": 'Bearer realm="draftwatch"'}
_CHECKED: Final = "draftwatch.checked_scopes"  # in the ASGI scope: the guards this request has passed

# Documents the scheme in the OpenAPI document; auto_error off so that the error body is ours.
bearer = HTTPBearer(auto_error=False, description="a token from DRAFTWATCH_API_TOKENS")


class TokenSet:
    """The configured tokens, kept as digests."""

    def __init__(self, tokens: Sequence[ApiToken]) -> None:
        if (refusal := check_tokens(tokens)) is not None:
            raise ValueError(refusal)
        self._entries = [(_digest(t.token), t.scope) for t in tokens]

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    def has_scope(self, scope: str) -> bool:
        """Whether any configured token carries ``scope``."""
        return any(s == scope for _, s in self._entries)

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


class Guard:
    """The dependency that lets a request through with a token of ``scope`` (or ``admin``).

    :class:`GuardedRoute` runs it before the body is read, so a request without a valid token gets
    401 or 403 whatever its body holds, malformed JSON included; as a dependency it also documents
    the bearer scheme in the OpenAPI document, and guards a route of any other class.
    """

    def __init__(self, scope: str) -> None:
        if scope not in API_SCOPES:
            raise ValueError(f"unknown scope {scope!r}")
        self.scope = scope

    async def __call__(
        self, request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
    ) -> None:
        if self.scope not in request.scope.get(_CHECKED, ()):
            self.check(request, None if credentials is None else credentials.credentials)

    def check(self, request: Request, presented: str | None, how: str = "Authorization: Bearer <token>") -> None:
        tokens: TokenSet = request.app.state.api.tokens
        if tokens.enabled:
            if presented is None:
                raise ApiError(401, "missing_token", f"send the header {how}",
                               headers=_CHALLENGE)  # fmt: skip
            granted = tokens.scopes_of(presented)
            if not granted:
                raise ApiError(401, "invalid_token", "the bearer token is not valid", headers=_CHALLENGE)
            if self.scope not in granted and "admin" not in granted:
                raise ApiError(
                    403, "insufficient_scope", f"this token lacks the {self.scope!r} scope this endpoint needs"
                )
        request.scope.setdefault(_CHECKED, set()).add(self.scope)

    @property
    def responses(self) -> dict[int | str, dict[str, Any]]:
        """The statuses this guard answers, for a route's OpenAPI ``responses``."""
        return described({401: "no or unknown bearer token", 403: f"the token lacks the {self.scope} scope"})


def require(scope: str) -> Guard:
    """The guard of ``scope``: ``Depends(require("read"))`` on a route or router."""
    return Guard(scope)


class GuardedRoute(APIRoute):
    """A route whose guards run before FastAPI reads and validates the body (which it does before dependencies)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        guards = [d.dependency for d in self.dependencies if isinstance(d.dependency, Guard)]

        async def guarded(request: Request) -> Response:
            scheme, token = get_authorization_scheme_param(request.headers.get("Authorization"))
            presented = token if scheme.lower() == "bearer" and token else None  # as HTTPBearer reads it
            for guard in guards:
                guard.check(request, presented)
            return await handler(request)

        return guarded if guards else handler


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


def check_tokens(tokens: Sequence[ApiToken]) -> str | None:
    """Why the configured tokens are refused (an example value left in place), or None; never quotes a token.

    >>> check_tokens([ApiToken("admin", "replace-me-admin-token-0001"), ApiToken("read", "k3pP9xQ2mVw7rT4s")])[:47]
    'refusing to start with the example admin token '
    >>> check_tokens([ApiToken("admin", "k3pP9xQ2mVw7rT4sL8")]) is None
    True
    """
    examples = sorted({t.scope for t in tokens if t.token.lower().startswith(PLACEHOLDER_PREFIX)})
    if not examples:
        return None
    return (
        f"refusing to start with the example {' and '.join(examples)} token{'s' if len(examples) > 1 else ''} "
        f"of deploy/base/secret.yaml (beginning with {PLACEHOLDER_PREFIX!r}), which anyone who has read the repository "
        "holds. Set DRAFTWATCH_API_TOKENS to tokens of your own, e.g. admin:$(openssl rand -hex 24); on Kubernetes, "
        "create the Secret draftwatch-api as deploy/README.md shows."
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
