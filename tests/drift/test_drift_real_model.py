"""A drift run on real records: smollm2-135m with the ngram drafter, four workloads.

Two workloads copy their input (the ngram drafter accepts most drafts), two do not. Midway, the
prompts of one copying workload (``fix``) switch to open-ended writing: the run must flag
acceptance drift for ``fix`` and for no other workload.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy.engine import Engine

from decoder.record import RequestRecord
from monitor.drift.run import run_drift
from monitor.drift.settings import DriftSettings
from tests.drift.conftest import store

pytestmark = pytest.mark.models

PER_WINDOW = 12
T0 = datetime(2026, 3, 1, tzinfo=UTC)
CUR = T0 + timedelta(hours=24)
NOW = T0 + timedelta(hours=25)
SENTENCES = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Our team ships a new release of the service every second Tuesday.",
    "Please remember to water the plants on the balcony while I am away.",
    "The library opens at nine in the morning and closes at six.",
    "She parked the red bicycle next to the old oak tree by the gate.",
    "Every request is logged with its latency and the model version.",
    "The train to the airport leaves from platform four every hour.",
    "He bought three apples, two pears and a loaf of fresh bread.",
    "The meeting about the budget was moved to Thursday afternoon.",
    "Cache misses make the first request of the day noticeably slower.",
    "The museum shows paintings from the seventeenth century this month.",
    "Our cat sleeps on the warm windowsill for most of the afternoon.",
    "The report lists every workload with its acceptance rate and speed.",
    "A light rain fell on the city during the whole weekend.",
]
TOPICS = [
    "a lighthouse",
    "friendship",
    "the ocean",
    "a robot",
    "autumn",
    "a dragon",
    "mountains",
    "coffee",
    "a lost key",
    "the moon",
    "a garden",
    "winter",
    "a city at night",
    "a violin",
]


def typo(sentence: str) -> str:
    return sentence.replace("the", "teh", 1)


def prompt(workload: str, phase: str, i: int) -> tuple[str, bool]:
    """(prompt, chat): the copying workloads are few-shot continuations the ngram drafter can copy."""
    offset = len(SENTENCES) // 2 if phase == "cur" else 0  # same style, other content in the current window
    sentence, topic = SENTENCES[(i + offset) % len(SENTENCES)], TOPICS[(i + offset) % len(TOPICS)]
    if workload == "repeat":
        return f"Text: {sentence}\nSame text: {sentence}\nSame text:", False
    if workload == "fix" and phase == "ref":
        return f"Draft: {typo(sentence)}\nCorrected: {sentence}\nDraft: {typo(sentence)}\nCorrected:", False
    if workload in ("fix", "story"):  # fix switches to open-ended writing in the current window
        return f"Write a poem about {topic}.", True
    return f"Describe {topic} in French.", True


@pytest.fixture(scope="module")
def records() -> list[RequestRecord]:
    import torch

    from decoder import NgramDrafter, SpeculativeDecoder, load_model

    collected: list[RequestRecord] = []
    decoder = SpeculativeDecoder(load_model("smollm2-135m", progress=False), NgramDrafter(), gamma=4)
    out = []
    # One thread: on a busy 2-core machine, torch's second thread spin-waits and a 16-token
    # request took tens of seconds; a single thread costs little on a quiet machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = _generate(decoder)
    finally:
        torch.set_num_threads(threads)
    collected.extend(out)
    return collected


def _generate(decoder: Any) -> list[RequestRecord]:
    out = []
    # Interleaved, so that machine load drifting during the test affects both windows alike.
    for i in range(PER_WINDOW):
        for workload in ("repeat", "fix", "story", "names"):
            for phase, start in (("ref", T0 + timedelta(minutes=60 * i)), ("cur", CUR + timedelta(minutes=4 * i))):
                text, chat = prompt(workload, phase, i)
                rec = decoder.generate(text, chat=chat, workload=workload, max_new_tokens=20).record
                latency = timedelta(milliseconds=rec.latency_ms or 0.0)
                out.append(replace(rec, ts_start=start, ts_end=start + latency))
    return out


def test_switching_prompts_is_found_for_that_workload_only(records: list[RequestRecord], engine: Engine) -> None:
    def mean_rate(workload: str) -> float:
        rates = [r.acceptance_rate for r in records if r.workload == workload and r.ts_start < CUR]
        return float(np.mean([x for x in rates if x is not None]))

    # The copying workloads accept clearly more than the open-ended ones.
    assert min(mean_rate("repeat"), mean_rate("fix")) > max(mean_rate("story"), mean_rate("names")) + 0.2
    store(engine, records)
    config = DriftSettings(current_window=timedelta(hours=1), reference_window=timedelta(hours=24), min_requests=8)
    run = run_drift(engine, config, NOW)
    acceptance = {(r.workload, r.test): r for r in run.results if r.test == "acceptance"}
    fix = acceptance[("fix", "acceptance")]
    assert fix.decision == "drift" and fix.effect is not None and fix.effect < -0.2, fix
    assert {w for (w, _t), r in acceptance.items() if r.decision == "drift"} == {"fix"}
    assert all(r.decision != "insufficient_data" for r in acceptance.values())
