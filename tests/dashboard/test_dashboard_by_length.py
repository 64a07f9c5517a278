"""The Workload page's acceptance by prompt length and by output position, against the store's own figures."""

from __future__ import annotations

import json
import math
from typing import Any

import pyarrow as pa

from dashboard.timerange import DEFAULT_RANGE, time_range
from monitor.store.reads import queries
from tests.dashboard.conftest import AppFactory, Store


def bars(element: Any) -> dict[tuple[str, str], float]:
    # Streamlit sends a chart's rows as Arrow IPC beside its spec.
    rows = pa.ipc.open_stream(element.proto.data.data).read_all().to_pylist()
    return {(row["window"], row["bucket"]): row["acceptance"] for row in rows}


def test_workload_page_shows_acceptance_by_length(app: AppFactory, seeded_store: Store) -> None:
    at = app(seeded_store.url, "workload")
    next(s for s in at.selectbox if s.label == "Workload").select("chat").run()
    assert not at.exception
    window = time_range(DEFAULT_RANGE)
    want: dict[str, dict[tuple[str, str], float]] = {"prompt": {}, "output": {}}
    for name, (start, end) in (
        ("reference", (window.reference.start, window.reference.end)),
        ("current", (window.start, window.end)),
    ):
        summary = queries.workload_summary(seeded_store.engine, "chat", start, end)
        assert summary is not None
        for kind, buckets in (("prompt", summary.by_prompt_length), ("output", summary.by_output_position)):
            want[kind].update({(name, b.bucket): b.acceptance_rate for b in buckets if b.acceptance_rate is not None})
    by_title = {}
    for element in at.get("vega_lite_chart"):
        x = json.loads(element.proto.spec).get("encoding", {}).get("x", {})
        by_title[x.get("title")] = element
    shown = {"prompt": bars(by_title["prompt tokens"]), "output": bars(by_title["output position of the step"])}
    for kind in ("prompt", "output"):
        assert shown[kind].keys() == want[kind].keys() and want[kind]
        assert all(math.isclose(shown[kind][k], want[kind][k]) for k in want[kind])
    # The seeded chat prompts (50-400 tokens) fill the first two buckets; its answers stay under 128 tokens.
    assert {b for _, b in want["prompt"]} == {"0-256", "256-1024"}
    assert {b for _, b in want["output"]} == {"0-32", "32-128"}
    # chat's acceptance fell (in the range's last hour): in every bucket, as the seed made it.
    assert all(want["prompt"][("current", b)] < want["prompt"][("reference", b)] for b in ("0-256", "256-1024"))
