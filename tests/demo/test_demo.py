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

from benchmarks.demo_run import PHASES, Run
from monitor.commands.main import build_parser
from monitor.demo.receiver import WebhookReceiver
from monitor.demo.scenario import FULL, QUICK
from monitor.demo.summary import finding_line
from monitor.demo.traffic import Traffic
from monitor.drift.result import DriftResult
from monitor.notify.signing import headers


def record(mode: str, latency_ms: float | None, ttft_ms: float | None, output_tokens: int) -> dict[str, object]:
    """The fields of a /v1/generate response's record that the demo reads."""
    drafted = 8 if mode == "speculative" else 0
    return {"mode": mode, "latency_ms": latency_ms, "ttft_ms": ttft_ms, "output_tokens": output_tokens,
            "num_draft_tokens": drafted, "num_accepted_tokens": drafted * 3 // 4}  # fmt: skip


def test_the_default_demo_serves_a_portfolio_and_its_help_says_so() -> None:
    # The n-gram drafter pays on a CPU where the 0.5B draft costs more than it saves; the controller picks.
    for scenario in (FULL, QUICK):
        assert scenario.model_arguments[-2:] == ("--drafter", "ngram")
    assert FULL.model_arguments == ("--target", "qwen-coder-1.5b", "--draft", "qwen-coder-0.5b", "--drafter", "ngram")
    assert FULL.drafter == "qwen-coder-0.5b and the n-gram drafter" and QUICK.drafter == "the n-gram drafter"
    subcommands = next(a for a in build_parser()._actions if a.dest == "command")
    description = " ".join(subcommands.choices["demo"].description.split())  # type: ignore[union-attr]
    assert (
        "qwen-coder-1.5b with a portfolio of two drafters, the qwen-coder-0.5b draft model and the n-gram"
        in description
    )


def test_speedup_compares_decode_speed_of_holdout_with_speculative_requests() -> None:
    traffic = Traffic()
    # Decode ms per token = (latency - TTFT) / (output tokens - 1): holdout 40 and 60 (mean 50) ...
    traffic.add("extract", record("holdout", 1000.0, 200.0, 21))
    traffic.add("extract", record("holdout", 1400.0, 200.0, 21))
    # ... speculative 20, with a long prompt (TTFT) that a latency / tokens ratio would count.
    traffic.add("extract", record("speculative", 2400.0, 2000.0, 21))
    # Left out: plain requests, one token (no decode phase), no TTFT.
    traffic.add("extract", record("plain", 100.0, 50.0, 21))
    traffic.add("extract", record("speculative", 50.0, 40.0, 1))
    traffic.add("extract", record("speculative", 5000.0, None, 21))
    assert traffic.speedup("extract") == pytest.approx(50.0 / 20.0)
    assert traffic.requests["extract"] == 6 and traffic.speculative["extract"] == 3
    assert traffic.acceptance("extract") == pytest.approx(18 / 24)
    before = traffic.copy()
    traffic.add("extract", record("speculative", 1200.0, 200.0, 21))  # 50 ms a token
    after = traffic.since(before)
    assert after.speedup("extract") is None  # no holdout request since
    assert traffic.speedup("extract") == pytest.approx(50.0 / 35.0)
    assert Traffic().speedup("extract") is None


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
        [sys.executable, "-m", "monitor.commands", "demo", "--quick", "--exit", "--dir", str(tmp_path / "demo")],
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
    # benchmarks/demo_run.py times the demo by its lines: each phase it looks for must be printed.
    run = Run()
    for line in output.replace("\r", "\n").splitlines():
        run.see(line, 0.0)
    assert set(run.seconds) >= {key for key, _, _ in PHASES if key not in ("convert", "quantize")}


def test_a_finding_without_a_p_value_prints() -> None:
    # The net-loss estimate decides without a p-value; the summary printed '{None:.2g}' and crashed.
    estimate = DriftResult("net_loss", "speedup", 40, 30, None, None, 0.87, (0.8, 0.95), "drift", note="estimate")
    assert finding_line(estimate) == (
        "  net_loss/speedup: effect +0.870 (95% CI [+0.800, +0.950]), p=n/a, q=n/a, n_ref=40, n_cur=30 — estimate"
    )
