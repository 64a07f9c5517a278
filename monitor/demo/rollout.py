"""The demo's second act (``draftwatch demo --rollout``): a new drafter rolled out on the demo's live traffic.

The sidecar serves the scenario's candidate drafter beside its portfolio (``serve
--candidate-drafter``), idle until a rollout stages it. After the drift scene the demo starts a
per-workload rollout through ``POST /v1/rollouts`` (steps 50 %, 100 %), keeps the same traffic
going, and prints each event as the scheduler's judge stores it (held, kept, promoted or rolled
back) while the rollout alerts arrive at the webhook receiver. It ends with the judge's word per
workload: which drafter serves it now, and the candidate's decode speed against the current
drafters' with its interval.

The judge's settings are the product's but for scale: a step lasts the scenario's
``rollout_interval`` and a workload is judged from :data:`MIN_REQUESTS` requests a side (30 in
production), so that the act takes minutes, not hours; :data:`MAX_HOLDS` lets the step wait for
the slower workloads.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

import httpx
from tqdm.auto import tqdm

from monitor.demo.scenario import Scenario

MIN_REQUESTS: Final = 10
MAX_HOLDS: Final = 8


def rollout_environment(scenario: Scenario) -> dict[str, str]:
    """The sidecar's settings for the act: its candidate drafter, the judge at the demo's scale, quick reads."""
    return {
        "DRAFTWATCH_DECODER_CANDIDATE": scenario.candidate,
        "DRAFTWATCH_ROLLOUT_DRAFTER": scenario.candidate_name,
        "DRAFTWATCH_ROLLOUT_MIN_REQUESTS": str(MIN_REQUESTS),
        "DRAFTWATCH_ROLLOUT_MAX_HOLDS": str(MAX_HOLDS),
        "DRAFTWATCH_SCHEDULER_ROLLOUT_INTERVAL": "5s",
        # The decoder reads the rollout's share every proxy.route_refresh_s: a step's share applies within it.
        "DRAFTWATCH_PROXY_ROUTE_REFRESH_S": "1",
    }


def start(client: httpx.Client, scenario: Scenario) -> dict[str, Any]:
    """Start the rollout as ``draftwatch rollout start --steps 50,100 --per-workload`` does; its row."""
    body = {"steps": [50, 100], "interval": scenario.rollout_interval, "per_workload": True}
    response = client.post("/v1/rollouts", json=body)
    response.raise_for_status()
    rollout: dict[str, Any] = response.json()
    return rollout


class Watch:
    """Follows one rollout through ``GET /v1/rollouts/ID``: prints its new events, keeps each workload's last word."""

    def __init__(self, client: httpx.Client, rollout_id: int) -> None:
        self.client = client
        self.rollout_id = rollout_id
        self.printed = 0
        self.latest: dict[str, Any] = {}
        self.judged: dict[str, dict[str, Any]] = {}  # per workload, the newest judgement that judged it

    def poll(self) -> dict[str, Any]:
        response = self.client.get(f"/v1/rollouts/{self.rollout_id}")
        response.raise_for_status()
        self.latest = response.json()
        for event in self.latest["events"][self.printed :]:
            tqdm.write(f"    rollout {event['kind']}: {event['reason']}")
            self._keep(event["judgement"].get("workloads", {}))
        self.printed = len(self.latest["events"])
        self._keep(self.latest["judgement"].get("workloads", {}))
        return self.latest

    @property
    def ended(self) -> bool:
        """Has the judge (or a hand) decided: promoted, rolled back or aborted?"""
        return bool(self.latest.get("status", "running") != "running")

    def done(self) -> bool:
        """Poll, then whether the rollout has ended."""
        self.poll()
        return self.ended

    def _keep(self, workloads: Mapping[str, dict[str, Any]]) -> None:
        for workload, judgement in workloads.items():
            if judgement.get("outcome") != "unjudged":
                self.judged[workload] = judgement


def served_by(rollout: Mapping[str, Any], workload: str) -> str:
    """Which drafter serves ``workload`` once the rollout has ended as it did."""
    side = rollout.get("workloads", {}).get(workload)
    if side == "candidate" or (rollout.get("status") == "promoted" and side is None and not rollout["per_workload"]):
        return f"the candidate ({rollout['drafter']})"
    return "the current drafters"


def verdict_lines(scenario: Scenario, watch: Watch) -> list[str]:
    """Per workload: who serves it now, the judge's outcome and the candidate's decode speed with its interval."""
    rollout = watch.latest
    lines = [f"rollout {rollout['id']} {rollout['status']}: {rollout['reason']}"]
    for workload in scenario.workloads:
        judged = watch.judged.get(workload)
        if judged is None:
            lines.append(f"  {workload:10} served by {served_by(rollout, workload)}; never judged (too few requests)")
            continue
        speed = next((m for m in judged["metrics"] if m["metric"] == "decode_speed"), None)
        shown = ""
        if speed is not None and speed["ci"]:
            shown = (f", decode speed {speed['ratio']:.2f}x the current drafters' [{speed['ci'][0]:.2f}, "
                     f"{speed['ci'][1]:.2f}] ({speed['candidate']:.0f} against {speed['current']:.0f} ms per token, "
                     f"{judged['n_candidate']} / {judged['n_current']} requests)")  # fmt: skip
        lines.append(f"  {workload:10} served by {served_by(rollout, workload)}; judged {judged['outcome']}{shown}")
    return lines


def wait_until_ended(watch: Watch, timeout: float) -> bool:
    """Poll until the rollout has ended (True) or ``timeout`` seconds pass (False): the judge runs every 5 s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if watch.done():
            return True
        time.sleep(1)
    return False
