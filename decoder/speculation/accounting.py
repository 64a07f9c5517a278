"""Per-request bookkeeping: counts and timings as the decode loop runs, turned into a record at the end."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from decoder.holdout import HoldoutReason
from decoder.record import OUTPUT_SPANS, Mode, RequestRecord, output_span, utc_now
from decoder.speculation.controller import Observation


@dataclass(slots=True)
class RequestStats:
    """What one request did, step by step; :meth:`to_record` checks the counting rules."""

    gamma: int
    mode: Mode
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    ts_start: datetime = field(default_factory=utc_now)
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    num_spec_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    acceptance_histogram: list[int] = field(default_factory=list)
    drafted_by_span: list[int] = field(default_factory=lambda: [0] * OUTPUT_SPANS)
    accepted_by_span: list[int] = field(default_factory=lambda: [0] * OUTPUT_SPANS)
    draft_seconds: float = 0.0  # proposing, step by step
    draft_prefill_seconds: float = 0.0  # the drafter reading the prompt when the request began
    draft_prefill_tokens: int = 0
    verify_seconds: float = 0.0
    stopped_mid_step: bool = False
    holdout_reason: HoldoutReason | None = None
    # For the controller: drafts the target judged, and target passes with and without drafts.
    judged: int = 0
    verify_passes: int = 0
    verify_drafts: int = 0
    verify_pass_seconds: float = 0.0
    single_passes: int = 0
    single_pass_seconds: float = 0.0
    sized_passes: dict[int, int] = field(default_factory=dict)  # verification passes by drafts carried
    sized_ms: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        width = self.gamma if self.mode == "speculative" else 0
        self.accepted_per_position = [0] * width
        self.acceptance_histogram = [0] * (width + 1) if width else []

    def first_token(self) -> None:
        self.first_token_at = time.perf_counter()
        self.output_tokens = 1

    def step(self, drafted: int, accepted: int, emitted: int, stopped_mid_step: bool) -> None:
        """Count one verification pass that drafted ``drafted``, accepted ``accepted`` and emitted ``emitted``."""
        # The step's first output position is the number of tokens output before it.
        span = output_span(self.output_tokens)
        self.output_tokens += emitted
        if self.mode != "speculative":
            return
        self.drafted_by_span[span] += drafted
        self.accepted_by_span[span] += accepted
        self.num_spec_steps += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        for position in range(accepted):
            self.accepted_per_position[position] += 1
        self.acceptance_histogram[accepted] += 1
        self.stopped_mid_step = stopped_mid_step

    def target_pass(self, drafts: int, accepted: int, seconds: float) -> None:
        """Time one target pass that carried ``drafts`` drafts, of which ``accepted`` were accepted."""
        self.verify_seconds += seconds
        if drafts:
            self.verify_passes += 1
            self.verify_drafts += drafts
            self.verify_pass_seconds += seconds
            self.judged += min(drafts, accepted + 1)
            self.sized_passes[drafts] = self.sized_passes.get(drafts, 0) + 1
            self.sized_ms[drafts] = self.sized_ms.get(drafts, 0.0) + seconds * 1000
        else:
            self.single_passes += 1
            self.single_pass_seconds += seconds

    def observation(self) -> Observation:
        """What the controller learns from this request."""
        return Observation(
            accepted=self.num_accepted_tokens,
            judged=self.judged,
            draft_tokens=self.verify_drafts,
            draft_ms=self.draft_seconds * 1000,
            draft_prefill_tokens=self.draft_prefill_tokens,
            draft_prefill_ms=self.draft_prefill_seconds * 1000,
            output_tokens=self.output_tokens,
            verify_passes=self.verify_passes,
            verify_drafts=self.verify_drafts,
            verify_ms=self.verify_pass_seconds * 1000,
            single_passes=self.single_passes,
            single_ms=self.single_pass_seconds * 1000,
            sized_passes=dict(self.sized_passes),
            sized_ms=dict(self.sized_ms),
        )

    def to_record(self, **identity: object) -> RequestRecord:
        """Finish the request; ``identity`` carries workload, models, sampling, finish reason, error."""
        now = time.perf_counter()
        record = RequestRecord(
            request_id=self.request_id,
            ts_start=self.ts_start,
            ts_end=utc_now(),
            mode=self.mode,
            num_speculative_tokens=self.gamma if self.mode == "speculative" else 0,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            num_spec_steps=self.num_spec_steps,
            num_draft_tokens=self.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens,
            accepted_per_position=list(self.accepted_per_position),
            acceptance_histogram=list(self.acceptance_histogram),
            drafted_by_span=list(self.drafted_by_span),
            accepted_by_span=list(self.accepted_by_span),
            ttft_ms=None if self.first_token_at is None else (self.first_token_at - self.started) * 1000,
            latency_ms=(now - self.started) * 1000,
            draft_ms=(self.draft_prefill_seconds + self.draft_seconds) * 1000,
            verify_ms=self.verify_seconds * 1000,
            stopped_mid_step=self.stopped_mid_step,
            holdout_reason=self.holdout_reason,
            **identity,  # type: ignore[arg-type]
        )
        return record.check()
