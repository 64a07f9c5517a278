"""The demo, start to finish: start the parts, drive real traffic, change one workload, wait for the alert."""

from __future__ import annotations

import base64
import gc
import itertools
import json
import logging
import os
import random
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from tqdm.auto import tqdm

from decoder.models.fetch import FetchError
from decoder.models.loading import ModelLoadError
from decoder.speculation.controller import SpeculationController
from monitor.api.decoding.controller_state import STATE_FILE, save_controller
from monitor.demo.processes import ProcessGroup, free_port
from monitor.demo.receiver import Delivery, WebhookReceiver
from monitor.demo.rollout import MIN_REQUESTS, Watch, rollout_environment, start, verdict_lines, wait_until_ended
from monitor.demo.scenario import Scenario
from monitor.demo.summary import print_summary
from monitor.demo.traffic import Traffic
from monitor.drift.queries import pin_baseline
from monitor.store.engine import create_engine

log = logging.getLogger(__name__)


def demo_environment(scenario: Scenario, workdir: Path, api_port: int, webhook_url: str, secret: str) -> dict[str, str]:
    """Settings for every child: a fresh SQLite file, short scheduler intervals, the local receiver."""
    return {
        **os.environ,
        "DRAFTWATCH_DATA_DIR": str(workdir),
        "DRAFTWATCH_DATABASE_URL": f"sqlite:///{workdir / 'draftwatch.db'}",
        "DRAFTWATCH_API_PORT": str(api_port),
        "DRAFTWATCH_DECODER_HOLDOUT_SHARE": "0.2",
        "DRAFTWATCH_SCHEDULER_DRIFT_INTERVAL": scenario.drift_interval,
        "DRAFTWATCH_SCHEDULER_DELIVERY_INTERVAL": "2s",
        "DRAFTWATCH_SCHEDULER_LEASE_TTL_S": "10",
        "DRAFTWATCH_SCHEDULER_HEARTBEAT_S": "2",
        "DRAFTWATCH_DRIFT_CURRENT_WINDOW": scenario.current_window,
        "DRAFTWATCH_DRIFT_REFERENCE_WINDOW": "15m",
        "DRAFTWATCH_DRIFT_MIN_REQUESTS": str(scenario.min_per_window),
        # The alert's split of the drop (mix or within, with intervals) at the demo's scale too: at the default 30
        # requests a workload and window it would only say there is not enough data to split.
        "DRAFTWATCH_DRIFT_EXPLAIN_MIN_REQUESTS": str(scenario.min_per_window),
        "DRAFTWATCH_ALERTS_FOR_RUNS": "1",
        "DRAFTWATCH_WEBHOOKS": json.dumps([{"url": webhook_url, "format": "alertmanager", "secret": secret}]),
    }


def is_acceptance_alert(workload: str) -> Any:
    def matches(delivery: Delivery) -> bool:
        return any(
            alert.get("status") == "firing"
            and alert.get("labels", {}).get("alertname") == "acceptance_drop"
            and alert.get("labels", {}).get("workload") == workload
            for alert in delivery.payload.get("alerts", [])
        )

    return matches


def print_delivery(delivery: Delivery) -> None:
    for alert in delivery.payload.get("alerts", []):
        labels, notes = alert.get("labels", {}), alert.get("annotations", {})
        tqdm.write(
            f"\n>>> webhook received (signature verified, id {delivery.webhook_id}): [{alert.get('status')}] "
            f"{labels.get('alertname')} workload={labels.get('workload', '-')} severity={labels.get('severity')}\n"
            f"    {notes.get('summary', '')} {notes.get('description', '')}".rstrip()
        )


# Most requests a phase adds per workload to measure its speedup. At the demo's 20 % holdout share any
# 10 consecutive requests of a workload hold out 2 (decoder/holdout.py), and a drafter the controller
# has switched off is probed within its probe_every (10) requests: 12 leave room for a request with
# a single output token, which has no decode time.
TOP_UP_REQUESTS = 12


def shuffled_rounds(prompts: list[str], rng: random.Random) -> Iterator[str]:
    """Every prompt once a round, in a new order each round.

    At the demo's 20 % share a workload's holdouts fall exactly 5 requests apart (decoder/holdout.py),
    and each workload has 5 prompts: cycled in a fixed order, every holdout would read the same prompt.
    """
    while True:
        yield from rng.sample(prompts, len(prompts))


def enough_before(scenario: Scenario, traffic: Traffic) -> bool:
    """Has the traffic before the change what the drift test needs, time apart?"""
    return (
        min(traffic.requests[w] for w in scenario.workloads) >= scenario.min_per_window
        # The controller may switch speculation off where it does not pay (prose, say); the
        # changed workload needs speculative requests, the acceptance test's evidence.
        and traffic.speculative[scenario.changed] >= scenario.min_per_window + 2
    )


def drive(
    client: httpx.Client,
    scenario: Scenario,
    traffic: Traffic,
    *,
    changed: bool,
    until: Any,
    desc: str,
    top_up: bool = True,
) -> Traffic:
    """Send requests round-robin over the workloads (the changed one three times as often after the change).

    Once ``until()`` holds, it tops up the workloads whose speedup this phase lacks evidence for
    (:meth:`Traffic.unmeasured`): the phase may end after a handful of requests of a workload (the
    alert can arrive soon after the change), too few to hold any out. The progress bar shows this
    phase's acceptance per workload; ``traffic`` accumulates every phase. Returns this phase's traffic.
    ``top_up`` False: none (the rollout's phase has its own evidence).
    """
    order = list(scenario.workloads) + ([scenario.changed] * 2 if changed else [])
    rng = random.Random(0)
    cursors = {w: shuffled_rounds(scenario.prompts(w, changed), rng) for w in scenario.workloads}
    phase = Traffic()
    with tqdm(desc=desc, unit="req") as bar:

        def send(workload: str) -> None:
            body = {"prompt": next(cursors[workload]), "chat": True, "workload": workload,
                    "max_new_tokens": scenario.max_new_tokens}  # fmt: skip
            response = client.post("/v1/generate", json=body)
            response.raise_for_status()
            traffic.add(workload, response.json()["record"])
            phase.add(workload, response.json()["record"])
            bar.set_postfix_str(f"acceptance {phase.line()}")
            bar.update()

        for workload in itertools.cycle(order):
            if until():
                break
            send(workload)
        added = dict.fromkeys(scenario.workloads, 0 if top_up else TOP_UP_REQUESTS)
        while lacking := [w for w in phase.unmeasured(scenario.workloads) if added[w] < TOP_UP_REQUESTS]:
            for workload in lacking:
                send(workload)
                added[workload] += 1
    return phase


def prepare_pair(scenario: Scenario, workdir: Path) -> str:
    """Load the sidecar's model pair here, once, so that the slow first steps show in the terminal.

    The sidecar runs as a child with its output in a log file. Loading the pair here first converts
    and quantizes the models into the cache (minutes on the first run, with progress bars) and times
    the pair (calibration) into the controller state that the sidecar resumes from its data directory
    (with its own holdout settings); the sidecar then loads the prepared copies in seconds and plans
    its first request from measured costs. A state already there (``--dir`` reused) is kept.
    Returns the pair's costs in one line, or where they were measured before.
    """
    decoder = scenario.decoder()
    state = workdir / STATE_FILE
    if state.exists():
        return f"the pair's costs as measured before, in {state}"
    print("timing the model pair (calibration)", flush=True)
    decoder.controller = SpeculationController()
    decoder.calibrate()
    save_controller(decoder.controller, state)
    return "; ".join(f"{label}: {decoder.controller.cost_summary(label)}" for label in decoder.labels)


def rollout_act(client: httpx.Client, scenario: Scenario, traffic: Traffic) -> bool:
    """The second act (monitor/demo/rollout.py): True when the rollout ended by the judge's decision in time."""
    print(f"\n*** a new drafter: {scenario.candidate} ({scenario.candidate_name}) rolled out on the live traffic, "
          f"per workload: 50 % of each workload's requests, then all where it passes; judged every 5 s from "
          f"{MIN_REQUESTS} requests a side, a step lasting {scenario.rollout_interval}. The "
          "workloads' prompts are the ones before the change again.\n", flush=True)  # fmt: skip
    watch = Watch(client, int(start(client, scenario)["id"]))
    deadline = time.monotonic() + scenario.rollout_timeout
    drive(client, scenario, traffic, changed=False, desc="rollout", top_up=False,
          until=lambda: watch.done() or time.monotonic() > deadline)  # fmt: skip
    ended = watch.ended or wait_until_ended(watch, timeout=15)
    if not ended:
        print(f"the rollout had not ended after {scenario.rollout_timeout:.0f} s: {watch.latest.get('reason')}")
        return False
    print("\n".join(verdict_lines(scenario, watch)), flush=True)
    return True


def run_demo(
    scenario: Scenario, workdir: Path, *, exit_after: bool, dashboard: bool, dashboard_port: int, rollout: bool = False
) -> int:
    """Run the demo; returns the exit status (0 when the acceptance alert arrived, and with ``rollout`` the
    rollout ended)."""
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"draftwatch demo ({scenario.name}): {scenario.target} drafting with {scenario.drafter}; "
          f"data, logs and database in {workdir}", flush=True)  # fmt: skip
    print(f"preparing {scenario.target}: fetch, convert and quantize once (minutes on the first run, "
          "seconds later), then time the pair", flush=True)  # fmt: skip
    # Before transformers' bars start, reading a GGUF file's tokenizer and building the model take a
    # minute with nothing on screen; decoder.models.loading says what is going on at INFO.
    logging.getLogger("decoder.models.loading").setLevel(logging.INFO)
    clock = time.monotonic()
    try:
        costs = prepare_pair(scenario, workdir)
    except (ModelLoadError, FetchError) as error:
        print(f"draftwatch demo: {error}", file=sys.stderr)
        return 1
    gc.collect()  # the prepared model's gigabytes (its modules hold reference cycles), before the sidecar loads
    print(f"models ready in {time.monotonic() - clock:.0f} s ({costs})", flush=True)
    secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    receiver = WebhookReceiver(secret, on_delivery=print_delivery).start()
    api_port = free_port()
    environment = demo_environment(scenario, workdir, api_port, receiver.url, secret)
    group = ProcessGroup({**environment, **(rollout_environment(scenario) if rollout else {})}, workdir)
    api = f"http://127.0.0.1:{api_port}"
    try:
        print("starting the sidecar (log: sidecar.log)", flush=True)
        clock = time.monotonic()
        group.start("sidecar", ["serve", *scenario.model_arguments])
        group.wait_http("sidecar", f"{api}/readyz", timeout=900)
        print(f"sidecar ready in {time.monotonic() - clock:.0f} s", flush=True)
        dashboard_url = None
        if dashboard:
            group.start("dashboard", ["dashboard", "--port", str(dashboard_port)])
            dashboard_url = f"http://127.0.0.1:{dashboard_port}"
        engine = create_engine(f"sqlite:///{workdir / 'draftwatch.db'}")
        traffic = Traffic()
        started = datetime.now(UTC)
        with httpx.Client(base_url=api, timeout=300) as client:
            clock = time.monotonic()
            drive(client, scenario, traffic, changed=False, desc="before the change", until=lambda: (
                time.monotonic() - clock >= scenario.before_seconds and enough_before(scenario, traffic)
            ))  # fmt: skip
            changed_at = datetime.now(UTC)
            before = traffic.copy()
            # The changed workload's reference is exactly the traffic before the change.
            pin_baseline(engine, scenario.changed, at=changed_at, length=changed_at - started + timedelta(seconds=1))
            print(f"\n*** the change: {scenario.change_description}\n", flush=True)
            alert_arrived = is_acceptance_alert(scenario.changed)
            deadline = time.monotonic() + scenario.after_timeout
            drive(client, scenario, traffic, changed=True, desc="after the change", until=lambda: (
                time.monotonic() > deadline or any(alert_arrived(d) for d in receiver.deliveries)
            ))  # fmt: skip
            alert = receiver.wait_for(alert_arrived, timeout=30)
            print_summary(engine, scenario, before, traffic.since(before), alert, dashboard_url)
            decided = rollout_act(client, scenario, traffic) if rollout and alert is not None else True
        if exit_after or alert is None or not decided:
            return 0 if alert is not None and decided else 1
        print("serving until Ctrl-C ...", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0 if exit_after is False else 130
    finally:
        group.stop()
        receiver.stop()
