"""Prometheus text exposition of what this sidecar recorded, with names parallel to vLLM's ``spec_decode_*``.

Counters are per process and count records when this process made them durable (committed or
fsync'd to the spool), ingested or decoded alike; Prometheus sums replicas. A record re-sent with a
known ``request_id`` is stored once and counted once; only one that arrives while the database is
down, and is therefore spooled before the store can tell, is counted again.

Every record family is labelled by ``workload``, ``target`` and ``drafter`` (the second half of the
drift results' ``pair``: ``model:qwen-coder-0.5b``, ``ngram``), and by ``mode`` where a request's mode
applies (requests, errors, tokens, latencies; drafts happen only in speculative mode). A label set
seen for the first time gets zero samples in every family, for every mode, so ``rate()`` and ratios
work from the first scrape. Label sets are bounded: after :data:`MAX_LABEL_SETS` distinct
``(workload, target, drafter)`` sets, further ones are counted under ``_other`` in all three (a name no
workload tag can take), and per-position counts beyond :data:`MAX_POSITIONS` under ``position="_other"``,
so a hostile client cannot blow up the series count.

>>> m = Metrics(); from monitor.ingest.synthetic import synthetic_record
>>> m.observe([synthetic_record(1, workload="code")], "written")
>>> for line in m.render().splitlines():
...     if line.startswith("draftwatch_requests_total{"):
...         print(line)
draftwatch_requests_total{workload="code",target="qwen-coder-1.5b",drafter="model:qwen-coder-0.5b",mode="holdout"} 0
draftwatch_requests_total{workload="code",target="qwen-coder-1.5b",drafter="model:qwen-coder-0.5b",mode="plain"} 0
draftwatch_requests_total{workload="code",target="qwen-coder-1.5b",drafter="model:qwen-coder-0.5b",mode="speculative"} 1
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from decoder.record import MODES, RequestRecord
from monitor.store.types import Pair

MAX_LABEL_SETS: Final = 200
MAX_POSITIONS: Final = 32
OTHER: Final = "_other"
TPOT_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)
TTFT_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)

Labels = tuple[tuple[str, str], ...]
OTHER_KEY: Final[Labels] = (("workload", OTHER), ("target", OTHER), ("drafter", OTHER))

REQUESTS: Final = "draftwatch_requests_total"
ERRORS: Final = "draftwatch_request_errors_total"
PROMPT_TOKENS: Final = "draftwatch_prompt_tokens_total"
GENERATION_TOKENS: Final = "draftwatch_generation_tokens_total"
DRAFTS: Final = "draftwatch_spec_decode_num_drafts_total"
DRAFT_TOKENS: Final = "draftwatch_spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS: Final = "draftwatch_spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS: Final = "draftwatch_spec_decode_num_accepted_tokens_per_pos_total"
TPOT: Final = "draftwatch_request_time_per_output_token_seconds"
TTFT: Final = "draftwatch_time_to_first_token_seconds"


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family as exposed; without samples it still says HELP and TYPE."""

    name: str
    help: str
    kind: str  # counter or gauge
    samples: Sequence[tuple[Labels, float]] = ()


@dataclass(frozen=True, slots=True)
class _Spec:
    name: str
    help: str
    by_mode: bool = False
    buckets: tuple[float, ...] = ()  # a histogram when given


# Every family fed by records, in exposition order.
RECORD_FAMILIES: Final = (
    _Spec(REQUESTS, "Finished requests recorded.", by_mode=True),
    _Spec(ERRORS, "Recorded requests that finished with an error.", by_mode=True),
    _Spec(PROMPT_TOKENS, "Prompt tokens of recorded requests.", by_mode=True),
    _Spec(GENERATION_TOKENS, "Output tokens of recorded requests.", by_mode=True),
    _Spec(DRAFTS, "Verification steps (vLLM: spec_decode_num_drafts)."),
    _Spec(DRAFT_TOKENS, "Draft tokens proposed."),
    _Spec(ACCEPTED_TOKENS, "Draft tokens accepted."),
    _Spec(ACCEPTED_PER_POS, "Steps whose draft token at position (0-based) was accepted."),
    _Spec(
        TPOT,
        "A request's decode time per output token after the first (vLLM's request_time_per_output_token).",
        by_mode=True,
        buckets=TPOT_BUCKETS,
    ),
    _Spec(TTFT, "Time to first token.", by_mode=True, buckets=TTFT_BUCKETS),
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

    def __init__(self, version: str = "0.0.0") -> None:
        self._lock = threading.Lock()
        self._version = version
        self._counters: dict[str, dict[Labels, float]] = {s.name: {} for s in RECORD_FAMILIES if not s.buckets}
        self._histograms: dict[str, dict[Labels, _Histogram]] = {s.name: {} for s in RECORD_FAMILIES if s.buckets}
        self._keys: set[Labels] = set()  # at most MAX_LABEL_SETS, plus OTHER_KEY
        # Figures rendered at scrape time: single values (recorder, decode queue) and whole families (store).
        self._collectors: list[Callable[[], Iterable[tuple[str, str, str, float]]]] = []
        self._family_collectors: list[Callable[[], Iterable[Family]]] = []

    def add_collector(self, collect: Callable[[], Iterable[tuple[str, str, str, float]]]) -> None:
        """``collect()`` yields ``(name, help, type, value)`` of unlabelled figures at every scrape."""
        self._collectors.append(collect)

    def add_families(self, collect: Callable[[], Iterable[Family]]) -> None:
        """``collect()`` yields labelled :class:`Family` objects at every scrape."""
        self._family_collectors.append(collect)

    def observe(self, records: Sequence[RequestRecord], where: str) -> None:
        # A spooled batch is counted when spooled; its later replay is the same records again.
        if where not in ("written", "spooled"):
            return
        with self._lock:
            for rec in records:
                self._observe_one(rec)

    def _key(self, rec: RequestRecord) -> Labels:
        """The record's label set; the first time it is seen, zero samples for it in every family."""
        drafter = Pair(rec.target_model, rec.drafter, rec.draft_model).label.removeprefix(f"{rec.target_model}/")
        key: Labels = (("workload", rec.workload), ("target", rec.target_model), ("drafter", drafter))
        if key not in self._keys and len(self._keys) >= MAX_LABEL_SETS:
            key = OTHER_KEY
        if key in self._keys:
            return key
        self._keys.add(key)
        for spec in RECORD_FAMILIES:
            if spec.name == ACCEPTED_PER_POS:
                continue  # positions are filled as records show them
            for labels in [(*key, ("mode", mode)) for mode in MODES] if spec.by_mode else [key]:
                if spec.buckets:
                    self._histograms[spec.name][labels] = _Histogram(spec.buckets)
                else:
                    self._counters[spec.name][labels] = 0.0
        return key

    def _observe_one(self, rec: RequestRecord) -> None:
        key = self._key(rec)
        by_mode: Labels = (*key, ("mode", rec.mode))
        c = self._counters
        c[REQUESTS][by_mode] += 1
        if rec.finish_reason == "error":
            c[ERRORS][by_mode] += 1
        c[PROMPT_TOKENS][by_mode] += rec.prompt_tokens
        c[GENERATION_TOKENS][by_mode] += rec.output_tokens
        c[DRAFTS][key] += rec.num_spec_steps
        c[DRAFT_TOKENS][key] += rec.num_draft_tokens
        c[ACCEPTED_TOKENS][key] += rec.num_accepted_tokens
        per_pos = c[ACCEPTED_PER_POS]
        # Every position the draft length allows, even one never accepted yet, so its rate exists.
        width = max(rec.num_speculative_tokens, len(rec.accepted_per_position))
        for position in range(min(width, MAX_POSITIONS + 1)):
            per_pos.setdefault(_position(key, position), 0.0)
        for position, accepted in enumerate(rec.accepted_per_position):
            per_pos[_position(key, position)] += accepted
        tpot = rec.decode_ms_per_token
        if tpot is not None:
            self._histograms[TPOT][by_mode].observe(tpot / 1000)
        if rec.ttft_ms is not None:
            self._histograms[TTFT][by_mode].observe(rec.ttft_ms / 1000)

    def render(self) -> str:
        """The Prometheus text format (version 0.0.4)."""
        build = [((("version", self._version),), 1.0)]
        lines = _family_lines(
            Family("draftwatch_build_info", "The draftwatch version of this process.", "gauge", build)
        )
        with self._lock:
            for spec in RECORD_FAMILIES:
                if spec.buckets:
                    lines += _histogram_lines(spec, self._histograms[spec.name])
                else:
                    lines += _family_lines(
                        Family(spec.name, spec.help, "counter", sorted(self._counters[spec.name].items()))
                    )
        for collect in self._collectors:
            for name, help_text, kind, value in collect():
                lines += _family_lines(Family(name, help_text, kind, [((), value)]))
        for collect_families in self._family_collectors:
            for family in collect_families():
                lines += _family_lines(family)
        return "\n".join(lines) + "\n"


def _position(key: Labels, position: int) -> Labels:
    return (*key, ("position", str(position) if position < MAX_POSITIONS else OTHER))


def _family_lines(family: Family) -> list[str]:
    lines = [f"# HELP {family.name} {family.help}", f"# TYPE {family.name} {family.kind}"]
    return lines + [f"{family.name}{_labels(labels)} {_number(value)}" for labels, value in family.samples]


def _histogram_lines(spec: _Spec, histograms: dict[Labels, _Histogram]) -> list[str]:
    name = spec.name
    lines = [f"# HELP {name} {spec.help}", f"# TYPE {name} histogram"]
    for labels, hist in sorted(histograms.items()):
        cumulative = 0
        for bound, count in zip(hist.buckets, hist.counts, strict=True):
            cumulative += count
            lines.append(f"{name}_bucket{_labels((*labels, ('le', _number(bound))))} {cumulative}")
        lines.append(f"{name}_bucket{_labels((*labels, ('le', '+Inf')))} {hist.count}")
        lines.append(f"{name}_sum{_labels(labels)} {_number(hist.total)}")
        lines.append(f"{name}_count{_labels(labels)} {hist.count}")
    return lines


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{key}="{_escape(value)}"' for key, value in labels)
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))
