"""Prometheus text exposition of what this sidecar recorded, with names parallel to vLLM's ``spec_decode_*``.

Counters are per process and count records when this process made them durable (committed or
fsync'd to the spool), ingested or decoded alike; Prometheus sums replicas. A record re-sent with a
known ``request_id`` is stored once and counted once; only one that arrives while the database is
down, and is therefore spooled before the store can tell, is counted again. Labels are bounded: after
:data:`MAX_WORKLOADS` distinct workloads, further ones are counted under ``workload="_other"`` (a
name no real tag can take), so a hostile client cannot blow up the series count.

>>> m = Metrics(); from monitor.ingest.synthetic import synthetic_record
>>> m.observe([synthetic_record(1, workload="code")], "written")
>>> 'draftwatch_requests_total{workload="code",mode="speculative"} 1' in m.render()
True
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from decoder.record import RequestRecord

MAX_WORKLOADS: Final = 200
OTHER: Final = "_other"
TPOT_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)
TTFT_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)

Labels = tuple[tuple[str, str], ...]
# (name, help, type) of every family, in exposition order.
FAMILIES: Final = (
    ("draftwatch_requests_total", "Finished requests recorded, by workload and mode.", "counter"),
    ("draftwatch_request_errors_total", "Recorded requests that finished with an error.", "counter"),
    ("draftwatch_spec_decode_num_drafts_total", "Verification steps (vLLM: spec_decode_num_drafts).", "counter"),
    ("draftwatch_spec_decode_num_draft_tokens_total", "Draft tokens proposed.", "counter"),
    ("draftwatch_spec_decode_num_accepted_tokens_total", "Draft tokens accepted.", "counter"),
    (
        "draftwatch_spec_decode_num_accepted_tokens_per_pos_total",
        "Steps whose draft token at position (0-based) was accepted.",
        "counter",
    ),
    ("draftwatch_prompt_tokens_total", "Prompt tokens of recorded requests.", "counter"),
    ("draftwatch_generation_tokens_total", "Output tokens of recorded requests.", "counter"),
    (
        "draftwatch_time_per_output_token_seconds",
        "Time per output token after the first (TTFT left out, as in vLLM's metric of that name).",
        "histogram",
    ),
    ("draftwatch_time_to_first_token_seconds", "Time to first token.", "histogram"),
)


class _Histogram:
    __slots__ = ("buckets", "count", "counts", "total")

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.buckets, value)
        if index < len(self.counts):
            self.counts[index] += 1
        self.count += 1
        self.total += value


class Metrics:
    """Thread-safe counters and histograms; :meth:`observe` is the recorder's ``on_durable`` hook."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[Labels, float]] = defaultdict(lambda: defaultdict(float))
        self._histograms: dict[str, dict[Labels, _Histogram]] = defaultdict(dict)
        self._workloads: set[str] = set()
        # Extra families rendered at scrape time (recorder figures, decode queue): name -> callable.
        self._collectors: list[Callable[[], Iterable[tuple[str, str, str, float]]]] = []

    def add_collector(self, collect: Callable[[], Iterable[tuple[str, str, str, float]]]) -> None:
        """``collect()`` yields ``(name, help, type, value)`` at every scrape."""
        self._collectors.append(collect)

    def observe(self, records: Sequence[RequestRecord], where: str) -> None:
        # A spooled batch is counted when spooled; its later replay is the same records again.
        if where not in ("written", "spooled"):
            return
        with self._lock:
            for rec in records:
                self._observe_one(rec)

    def _workload(self, tag: str) -> str:
        if tag in self._workloads:
            return tag
        if len(self._workloads) >= MAX_WORKLOADS:
            return OTHER
        self._workloads.add(tag)
        return tag

    def _observe_one(self, rec: RequestRecord) -> None:
        workload = self._workload(rec.workload)
        wl: Labels = (("workload", workload),)
        c = self._counters
        c["draftwatch_requests_total"][(*wl, ("mode", rec.mode))] += 1
        if rec.finish_reason == "error":
            c["draftwatch_request_errors_total"][wl] += 1
        c["draftwatch_prompt_tokens_total"][wl] += rec.prompt_tokens
        c["draftwatch_generation_tokens_total"][wl] += rec.output_tokens
        if rec.num_draft_tokens or rec.num_spec_steps:
            c["draftwatch_spec_decode_num_drafts_total"][wl] += rec.num_spec_steps
            c["draftwatch_spec_decode_num_draft_tokens_total"][wl] += rec.num_draft_tokens
            c["draftwatch_spec_decode_num_accepted_tokens_total"][wl] += rec.num_accepted_tokens
            for position, accepted in enumerate(rec.accepted_per_position):
                c["draftwatch_spec_decode_num_accepted_tokens_per_pos_total"][(*wl, ("position", str(position)))] += (
                    accepted
                )
        tpot = rec.decode_ms_per_token
        if tpot is not None:
            self._histogram("draftwatch_time_per_output_token_seconds", wl, TPOT_BUCKETS).observe(tpot / 1000)
        if rec.ttft_ms is not None:
            self._histogram("draftwatch_time_to_first_token_seconds", wl, TTFT_BUCKETS).observe(rec.ttft_ms / 1000)

    def _histogram(self, name: str, labels: Labels, buckets: Sequence[float]) -> _Histogram:
        family = self._histograms[name]
        if labels not in family:
            family[labels] = _Histogram(buckets)
        return family[labels]

    def render(self) -> str:
        """The Prometheus text format (version 0.0.4)."""
        lines: list[str] = []
        with self._lock:
            for name, help_text, kind in FAMILIES:
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
                if kind == "counter":
                    for labels, value in sorted(self._counters[name].items()):
                        lines.append(f"{name}{_labels(labels)} {_number(value)}")
                    continue
                for labels, hist in sorted(self._histograms[name].items()):
                    cumulative = 0
                    for bound, count in zip(hist.buckets, hist.counts, strict=True):
                        cumulative += count
                        lines.append(f"{name}_bucket{_labels((*labels, ('le', _number(bound))))} {cumulative}")
                    lines.append(f"{name}_bucket{_labels((*labels, ('le', '+Inf')))} {hist.count}")
                    lines.append(f"{name}_sum{_labels(labels)} {_number(hist.total)}")
                    lines.append(f"{name}_count{_labels(labels)} {hist.count}")
        for collect in self._collectors:
            for name, help_text, kind, value in collect():
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {_number(value)}"]
        return "\n".join(lines) + "\n"


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{key}="{_escape(value)}"' for key, value in labels)
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
