"""Records built from a cost model, so that a workload's true decode-phase speedup is known.

A plain token costs ``t1`` ms. A speculative step drafts ``gamma`` tokens at ``draft`` ms each,
verifies them in one target pass of ``verify`` × t1 (on a CPU a pass over 5 tokens costs more than
over 1) plus ``overhead`` ms of bookkeeping, and emits 1 + accepted tokens, accepted being a
geometric run with per-token acceptance ``alpha``. The expected speedup is then

    t1 · E[1 + accepted] / (verify · t1 + gamma · draft + overhead)

which for an n-gram drafter (draft ≈ 0) falls below 1 once alpha is low, where Leviathan et al.'s
formula, with no verification cost beyond one target pass, never does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from decoder.record import Mode, RequestRecord


@dataclass(frozen=True, slots=True)
class Profile:
    """One drafter's cost and acceptance on one target."""

    name: str
    alpha: float
    draft: float  # ms per drafted token
    drafter: str = "ngram"
    draft_model: str | None = None
    verify: float = 1.15  # verification pass over gamma drafts, in one-token passes
    overhead: float = 0.4  # ms per step
    gamma: int = 4
    t1: float = 20.0

    def expected_speedup(self) -> float:
        tokens = sum(self.alpha**k for k in range(self.gamma + 1))
        return self.t1 * tokens / (self.verify * self.t1 + self.gamma * self.draft + self.overhead)


# Random proposals: almost nothing accepted. With an n-gram's cost profile ~0.84x, a model's ~0.5x.
RANDOM_NGRAM = Profile("random-ngram", alpha=0.03, draft=0.01)
RANDOM_MODEL = Profile("random-model", alpha=0.03, draft=6.0, drafter="model", draft_model="qwen-coder-0.5b")
GOOD_NGRAM = Profile("good-ngram", alpha=0.7, draft=0.01)


def cost_record(profile: Profile, index: int, ts: datetime, *, workload: str, mode: Mode, seed: int) -> RequestRecord:
    rng = random.Random(f"{seed}-{profile.name}-{workload}-{mode}-{index}")
    spec = mode == "speculative"
    prompt = rng.randint(30, 600)
    ttft = 0.9 * prompt * rng.lognormvariate(0.0, 0.1)  # prompt reading: shared, and left out of speed
    jitter = rng.lognormvariate(0.0, 0.15)  # this request's machine noise, on every cost
    steps, accepted, per_position, histogram, decode = 0, 0, [0] * profile.gamma, [0] * (profile.gamma + 1), 0.0
    if spec:
        steps = rng.randint(10, 60)
        for _ in range(steps):
            run = 0
            while run < profile.gamma and rng.random() < profile.alpha:
                per_position[run] += 1
                run += 1
            histogram[run] += 1
            accepted += run
        step_ms = profile.verify * profile.t1 + profile.gamma * profile.draft + profile.overhead
        decode = steps * step_ms * jitter
        output = 1 + accepted + steps
    else:
        output = rng.randint(11, 61)
        decode = (output - 1) * profile.t1 * jitter
    return RequestRecord(
        request_id=f"{profile.name}-{workload}-{mode}-{seed}-{index}-{int(ts.timestamp())}",
        ts_start=ts,
        ts_end=ts + timedelta(milliseconds=ttft + decode),
        workload=workload,
        target_model="qwen-coder-1.5b",
        drafter=profile.drafter if spec else "none",
        draft_model=profile.draft_model if spec else None,
        mode=mode,
        num_speculative_tokens=profile.gamma if spec else 0,
        prompt_tokens=prompt,
        output_tokens=output,
        num_spec_steps=steps,
        num_draft_tokens=steps * profile.gamma,
        num_accepted_tokens=accepted,
        accepted_per_position=per_position if spec else [],
        acceptance_histogram=histogram if spec else [],
        ttft_ms=ttft,
        latency_ms=ttft + decode,
        draft_ms=steps * profile.gamma * profile.draft * jitter if spec else 0.0,
        verify_ms=steps * profile.verify * profile.t1 * jitter if spec else 0.0,
        source="embedded",
    )


def cost_stream(
    profile: Profile, start: datetime, end: datetime, count: int, *, workload: str, holdout: float, seed: int
) -> list[RequestRecord]:
    """``count`` requests spread over ``[start, end)``, a ``holdout`` share of them decoded plain."""
    rng = random.Random(f"{seed}-{profile.name}-{workload}-modes")
    step = (end - start) / count
    modes: list[Mode] = ["holdout" if rng.random() < holdout else "speculative" for _ in range(count)]
    return [
        cost_record(profile, i, start + step * i, workload=workload, mode=mode, seed=seed)
        for i, mode in enumerate(modes)
    ]
