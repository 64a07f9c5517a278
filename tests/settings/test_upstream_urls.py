"""Upstream URLs are checked whole when the settings load, and their passwords never show."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request

from monitor.commands.main import main
from monitor.config import ConfigError, Settings
from monitor.proxy.settings import parse_upstream, parse_upstreams
from monitor.settings.masking import mask_urls, quoted
from tests.proxy.upstream import Upstream, proxy_sidecar, serving

SECRET = "s3cret-Pw"


def load_error(**env: str) -> str:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"HOME": "/nonexistent", **env})
    return str(raised.value)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:99999", "port 99999: expected a port 1-65535"),
        ("http://127.0.0.1:0", "port 0: expected a port 1-65535"),
        ("http://127.0.0.1:abc", "port 'abc': expected a port 1-65535"),
        ("http://127.0.0.1:", "port '': expected a port 1-65535"),
        ("http://[::1", "expected an IPv6 address in brackets, such as http://[::1]:8080"),
        ("http://[::1]x", "expected an IPv6 address in brackets, such as http://[::1]:8080"),
        ("http://[not-v6]:80", "expected an IPv6 address in brackets, such as http://[::1]:8080"),
        ("http://::1:8080", "expected an IPv6 address in brackets, such as http://[::1]:8080"),
        ("http://:8080", "expected a host, such as http://127.0.0.1:8080"),
        ("http://h!st:8080", "host 'h!st': expected a host name or an IP address"),
        ("ftp://h:21", "expected an http:// or https:// base URL, such as http://127.0.0.1:8080"),
        ("http://h:1/v1?key=x", "expected no query or fragment: the proxy appends each request's own path and query"),
        ("http://h:1/#top", "expected no query or fragment: the proxy appends each request's own path and query"),
        ("http://h:1/a b", "expected a URL of printable ASCII, no blanks: percent-encode other characters"),
        ("http://h:1/é", "expected a URL of printable ASCII, no blanks: percent-encode other characters"),
        ("http://@h:1", "expected user:password before '@'"),
    ],
)
def test_a_bad_upstream_is_refused_at_load_naming_the_variable_and_value(url: str, expected: str) -> None:
    # Quoted as given, but for a query's or fragment's values (tests/settings/test_masking_urls.py).
    assert load_error(DRAFTWATCH_PROXY_UPSTREAM=url) == f"DRAFTWATCH_PROXY_UPSTREAM={mask_urls(url)!r}: {expected}"
    assert load_error(DRAFTWATCH_PROXY_BASELINE_UPSTREAM=url).endswith(f": {expected}")


def test_what_the_proxy_forwards_to_is_accepted() -> None:
    assert parse_upstreams("http://a:8080/v1/, https://[::1]:8443, http://ada:p%40ss@b") == (
        "http://a:8080/v1",
        "https://[::1]:8443",
        "http://ada:p%40ss@b",
    )
    assert parse_upstream("http://model_server-1.internal") == "http://model_server-1.internal"


def test_a_password_is_masked_in_the_error_even_where_it_breaks_the_url() -> None:
    for url in (f"http://ada:{SECRET}@h:99999", f"http://ada:{SECRET}/x@h:1", f"http://ada:{SECRET}?@h:1"):
        message = load_error(DRAFTWATCH_PROXY_UPSTREAM=f"http://ok:1,{url}")
        assert SECRET not in message and "ada:***@h" in message, message
    # A password with "/" unencoded ends the authority early: refused before its pieces are read as a port.
    assert load_error(DRAFTWATCH_PROXY_UPSTREAM=f"http://ada:{SECRET}/x@h:1").endswith(
        "expected '@' only to end user:password (percent-encode / ? # @ in a password)"
    )


def test_a_route_s_bad_upstream_is_refused_with_its_password_masked(tmp_path: Path) -> None:
    routes = [{"model": "q*", "upstream": ["http://a:1", f"http://ada:{SECRET}@b:70000"]}]
    message = load_error(DRAFTWATCH_PROXY_ROUTES=json.dumps(routes))
    assert SECRET not in message
    assert message.endswith("route 1: upstream=['http://a:1', 'http://ada:***@b:70000']: port 70000: expected a port "
                            "1-65535")  # fmt: skip
    path = tmp_path / "draftwatch.toml"
    path.write_text(
        f'[[proxy.routes]]\nmodel = "q"\nupstream = "http://a:1"\nbaseline_upstream = "http://u:{SECRET}@[::1"\n'
    )
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"HOME": str(tmp_path)}, path)
    assert SECRET not in str(raised.value) and "baseline_upstream='http://u:***@[::1'" in str(raised.value)


def test_routes_nested_too_deep_to_read_are_refused_in_one_short_line() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    message = load_error(DRAFTWATCH_PROXY_ROUTES=deep)
    assert message.endswith("expected a JSON list of {model, upstream, kind, baseline_upstream, candidate_upstream} "
                            "tables, not nested thousands deep")  # fmt: skip
    assert "\n" not in message and len(message) < 500
    # Deep enough to read but no table: quoted cut short, not whole.
    message = load_error(DRAFTWATCH_PROXY_ROUTES="[" * 500 + "]" * 500)
    got = message.partition(": route 1: expected a table with model and upstream, got ")[2]
    assert got.startswith("[[[") and "...]" in got and len(message) < 500


def test_masking_keeps_the_user_and_hides_the_password_or_a_lone_user() -> None:
    assert mask_urls("http://a:1,http://ada:x@b:2, postgresql+psycopg://db:pw@h/d") == (
        "http://a:1,http://ada:***@b:2, postgresql+psycopg://db:***@h/d"
    )
    assert mask_urls("https://ghp_token@h") == "https://***@h"
    assert quoted("x" * 1000).count("x") < 300


def test_config_show_masks_url_passwords_in_text_and_json(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("DRAFTWATCH_PROXY_UPSTREAM", f"http://ada:{SECRET}@a:8080,http://b:8080")
    monkeypatch.setenv("DRAFTWATCH_PROXY_ROUTES", json.dumps([{"model": "q", "upstream": f"http://r:{SECRET}@r:1"}]))
    monkeypatch.setenv("DRAFTWATCH_DATABASE_URL", f"postgresql+psycopg://dw:{SECRET}@db/dw")
    assert main(["config", "show"]) == 0
    text = capsys.readouterr().out
    assert main(["config", "show", "--json"]) == 0
    rows = {row["setting"]: row["value"] for row in json.loads(capsys.readouterr().out)}
    assert SECRET not in text and SECRET not in json.dumps(rows)
    assert rows["proxy.upstream"] == "http://ada:***@a:8080, http://b:8080"
    assert rows["proxy.routes"] == "q -> [http://r:***@r:1] (proxy.kind)"
    assert rows["database.url"] == "postgresql+psycopg://dw:***@db/dw"
    assert "http://ada:***@a:8080, http://b:8080" in text


class CountingUpstream(Upstream):
    """The stand-in upstream, remembering every Authorization header of each request: one, never two."""

    def __init__(self) -> None:
        super().__init__()
        self.authorizations: list[list[str]] = []

    async def _remember(self, request: Request) -> dict[str, Any] | None:
        self.authorizations.append(request.headers.getlist("authorization"))
        return await super()._remember(request)


def test_a_url_s_credentials_go_upstream_as_basic_auth_unless_the_client_sends_its_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stub = CountingUpstream()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    db_url = f"sqlite:///{tmp_path / 'dw.db'}"
    caplog.set_level(logging.DEBUG)
    with serving(stub) as url:
        with_credentials = url.replace("http://", "http://ada:p%40ss%3Aw0rd@")
        with proxy_sidecar(tmp_path, db_url, with_credentials) as client:
            assert client.post("/v1/chat/completions", json=body).status_code == 200
            mine = client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer client-key"})
            assert mine.status_code == 200
    assert stub.authorizations == [["Basic " + base64.b64encode(b"ada:p@ss:w0rd").decode()], ["Bearer client-key"]]
    sent = stub.seen[0][1]
    # The Host header and every log line name the upstream by host and port alone.
    assert sent["host"] == url.removeprefix("http://")
    assert "p%40ss" not in caplog.text and "p@ss" not in caplog.text


def test_a_config_file_nested_too_deep_is_one_config_error(tmp_path: Path) -> None:
    deep = tmp_path / "draftwatch.toml"
    deep.write_text("x = " + "[" * 20_000 + "]" * 20_000 + "\n")
    with pytest.raises(ConfigError, match="nest thousands deep"):
        Settings.from_env({"HOME": str(tmp_path)}, deep)


def test_a_misspelled_key_in_the_file_shows_its_value_masked(tmp_path: Path) -> None:
    config = tmp_path / "draftwatch.toml"
    config.write_text(f'[proxy]\nupstrem = "http://ada:{SECRET}@h:8080"\n')
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"HOME": str(tmp_path)}, config)
    assert "did you mean proxy.upstream?" in str(raised.value) and SECRET not in str(raised.value)
