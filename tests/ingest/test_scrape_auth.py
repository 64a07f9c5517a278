"""A scrape target behind auth: its Authorization header reaches it, and nowhere else, and is never shown.

Real HTTP servers: one refuses a scrape without the right header (401), another records what it
was sent, so that a second target scraped in the same pass (or a redirect) is seen not to get it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from monitor.commands.main import main
from monitor.config import ConfigError, Settings
from monitor.ingest.scrape.run import scrape_due
from monitor.ingest.scrape.targets import ScrapeTarget, parse_targets
from monitor.store.scrape import target_health

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "scrape"
BODY = (FIXTURES / "llamacpp-b11434-after-1-request.txt").read_bytes()
TOKEN = "tok-7f3a9c-not-for-logs"
T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


class Endpoint:
    """A /metrics endpoint that wants ``required`` as its Authorization (None: wants none) and keeps what came."""

    def __init__(self, required: str | None, redirect_to: str | None = None) -> None:
        self.seen: list[str | None] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                given = self.headers.get("Authorization")
                outer.seen.append(given)
                if redirect_to is not None:
                    self.send_response(302)
                    self.send_header("Location", redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if required is not None and given != required:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", "Bearer")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(BODY)))
                self.end_headers()
                self.wfile.write(BODY)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"


@pytest.fixture
def serve() -> Iterator[Any]:
    started: list[Endpoint] = []

    def start(required: str | None, redirect_to: str | None = None) -> Endpoint:
        endpoint = Endpoint(required, redirect_to)
        threading.Thread(target=endpoint.server.serve_forever, daemon=True).start()
        started.append(endpoint)
        return endpoint

    yield start
    for endpoint in started:
        endpoint.server.shutdown()
        endpoint.server.server_close()


def targets(*tables: dict[str, Any]) -> tuple[ScrapeTarget, ...]:
    return parse_targets([{"kind": "llamacpp", **t} for t in tables])


def test_the_header_opens_the_target_and_reaches_no_other(
    engine: Engine, serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    guarded, open_ = serve(f"Bearer {TOKEN}"), serve(None)
    with_token, without, other = targets(
        {"url": guarded.url, "name": "guarded", "bearer_token": TOKEN},
        {"url": guarded.url, "name": "no-token"},
        {"url": open_.url, "name": "open"},
    )
    caplog.set_level(logging.DEBUG)
    report = scrape_due(engine, [with_token, without, other], T0)
    assert report.failed == {"no-token": "HTTP 401"}
    health = {h.name: h.status for h in target_health(engine)}
    assert health == {"guarded": "up", "no-token": "down", "open": "up"}
    assert guarded.seen == [f"Bearer {TOKEN}", None]
    assert open_.seen == [None]
    assert TOKEN not in caplog.text


def test_authorization_is_sent_as_given(engine: Engine, serve: Any) -> None:
    guarded = serve(f"Token {TOKEN}")
    (t,) = targets({"url": guarded.url, "authorization": f"Token {TOKEN}"})
    assert scrape_due(engine, [t], T0).failed == {}
    assert guarded.seen == [f"Token {TOKEN}"]


def test_a_redirect_is_not_followed_with_the_credential(engine: Engine, serve: Any) -> None:
    elsewhere = serve(None)
    redirecting = serve(None, redirect_to=elsewhere.url)
    (t,) = targets({"url": redirecting.url, "bearer_token": TOKEN})
    assert scrape_due(engine, [t], T0).failed == {t.name: "HTTP 302"}
    assert elsewhere.seen == []


def test_the_credential_is_never_shown(tmp_path: Path) -> None:
    (t,) = targets({"url": "http://h/metrics", "authorization": f"Bearer {TOKEN}"})
    for shown in (repr(t), str(t), repr(dataclasses.asdict(t)), repr(dataclasses.astuple(t)), f"{t}"):
        assert TOKEN not in shown
    home = {"HOME": str(tmp_path), "DRAFTWATCH_DATA_DIR": str(tmp_path)}
    # A table the parser refuses (a typo'd key next to the token) is reported without quoting it.
    bad = [{"url": "http://h/metrics", "kind": "vllm", "bearer_token": TOKEN, "intervall": "1m"}]
    with pytest.raises(ConfigError, match="unknown key 'intervall'") as refused:
        Settings.from_env({**home, "DRAFTWATCH_SCRAPE": json.dumps(bad)})
    assert TOKEN not in str(refused.value)
    config = tmp_path / "draftwatch.toml"
    config.write_text(f'[[scrape]]\nurl = "http://h/metrics"\nkind = "vllm"\nbearer_token = "{TOKEN}\\nX-Evil: 1"\n')
    with pytest.raises(ConfigError, match="bearer_token: expected a non-empty string on one line") as refused:
        Settings.from_env(home, config)
    assert TOKEN not in str(refused.value)


@pytest.mark.parametrize(
    ("table", "error"),
    [
        ({"authorization": "Bearer a", "bearer_token": "a"}, "give authorization or bearer_token, not both"),
        ({"bearer_token": "two words"}, "bearer_token: expected the token alone"),
        ({"authorization": ""}, "authorization: expected a non-empty string"),
        ({"authorization": 42}, "authorization: expected a non-empty string"),
        ({"url": "http://u:p@h/metrics", "bearer_token": "a"}, "the url carries a user part too"),
    ],
)
def test_a_malformed_credential_is_refused(table: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        targets({"url": "http://h/metrics", **table})


def test_config_show_masks_the_targets(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [n for n in os.environ if n.startswith("DRAFTWATCH_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    config = tmp_path / "draftwatch.toml"
    config.write_text(f'[[scrape]]\nurl = "http://h/metrics"\nkind = "vllm"\nbearer_token = "{TOKEN}"\n')
    assert main(["config", "show", "--json"]) == 0
    out, err = capsys.readouterr()
    shown = {row["setting"]: row["value"] for row in json.loads(out)}
    assert shown["scrape"] == "*** (set)"
    assert TOKEN not in out + err
