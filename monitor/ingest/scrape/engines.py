"""What each engine's exposition says about speculation, per series: cumulative counters or a gauge.

* vLLM (``vllm:``) and llama.cpp (``llamacpp:``, with ``--metrics``) write the same four counters:
  ``spec_decode_num_drafts_total`` (verification steps), ``spec_decode_num_draft_tokens_total``,
  ``spec_decode_num_accepted_tokens_total`` and ``spec_decode_num_accepted_tokens_per_pos_total``
  (label ``position``). vLLM labels them ``model_name`` and ``engine`` (vllm/v1/spec_decode/metrics.py,
  ``SpecDecodingProm``); llama.cpp (build 11434) writes one unlabelled series per server.
* SGLang writes gauges only: ``sglang:spec_accept_rate`` (accepted / drafted in the last batch) and
  ``sglang:spec_accept_length``, labelled ``model_name`` (python/sglang/srt/metrics/collector.py).

A series is one model of the target: vLLM's engines (data-parallel ranks) of one model are summed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from monitor.ingest.scrape.exposition import Sample

Kind = Literal["vllm", "llamacpp", "sglang"]
KINDS: Final[tuple[Kind, ...]] = ("vllm", "llamacpp", "sglang")
PREFIX: Final[Mapping[Kind, str]] = {"vllm": "vllm:", "llamacpp": "llamacpp:", "sglang": "sglang:"}
COUNTERS: Final = {
    "spec_decode_num_drafts_total": "drafts",
    "spec_decode_num_draft_tokens_total": "draft_tokens",
    "spec_decode_num_accepted_tokens_total": "accepted_tokens",
}
PER_POSITION: Final = "spec_decode_num_accepted_tokens_per_pos_total"
# Positions past this are not a draft length any engine runs; a label beyond it is refused.
MAX_POSITIONS: Final = 64


class EngineError(ValueError):
    """The exposition lacks what the engine must report, or reports it impossibly."""


@dataclass(slots=True)
class Reading:
    """One series' figures at one scrape: cumulative counters (vLLM, llama.cpp) or gauges (SGLang)."""

    model: str | None
    counters: dict[str, float] = field(default_factory=dict)
    per_position: dict[int, float] = field(default_factory=dict)
    # SGLang's gauges per rank of the model (its ranks report the same batch statistic): their mean stands for it.
    gauges: dict[str, list[float]] = field(default_factory=dict)

    @property
    def accept_rate(self) -> float | None:
        return _mean(self.gauges.get("spec_accept_rate"))

    @property
    def accept_length(self) -> float | None:
        return _mean(self.gauges.get("spec_accept_length"))


def read(kind: Kind, samples: Iterable[Sample]) -> dict[str | None, Reading]:
    """The readings of one scrape, by model name (None where the engine names none)."""
    prefix = PREFIX[kind]
    readings: dict[str | None, Reading] = {}
    for sample in samples:
        if not sample.name.startswith(prefix):
            continue
        name = sample.name[len(prefix) :]
        model = sample.labels.get("model_name")
        if kind == "sglang":
            if name in ("spec_accept_rate", "spec_accept_length"):
                _gauge(readings.setdefault(model, Reading(model)), name, sample.value)
            continue
        if name in COUNTERS or name == PER_POSITION:
            if not math.isfinite(sample.value) or sample.value < 0:
                raise EngineError(f"{sample.name} is {sample.value}: a counter is finite and non-negative")
            reading = readings.setdefault(model, Reading(model))
            if name == PER_POSITION:
                position = _position(sample)
                reading.per_position[position] = reading.per_position.get(position, 0.0) + sample.value
            else:
                key = COUNTERS[name]
                reading.counters[key] = reading.counters.get(key, 0.0) + sample.value
    for reading in readings.values():
        absent = [f"{prefix}{n}" for n, key in COUNTERS.items() if key not in reading.counters]
        if kind != "sglang" and absent:
            raise EngineError(f"the {kind} exposition has no {', '.join(absent)} for model {reading.model!r}")
    if not readings:
        raise EngineError(_nothing(kind))
    return readings


def _gauge(reading: Reading, name: str, value: float) -> None:
    if math.isfinite(value):
        reading.gauges.setdefault(name, []).append(value)


def _mean(values: list[float] | None) -> float | None:
    """The mean of the ranks' values (a pairwise running average would weigh the last rank as half).

    >>> _mean([0.6, 0.6, 0.3]), _mean(None)
    (0.5, None)
    """
    return sum(values) / len(values) if values else None


def _position(sample: Sample) -> int:
    raw = sample.labels.get("position", "")
    if not raw.isdigit() or int(raw) >= MAX_POSITIONS:
        raise EngineError(f"{sample.name} has position={raw!r}: expected 0..{MAX_POSITIONS - 1}")
    return int(raw)


def _nothing(kind: Kind) -> str:
    how = {
        "vllm": "vLLM writes them once a speculative config is set (--speculative-config)",
        "llamacpp": "start llama-server with --metrics and a draft (-md DRAFT.gguf --spec-type draft-simple)",
        "sglang": "start SGLang with --enable-metrics and --speculative-algorithm",
    }[kind]
    return f"the exposition carries no {PREFIX[kind]}spec_* series: {how}"
