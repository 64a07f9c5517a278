"""The base install: the watching sidecar runs without the decoder's and the dashboard's packages.

The interpreter under test starts with ``-S`` and a ``PYTHONPATH`` of this environment's packages
minus the extras' (torch, transformers, gguf, safetensors, ninja, streamlit, altair), so they are
absent as on a base install, not merely unused: ``import torch`` fails there.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from decoder.extras import EXTRAS
from monitor.demo.receiver import Delivery, WebhookReceiver
from tests.api.conftest import ADMIN, INGEST, TOKENS, auth
from tests.drift.records import window_stream
from tests.serving import free_port

ROOT = Path(__file__).resolve().parents[1]
ABSENT = {*(m for modules in EXTRAS.values() for m in modules), "safetensors", "ninja", "torchgen"}
HEAVY = ("torch", "transformers", "streamlit", "scipy", "fastapi", "sqlalchemy")


def _distribution(entry: str) -> str:
    return entry.split("-")[0].split(".")[0].lower()


@pytest.fixture(scope="module")
def base_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment whose interpreter (run with -S) sees this one's packages except the extras'."""
    packages = tmp_path_factory.mktemp("base-site-packages")
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if _distribution(entry.name) not in ABSENT and not entry.name.endswith(".pth"):
            (packages / entry.name).symlink_to(entry)
    return {**os.environ, "PYTHONPATH": f"{packages}{os.pathsep}{ROOT}"}


def draftwatch(*args: str) -> list[str]:
    return [sys.executable, "-S", "-m", "monitor.commands", *args]


def test_help_imports_none_of_the_heavy_packages() -> None:
    # What makes `draftwatch --help` start in a fraction of a second: registering the commands loads
    # neither the model code, nor the statistics, the web framework or the database layer.
    probe = ("import json, sys; from monitor.commands.main import build_parser; build_parser(); "
             "print(json.dumps(sorted(sys.modules)))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert [m for m in HEAVY if m in json.loads(done.stdout)] == []


def test_the_extras_are_absent_there_and_their_commands_say_which_to_install(base_env: dict[str, str]) -> None:
    assert subprocess.run([sys.executable, "-S", "-c", "import torch"], env=base_env, capture_output=True).returncode
    cases = {
        ("generate", "hello"): "pip install 'draftwatch[decoder]'",
        ("serve", "--target", "smollm2-135m"): "pip install 'draftwatch[decoder]'",
        ("dashboard",): "pip install 'draftwatch[dashboard]'",
        ("demo", "--exit"): "pip install 'draftwatch[decoder]'",
    }
    for args, advice in cases.items():
        done = subprocess.run(draftwatch(*args), env=base_env, capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 2, (args, done.stderr)
        assert advice in done.stderr and "not installed" in done.stderr, (args, done.stderr)


def test_evaluate_asks_a_remote_server_without_the_decoder_and_evaluate_decoding_here_needs_it(
    base_env: dict[str, str],
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: the command got as far as asking
    remote = subprocess.run(draftwatch("evaluate", "--server", url, "--builtin"), env=base_env, capture_output=True,
                            text=True, cwd=ROOT)  # fmt: skip
    assert remote.returncode == 1 and remote.stderr.startswith(f"error: cannot reach {url}"), remote.stderr
    local = subprocess.run(draftwatch("evaluate", "--server", url, "--drafter", "ngram", "--builtin"), env=base_env,
                           capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert local.returncode == 2 and "pip install 'draftwatch[decoder]'" in local.stderr, local.stderr


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    started = WebhookReceiver(secret).start()
    yield started
    started.stop()


def _acceptance_drop(delivery: Delivery) -> bool:
    return any(a.get("status") == "firing" and a.get("labels", {}).get("alertname") == "acceptance_drop"
               for a in delivery.payload.get("alerts", []))  # fmt: skip


@pytest.mark.slow
def test_serve_ingests_runs_drift_and_delivers_a_webhook_without_the_extras(
    base_env: dict[str, str], receiver: WebhookReceiver, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **base_env,
        "HOME": str(tmp_path),
        "DRAFTWATCH_DATA_DIR": str(tmp_path / "data"),
        "DRAFTWATCH_DATABASE_URL": f"sqlite:///{tmp_path / 'draftwatch.db'}",
        "DRAFTWATCH_API_TOKENS": TOKENS,
        "DRAFTWATCH_SCHEDULER_DRIFT_INTERVAL": "3s",
        "DRAFTWATCH_SCHEDULER_DELIVERY_INTERVAL": "1s",
        "DRAFTWATCH_SCHEDULER_HEARTBEAT_S": "1",
        "DRAFTWATCH_DRIFT_CURRENT_WINDOW": "10m",
        "DRAFTWATCH_DRIFT_REFERENCE_WINDOW": "1h",
        "DRAFTWATCH_ALERTS_FOR_RUNS": "1",
        "DRAFTWATCH_WEBHOOKS": json.dumps([{"url": receiver.url, "format": "alertmanager", "secret": receiver.secret}]),
    }
    server = subprocess.Popen(draftwatch("--log-level", "INFO", "serve", "--port", str(port)), env=env,
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None and time.monotonic() < deadline, "serve did not become ready"
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        now = datetime.now(UTC)
        # A workload at 80 % acceptance for an hour, then at 30 % for the last ten minutes.
        before = window_stream(now - timedelta(minutes=70), now - timedelta(minutes=10), 200, workload="rag", alpha=0.8)
        after = window_stream(now - timedelta(minutes=10), now - timedelta(minutes=1), 200, workload="rag", alpha=0.3)
        answer = httpx.post(f"{base}/v1/events", json={"events": [r.to_dict() for r in before + after]},
                            headers=auth(INGEST), timeout=30)  # fmt: skip
        assert answer.status_code == 202 and answer.json()["stored"] == 400
        delivery = receiver.wait_for(_acceptance_drop, timeout=90)
        assert delivery is not None and delivery.verified
        drift = httpx.get(f"{base}/v1/drift", params={"workload": "rag", "test": "acceptance"}, headers=auth(ADMIN))
        assert [r["decision"] for r in drift.json()["results"]] == ["drift"]
    finally:
        server.terminate()
        output = server.communicate(timeout=30)[0].decode()
    assert "Traceback" not in output, output[-3000:]
