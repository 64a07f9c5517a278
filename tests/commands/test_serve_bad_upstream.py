"""`draftwatch serve` with a bad upstream URL: exit 2 and one line before anything listens, through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.serving import free_port

DRAFTWATCH = Path(sys.executable).with_name("draftwatch")
SECRET = "s3cret-Pw"


def environment(tmp_path: Path, **env: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTWATCH_")}
    return {**clean, "HOME": str(tmp_path), "DRAFTWATCH_DATA_DIR": str(tmp_path / "data"), **env}


def serve(tmp_path: Path, *options: str, **env: str) -> subprocess.CompletedProcess[str]:
    command = [str(DRAFTWATCH), "serve", "--no-scheduler", "--port", str(free_port()), *options]
    return subprocess.run(command, env=environment(tmp_path, **env), capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)  # fmt: skip


@pytest.mark.parametrize(
    ("options", "env", "message"),
    [
        (["--upstream", "http://127.0.0.1:99999"], {},
         "--upstream='http://127.0.0.1:99999': port 99999: expected a port 1-65535"),
        (["--upstream", "http://127.0.0.1:abc"], {}, "--upstream='http://127.0.0.1:abc': port 'abc': expected a port "
                                                     "1-65535"),
        (["--upstream", "http://[::1"], {},
         "--upstream='http://[::1': expected an IPv6 address in brackets, such as http://[::1]:8080"),
        (["--upstream", "http://a:1", "--baseline-upstream", f"http://ada:{SECRET}@b:0"], {},
         "--baseline-upstream='http://ada:***@b:0': port 0: expected a port 1-65535"),
        (["--upstream", "http://a:1", "--upstream", "http://a:1/"], {},
         "--upstream: expected each base URL once, got ['http://a:1', 'http://a:1']"),
        ([], {"DRAFTWATCH_PROXY_UPSTREAM": f"http://ada:{SECRET}@a:1,http://b:x"},
         "DRAFTWATCH_PROXY_UPSTREAM='http://ada:***@a:1,http://b:x': port 'x': expected a port 1-65535"),
        (["--upstream", "http://a:1"], {"DRAFTWATCH_PROXY_ROUTES": "[" * 50_000 + "]" * 50_000},
         "expected a JSON list of {model, upstream, kind, baseline_upstream, candidate_upstream} tables, not nested "
         "thousands deep"),
    ],
)  # fmt: skip
def test_a_bad_upstream_exits_2_with_one_line_and_no_traceback(
    tmp_path: Path, options: list[str], env: dict[str, str], message: str
) -> None:
    done = serve(tmp_path, *options, **env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "listening" not in done.stderr and SECRET not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("draftwatch serve: ") and line.endswith(message), line


def test_the_comma_form_on_the_command_line_is_a_pool_as_in_the_environment(tmp_path: Path) -> None:
    pool = f"http://ada:{SECRET}@127.0.0.1:9,http://127.0.0.1:10"
    command = [str(DRAFTWATCH), "serve", "--no-scheduler", "--port", str(free_port()),
               "--upstream", pool, "--upstream", "http://127.0.0.1:11"]  # fmt: skip
    with subprocess.Popen(command, env=environment(tmp_path), stderr=subprocess.PIPE, text=True, cwd=tmp_path) as proc:
        try:
            assert proc.stderr is not None
            deadline = time.monotonic() + 60
            line = ""
            while "listening" not in line:
                assert time.monotonic() < deadline and proc.poll() is None, line
                line = proc.stderr.readline()
        finally:
            proc.terminate()
            proc.wait(30)
    assert "proxy mode: 3 speculative upstream(s)" in line and SECRET not in line


def test_config_show_json_lists_the_pool_masked(tmp_path: Path) -> None:
    env = environment(tmp_path, DRAFTWATCH_PROXY_BASELINE_UPSTREAM=f"http://ada:{SECRET}@b:1")
    done = subprocess.run([str(DRAFTWATCH), "config", "show", "--json"], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = {row["setting"]: row["value"] for row in json.loads(done.stdout)}
    assert rows["proxy.baseline_upstream"] == "http://ada:***@b:1" and SECRET not in done.stdout
