"""A replica is free again before the client has its answer's last byte (issue 37's member share, issue 49).

A sequential client sends its next request as soon as an answer ends; if the replica were released only
after that last byte went out, the next pick would find it busy and send the request to the other member
(under load, the member baseline got 26-29 of 40 generations where turns give 20). An ASGI wrapper notes
the replicas' in-flight count at the message that ends each answer, before the client can read it.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from monitor.api.app import create_app
from monitor.api.server import uvicorn_options
from tests.api.conftest import make_settings
from tests.proxy.upstream import Upstream, serving
from tests.serving import serving as serving_app

CHAT = {"model": "qwen-coder", "messages": [{"role": "user", "content": "hi"}]}


class Watched:
    """The sidecar's app, noting the replicas' requests in flight as each answer's last message is sent."""

    def __init__(self, tmp_path: Path, upstream: str, baseline: str) -> None:
        database = f"sqlite:///{tmp_path / 'proxy.db'}"
        self.settings = make_settings(tmp_path, database, DRAFTWATCH_PROXY_UPSTREAM=upstream,
                                      DRAFTWATCH_PROXY_BASELINE_UPSTREAM=baseline,
                                      DRAFTWATCH_PROXY_BASELINE_POLICY="member")  # fmt: skip
        self.app = create_app(self.settings)
        self.at_end: list[int] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return

        async def noted(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                router = self.app.state.api.router
                self.at_end.append(sum(member.inflight for member in router.members()))
            await send(message)

        await self.app(scope, receive, noted)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("GET", "/v1/models", None), ("POST", "/v1/chat/completions", CHAT),
     ("POST", "/v1/chat/completions", {**CHAT, "stream": True})],
    ids=["listing", "whole", "streamed"],
)  # fmt: skip
def test_the_replica_is_free_before_the_answer_s_last_byte(
    tmp_path: Path, method: str, path: str, body: dict[str, object] | None
) -> None:
    speculative, baseline = Upstream(), Upstream()
    with serving(speculative) as spec_url, serving(baseline) as base_url:
        watched = Watched(tmp_path, spec_url, base_url)
        with (
            serving_app(watched, **uvicorn_options(watched.settings.api), log_level="warning") as url,
            httpx.Client(base_url=url, timeout=30) as client,
        ):
            for _ in range(6):
                assert client.request(method, path, json=body).status_code == 200
    assert watched.at_end == [0] * 6
