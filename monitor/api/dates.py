"""The ``Date`` header, added here to a response that lacks one, instead of by uvicorn.

uvicorn puts its own ``Date`` in front of every response's headers, so a proxied response, which
carries the engine's, went out with two. ``draftwatch serve`` turns uvicorn's off; this middleware
adds one where the app (or the engine behind the proxy) sent none.
"""

from __future__ import annotations

import time
from email.utils import formatdate

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class DateMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._second = -1
        self._date = b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def dated(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"date" for name, _ in headers):
                    message = {**message, "headers": [(b"date", self._now()), *headers]}
            await send(message)

        await self.app(scope, receive, dated)

    def _now(self) -> bytes:
        # Formatted once a second, as uvicorn does: the header has a resolution of one second.
        second = int(time.time())
        if second != self._second:
            self._second, self._date = second, formatdate(second, usegmt=True).encode()
        return self._date
