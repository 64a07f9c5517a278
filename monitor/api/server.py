"""How ``draftwatch serve`` runs uvicorn: its options (the tests' sidecar takes the same) and a bounded, graceful stop.

uvicorn alone stops accepting at SIGTERM (a load balancer still sending there gets refusals) and then
waits for every open request without a bound: one never-ending stream held the process until the
pod's SIGKILL, which lost the records of every stream in flight. Here a SIGTERM (or Ctrl+C) goes in
three phases:

1. drain, ``api.drain_delay_s``: requests are still taken and served, while ``/readyz`` answers 503
   and every answer closes its connection, so a load balancer takes the server out and clients'
   next requests open connections that go elsewhere;
2. stop, ``api.shutdown_timeout_s``: no new connections; the requests and streams open run on;
3. end: the connections still open are closed (``ApiState.stopping`` set first). Each request ends
   as one whose client left, and its relay records it as cut; a request that ignores its client
   leaving is cancelled after ``END_WAIT_S``. Then the lifespan's end writes the records
   (monitor/api/app.py: ``recorder.close``) and ``serve`` returns.

A second signal ends the drain at once; a second Ctrl+C during the stop exits without the lifespan's
end, as uvicorn's does.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from types import FrameType
from typing import Any, Final

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from monitor.api.connections import limited_protocol
from monitor.api.settings import ApiSettings
from monitor.api.state import ApiState

log = logging.getLogger(__name__)

# After the shutdown's limit closed their connections: how long requests have to end before they are cancelled.
END_WAIT_S: Final = 5.0


def uvicorn_options(api: ApiSettings) -> dict[str, Any]:
    """uvicorn.Config's options for the API: the client limits of monitor/api/connections.py, no Server header,
    no Date (the app adds one where a response has none: monitor/api/dates.py), and the shutdown's last bound."""
    return {
        "http": limited_protocol(api),
        "server_header": False,
        "date_header": False,
        # uvicorn's own bound comes after the server's (GracefulServer): it cancels what outlived END_WAIT_S.
        "timeout_graceful_shutdown": api.shutdown_timeout_s + END_WAIT_S,
    }


class GracefulServer(uvicorn.Server):
    """uvicorn's server with the drain, the bounded stop and the recorded end of the module's description."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, api: ApiSettings) -> None:
        super().__init__(config)
        self.api_app = app
        self.drain_delay_s = api.drain_delay_s
        self.shutdown_timeout_s = api.shutdown_timeout_s
        self.drain_ends: float | None = None

    def _state(self) -> ApiState | None:
        state: ApiState | None = getattr(self.api_app.state, "api", None)  # None until the lifespan started
        return state

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # uvicorn's records the signal to raise it again once stopped, which killed the process before
        # serve's own end (the scheduler's stop) ran: here a stop by signal is the normal end.
        if self.should_exit:
            if sig == signal.SIGINT:
                self.force_exit = True
            return
        if self.drain_ends is None and self.drain_delay_s > 0:
            log.info("draining for %g s (api.drain_delay_s): /readyz answers 503, requests are still taken",
                     self.drain_delay_s)  # fmt: skip
            self.drain_ends = time.monotonic() + self.drain_delay_s
            self._drain()
            return
        self.should_exit = True

    def _drain(self) -> None:
        if (state := self._state()) is not None:
            state.draining = True

    async def on_tick(self, counter: int) -> bool:
        if self.drain_ends is not None:
            self._drain()  # also where the signal came before the lifespan had started
            if time.monotonic() >= self.drain_ends:
                self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._drain()
        ending = asyncio.get_running_loop().call_later(self.shutdown_timeout_s, self._end_open_requests)
        try:
            await super().shutdown(sockets)
        finally:
            ending.cancel()

    def _end_open_requests(self) -> None:
        connections = list(self.server_state.connections)
        if not connections:
            return
        log.warning("ending %d connection(s) still open %g s after the shutdown began (api.shutdown_timeout_s); "
                    "their requests are recorded as cut", len(connections), self.shutdown_timeout_s)  # fmt: skip
        if (state := self._state()) is not None:
            state.stopping = True
        for connection in connections:
            # At once, unsent bytes dropped: a client that stopped reading would otherwise hold the close.
            connection.transport.abort()


class DrainMiddleware:
    """While the server drains (``ApiState.draining``; ``/readyz`` answers 503 meanwhile): every answer closes its
    connection, so that the client's next request opens one, which a load balancer sends elsewhere."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state: ApiState | None = getattr(scope["app"].state, "api", None) if scope["type"] == "http" else None
        if state is None or not state.draining:
            await self.app(scope, receive, send)
            return

        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing)
