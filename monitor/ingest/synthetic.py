"""Synthetic but valid records, for tests, benchmarks and demos of the storage side.

Each record satisfies the embedded decoder's counting rules: per-step accepted draft counts
drawn with a workload-specific acceptance probability, ``output_tokens = 1 + accepted + steps``.

>>> rec = synthetic_record(7, workload="code")
>>> rec.check() is rec, rec.request_id
(True, 'syn-7')
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Final, NamedTuple

from decoder.record import Mode, RequestRecord

EPOCH: Final = datetime(2026, 1, 1, tzinfo=UTC)
ACCEPTANCE: Final = {"code": 0.8, "chat": 0.55, "summarize": 0.65, "translate": 0.3}


class Steps(NamedTuple):
    per_position: list[int]
    histogram: list[int]
    accepted: int


def draw_steps(rng: random.Random, steps: int, gamma: int, alpha: float) -> Steps:
    """The counts of ``steps`` verification passes of ``gamma`` drafts, each accepted with probability ``alpha``
    until the first rejection (the embedded decoder's rule); no drafts (``gamma`` 0) gives empty counts.

    >>> draw_steps(random.Random(1), 3, 2, 0.9)
    Steps(per_position=[3, 3], histogram=[0, 0, 3], accepted=6)
    """
    per_position = [0] * gamma
    histogram = [0] * (gamma + 1) if gamma else []
    accepted = 0
    for _ in range(steps):
        run = 0
        while run < gamma and rng.random() < alpha:
            per_position[run] += 1
            run += 1
        histogram[run] += 1
        accepted += run
    return Steps(per_position, histogram, accepted)


def synthetic_record(
    index: int,
    *,
    workload: str = "chat",
    start: datetime = EPOCH,
    spacing: timedelta = timedelta(milliseconds=250),
    mode: Mode = "speculative",
    gamma: int = 4,
    prefix: str = "syn",
    target_version: str | None = "v1",
    seed: int | None = None,
) -> RequestRecord:
    """Record number ``index`` of a synthetic stream; deterministic for a given index and seed."""
    rng = random.Random(index if seed is None else seed * 1_000_003 + index)
    alpha = ACCEPTANCE.get(workload, 0.5)
    steps = rng.randint(4, 24)
    if mode != "speculative":
        gamma = 0
    per_position, histogram, accepted = draw_steps(rng, steps if gamma else 0, gamma, alpha)
    output = 1 + accepted + (steps if gamma else rng.randint(8, 64))
    ms_per_token = (8.0 if mode == "speculative" else 11.0) * rng.uniform(0.8, 1.25)
    ttft = rng.uniform(20.0, 80.0)
    latency = ttft + ms_per_token * (output - 1)
    ts_start = start + spacing * index
    return RequestRecord(
        request_id=f"{prefix}-{index}",
        ts_start=ts_start,
        ts_end=ts_start + timedelta(milliseconds=latency),
        workload=workload,
        target_model="qwen-coder-1.5b",
        drafter="model" if gamma else "none",
        draft_model="qwen-coder-0.5b" if gamma else None,
        target_version=target_version,
        draft_version="v1" if gamma else None,
        mode=mode,
        num_speculative_tokens=gamma,
        prompt_tokens=rng.randint(16, 512),
        output_tokens=output,
        num_spec_steps=steps if gamma else 0,
        num_draft_tokens=steps * gamma,
        num_accepted_tokens=accepted,
        accepted_per_position=per_position,
        acceptance_histogram=histogram,
        ttft_ms=ttft,
        latency_ms=latency,
        draft_ms=latency * 0.2 if gamma else 0.0,
        verify_ms=latency * 0.7 if gamma else 0.0,
        temperature=0.0,
        top_p=1.0,
        finish_reason="stop",
        source="embedded",
    )
