"""Proxy mode's entry: which requests are the engine's, the forwarded routes, and the answer to each.

:class:`ProxyMiddleware` sends every path but draftwatch's own to :func:`forward`, which checks the
proxy's token, refuses what no engine could be sent (answered here, never counted against a
replica: a target that is no path, a generation whose body it cannot read or whose model is no
string), reads the body (:mod:`monitor.proxy.forward.body`), makes the
:class:`~monitor.proxy.forward.exchange.Exchange`, sends it upstream (once more to another replica
when the first refused the connection) and answers with the whole body, the relay of a stream, or
the answer passed through as it comes where it is not recorded or too large to hold
(:mod:`monitor.proxy.forward.relay`); a client that leaves cancels the upstream request.

The request target goes upstream as the client sent it (its ``raw_path`` and query), percent-escapes
and all: decoded, ``%3F`` would become a query and ``%20`` a space that breaks the request line.
Which route a request is (a generation, recorded; ``/v1/models``) is read from its path without
repeated or trailing slashes and, for the engine's known routes, in any case: the engine decides what
``//v1/chat/completions`` means (vLLM and SGLang answer 404, or redirect a trailing slash; a gateway
in front, such as nginx, merges the slashes and serves it), so it is forwarded as sent and recorded as
the generation it names, a failed one where the engine refused it, as any refused generation is.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, Final
from urllib.parse import quote
from weakref import WeakKeyDictionary

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from monitor.api.auth import Guard
from monitor.api.errors import ApiError
from monitor.api.state import api_state, offer
from monitor.ingest.capture.rows import proxied_row
from monitor.proxy.encoding import TooLargeError, codings, decoded
from monitor.proxy.forward.body import read_body
from monitor.proxy.forward.events import cleaned_sglang_of, json_object, object_in
from monitor.proxy.forward.exchange import (
    HOP_HEADERS,
    NATIVE_PATHS,
    OPENAI_PATHS,
    PROXY_TOKEN_HEADER,
    RECORDED_PATHS,
    Exchange,
    client_headers,
)
from monitor.proxy.forward.models import merged_models
from monitor.proxy.forward.relay import Relay, RelayResponse, ThroughResponse
from monitor.proxy.forward.sparse import SMALL_BYTES
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
MODEL_PREFIX: Final = "/v1/models/"
# An origin-form request target (RFC 9112 section 3.2.1): a path, then visible ASCII only.
_TARGET: Final = re.compile(rb"/[\x21-\x7e]*")
_UNREADABLE: Final = "a generation's body must be one JSON object in UTF-8"
_UNDECODABLE: Final = "a generation's body must come in a content coding the proxy reads (gzip, deflate or none)"

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
    scope = request.scope
    target = _target(scope)
    malformed = _malformed(request.method, target)
    if malformed is not None:
        # Answered here, before a replica is picked: the client's own mistake never counts against its health.
        return openai_error(400, malformed, "invalid_request_error", "invalid_request_target")
    path = _route_path(scope["path"])
    if router.routes and request.method == "GET" and path == "/v1/models":
        return await _merged_models(request, state.settings.proxy, router)
    limit = state.settings.proxy.max_body_bytes
    try:
        body = await read_body(await _whole_body(request), request.headers.get("content-encoding", ""), limit)
    except TooLargeError:
        return openai_error(413, f"the decoded body exceeds {limit} bytes", "invalid_request_error", "body_too_large")
    generation = request.method == "POST" and path in RECORDED_PATHS
    if generation and body.payload is None:
        # Neither routed by its model nor recorded, it would reach the default pool whatever model it names, and
        # its failure there would count against that replica: the client's mistake, told before it reaches one.
        return openai_error(400, _UNREADABLE if body.text is not None else _UNDECODABLE, "invalid_request_error",
                            "invalid_body")  # fmt: skip
    model = (body.payload or {}).get("model")
    if path.lower().startswith(MODEL_PREFIX):
        model = path[len(MODEL_PREFIX) :]  # /v1/models/{id} goes where a request for that model would
    elif generation and not isinstance(model, str | None):
        # As the OpenAI API, vLLM and SGLang answer it (their schemas take a string): a model that can be
        # neither routed by nor recorded under is the client's mistake, told before it reaches a replica.
        return openai_error(400, "model must be a string", "invalid_request_error", "invalid_model")
    routed = request if path == scope["path"] else Request({**scope, "path": path}, request.receive)
    exchange = Exchange(state, router, routed, body, model)
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
        response = await _answer(request, exchange, target)
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
            exchange.record(None, error=exchange.early_end)
    # The client left: nobody reads this (499, nginx's "client closed request").
    return Response(status_code=499) if response is None else response


async def _whole_body(request: Request) -> bytes:
    """The request's body as monitor/api/limits.py hands it on: one message, taken as it is.

    Starlette's ``Request.body()`` joins what it read with the stream's empty end, a copy of every body
    for the whole request.
    """
    pieces = []
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        pieces.append(message.get("body", b""))
        if not message.get("more_body", False):
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _target(scope: Scope) -> bytes:
    """The request target as the client sent it: its raw path (percent-escapes kept) and query."""
    path = scope.get("raw_path") or quote(scope["path"]).encode()  # raw_path is optional in ASGI
    query = scope["query_string"]
    return path + b"?" + query if query else path


def _malformed(method: str, target: bytes) -> str | None:
    """Why no engine could be sent this request, or None."""
    if method == "CONNECT":
        return "CONNECT is not served: this is an engine's API, not a tunnel"
    if not _TARGET.fullmatch(target):
        return "the request target must be a path of visible ASCII characters (RFC 9112)"
    return None


def _route_path(path: str) -> str:
    """The path routes are told apart by: no repeated or trailing slash, one of the engine's known routes in lower case.

    >>> _route_path("//v1/chat/completions/"), _route_path("/V1/Models"), _route_path("/v1/models/Qwen//7B")
    ('/v1/chat/completions', '/v1/models', '/v1/models/Qwen/7B')
    """
    collapsed = "/" + "/".join(segment for segment in path.split("/") if segment)
    lowered = collapsed.lower()
    return lowered if lowered in FORWARDED_PATHS else collapsed


async def _merged_models(request: Request, settings: ProxySettings, router: Router) -> Response:
    """Every deployment's models in one list (monitor/proxy/forward/models.py); 502 when none answered."""
    merged = await merged_models(router.deployments, client_headers(request, settings), settings.max_body_bytes)
    if merged is None:
        return openai_error(502, "no upstream answered /v1/models", "upstream_unavailable")
    return JSONResponse(merged)


async def _answer(request: Request, exchange: Exchange, target: bytes) -> Response:
    """The upstream's answer to one request, as the client gets it; recorded, or handed to the relay that records it."""
    try:
        response, content = await _send(request, exchange, target)
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
    if content is None and exchange.recording:
        relay = Relay(exchange, response, codings(coding))
        # Read event by event, a stream is decoded here and goes on as identity (an unknown coding passes as is).
        return RelayResponse(relay, response.status, _headers_out(response, decoded=relay.decoder is not None))
    if not isinstance(content, bytes):  # passed on as it comes, unread: its framing (a length, or none) kept
        headers = _headers_out(response, decoded=False, keep_length=True)
        if content is None:
            return ThroughResponse(exchange, response, response.chunks(), headers)
        unread = f"the answer exceeds proxy.max_body_bytes ({exchange.settings.max_body_bytes} bytes): passed unread"
        return ThroughResponse(exchange, response, content, headers, unread)
    head = request.method == "HEAD"
    headers = _headers_out(response, decoded=False, keep_length=head)
    limit = exchange.settings.max_body_bytes
    if coding or len(content) > SMALL_BYTES:  # a large answer, or one that may inflate, read off the event loop
        readable, report = await asyncio.to_thread(_read_answer, content, coding, limit)
    else:
        readable, report = content, json_object(content)
    if readable is None:
        exchange.unreadable(f"the response's content coding {coding!r} cannot be read")
    elif response.status >= 400 or report is None:
        exchange.record(None, error=f"upstream status {response.status}")
    else:
        exchange.record_after_reply(report)
        cleaned = await cleaned_sglang_of(readable, exchange.sglang_added) if exchange.sglang_added else readable
        if cleaned is not None and cleaned != readable:  # rewritten here: it goes as identity
            content, headers = cleaned, _headers_out(response, decoded=True)
    return _whole(b"" if head else content, response.status, headers, head=head)


def _read_answer(content: bytes, coding: str, limit: int) -> tuple[bytes | None, dict[str, Any] | None]:
    """A whole answer decoded (None: it cannot be) and read as one JSON object, in a worker thread."""
    readable = decoded(content, coding, limit)
    return readable, None if readable is None else object_in(readable)


async def _send(
    request: Request, exchange: Exchange, target: bytes
) -> tuple[UpstreamResponse, bytes | AsyncIterator[bytes] | None]:
    """The upstream's answer: a whole body, read and closed; one too large to hold (its chunks, the first ones
    read again); or None: not read here (an event stream, or the answer of a route not recorded)."""
    while True:
        try:
            response = await exchange.route.member.send(request.method, target, exchange.headers, exchange.body)
        except UpstreamRefusedError:
            if exchange.moved():
                continue
            raise
        if not exchange.recording or response.header("content-type").startswith("text/event-stream"):
            return response, None
        limit = exchange.settings.max_body_bytes
        chunks = response.chunks()
        pieces: list[bytes] = []
        # Held up to the bound, by the length declared, else by what came so far.
        size = _length(response)
        try:
            if size <= limit:
                size = 0
                while size <= limit and (chunk := await anext(chunks, None)) is not None:
                    pieces.append(chunk)
                    size += len(chunk)
        except UpstreamTimeoutError:
            response.close()
            raise
        except UpstreamError as error:
            response.close()
            raise _CutShortError(str(error)) from None
        except BaseException:
            response.close()
            raise
        if size > limit:
            return response, _chained(pieces, chunks)
        response.close()
        content = b"".join(pieces)
        # A refused stream_options goes again once without it (a 400: nothing was generated).
        if not exchange.refused_stream_options(response.status, response.header("content-encoding"), content):
            return response, content


def _length(response: UpstreamResponse) -> int:
    """The answer's declared Content-Length; 0 when it declares none (or none that reads as one)."""
    declared = response.header("content-length")
    return int(declared) if declared.isdigit() else 0


async def _chained(first: list[bytes], rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    for chunk in first:
        yield chunk
    async for chunk in rest:
        yield chunk


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
