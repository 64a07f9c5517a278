"""No URL secret is quoted (issue 49, item 8): a refusal and ``config show`` mask a URL's user info, a password
with blanks included, and every value of its query and fragment, keeping the keys; through the real command."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monitor.settings.masking import mask_urls, quoted
from tests.serving import ROOT

KEY = "sk-live-123"
PASSWORD = "pass word"


def draftwatch(tmp_path: Path, *arguments: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTWATCH_")}
    environment = {**clean, "HOME": str(tmp_path), "DRAFTWATCH_DATA_DIR": str(tmp_path / "data"), **env}
    return subprocess.run([sys.executable, "-m", "monitor.commands", *arguments], env=environment, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.mark.parametrize(
    ("upstream", "shown"),
    [
        (f"http://127.0.0.1:8080?api_key={KEY}", "'http://127.0.0.1:8080?api_key=***': expected no query"),
        (f"http://ada:{PASSWORD}@127.0.0.1:8080", "'http://ada:***@127.0.0.1:8080': expected a URL of printable"),
        (f"http://127.0.0.1:8080/v1#access_token={KEY}", "'http://127.0.0.1:8080/v1#access_token=***': expected no"),
    ],
)
def test_serve_refuses_an_upstream_without_quoting_its_secret(tmp_path: Path, upstream: str, shown: str) -> None:
    done = draftwatch(tmp_path, "serve", "--upstream", upstream, "--port", "99999", "--no-scheduler")
    assert done.returncode == 2, done.stderr
    assert KEY not in done.stdout + done.stderr and PASSWORD not in done.stdout + done.stderr
    assert f"draftwatch serve: --upstream={shown}" in done.stderr


def test_config_show_refuses_an_upstream_without_quoting_its_secrets(tmp_path: Path) -> None:
    upstream = f"http://ada:{PASSWORD}@127.0.0.1:8080/v1?api_key={KEY}&model=m"
    done = draftwatch(tmp_path, "config", "show", DRAFTWATCH_PROXY_UPSTREAM=upstream)
    assert done.returncode == 2, done.stderr
    assert KEY not in done.stdout + done.stderr and PASSWORD not in done.stdout + done.stderr
    assert "DRAFTWATCH_PROXY_UPSTREAM='http://ada:***@127.0.0.1:8080/v1?api_key=***&model=***'" in done.stderr


def test_config_show_masks_a_database_url_s_query_values(tmp_path: Path) -> None:
    # A database URL may carry its password as a query parameter (libpq's); config show quotes it masked.
    database = f"postgresql+psycopg://dw@db/dw?password={KEY}&sslmode=require"
    done = draftwatch(tmp_path, "config", "show", DRAFTWATCH_DATABASE_URL=database)
    assert done.returncode == 0, done.stderr
    assert KEY not in done.stdout and "postgresql+psycopg://***@db/dw?password=***&sslmode=***" in done.stdout


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        # A password with blanks, quotes, "/", "?", "#" or "@" unencoded: masked up to the authority's last "@".
        ("http://ada:p a'ss/?#@w@h:1/v1", "http://ada:***@h:1/v1"),
        # The next URL of a list, after a comma or blanks, is a URL of its own.
        ("http://a:p w@h:1, https://b:q@i:2,http://j:3?k=v", "http://a:***@h:1, https://b:***@i:2,http://j:3?k=***"),
        # Keys kept; a parameter without "=" may be a token alone.
        ("http://h:1/?a=1;b=2&&c#x=1&y", "http://h:1/?a=***;b=***&&***#x=***&***"),
        # Where "@" follows in the text, more is masked than the URL's: never less.
        ("see http://h:1 and user@example.com", "see http://h:***@example.com"),
        ("http://[::1]:8080/v1", "http://[::1]:8080/v1"),
    ],
)
def test_mask_urls(text: str, masked: str) -> None:
    assert mask_urls(text) == masked


def test_masking_is_linear_in_the_value_whatever_it_holds() -> None:
    # Each value takes this a few hundredths of a second; a search that backtracks (for the last "@" after
    # each "://", or for the scheme before each) takes minutes on one of them.
    values = ["://" * 20_000, "http://" + "a:" * 150_000 + "@", "http://h?" + "&a=b" * 75_000,
              "x" * 300_000 + "://", " " * 300_000 + "://" + "a" * 300_000]  # fmt: skip
    for value in values:
        started = time.perf_counter()
        assert len(quoted(value)) < 300
        assert time.perf_counter() - started < 1.0, value[:20]


def test_a_refused_database_url_and_a_remote_candidates_error_quote_no_secret() -> None:
    from monitor.commands.evaluate.servers import ServerError
    from monitor.store.engine import create_engine

    with pytest.raises(ValueError, match="only sqlite and postgresql") as refused:
        create_engine(f"mysql://ada:{KEY}@db.example/x?password={KEY}")
    assert KEY not in str(refused.value) and "mysql://ada:***@db.example/x?password=***" in str(refused.value)
    error = ServerError(f"cannot reach http://ada:{KEY}@h:8080?api_key={KEY}: start the server there")
    assert KEY not in str(error) and "http://ada:***@h:8080?api_key=***" in str(error)
