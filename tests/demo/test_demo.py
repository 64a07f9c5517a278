"""The demo end to end (real decoding, real processes, real webhooks), and its receiver's signature check."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from monitor.demo.receiver import WebhookReceiver
from monitor.webhooks.signing import headers


def test_receiver_keeps_verified_deliveries_once_and_rejects_forged_ones() -> None:
    key = os.urandom(24)
    receiver = WebhookReceiver("whsec_" + base64.b64encode(key).decode()).start()
    try:
        body = '{"alerts": [{"status": "firing", "labels": {"alertname": "acceptance_drop", "workload": "x"}}]}'
        signed = headers("msg_1", int(time.time()), body, key)
        for _ in range(2):  # a retry of the same webhook-id is kept once
            assert httpx.post(receiver.url, content=body, headers=signed).status_code == 204
        forged = headers("msg_2", int(time.time()), body, b"not the key at all, no....")
        httpx.post(receiver.url, content=body, headers=forged)
        assert [d.webhook_id for d in receiver.deliveries] == ["msg_1"]
        assert receiver.rejected == 1
        found = receiver.wait_for(lambda d: d.payload["alerts"][0]["labels"]["workload"] == "x", timeout=1)
        assert found is not None and found.verified
    finally:
        receiver.stop()


@pytest.mark.models
@pytest.mark.slow
def test_quick_demo_exits_zero_with_the_alert(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "monitor.cli", "demo", "--quick", "--exit", "--dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, result.stdout[-4000:]
    assert "alert received by the local webhook receiver (signature verified" in output
    assert "acceptance_drop" in output and "'workload': 'extract'" in output
    assert "drift findings of the latest run for workload 'extract'" in output
