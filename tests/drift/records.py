"""Seeded record streams with known acceptance and latency, for the drift tests."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from decoder.record import OUTPUT_SPANS, Mode, RequestRecord, output_span
from monitor.ingest.synthetic import Steps, draw_steps


def record(
    index: int,
    ts: datetime,
    *,
    workload: str,
    alpha: float,
    ms_per_token: float = 20.0,
    mode: Mode = "speculative",
    gamma: int = 4,
    draft_version: str = "d1",
    prompt_tokens: int | None = None,
    seed: int = 0,
    answer_tokens: int | None = None,
) -> RequestRecord:
    """A valid embedded record: per-request alpha jittered (Beta), geometric runs per step, lognormal time.

    Without ``answer_tokens`` a speculative record takes 6-20 steps, so its output grows with its
    acceptance; with it, steps are taken until the output reaches that length, as a real answer's
    length is its own whatever the drafter accepts.
    """
    # Seeded by position in the stream, not by the wall clock, so a stream is the same on every run.
    rng = random.Random(f"{seed}-{workload}-{index}")
    a = rng.betavariate(alpha * 30, (1 - alpha) * 30)
    steps = rng.randint(6, 20)
    spec = mode == "speculative"
    if spec and answer_tokens is not None:
        steps, (per_position, histogram, accepted) = _steps_until(rng, answer_tokens, gamma, a)
    else:
        per_position, histogram, accepted = draw_steps(rng, steps if spec else 0, gamma if spec else 0, a)
    output = 1 + accepted + steps if spec else rng.randint(20, 60)
    drafted_by_span, accepted_by_span = _spans(random.Random(f"spans-{seed}-{workload}-{index}"), histogram, gamma)
    ttft = rng.lognormvariate(3.5, 0.3)
    latency = ttft + ms_per_token * rng.lognormvariate(0.0, 0.25) * (output - 1)
    return RequestRecord(
        request_id=f"{workload}-{seed}-{index}-{int(ts.timestamp() * 1000)}",
        ts_start=ts,
        ts_end=ts + timedelta(milliseconds=latency),
        workload=workload,
        target_model="qwen-coder-1.5b",
        drafter="model",
        draft_model="qwen-coder-0.5b",
        target_version="t1",
        draft_version=draft_version,
        mode=mode,
        num_speculative_tokens=gamma if spec else 0,
        prompt_tokens=prompt_tokens if prompt_tokens is not None else rng.randint(50, 400),
        output_tokens=output,
        num_spec_steps=steps if spec else 0,
        num_draft_tokens=steps * gamma if spec else 0,
        num_accepted_tokens=accepted,
        accepted_per_position=per_position,
        acceptance_histogram=histogram,
        drafted_by_span=drafted_by_span,
        accepted_by_span=accepted_by_span,
        ttft_ms=ttft,
        latency_ms=latency,
        draft_ms=latency * 0.15 if spec else 0.0,
        verify_ms=latency * 0.75 if spec else 0.0,
        temperature=0.0,
        top_p=1.0,
        finish_reason="stop",
        source="embedded",
    )


def _steps_until(rng: random.Random, tokens: int, gamma: int, alpha: float) -> tuple[int, Steps]:
    """Steps drawn one at a time until ``1 + accepted + steps`` reaches ``tokens``; how many, and their counts."""
    steps, total = 0, draw_steps(rng, 0, gamma, alpha)
    while 1 + total.accepted + steps < tokens:
        one = draw_steps(rng, 1, gamma, alpha)
        steps += 1
        total = Steps(
            [x + y for x, y in zip(total.per_position, one.per_position, strict=True)],
            [x + y for x, y in zip(total.histogram, one.histogram, strict=True)],
            total.accepted + one.accepted,
        )
    return steps, total


def _spans(rng: random.Random, histogram: list[int], gamma: int) -> tuple[list[int], list[int]]:
    """Drafted and accepted tokens per output span, as the embedded decoder counts them.

    The histogram's steps in a seeded order (a stream of its own, so the records' other draws are
    unchanged), each drafting ``gamma`` and emitting its accepted drafts plus one token, from position 1.
    """
    steps = [j for j, count in enumerate(histogram) for _ in range(count)]
    rng.shuffle(steps)
    drafted, accepted = [0] * OUTPUT_SPANS, [0] * OUTPUT_SPANS
    position = 1  # the first token comes from the prompt pass
    for j in steps:
        span = output_span(position)
        drafted[span] += gamma
        accepted[span] += j
        position += j + 1
    return drafted, accepted


def window_stream(
    start: datetime, end: datetime, count: int, *, workload: str, alpha: float, **kwargs: object
) -> list[RequestRecord]:
    """``count`` records spread evenly over ``[start, end)``."""
    step = (end - start) / count
    return [record(i, start + step * i, workload=workload, alpha=alpha, **kwargs) for i in range(count)]  # type: ignore[arg-type]
