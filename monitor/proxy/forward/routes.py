"""Proxy mode's entry: which requests are the engine's, the forwarded routes, and the answer to each.

:class:`ProxyMiddleware` sends every path but draftwatch's own to :func:`forward`, which checks the
proxy's token, makes the :class:`~monitor.proxy.forward.exchange.Exchange`, sends it upstream
(once more to another replica when the first refused the connection) and answers with the whole
body or the relay (:mod:`monitor.proxy.forward.relay`); a client that leaves cancels the upstream
request.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final
from weakref import WeakKeyDictionary

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from monitor.api.auth import Guard
from monitor.api.errors import ApiError
from monitor.api.state import api_state, offer
from monitor.ingest.capture.rows import proxied_row
from monitor.proxy.asks import cleaned_sglang_json
from monitor.proxy.encoding import codings, decoded
from monitor.proxy.forward.events import json_object
from monitor.proxy.forward.exchange import (
    HOP_HEADERS,
    NATIVE_PATHS,
    OPENAI_PATHS,
    PROXY_TOKEN_HEADER,
    Exchange,
    client_headers,
)
from monitor.proxy.forward.models import merged_models
from monitor.proxy.forward.relay import Relay, RelayResponse
from monitor.proxy.routing import Router
from monitor.proxy.settings import ProxySettings
from monitor.proxy.upstream import (
    UpstreamError,
    UpstreamRefusedError,
    UpstreamResponse,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)

FORWARDED_PATHS: Final = (*OPENAI_PATHS, *NATIVE_PATHS, "/v1/models")

router = APIRouter()


# Whom a refused token is answered as, in the OpenAI error's type.
_AUTH_ERRORS: Final = {401: "authentication_error", 403: "permission_error"}


class _CutShortError(UpstreamError):
    """The upstream stopped in the middle of a whole (non-streamed) body."""


async def forward(request: Request) -> Response:
    state = api_state(request)
    router = state.router
    if router is None:  # the route exists only in proxy mode
        raise ApiError(503, "proxy_off", "proxy mode is off: start the sidecar with --upstream URL")
    if state.tokens.has_scope("proxy"):
        # The client's own Authorization belongs to the upstream: draftwatch's token comes apart.
        presented = request.headers.get(PROXY_TOKEN_HEADER)
        try:
            Guard("proxy").check(request, presented, how="X-Draftwatch-Token: <token of scope proxy>")
        except ApiError as refused:  # in the shape the engine's clients parse
            kind = _AUTH_ERRORS.get(refused.status, "invalid_request_error")
            return openai_error(refused.status, refused.message, kind, refused.code, refused.headers)
    if router.routes and request.method == "GET" and request.scope["path"] == "/v1/models":
        return await _merged_models(request, state.settings.proxy, router)
    exchange = Exchange(state, router, request, await request.body())
    response: Response | None = None
    left = False
    task = asyncio.current_task()
    assert task is not None

    async def watch() -> None:
        # The body is read: the next message is the client leaving. Cancelling the upstream request
        # closes its connection, which is what stops the engine generating for nobody. A plain task
        # and Task.cancel: anyio's task group and cancel scope cost a tenth of a proxied request.
        nonlocal left
        while (await request.receive())["type"] != "http.disconnect":
            pass
        left = True
        task.cancel()

    # Only the awaits below can be interrupted: the watcher is cancelled before any other.
    watcher = asyncio.ensure_future(watch())
    try:
        response = await _answer(request, exchange)
        await exchange.on_disk()  # a whole answer: its body is sent after this
    except asyncio.CancelledError:
        if not left:  # the server stops
            raise
        task.uncancel()
    except Exception:
        exchange.record(None, error="the proxy failed (see its log)")
        raise
    finally:
        watcher.cancel()
        if response is None:  # the client left (or the server stops) before the answer came
            exchange.record(None, error="client disconnected")
    # The client left: nobody reads this (499, nginx's "client closed request").
    return Response(status_code=499) if response is None else response


async def _merged_models(request: Request, settings: ProxySettings, router: Router) -> Response:
    """Every deployment's models in one list (monitor/proxy/forward/models.py); 502 when none answered."""
    merged = await merged_models(router.deployments, client_headers(request, settings), settings.max_body_bytes)
    if merged is None:
        return openai_error(502, "no upstream answered /v1/models", "upstream_unavailable")
    return JSONResponse(merged)


async def _answer(request: Request, exchange: Exchange) -> Response:
    """The upstream's answer to one request, as the client gets it; recorded, or handed to the relay that records it."""
    try:
        response, content = await _send(request, exchange)
    except UpstreamTimeoutError:
        exchange.record(None, error="upstream timed out")
        silence = f"the upstream sent nothing within {exchange.settings.timeout_s:g} s"
        return openai_error(504, silence, "upstream_timeout")
    except _CutShortError as error:
        exchange.record(None, error=f"upstream response cut: {error}")
        return openai_error(502, "the upstream's response was cut short", "upstream_unavailable")
    except UpstreamUnavailableError as error:
        exchange.record(None, error=f"upstream unreachable: {error}")
        netloc = exchange.route.member.upstream.netloc
        return openai_error(502, f"the upstream at {netloc} cannot be reached ({error})",
                            "upstream_unavailable")  # fmt: skip
    if exchange.recording and response.status < 400:  # a request the upstream refused is no traffic to evaluate on
        offer(request, lambda: proxied_row(exchange.path, exchange.payload, exchange.workload))
    coding = response.header("content-encoding")
    if content is None:
        relay = Relay(exchange, response, codings(coding))
        # Read event by event, a stream is decoded here and goes on as identity (an unknown coding passes as is).
        return RelayResponse(relay, response.status, _headers_out(response, decoded=relay.decoder is not None))
    head = request.method == "HEAD"
    headers = _headers_out(response, decoded=False, keep_length=head)
    readable = decoded(content, coding, exchange.settings.max_body_bytes)
    report = None if readable is None else json_object(readable)
    if readable is None:
        exchange.unreadable(f"the response's content coding {coding!r} cannot be read")
    elif response.status >= 400 or report is None:
        exchange.record(None, error=f"upstream status {response.status}")
    else:
        exchange.record(report)
        cleaned = cleaned_sglang_json(readable, exchange.sglang_added)
        if cleaned is not None and cleaned != readable:  # rewritten here: it goes as identity
            content, headers = cleaned, _headers_out(response, decoded=True)
    return _whole(b"" if head else content, response.status, headers, head=head)


async def _send(request: Request, exchange: Exchange) -> tuple[UpstreamResponse, bytes | None]:
    """The upstream's answer: an event stream still to relay (None), or a whole body, read and closed."""
    query = request.scope["query_string"]
    target = exchange.path.encode() + (b"?" + query if query else b"")
    while True:
        try:
            response = await exchange.route.member.send(request.method, target, exchange.headers, exchange.body)
        except UpstreamRefusedError:
            if exchange.moved():
                continue
            raise
        if response.header("content-type").startswith("text/event-stream"):
            return response, None
        try:
            content = await response.read()
        except UpstreamTimeoutError:
            raise
        except UpstreamError as error:
            raise _CutShortError(str(error)) from None
        finally:
            response.close()
        # A refused stream_options goes again once without it (a 400: nothing was generated).
        if not exchange.refused_stream_options(response.status, response.header("content-encoding"), content):
            return response, content


def _headers_out(response: UpstreamResponse, *, decoded: bool, keep_length: bool = False) -> list[tuple[bytes, bytes]]:
    """The upstream's headers for the client, repeated ones included; a body decoded here loses its coding."""
    dropped = HOP_HEADERS - {"content-length"} if keep_length else HOP_HEADERS
    return [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in response.headers
        if name.lower() not in dropped and not (decoded and name.lower() == "content-encoding")
    ]


def _whole(content: bytes, status: int, headers: list[tuple[bytes, bytes]], *, head: bool) -> Response:
    response = Response(content, status)
    # A HEAD answer keeps the upstream's Content-Length (of the body it did not send).
    response.raw_headers = [*headers, *([] if head else response.raw_headers)]
    return response


def openai_error(
    status: int, message: str, kind: str, code: str | int | None = None, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """An error in the OpenAI shape, which the clients of every stack parse (draftwatch's own shape they do not)."""
    body = {"error": {"message": message, "type": kind, "code": status if code is None else code}}
    return JSONResponse(body, status, headers=dict(headers or {}))


# Per app: the paths draftwatch serves itself, which are never forwarded.
_OWN_PATHS: WeakKeyDictionary[Any, re.Pattern[str]] = WeakKeyDictionary()


def proxied(scope: Scope) -> bool:
    """Whether a request in proxy mode is the engine's (forwarded) rather than one of draftwatch's own routes.

    Draftwatch's are its routes' families (``/v1/workloads`` and all under it, ``/metrics``, ...),
    whatever the method; everything else an engine may serve (embeddings, audio, rerank, tokenize,
    its health) is forwarded.
    """
    app = scope.get("app")
    if app is None:
        return False
    own = _OWN_PATHS.get(app)
    if own is None:
        own = _OWN_PATHS[app] = _own_paths(app.routes)
    return own.fullmatch(scope["path"]) is None


def _routes(routes: list[Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every route with its full path, through the routers FastAPI keeps included (not copied) in the app."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _routes(included.routes, prefix + getattr(route.include_context, "prefix", ""))
        elif isinstance(getattr(route, "path", None), str):
            yield prefix + route.path, route


def _own_paths(routes: list[Any]) -> re.Pattern[str]:
    prefixes = set()
    for path, route in _routes(routes):
        if getattr(route, "endpoint", None) is forward:
            continue
        segments = path.strip("/").split("/")
        # /v1/NAME and all under it; a top-level /NAME (/metrics, /healthz) and all under it.
        family = segments[:2] if segments[0] == "v1" and len(segments) > 1 else segments[:1]
        if any("{" in segment for segment in family) or not family[0]:
            prefixes.add(compile_path(path)[0].pattern.removeprefix("^").removesuffix("$"))  # that route alone
            continue
        prefixes.add(re.escape("/" + "/".join(family)))
    return re.compile(f"(?:{'|'.join(sorted(prefixes))})(?:/.*)?")


class ProxyMiddleware:
    """Proxy mode's dispatch: any path but draftwatch's own, with any method, is the engine's and is forwarded.

    Ahead of the routes, so that a method the documented routes do not take (HEAD, OPTIONS) and the
    engine's other routes (embeddings, audio, rerank, tokenize, its health) reach it too; only the
    generations are recorded.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not proxied(scope):
            await self.app(scope, receive, send)
            return
        response = await forward(Request(scope, receive, send))
        await response(scope, receive, send)


for _path in FORWARDED_PATHS:
    router.add_api_route(
        _path,
        forward,
        methods=["GET"] if _path == "/v1/models" else ["POST"],
        summary=f"pass-through {_path} (proxy mode)",
        description="Forwarded to proxy.upstream unchanged, body and response alike; recorded as one request.",
        tags=["proxy"],
    )
