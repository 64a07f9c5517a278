"""The demo end to end (real decoding, real processes, real webhooks), and its receiver's signature check."""

from __future__ import annotations

import base64
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from benchmarks.demo_run import PHASES, Run
from decoder.record import decode_ms_per_token
from decoder.speculation.controller import Observation, SpeculationController
from monitor.commands.main import build_parser
from monitor.config import Settings
from monitor.demo.receiver import WebhookReceiver
from monitor.demo.rollout import MAX_HOLDS, MIN_REQUESTS, Watch, rollout_environment, served_by, verdict_lines
from monitor.demo.run import demo_environment, drive, enough_before, shuffled_rounds
from monitor.demo.scenario import FULL, QUICK, Scenario
from monitor.demo.summary import finding_line, traffic_table
from monitor.demo.traffic import Traffic
from monitor.drift.result import DriftResult
from monitor.notify.signing import headers
from monitor.store.engine import create_engine
from monitor.store.models import RequestRow
from monitor.store.rollouts import SERVED_MODES, get_rollout, rollout_events
from tests.rollout_truth import Bands, Word, check_judge, judged_words, truth_of

# A webhook secret the settings accept, where a test resolves the demo's environment.
SECRET = "whsec_" + base64.b64encode(b"0" * 24).decode()


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


@pytest.mark.parametrize("scenario", [QUICK, FULL], ids=["quick", "full"])
def test_the_alert_s_split_runs_at_the_demo_s_scale(tmp_path: Path, scenario: Scenario) -> None:
    """At the default drift.explain_min_requests (30) the demo's windows hold too few requests a workload: the
    alert would only say there is not enough data to split."""
    environment = demo_environment(scenario, tmp_path, 8000, "http://127.0.0.1:9/hook", SECRET)
    # Resolved as the demo's processes resolve them: a misspelt variable would leave the default.
    drift = Settings.from_env({"HOME": str(tmp_path), **environment}, None).drift
    assert drift.explain_min_requests == drift.min_requests == scenario.min_per_window < 30


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
def test_quick_demo_exits_zero_with_the_alert_and_the_rollout_decided(tmp_path: Path) -> None:
    demo = ["demo", "--quick", "--rollout", "--exit", "--dir", str(tmp_path / "demo")]
    result = subprocess.run(
        [sys.executable, "-m", "monitor.commands", *demo],
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
    # The alert's description is printed: the drop quantified, and split (or why not) at the demo's scale.
    assert "Acceptance fell" in output
    # The second act: the target as its own draft decodes plain, about half the n-gram drafter's speed on the
    # copying prompts of extract (0.48x when this test was written), so the judge keeps extract on the current
    # drafter. Checked against the decoder's own timings of the requests the judge read, not this machine's premise.
    assert "*** a new drafter: model:smollm2-135m (self-draft)" in output
    assert "rollout 1 rolled_back:" in output or "rollout 1 promoted:" in output
    truth, words = extract_truth(tmp_path / "demo" / "draftwatch.db")
    # The judge's floor from the tolerance the demo's sidecar resolves (its environment, as the demo gives it).
    environment = {**demo_environment(QUICK, tmp_path / "demo", 8000, "http://r", SECRET), **rollout_environment(QUICK)}
    bands = Bands.of(Settings.from_env(environment, None).rollout.tolerance)
    call = check_judge({"extract": truth}, words, bands)["extract"]
    if call == "fail":
        assert "extract    served by the current drafters; judged fail, decode speed" in output
        assert "rollout kept: extract kept on the current drafter (failed)" in output
    # benchmarks/demo_run.py times the demo by its lines: each phase it looks for must be printed.
    run = Run()
    for line in output.replace("\r", "\n").splitlines():
        run.see(line, 0.0)
    assert set(run.seconds) >= {key for key, _, _ in PHASES if key not in ("convert", "quantize")}


def extract_truth(db: Path) -> tuple[float, dict[str, Word]]:
    """The demo's rollout on extract: the records' own ratio over the judge's last interval that judged it, and the
    judge's words (:func:`tests.rollout_truth.judged_words`).

    The ratio is the current drafters' mean decode ms per token over the candidate's, from the stored records of
    that interval (what the decoder measured).
    """
    engine = create_engine(f"sqlite:///{db}")
    try:
        rollout = get_rollout(engine, 1)
        assert rollout is not None
        words = judged_words(rollout_events(engine, rollout_id=1), rollout.judgement)
        assert "extract" in words, f"extract was never judged: {rollout}"
        start, end = (datetime.fromisoformat(t).replace(tzinfo=None) for t in words["extract"].interval)
        r = RequestRow
        with engine.connect() as conn:
            rows = conn.execute(
                select(r.drafter, r.latency_ms, r.ttft_ms, r.output_tokens, r.decode_ms, r.ts_start).where(
                    r.workload == "extract", r.mode.in_(SERVED_MODES)
                )
            ).all()
    finally:
        engine.dispose()
    sides: dict[str, list[float]] = {"candidate": [], "current": []}
    for row in rows:
        ms = decode_ms_per_token(row.latency_ms, row.ttft_ms, row.output_tokens, row.decode_ms)
        if ms is None or not start <= row.ts_start.replace(tzinfo=None) < end:
            continue
        if row.drafter == rollout.drafter:
            sides["candidate"].append(ms)
        elif row.drafter in rollout.current_drafters:
            sides["current"].append(ms)
    means = {side: statistics.mean(ms) for side, ms in sides.items() if ms}
    return truth_of(means, f"extract's records in the judge's interval {start} to {end}"), words


def test_a_finding_without_a_p_value_prints() -> None:
    # The net-loss estimate decides without a p-value; the summary printed '{None:.2g}' and crashed.
    estimate = DriftResult(
        test="net_loss",
        metric="speedup",
        n_ref=40,
        n_cur=30,
        statistic=None,
        p=None,
        effect=0.87,
        ci=(0.8, 0.95),
        decision="drift",
        note="estimate",
    )
    assert finding_line(estimate) == (
        "  net_loss/speedup: effect +0.870 (95% CI [+0.800, +0.950]), p=n/a, q=n/a, n_ref=40, n_cur=30 — estimate"
    )


# The fake sidecar's acceptance per workload, and every request's output tokens.
FAKE_ALPHA = {"code-edit": 0.8, "extract": 0.9, "prose": 0.05}
FAKE_TOKENS = 32


class FakeSidecar:
    """/v1/generate without models: the demo's controller (its holdout policy, seed 0 as prepare_pair saves it)
    plans each request and learns from made-up measurements, so prose's drafts lose and it runs plain."""

    def __init__(self, scenario: Scenario, workdir: Path) -> None:
        environ = demo_environment(scenario, workdir, 8000, "http://127.0.0.1:1/hook", "whsec_" + "A" * 32)
        policy = Settings.from_env(environ).holdout_policy
        self.controller = SpeculationController.from_state(SpeculationController().state(), policy)
        self.held_prompts: dict[str, list[str]] = defaultdict(list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        workload = body["workload"]
        plan = self.controller.plan(workload, prompt_tokens=60, max_new_tokens=FAKE_TOKENS)
        self.held_prompts[workload] += [body["prompt"]] if plan.mode == "holdout" else []
        if plan.mode == "speculative":
            judged = 8 * 4  # 8 steps of 4 drafts; t1 = 100 ms, a draft 30 ms
            accepted = round(FAKE_ALPHA[workload] * judged)
            seen = Observation(accepted=accepted, judged=judged, draft_tokens=judged, draft_ms=judged * 30.0,
                               verify_passes=8, verify_drafts=judged, verify_ms=8 * 120.0,
                               output_tokens=FAKE_TOKENS)  # fmt: skip
            decode_ms = 8 * (4 * 30.0 + 120.0)
        else:
            accepted = judged = 0
            seen = Observation(single_passes=FAKE_TOKENS, single_ms=FAKE_TOKENS * 100.0, output_tokens=FAKE_TOKENS)
            decode_ms = (FAKE_TOKENS - 1) * 100.0
        self.controller.observe(workload, seen, plan.mode)
        record = {"mode": plan.mode, "ttft_ms": 200.0, "latency_ms": 200.0 + decode_ms, "output_tokens": FAKE_TOKENS,
                  "num_draft_tokens": judged, "num_accepted_tokens": accepted}  # fmt: skip
        return httpx.Response(200, json={"record": record})


@pytest.mark.parametrize("scenario", [QUICK, FULL], ids=lambda s: s.name)
@pytest.mark.parametrize("after_requests", [1, 5, 17])
def test_the_summary_has_a_speedup_for_every_workload_before_and_after(
    tmp_path: Path, scenario: Scenario, after_requests: int
) -> None:
    """Both phases as short as the demo lets them be: before, just what the drift test needs; after, the
    alert arriving after ``after_requests`` requests (17 in benchmarks/RESULTS.md's run, which had 3 holdouts
    in all and printed n/a for every workload)."""
    sidecar = FakeSidecar(scenario, tmp_path)
    traffic = Traffic()
    with httpx.Client(transport=httpx.MockTransport(sidecar.handle), base_url="http://sidecar") as client:
        drive(client, scenario, traffic, changed=False, desc="before", until=lambda: enough_before(scenario, traffic))
        before = traffic.copy()
        start = sum(before.requests.values())
        after = drive(client, scenario, traffic, changed=True, desc="after",
                      until=lambda: sum(traffic.requests.values()) - start >= after_requests)  # fmt: skip
    assert sidecar.controller.plan("prose").mode in ("plain", "holdout")  # prose's speculation is probed only
    table = traffic_table(scenario, before, after)
    assert len(table) == 1 + len(scenario.workloads) and not any("n/a" in line for line in table[1:]), table
    for phase in (before, after):
        assert phase.unmeasured(scenario.workloads) == []
        assert all(phase.speedup(w) is not None for w in scenario.workloads)
    # Holdouts fall every 5th request at 20 %, and a workload has 5 prompts: in a fixed order every
    # holdout of a workload read the same one.
    assert all(len(set(sidecar.held_prompts[w])) > 1 for w in scenario.workloads), sidecar.held_prompts


def test_shuffled_rounds_send_every_prompt_once_a_round_in_changing_orders() -> None:
    prompts = [f"p{i}" for i in range(5)]
    sent = list(itertools.islice(shuffled_rounds(prompts, random.Random(1)), 50))
    rounds = [sent[i : i + 5] for i in range(0, 50, 5)]
    assert all(sorted(r) == prompts for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1


def judged(outcome: str, ratio: float, ci: tuple[float, float]) -> dict[str, object]:
    """A workload's judgement as GET /v1/rollouts/ID shows it."""
    speed = {"metric": "decode_speed", "outcome": outcome, "candidate": 40.0, "current": 40.0 * ratio,
             "ratio": ratio, "ci": list(ci)}  # fmt: skip
    return {"outcome": outcome, "reason": "", "score": 100, "n_candidate": 12, "n_current": 20, "metrics": [speed]}


def test_the_rollout_act_says_who_serves_each_workload_and_why() -> None:
    watch = Watch(httpx.Client(), 1)
    watch.latest = {"id": 1, "status": "promoted", "per_workload": True, "drafter": "draft-only",
                    "reason": "promoted", "workloads": {"extract": "current", "prose": "candidate"}}  # fmt: skip
    watch.judged = {"extract": judged("fail", 0.45, (0.4, 0.5)), "prose": judged("pass", 1.03, (0.98, 1.08))}
    lines = verdict_lines(FULL, watch)
    assert lines[0] == "rollout 1 promoted: promoted"
    by = {line.split()[0]: line for line in lines[1:]}
    assert (
        "served by the current drafters; judged fail, decode speed 0.45x the current drafters' [0.40, 0.50]"
        in (by["extract"])
    )
    assert "served by the candidate (draft-only); judged pass, decode speed 1.03x" in by["prose"]
    assert by["code-edit"].endswith("served by the current drafters; never judged (too few requests)")
    # A whole (not per-workload) promotion gives the candidate every workload; a rollback none.
    whole = {**watch.latest, "per_workload": False, "workloads": {}}
    assert served_by(whole, "code-edit") == "the candidate (draft-only)"
    assert served_by({**whole, "status": "rolled_back"}, "code-edit") == "the current drafters"


def test_the_rollout_act_s_sidecar_serves_the_candidate_and_judges_at_the_demo_s_scale() -> None:
    for scenario in (QUICK, FULL):
        settings = Settings.from_env({**demo_environment(scenario, Path("/tmp/x"), 8000, "http://r", SECRET),
                                      **rollout_environment(scenario)})  # fmt: skip
        assert str(settings.decoder.candidate) == scenario.candidate
        assert settings.rollout.drafter == scenario.candidate_name
        assert settings.rollout.min_requests == MIN_REQUESTS < 30 and settings.rollout.max_holds == MAX_HOLDS
