"""deploy/'s example tokens never guard a sidecar: ``draftwatch serve`` refuses them in one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from monitor.api.app import create_app
from monitor.api.settings import parse_api_tokens
from tests.api.conftest import ADMIN, make_settings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "replace-me-admin-token-0001"  # deploy/base/secret.yaml's


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_serve_refuses_an_example_token_in_one_line(tmp_path: Path, sqlite_url: str, host: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "monitor.commands", "serve", "--host", host, "--database-url", sqlite_url,
         "--no-scheduler"],
        capture_output=True,
        text=True,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "DRAFTWATCH_API_TOKENS": f"read:{ADMIN},admin:{EXAMPLE}"},
        cwd=ROOT,
        timeout=60,  # a refusal takes a second or two; a sidecar that started would run on
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("draftwatch serve: refusing to start with the example admin token"), line
    assert "DRAFTWATCH_API_TOKENS" in line and "deploy/README.md" in line
    assert EXAMPLE not in done.stderr + done.stdout and ADMIN not in done.stderr + done.stdout


def test_an_app_is_never_built_with_an_example_token(tmp_path: Path, sqlite_url: str) -> None:
    settings = make_settings(tmp_path, sqlite_url)
    example = settings.with_values({"api.tokens": parse_api_tokens("read:replace-me-read-token-0001")})
    with pytest.raises(ValueError, match="example read token"):
        create_app(example)
