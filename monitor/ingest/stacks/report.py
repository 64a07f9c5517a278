"""What a serving stack reported about one request, and the rules every stack's parser shares.

A parser reads the stack's own response (a non-streamed body, or the final streamed chunk that
carries the usage) and returns a :class:`StackReport`: the counts and timings the stack reported,
in the record's terms, nothing invented. A figure the stack does not report is ``None``; a
response that lacks what the stack must report, or contradicts what the caller knows about the
deployment, raises :class:`StackError` with one :class:`Problem` per fault, each naming the field
and what to do. Values are never echoed beyond the counts themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from decoder.record import MAX_COUNT, MAX_MS, MAX_SPECULATIVE_TOKENS, FinishReason

Stack = Literal["vllm", "llamacpp", "sglang"]
Loc = tuple[str | int, ...]

Count = Annotated[StrictInt, Field(ge=0, le=MAX_COUNT)]
Gamma = Annotated[StrictInt, Field(ge=0, le=MAX_SPECULATIVE_TOKENS)]
Histogram = Annotated[list[Count], Field(max_length=MAX_SPECULATIVE_TOKENS + 1)]
# Per-step arrays hold one entry per verification step; the API's body limit bounds them first.
MAX_STEPS: Final = 1_000_000
PerStep = Annotated[list[Count], Field(max_length=MAX_STEPS)]
Millis = Annotated[float, Field(ge=0, le=MAX_MS, allow_inf_nan=False)]
Seconds = Annotated[float, Field(ge=0, le=1e7, allow_inf_nan=False)]
# Unix timestamps (seconds) from 2000 to 2100.
UnixSeconds = Annotated[float, Field(ge=946_684_800, le=4_102_444_800, allow_inf_nan=False)]
Identifier = Annotated[str, Field(max_length=128)]
ModelName = Annotated[str, Field(max_length=512)]
Reason = Annotated[str, Field(max_length=64)]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class Lenient(BaseModel):
    """A stack's object: only the fields read are declared; the rest (generated text included) is ignored."""

    # The stacks' objects carry much more than is read here, and add fields between versions.
    model_config = ConfigDict(extra="ignore", frozen=True)


@dataclass(frozen=True, slots=True)
class Problem:
    """One fault of a response: where (``loc``, within the response), what (``msg``) and its kind (``type``)."""

    loc: Loc
    msg: str
    type: str


class StackError(ValueError):
    """A response that cannot be mapped: every problem found, not just the first."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, p.loc))}: {p.msg}" for p in problems))
        self.problems = tuple(problems)


@dataclass(frozen=True, slots=True)
class StackReport:
    """What one stack response said about its request, in the record's terms.

    ``drafted``/``accepted`` count draft tokens (the bonus token excluded). ``steps`` is the number
    of verification passes, ``None`` where the stack does not count them (llama.cpp).
    ``histogram[j]`` counts the steps that accepted exactly ``j`` drafts, padded to
    ``num_speculative_tokens + 1`` bins; ``per_position[i]`` the steps that accepted the draft at
    position ``i``; both are empty where the stack reports no histogram. ``finish_reason`` is
    ``None`` when the response does not say (a stream's final usage chunk has no choices).
    ``ttft_ms`` and ``latency_ms`` share one origin, so that ``latency - ttft`` is the decode time;
    ``queue_ms`` is the wait before that origin, where the stack measures from scheduling.
    ``ts_start``/``ts_end`` are the stack's own clock, where it reports one. ``cached_prompt_tokens``
    counts the prompt tokens served from the prefix cache, where the stack reports it (0 is a figure).
    """

    stack: Stack
    request_id: str | None
    model: str | None
    mode: Literal["speculative", "plain"]
    prompt_tokens: int
    output_tokens: int
    drafted: int = 0
    accepted: int = 0
    steps: int | None = None
    num_speculative_tokens: int | None = None
    histogram: tuple[int, ...] = ()
    per_position: tuple[int, ...] = ()
    finish_reason: FinishReason | None = None
    ttft_ms: float | None = None
    latency_ms: float | None = None
    queue_ms: float | None = None
    ts_start: datetime | None = None
    ts_end: datetime | None = None
    cached_prompt_tokens: int | None = None

    @property
    def decode_ms(self) -> float | None:
        """The stack's own decode time: its latency less its TTFT (one origin), where it reports both."""
        if self.ttft_ms is None or self.latency_ms is None:
            return None
        return max(self.latency_ms - self.ttft_ms, 0.0)


class PromptDetails(Lenient):
    """OpenAI's ``usage.prompt_tokens_details``, as vLLM, llama.cpp and SGLang write it."""

    cached_tokens: Count | None = None


def cached_of(details: PromptDetails | None) -> int | None:
    """``prompt_tokens_details.cached_tokens``, None where the details or the figure are absent."""
    return None if details is None else details.cached_tokens


def reported(report: StackReport) -> dict[str, Any]:
    """The record's fields a stack's report gives, its counts and its own timings: the same for a posted
    response (the adapters) and a proxied one."""
    return {
        "num_speculative_tokens": report.num_speculative_tokens or 0,
        "prompt_tokens": report.prompt_tokens,
        "output_tokens": report.output_tokens,
        "num_spec_steps": report.steps or 0,
        "num_draft_tokens": report.drafted,
        "num_accepted_tokens": report.accepted,
        "acceptance_histogram": list(report.histogram),
        "accepted_per_position": list(report.per_position),
        "ttft_ms": report.ttft_ms,
        "latency_ms": report.latency_ms,
        "cached_prompt_tokens": report.cached_prompt_tokens,
    }


def validated(model: type[M], response: Mapping[str, Any]) -> M:
    """``response`` read as ``model``; type and range faults become :class:`StackError`, without the values."""
    try:
        return model.model_validate(response)
    except ValidationError as error:
        raise StackError(
            [
                Problem(loc=tuple(item["loc"]), msg=item["msg"], type=item["type"])
                for item in error.errors(include_url=False, include_input=False, include_context=False)[:50]
            ]
        ) from None


def agreed(stack: Stack, names: Sequence[tuple[Loc, T | None]]) -> T | None:
    """The value under the first name present; a stack's current name and its aliases must agree.

    >>> agreed("sglang", [(("a",), None), (("b",), 3), (("c",), 3)])
    3
    """
    present = [(loc, value) for loc, value in names if value is not None]
    if not present:
        return None
    (first_loc, first), *others = present
    for loc, value in others:
        if value != first:
            # Counts are quoted; a histogram (up to 1025 bins) is only said to differ.
            said = f"differs from {_dotted(first_loc)}"
            if not isinstance(value, list):
                said = f"is {value!r}, but {_dotted(first_loc)} is {first!r}"
            msg = f"{said}: the {stack} response names one figure twice (a current name and its alias) with two values"
            raise StackError([Problem(loc=loc, msg=msg, type="value_error")])
    return first


def missing(stack: Stack, locs: Sequence[Loc], why: str) -> StackError:
    """The 422 for figures a stack must report and did not: each named, with what makes the stack report it."""
    return StackError(
        [Problem(loc=loc, msg=f"the {stack} response carries no {_dotted(loc)}: {why}", type="missing") for loc in locs]
    )


def required(stack: Stack, why: str, figures: Sequence[tuple[Loc, int | None]]) -> list[int]:
    """The counts of ``figures``, or the 422 naming every one that is absent.

    >>> required("vllm", "", [(("a",), 1), (("b",), 0)])
    [1, 0]
    """
    absent = [loc for loc, value in figures if value is None]
    if absent:
        raise missing(stack, absent, why)
    return [value for _, value in figures if value is not None]


def declared_plain(stack: Stack, loc: Loc, value: object) -> StackError:
    """The 422 for speculative figures from a deployment the caller declared plain."""
    return StackError(
        [
            Problem(
                loc=loc,
                msg=f"is {value!r}: the {stack} response reports speculative decoding, but the deployment was "
                "declared plain (speculative false); declare it speculative, or leave speculative unset to infer it",
                type="value_error",
            )
        ]
    )


def finish(stack: Stack, loc: Loc, value: str | None, known: Mapping[str, FinishReason]) -> FinishReason | None:
    """The record's finish reason for the stack's own word; an unknown word is refused, never guessed.

    >>> finish("vllm", ("choices", 0, "finish_reason"), "tool_calls", OPENAI_FINISH)
    'stop'
    """
    if value is None:
        return None
    if value not in known:
        raise StackError(
            [
                Problem(
                    loc=loc,
                    msg=f"{value!r} is not a finish reason the {stack} adapter knows ({', '.join(known)}): "
                    "send finish_reason (stop, length or error)",
                    type="value_error",
                )
            ]
        )
    return known[value]


# OpenAI-compatible ``choices[].finish_reason`` as vLLM and llama.cpp write it.
OPENAI_FINISH: Final[Mapping[str, FinishReason]] = {
    "stop": "stop",
    "tool_calls": "stop",
    "length": "length",
    "abort": "error",
    "error": "error",
}


def settle_gamma(reported: int | None, given: int | None, source: str) -> int | None:
    """The draft length: the stack's own figure (``source`` says where it comes from), else the caller's.

    >>> settle_gamma(None, 8, "x"), settle_gamma(3, None, "x")
    (8, 3)
    """
    if reported is not None and given is not None and reported != given:
        raise StackError(
            [
                Problem(
                    loc=("num_speculative_tokens",),
                    msg=f"{given} was given, but the response reports {source} = {reported}: "
                    "send the draft length the deployment runs with, or leave it out",
                    type="value_error",
                )
            ]
        )
    return reported if reported is not None else given


def spread(histogram: Sequence[int] | None, gamma: int | None) -> tuple[int | None, tuple[int, ...], tuple[int, ...]]:
    """``(gamma, histogram, per_position)``: the histogram zero-padded to ``gamma + 1`` bins, positions derived.

    Acceptance is a prefix, so the steps that accepted the draft at position ``i`` are those that
    accepted more than ``i``. Without a draft length the histogram's own bins bound it.

    >>> spread([39, 1, 0, 3], 3)
    (3, (39, 1, 0, 3), (4, 3, 3))
    >>> spread([1, 1, 8], 3)
    (3, (1, 1, 8, 0), (9, 8, 0))
    """
    if not histogram:
        return gamma, (), ()
    gamma = len(histogram) - 1 if gamma is None else gamma
    bins = (*histogram, *([0] * (gamma + 1 - len(histogram))))
    return gamma, bins, tuple(sum(bins[i + 1 :]) for i in range(min(gamma, len(bins) - 1)))


def _dotted(loc: Loc) -> str:
    return ".".join(map(str, loc))
