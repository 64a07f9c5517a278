"""The typed results of :mod:`monitor.store.reads.queries` (kept apart so that module stays about SQL)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from monitor.store.rollups import SUM_COLUMNS


@dataclass(frozen=True, slots=True, order=True)
class Pair:
    """A target/drafter combination; ``draft_model`` is None for model-free drafters (ngram, none)."""

    target_model: str
    drafter: str
    draft_model: str | None = None

    @property
    def label(self) -> str:
        """``target/drafter`` or ``target/drafter:draft_model``, as drift results and alerts name the pair.

        >>> Pair("qwen-coder-1.5b", "model", "qwen-coder-0.5b").label, Pair("smollm2-135m", "ngram").label
        ('qwen-coder-1.5b/model:qwen-coder-0.5b', 'smollm2-135m/ngram')
        """
        base = f"{self.target_model}/{self.drafter}"
        return f"{base}:{self.draft_model}" if self.draft_model and self.draft_model != self.drafter else base


@dataclass(frozen=True, slots=True)
class Sums:
    """Additive figures of a set of rollup rows, and what follows from them."""

    n_requests: int = 0
    n_errors: int = 0
    sum_prompt_tokens: int = 0
    sum_output_tokens: int = 0
    sum_spec_steps: int = 0
    sum_draft_tokens: int = 0
    sum_accepted_tokens: int = 0
    n_drafting: int = 0
    sum_acceptance_rate: float = 0.0
    n_timed: int = 0
    sum_ms_per_token: float = 0.0
    sum_timed_latency_ms: float = 0.0
    sum_timed_output_tokens: int = 0
    n_ttft: int = 0
    sum_ttft_ms: float = 0.0

    @property
    def acceptance_rate_tokens(self) -> float | None:
        return self.sum_accepted_tokens / self.sum_draft_tokens if self.sum_draft_tokens else None

    @property
    def acceptance_rate_requests(self) -> float | None:
        return self.sum_acceptance_rate / self.n_drafting if self.n_drafting else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1.0 + self.sum_accepted_tokens / self.sum_spec_steps if self.sum_spec_steps else None

    @property
    def ms_per_token_mean(self) -> float | None:
        return self.sum_ms_per_token / self.n_timed if self.n_timed else None

    @property
    def tokens_per_second(self) -> float | None:
        """Aggregate throughput: output tokens over decoding time, across timed requests."""
        if self.sum_timed_latency_ms <= 0:
            return None
        return self.sum_timed_output_tokens * 1000.0 / self.sum_timed_latency_ms

    def __add__(self, other: Sums) -> Sums:
        return Sums(**{c: getattr(self, c) + getattr(other, c) for c in SUM_COLUMNS})


@dataclass(frozen=True, slots=True)
class LengthAcceptance:
    """Acceptance of one length bucket (a prompt-length bucket or an output span, :mod:`monitor.store.lengths`).

    ``drafting_requests`` are the requests that drafted in it (for a span: at an output position in
    it); ``acceptance_rate`` is accepted / drafted tokens, None when nothing was drafted.
    """

    bucket: str
    low: int
    high: int | None  # exclusive; None for the last, open bucket
    drafting_requests: int
    drafted: int
    accepted: int
    acceptance_rate: float | None


@dataclass(frozen=True, slots=True)
class WorkloadSummary:
    """One workload over a time range."""

    workload: str
    requests: int
    errors: int
    requests_by_mode: dict[str, int]
    acceptance_rate_tokens: float | None
    acceptance_rate_requests: float | None
    mean_acceptance_length: float | None
    ms_per_token_mean: float | None
    ms_per_token_p50: float | None
    ms_per_token_p95: float | None
    ms_per_token_p99: float | None
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    tokens_per_second: float | None
    # Mean decode-phase ms per token (after the first) of holdout traffic over that of speculative
    # traffic: above 1 speculation is faster. None without both populations.
    measured_speedup: float | None
    holdout_requests: int
    # Acceptance by prompt-length bucket (every request that drafted) and by output span (the
    # records that report spans: the embedded decoder's, not a serving stack's), every bucket listed.
    by_prompt_length: list[LengthAcceptance]
    by_output_position: list[LengthAcceptance]


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    bucket: datetime
    requests: int
    acceptance_rate_tokens: float | None
    acceptance_rate_requests: float | None
    mean_acceptance_length: float | None
    ms_per_token_mean: float | None
    ms_per_token_p95: float | None
    tokens_per_second: float | None


@dataclass(frozen=True, slots=True)
class PositionAcceptance:
    """How often the draft token at ``position`` (0-based) was accepted, per verification step."""

    position: int
    accepted: int
    steps: int
    rate: float | None


@dataclass(frozen=True, slots=True)
class LengthBin:
    """Verification steps that accepted exactly ``accepted`` draft tokens."""

    accepted: int
    steps: int
    share: float


@dataclass(frozen=True, slots=True)
class RequestSample:
    """Per-request values for statistical tests (the unit of evidence is the request)."""

    request_id: str
    ts_start: datetime
    mode: str
    acceptance_rate: float | None
    ms_per_token: float | None  # decode phase: RequestRecord.decode_ms_per_token
    ttft_ms: float | None


@dataclass(frozen=True, slots=True)
class DeploymentEvent:
    ts: datetime
    kind: str
    role: str
    model: str
    version: str
    workload: str | None
