"""`draftwatch config show` and the warning for a misspelled DRAFTWATCH_* variable, through the entry point."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from monitor.commands.main import main

TOKEN = "read:abcdefghijklmnopqrstuvwxyz"
SECRET = "whsec_" + "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("DRAFTWATCH_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))


def show(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[dict[str, dict[str, str]], str]:
    assert main(["config", "show", "--json", *extra]) == 0
    out, err = capsys.readouterr()
    return {row["setting"]: row for row in json.loads(out)}, out + err


def test_every_setting_with_its_source_and_no_secret_shown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("DRAFTWATCH_API_TOKENS", TOKEN)
    monkeypatch.setenv("DRAFTWATCH_WEBHOOKS", json.dumps([{"url": "https://hooks.example.com/x", "secret": SECRET}]))
    (tmp_path / "draftwatch.toml").write_text('[proxy]\nbaseline_upstream = ["http://plain:8081"]\n')
    rows, printed = show(capsys)
    assert rows["api.tokens"]["source"] == "DRAFTWATCH_API_TOKENS" and rows["api.tokens"]["value"] == "*** (set)"
    assert rows["proxy.baseline_upstream"]["source"] == f"{tmp_path / 'draftwatch.toml'}: proxy.baseline_upstream"
    assert rows["proxy.baseline_upstream"]["value"] == "http://plain:8081"
    assert rows["drift.min_requests"] == {"setting": "drift.min_requests", "value": "30", "source": "default",
                                          "env": "DRAFTWATCH_DRIFT_MIN_REQUESTS"}  # fmt: skip
    assert "abcdefghijklmnop" not in printed and "c2VjcmV0" not in printed


def test_a_misspelled_variable_is_named_with_the_closest_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DRAFTWATCH_PROXY_UPSTEAM", "http://127.0.0.1:8080")
    monkeypatch.setenv("DRAFTWATCH_QUANTIZE", "int4")  # the decoder's own variable: no warning
    _, printed = show(capsys)
    assert "DRAFTWATCH_PROXY_UPSTEAM is not a draftwatch setting and is ignored: did you mean " \
           "DRAFTWATCH_PROXY_UPSTREAM?" in printed  # fmt: skip
    assert "DRAFTWATCH_QUANTIZE" not in printed.split("[", 1)[0]


def test_an_unknown_key_in_the_file_is_an_error_with_the_closest_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "draftwatch.toml").write_text("[proxy]\nbaseline_upstrem = 'http://plain:8081'\n")
    assert main(["config", "show"]) == 2
    assert "unknown setting (did you mean proxy.baseline_upstream?)" in capsys.readouterr().err
