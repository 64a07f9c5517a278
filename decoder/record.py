"""The per-request record: the contract between the decoder, the store and everything that reads it.

Field names follow vLLM's per-request speculative-decoding metrics where they overlap, so that
records from vLLM, llama.cpp or SGLang map onto this one without renaming.

Counting rules (the decoder guarantees them, :meth:`RequestRecord.check` enforces them):

* ``num_spec_steps`` is the number of target verification passes after the prefill; each step
  drafts ``0..gamma`` tokens, accepts a prefix of them and then emits one token of the target's own
  (the correction after a rejection, or the bonus token when every draft was accepted).
* ``accepted_per_position[i]`` counts the steps whose draft token at position ``i`` was accepted,
  so its sum is ``num_accepted_tokens``; ``acceptance_histogram[j]`` counts the steps that accepted
  exactly ``j`` drafts, so its sum is ``num_spec_steps``.
* Drafts the target accepted *after* a stop (end-of-sequence or a stop string) are counted as
  drafted but not accepted: they were proposed, and never emitted. The step's own target token is
  then not emitted either, which is why ``output_tokens`` is ``1 + accepted + steps`` minus one when
  the request ended inside a step (``stopped_mid_step``).
* ``drafted_by_span[k]`` and ``accepted_by_span[k]`` count the drafted and accepted tokens of the
  steps whose first output position falls in span ``k`` of :data:`OUTPUT_SPAN_EDGES`: ``[0, 32)``,
  ``[32, 128)``, ``[128, ∞)``. A step's first output position is the number of tokens the request
  had output before the step (the first token, from the prompt pass, is position 0, so the first
  step is at position 1); a step that straddles an edge counts whole in the span it starts in.
  Their sums are ``num_draft_tokens`` and ``num_accepted_tokens``. Both are ``None`` where the
  positions are unknown (a serving stack reports only the request's totals), never zeros.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Final, Literal

from decoder.holdout import HOLDOUT_REASONS, HoldoutReason

Mode = Literal["speculative", "plain", "holdout"]
FinishReason = Literal["stop", "length", "error"]

MODES: Final = ("speculative", "plain", "holdout")
COUNT_FIELDS: Final = (
    "num_speculative_tokens", "prompt_tokens", "output_tokens", "num_spec_steps", "num_draft_tokens",
    "num_accepted_tokens",
)  # fmt: skip
MEASURE_FIELDS: Final = (
    "ttft_ms", "latency_ms", "decode_ms", "draft_ms", "verify_ms", "temperature", "top_p", "prompt_copy_share",
    "replica_uptime_s", "kv_cache_use",
)  # fmt: skip  # None or >= 0
FINISH_REASONS: Final = ("stop", "length", "error")
WORKLOAD_MAX_LENGTH: Final = 64
WORKLOAD_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,63}$")
# Output positions where a span of drafted_by_span / accepted_by_span ends: [0, 32), [32, 128), [128, ∞).
OUTPUT_SPAN_EDGES: Final = (32, 128)
OUTPUT_SPANS: Final = len(OUTPUT_SPAN_EDGES) + 1
MAX_TEXT: Final = 512
# A replica up for longer than ten years is a clock gone wrong, not an uptime.
MAX_UPTIME_S: Final = 10 * 365 * 86_400.0
UPTIME_FROM: Final = ("process", "first_sight")
MAX_ERROR_TEXT: Final = 8192
# Beyond any real draft length; keeps the per-position arrays and histogram rows bounded.
MAX_SPECULATIVE_TOKENS: Final = 1024
# Counts stay exact in JSON and in PostgreSQL BIGINT sums.
MAX_COUNT: Final = 2**53
# Timings above ~116 days are not request timings; bounding them also keeps rollup sums finite.
MAX_MS: Final = 1e10
MAX_TEMPERATURE: Final = 100.0
# decoder/causes.py's style fingerprint: the first 12 hex characters of a SHA-256.
STYLE_HASH_PATTERN: Final = re.compile(r"^[0-9a-f]{12}$")


@dataclass(frozen=True, slots=True)
class Limit:
    """A field's bounds: ``ge``/``le`` for a number, ``min_length``/``max_length`` for a text or a list.

    Declared once, in :data:`LIMITS`: :meth:`RequestRecord.check` enforces them on every record, and the wire
    schemas (``monitor/api/events.py``, ``monitor/api/ingest/adapters.py``) pass them to pydantic as they are, which is
    why the names are pydantic's ``Field`` arguments. ``allow_inf_nan=False``: the number must be finite.
    """

    ge: float | None = None
    le: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    pattern: str | None = None
    allow_inf_nan: bool | None = None


COUNT: Final = Limit(ge=0, le=MAX_COUNT)  # a count, and each entry of the per-position and per-span lists
MILLIS: Final = Limit(ge=0, le=MAX_MS, allow_inf_nan=False)
_NAME: Final = Limit(min_length=1, max_length=MAX_TEXT)
_TEXT: Final = Limit(max_length=MAX_TEXT)
_SPANS: Final = Limit(min_length=OUTPUT_SPANS, max_length=OUTPUT_SPANS)
LIMITS: Final[Mapping[str, Limit]] = MappingProxyType({
    "request_id": Limit(min_length=1, max_length=128),
    "workload": Limit(min_length=1, max_length=WORKLOAD_MAX_LENGTH, pattern=WORKLOAD_PATTERN.pattern),
    "target_model": _NAME,
    "drafter": _NAME,
    "draft_model": _TEXT,
    "target_version": _TEXT,
    "draft_version": _TEXT,
    "error": Limit(max_length=MAX_ERROR_TEXT),
    "source": Limit(min_length=1, max_length=64),
    "prompt_hash": Limit(max_length=128),
    **dict.fromkeys(COUNT_FIELDS, COUNT),
    "num_speculative_tokens": Limit(ge=0, le=MAX_SPECULATIVE_TOKENS),
    # One entry per draft position; one bin per accepted count 0..num_speculative_tokens.
    "accepted_per_position": Limit(max_length=MAX_SPECULATIVE_TOKENS),
    "acceptance_histogram": Limit(max_length=MAX_SPECULATIVE_TOKENS + 1),
    "drafted_by_span": _SPANS,
    "accepted_by_span": _SPANS,
    **dict.fromkeys(("ttft_ms", "latency_ms", "decode_ms", "draft_ms", "verify_ms"), MILLIS),
    "temperature": Limit(ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False),
    "top_p": Limit(ge=0, le=1, allow_inf_nan=False),
    # Itself included: a request in flight at its replica makes at least one.
    "upstream_inflight": Limit(ge=1, le=MAX_COUNT),
    "replica": _TEXT,
    "cached_prompt_tokens": COUNT,
    "style_hash": Limit(min_length=12, max_length=12, pattern=STYLE_HASH_PATTERN.pattern),
    "prompt_copy_share": Limit(ge=0, le=1, allow_inf_nan=False),
    "engine_version": _TEXT,
    "replica_uptime_s": Limit(ge=0, le=MAX_UPTIME_S, allow_inf_nan=False),
    "uptime_from": Limit(pattern=r"^(process|first_sight)$"),
    "kv_cache_use": Limit(ge=0, le=1, allow_inf_nan=False),
})  # fmt: skip
# Texts the record may carry: the store is PostgreSQL, which refuses NUL, and UTF-8, which cannot hold a lone surrogate.
TEXT_FIELDS: Final = (
    "request_id", "workload", "target_model", "drafter", "draft_model", "target_version", "draft_version", "error",
    "source", "prompt_hash", "replica", "style_hash", "engine_version", "uptime_from",
)  # fmt: skip
_REQUIRED_TEXTS: Final = ("request_id", "workload", "target_model", "drafter", "source")


class RecordError(ValueError):
    """A record breaks the contract; ``field`` names the offending field."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


def validate_workload(tag: str) -> str:
    """Return ``tag`` if it is a valid workload tag, else raise :class:`RecordError`.

    >>> validate_workload("code-edit")
    'code-edit'
    >>> validate_workload("no spaces")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    decoder.record.RecordError: workload: 'no spaces' is not a valid tag: ...
    """
    if not isinstance(tag, str) or not WORKLOAD_PATTERN.match(tag):
        raise RecordError(
            "workload",
            f"{tag!r} is not a valid tag: use 1-{WORKLOAD_MAX_LENGTH} of [A-Za-z0-9_.:-], "
            "starting with a letter or digit",
        )
    return tag


def clean_text(value: str) -> str:
    """Return ``value`` if the store can hold it, else raise :class:`ValueError` saying why.

    PostgreSQL refuses NUL in text and an unpaired surrogate cannot be encoded as UTF-8: either would
    fail a whole batch at commit time, after the record was accepted.
    """
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("must be valid Unicode (no unpaired surrogates)") from None
    return value


def _check_limit(name: str, value: object, limit: Limit) -> None:
    """Raise :class:`RecordError` if ``value`` (already of its field's type, or None) breaks ``limit``."""
    if value is None:
        return
    if isinstance(value, str | list):
        low, high, size = limit.min_length, limit.max_length, len(value)
        if (low is not None and size < low) or (high is not None and size > high):
            between = _between(low, high)
            wanted = f"{between} characters long" if isinstance(value, str) else f"a list of {between} entries"
            raise RecordError(name, f"must be {wanted}, got {size}")
        return
    if limit.allow_inf_nan is False and isinstance(value, float) and not math.isfinite(value):
        raise RecordError(name, f"must be a finite number, got {value!r}")
    if (limit.ge is not None and value < limit.ge) or (limit.le is not None and value > limit.le):  # type: ignore[operator]
        raise RecordError(name, f"must be {_between(limit.ge, limit.le)}, got {value!r}")


def _between(low: float | None, high: float | None) -> str:
    """
    >>> _between(1, 128), _between(None, 512), _between(0, 1e10), _between(3, 3)
    ('from 1 to 128', 'at most 512', 'from 0 to 1e+10', '3')
    """
    if low == high:
        return _number(low)
    if low is None:
        return f"at most {_number(high)}"
    if high is None:
        return f"at least {_number(low)}"
    return f"from {_number(low)} to {_number(high)}"


def _number(value: float | None) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def decode_ms_per_token(
    latency_ms: float | None, ttft_ms: float | None, output_tokens: int, decode_ms: float | None = None
) -> float | None:
    """Milliseconds per output token after the first: ``(latency - TTFT) / (output_tokens - 1)``.

    The one speed figure every comparison of speculative with plain decoding uses. Prompt reading
    (TTFT) is left out: plain and speculative decoding share it, and it can dominate a short
    answer to a long prompt. The embedded decoder's draft model reads the prompt after the first
    token, so that cost lands here, charged to speculation. ``None`` without both timings or with
    fewer than two output tokens.

    ``decode_ms``, where given, is the decode phase measured apart from queueing and prompt reading
    (a serving stack's own timings, or a stream's first text-bearing event to its last): it replaces
    ``latency - TTFT``, which behind a proxy also holds the time the request waited in the engine's queue.

    >>> decode_ms_per_token(100.0, 60.0, 9)
    5.0
    >>> decode_ms_per_token(100.0, 60.0, 9, decode_ms=16.0)
    2.0
    >>> decode_ms_per_token(100.0, None, 9) is None, decode_ms_per_token(100.0, 60.0, 1) is None
    (True, True)
    """
    if output_tokens < 2:
        return None
    if decode_ms is not None:
        return decode_ms / (output_tokens - 1)
    if latency_ms is None or ttft_ms is None:
        return None
    return max(latency_ms - ttft_ms, 0.0) / (output_tokens - 1)


def pooled_decode_ms_per_token(records: Iterable[RequestRecord]) -> float | None:
    """:func:`decode_ms_per_token` pooled over requests: all their decode time over all their tokens after the first.

    Long answers weigh more than in a mean of per-request figures; ``None`` when no request has both timings
    and two tokens.
    """
    timed = [(per_token * (r.output_tokens - 1), r.output_tokens - 1) for r in records
             if (per_token := r.decode_ms_per_token) is not None]  # fmt: skip
    tokens = sum(count for _, count in timed)
    return sum(ms for ms, _ in timed) / tokens if tokens else None


def output_span(position: int) -> int:
    """The span of :data:`OUTPUT_SPAN_EDGES` that output position ``position`` (0-based) falls in.

    >>> output_span(1), output_span(31), output_span(32), output_span(127), output_span(128)
    (0, 0, 1, 1, 2)
    """
    return bisect_right(OUTPUT_SPAN_EDGES, position)


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class RequestRecord:
    """One finished request, successful or not."""

    request_id: str
    ts_start: datetime
    ts_end: datetime
    workload: str
    target_model: str
    drafter: str
    draft_model: str | None = None
    target_version: str | None = None
    draft_version: str | None = None
    mode: Mode = "speculative"
    num_speculative_tokens: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    num_spec_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    acceptance_histogram: list[int] = field(default_factory=list)
    ttft_ms: float | None = None
    latency_ms: float | None = None
    draft_ms: float | None = None
    verify_ms: float | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    finish_reason: FinishReason = "stop"
    error: str | None = None
    source: str = "embedded"
    prompt_hash: str | None = None
    stopped_mid_step: bool = False
    holdout_reason: HoldoutReason | None = None  # at which rate a holdout request was drawn (decoder/holdout.py)
    drafted_by_span: list[int] | None = None  # by the step's first output position (module docstring)
    accepted_by_span: list[int] | None = None
    # The decode phase alone, where it was measured apart from queueing (see decode_ms_per_token).
    decode_ms: float | None = None
    # Requests in flight at the serving stack's replica when this one started, itself included (proxy
    # mode): the load a comparison of speculative with plain decoding must match.
    upstream_inflight: int | None = None
    # The mode was read off the response, not declared: a serving stack's answer without draft counts
    # from a deployment whose role nobody declared is stored plain, though its drafter may only have
    # proposed nothing (an n-gram drafter without a match). Such requests are not a baseline: the
    # speedup's plain populations leave them out.
    mode_inferred: bool = False
    # What a cause of a drop needs (decoder/causes.py; None where the path does not know it, never invented):
    # the replica that answered (proxy mode: its host:port), the prompt tokens the engine served from its
    # prefix cache (as the engine reports them), the style fingerprint (the request minus the user's text)
    # and the share of the answer's word 4-grams found in the prompt.
    replica: str | None = None
    cached_prompt_tokens: int | None = None
    style_hash: str | None = None
    prompt_copy_share: float | None = None
    # What the replica last said about itself (proxy mode, monitor/proxy/engine_watch.py; None where it did not):
    # its build, how long it had been up when the request started (``uptime_from``: its process start, or the
    # sidecar's first sight of it), and the share of its KV cache in use (0-1).
    engine_version: str | None = None
    replica_uptime_s: float | None = None
    uptime_from: str | None = None
    kv_cache_use: float | None = None

    # Derived figures: computed, never stored twice.

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted draft tokens, ``None`` when nothing was drafted."""
        if self.num_draft_tokens == 0:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens emitted per verification pass: ``1 + accepted / steps``."""
        if self.num_spec_steps == 0:
            return None
        return 1.0 + self.num_accepted_tokens / self.num_spec_steps

    @property
    def decode_ms_per_token(self) -> float | None:
        return decode_ms_per_token(self.latency_ms, self.ttft_ms, self.output_tokens, self.decode_ms)

    @property
    def tokens_per_second(self) -> float | None:
        if self.latency_ms is None or self.latency_ms <= 0 or self.output_tokens == 0:
            return None
        return self.output_tokens * 1000.0 / self.latency_ms

    def check(self) -> RequestRecord:
        """Raise :class:`RecordError` naming the first field that breaks the contract.

        A valid record takes one pass of cheap tests (:func:`quick_pass`, a few microseconds on the
        recorder's caller's thread); only a record that fails one of them goes through the rules one
        by one (:meth:`_check_rules`), which find the field and build the message.
        """
        try:
            if quick_pass(self):
                return self
        except Exception:  # an odd value (unhashable, incomparable): the rules say what is wrong with it
            pass
        return self._check_rules()

    def _check_rules(self) -> RequestRecord:
        self._check_types()
        validate_workload(self.workload)
        for name in ("ts_start", "ts_end"):
            _check_utc(name, getattr(self, name))
        for name in TEXT_FIELDS:
            value = getattr(self, name)
            if value is not None:
                try:
                    clean_text(value)
                except ValueError as error:
                    raise RecordError(name, str(error)) from None
        if self.mode not in MODES:
            raise RecordError("mode", f"{self.mode!r} is not one of {', '.join(MODES)}")
        if self.holdout_reason is not None and (self.mode != "holdout" or self.holdout_reason not in HOLDOUT_REASONS):
            raise RecordError(
                "holdout_reason",
                f"{self.holdout_reason!r} needs mode holdout (got {self.mode!r}) "
                f"and one of {', '.join(HOLDOUT_REASONS)}",
            )
        if (self.uptime_from is None) != (self.replica_uptime_s is None) or self.uptime_from not in (
            None,
            *UPTIME_FROM,
        ):
            raise RecordError(
                "uptime_from",
                f"{self.uptime_from!r} must be one of {', '.join(UPTIME_FROM)} with replica_uptime_s, null without it",
            )
        if self.style_hash is not None and not STYLE_HASH_PATTERN.fullmatch(self.style_hash):
            raise RecordError("style_hash", f"{self.style_hash!r} is not 12 lower-case hex characters")
        if self.mode_inferred and self.mode != "plain":
            raise RecordError("mode_inferred", f"is only set on a plain request (got mode {self.mode!r})")
        if self.finish_reason not in FINISH_REASONS:
            raise RecordError("finish_reason", f"{self.finish_reason!r} is not one of {', '.join(FINISH_REASONS)}")
        for name, limit in LIMITS.items():
            _check_limit(name, getattr(self, name), limit)
        try:
            backwards = self.ts_end < self.ts_start
        except TypeError:  # one aware and one naive timestamp
            raise RecordError("ts_end", "and ts_start must both carry a time zone, or neither") from None
        if backwards:
            raise RecordError("ts_end", f"{self.ts_end.isoformat()} is before ts_start")
        if self.num_accepted_tokens > self.num_draft_tokens:
            raise RecordError(
                "num_accepted_tokens",
                f"{self.num_accepted_tokens} accepted exceeds {self.num_draft_tokens} drafted",
            )
        # Each step drafts at most num_speculative_tokens. Where either is 0 the bound is unknown: a
        # stack that reports drafts but not steps (llama.cpp), or no draft length.
        most = self.num_spec_steps * self.num_speculative_tokens
        if self.mode == "speculative" and most and self.num_draft_tokens > most:
            raise RecordError(
                "num_draft_tokens",
                f"{self.num_draft_tokens} drafted exceeds num_spec_steps x num_speculative_tokens = "
                f"{self.num_spec_steps} x {self.num_speculative_tokens} = {most}: a step drafts at most "
                "num_speculative_tokens",
            )
        self._check_counts("accepted_per_position", self.num_accepted_tokens, "num_accepted_tokens")
        self._check_counts("acceptance_histogram", self.num_spec_steps, "num_spec_steps")
        if self.accepted_per_position and len(self.accepted_per_position) > self.num_speculative_tokens:
            raise RecordError(
                "accepted_per_position",
                f"has {len(self.accepted_per_position)} positions, more than "
                f"num_speculative_tokens={self.num_speculative_tokens}",
            )
        if self.acceptance_histogram and len(self.acceptance_histogram) != self.num_speculative_tokens + 1:
            raise RecordError(
                "acceptance_histogram",
                f"has {len(self.acceptance_histogram)} bins, expected num_speculative_tokens + 1 = "
                f"{self.num_speculative_tokens + 1}",
            )
        self._check_spans()
        if (
            self.source == "embedded"
            and self.mode == "speculative"
            and self.finish_reason != "error"
            and self.output_tokens > 0
        ):
            expected = 1 + self.num_accepted_tokens + self.num_spec_steps - int(self.stopped_mid_step)
            if self.output_tokens != expected:
                raise RecordError(
                    "output_tokens",
                    f"{self.output_tokens} disagrees with 1 + accepted + steps"
                    f"{' - 1' if self.stopped_mid_step else ''} = {expected}",
                )
        return self

    def _check_types(self) -> None:
        """Each field's type, first: the rules after it compare and measure values they can take for granted."""
        for name in ("ts_start", "ts_end"):
            value = getattr(self, name)
            if not isinstance(value, datetime):
                raise RecordError(name, f"must be a datetime, got {value!r}")
        for name in TEXT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, str) and (value is not None or name in _REQUIRED_TEXTS):
                raise RecordError(name, f"must be text, got {value!r}")
        for name in COUNT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise RecordError(name, f"must be an integer, got {value!r}")
        for name in MEASURE_FIELDS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise RecordError(name, f"must be a number, got {value!r}")
        for name in ("upstream_inflight", "cached_prompt_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise RecordError(name, f"must be an integer, got {value!r}")
        for name in ("accepted_per_position", "acceptance_histogram"):
            if not isinstance(getattr(self, name), list):
                raise RecordError(name, f"must be a list, got {getattr(self, name)!r}")
        for name in ("drafted_by_span", "accepted_by_span"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), list):
                raise RecordError(name, f"must be a list or null, got {getattr(self, name)!r}")
        for name in ("stopped_mid_step", "mode_inferred"):
            if not isinstance(getattr(self, name), bool):
                raise RecordError(name, f"must be a bool, got {getattr(self, name)!r}")

    def _check_counts(self, name: str, total: int, total_name: str) -> None:
        counts = getattr(self, name)
        if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
            raise RecordError(name, f"must hold non-negative integers, got {counts!r}")
        if counts and sum(counts) != total:
            raise RecordError(name, f"sums to {sum(counts)}, but {total_name} is {total}")

    def _check_spans(self) -> None:
        drafted, accepted = self.drafted_by_span, self.accepted_by_span
        if (drafted is None) != (accepted is None):
            missing = "accepted_by_span" if accepted is None else "drafted_by_span"
            raise RecordError(missing, "must be given with the other span count (both, or neither)")
        if drafted is None or accepted is None:
            return
        self._check_counts("drafted_by_span", self.num_draft_tokens, "num_draft_tokens")
        self._check_counts("accepted_by_span", self.num_accepted_tokens, "num_accepted_tokens")
        for span, (d, a) in enumerate(zip(drafted, accepted, strict=True)):
            if a > d:
                raise RecordError("accepted_by_span", f"span {span}: {a} accepted exceeds {d} drafted")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: timestamps as ISO 8601 strings, derived figures left out."""
        data = asdict(self)
        data["ts_start"] = self.ts_start.isoformat()
        data["ts_end"] = self.ts_end.isoformat()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        """Build a record from :meth:`to_dict`'s shape; unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise RecordError(unknown[0], "is not a field of the record")
        values = dict(data)
        for name in ("ts_start", "ts_end"):
            values[name] = _parse_timestamp(name, values.get(name))
        try:
            return cls(**values)
        except TypeError as error:
            raise RecordError("record", str(error)) from error


_MODE_SET: Final = frozenset(MODES)
_FINISH_SET: Final = frozenset(FINISH_REASONS)
_HOLDOUT_SET: Final = frozenset(HOLDOUT_REASONS)
_MAX_VALID_TAGS: Final = 4096
_VALID_TAGS: set[str] = set()  # workload tags that matched WORKLOAD_PATTERN (a memo; bounded)
_match_workload: Final = WORKLOAD_PATTERN.match
# LIMITS as plain names for quick_pass: a dict lookup per field would cost as much as the test itself.
_ID, _SOURCE, _ERROR, _HASH = (LIMITS[name] for name in ("request_id", "source", "error", "prompt_hash"))
_match_style: Final = STYLE_HASH_PATTERN.fullmatch


def _most(name: str) -> float:
    most = LIMITS[name].le
    if most is None:
        raise TypeError(f"LIMITS[{name!r}] declares no upper bound")
    return most


_GAMMA_MAX, _COUNT_MAX, _MS_MAX, _TEMPERATURE_MAX, _TOP_P_MAX, _INFLIGHT_MAX = map(
    _most, ("num_speculative_tokens", "prompt_tokens", "ttft_ms", "temperature", "top_p", "upstream_inflight")
)


def _text_fits(text: object, limit: Limit) -> bool:
    """:func:`clean_text` and the limit's lengths, as a test: the encoding is tried only where the text is not ASCII."""
    if type(text) is not str or "\x00" in text:
        return False
    if not (limit.min_length or 0) <= len(text) <= (limit.max_length or math.inf):
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def quick_pass(r: RequestRecord) -> bool:
    """True only if :meth:`RequestRecord.check` accepts ``r``: all its rules in one pass that builds nothing.

    False means "ask check()": this refuses more than the rules do (an int subclass, a tuple for a
    list, an int for a float, a time zone other than UTC), never accepts what they refuse;
    tests/decoder/test_record.py holds the two to each other. An odd value (unhashable,
    incomparable) may raise instead: callers treat that as False.
    """
    # Plain attribute reads and identity tests, unrolled: on the recorder's caller's thread every
    # bytecode counts, and a loop over field names with getattr costs several times as much.
    workload = r.workload
    if type(workload) is not str:
        return False
    if workload not in _VALID_TAGS:  # a set lookup instead of the regular expression, for tags seen before
        if _match_workload(workload) is None:
            return False
        if len(_VALID_TAGS) < _MAX_VALID_TAGS:
            _VALID_TAGS.add(workload)
    ts_start = r.ts_start
    ts_end = r.ts_end
    if type(ts_start) is not datetime or type(ts_end) is not datetime or ts_end < ts_start:
        return False
    tz = ts_start.tzinfo
    if tz is not UTC and tz is not None and (not 1 < ts_start.year < 9999 or ts_start.utcoffset() is None):
        return False  # the rules try the conversion to UTC
    tz = ts_end.tzinfo
    if tz is not UTC and tz is not None and (not 1 < ts_end.year < 9999 or ts_end.utcoffset() is None):
        return False
    if not (
        _text_fits(r.request_id, _ID)
        and _text_fits(r.target_model, _NAME)
        and _text_fits(r.drafter, _NAME)
        and _text_fits(r.source, _SOURCE)
        and (r.draft_model is None or _text_fits(r.draft_model, _TEXT))
        and (r.target_version is None or _text_fits(r.target_version, _TEXT))
        and (r.draft_version is None or _text_fits(r.draft_version, _TEXT))
        and (r.error is None or _text_fits(r.error, _ERROR))
        and (r.prompt_hash is None or _text_fits(r.prompt_hash, _HASH))
        and (r.replica is None or _text_fits(r.replica, _TEXT))
        and (r.style_hash is None or (type(r.style_hash) is str and _match_style(r.style_hash) is not None))
        and (r.engine_version is None or _text_fits(r.engine_version, _TEXT))
    ):
        return False
    uptime = r.replica_uptime_s
    if uptime is None:
        if r.uptime_from is not None:
            return False
    elif type(uptime) is not float or not 0.0 <= uptime <= MAX_UPTIME_S or r.uptime_from not in UPTIME_FROM:
        return False
    value = r.kv_cache_use
    if value is not None and (type(value) is not float or not 0.0 <= value <= 1.0):
        return False
    mode = r.mode
    finish_reason = r.finish_reason
    if mode not in _MODE_SET or finish_reason not in _FINISH_SET:
        return False
    holdout = r.holdout_reason
    if holdout is not None and (mode != "holdout" or holdout not in _HOLDOUT_SET):
        return False
    gamma = r.num_speculative_tokens
    steps = r.num_spec_steps
    drafted = r.num_draft_tokens
    accepted = r.num_accepted_tokens
    output = r.output_tokens
    prompt = r.prompt_tokens
    if not type(gamma) is type(steps) is type(drafted) is type(accepted) is type(output) is type(prompt) is int:
        return False
    if not (0 <= gamma <= _GAMMA_MAX and 0 <= steps <= _COUNT_MAX and 0 <= output <= _COUNT_MAX
            and 0 <= prompt <= _COUNT_MAX and 0 <= accepted <= drafted <= _COUNT_MAX):  # fmt: skip
        return False
    value = r.ttft_ms
    if value is not None and (type(value) is not float or not 0.0 <= value <= _MS_MAX):
        return False
    value = r.latency_ms
    if value is not None and (type(value) is not float or not 0.0 <= value <= _MS_MAX):
        return False
    value = r.decode_ms
    if value is not None and (type(value) is not float or not 0.0 <= value <= _MS_MAX):
        return False
    value = r.draft_ms
    if value is not None and (type(value) is not float or not 0.0 <= value <= _MS_MAX):
        return False
    value = r.verify_ms
    if value is not None and (type(value) is not float or not 0.0 <= value <= _MS_MAX):
        return False
    inflight = r.upstream_inflight
    if inflight is not None and (type(inflight) is not int or not 1 <= inflight <= _INFLIGHT_MAX):
        return False
    cached = r.cached_prompt_tokens
    if cached is not None and (type(cached) is not int or not 0 <= cached <= _COUNT_MAX):
        return False
    value = r.prompt_copy_share
    if value is not None and (type(value) is not float or not 0.0 <= value <= 1.0):
        return False
    value = r.temperature
    if type(value) is not float or not 0.0 <= value <= _TEMPERATURE_MAX:
        return False
    value = r.top_p
    if type(value) is not float or not 0.0 <= value <= _TOP_P_MAX:
        return False
    stopped = r.stopped_mid_step
    if stopped is not False and stopped is not True:
        return False
    inferred = r.mode_inferred
    if inferred is not False and (inferred is not True or mode != "plain"):
        return False
    if mode == "speculative" and steps and gamma and drafted > steps * gamma:
        return False
    per_position = r.accepted_per_position
    histogram = r.acceptance_histogram
    if type(per_position) is not list or type(histogram) is not list:
        return False
    # Python loops, not sum()/min()/map(): after the caller's thread has done other work, each builtin
    # it reaches is a cold call, and a short loop in the interpreter costs less than several of them.
    if per_position:
        if len(per_position) > gamma:
            return False
        total = 0
        for count in per_position:
            if type(count) is not int or count < 0:
                return False
            total += count
        if total != accepted:
            return False
    if histogram:
        if len(histogram) != gamma + 1:
            return False
        total = 0
        for count in histogram:
            if type(count) is not int or count < 0:
                return False
            total += count
        if total != steps:
            return False
    by_span = r.drafted_by_span
    accepted_by_span = r.accepted_by_span
    if by_span is not None or accepted_by_span is not None:
        if type(by_span) is not list or type(accepted_by_span) is not list:
            return False
        if len(by_span) != OUTPUT_SPANS or len(accepted_by_span) != OUTPUT_SPANS:
            return False
        total = total_accepted = 0
        for span in range(OUTPUT_SPANS):
            count = by_span[span]
            accepted_count = accepted_by_span[span]
            if type(count) is not int or type(accepted_count) is not int or not 0 <= accepted_count <= count:
                return False
            total += count
            total_accepted += accepted_count
        if total != drafted or total_accepted != accepted:
            return False
    return not (
        r.source == "embedded"
        and mode == "speculative"
        and finish_reason != "error"
        and output > 0
        and output != 1 + accepted + steps - stopped
    )


def _check_utc(name: str, value: datetime) -> None:
    # The store keeps UTC: a time whose conversion leaves the calendar (9999-12-31T23:00-05:00 is
    # year 10000 in UTC) could never be written, and would fail its whole batch after acceptance.
    if value.tzinfo is None or value.tzinfo is UTC:
        return
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise RecordError(
            name, f"{value.isoformat()} falls outside years 1-9999 in UTC: send the time the request actually ran"
        ) from None


def _parse_timestamp(name: str, value: object) -> datetime:
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError as error:
            raise RecordError(name, f"{value!r} is not an ISO 8601 timestamp") from error
    else:
        raise RecordError(name, f"must be an ISO 8601 timestamp, got {value!r}")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
