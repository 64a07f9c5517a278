"""vLLM's OpenAI-compatible responses: chat and completions (body or final usage chunk) and ``/v1/responses``.

Follows vLLM at commit 02cf515f (docs/features/speculative_decoding/acceptance_metrics.md) and
0377ba9a (docs/features/per_request_metrics.md): per-request figures ride the response's top-level
``metrics`` object, ``metrics.speculative_decoding`` when the server runs with
``--per-request-spec-decode-metrics summary`` (or ``detailed``, which adds ``per_step_accepted``
and ``per_step_drafted``). Both are ``null`` for ``n > 1`` and absent when the flags are off; a
stream carries them on its final usage chunk only (``stream_options.include_usage``), whose
``choices`` is empty. ``/v1/responses`` counts ``usage.input_tokens``/``output_tokens`` and ends in
``status`` (vllm/entrypoints/openai/responses/protocol.py at c0bc5965).

``acceptance_histogram_by_draft_length`` (acceptance_metrics.md at 02cf515f) maps each proposed
draft length ``k`` seen in the request (a JSON string key, after grammar validation) to ``k + 1``
bins: row ``k``, bin ``j`` counts the steps that accepted ``j`` of ``k`` drafts. Where draft
lengths vary per step it is the only figure that says how many steps drafted each position, so it
is checked against the flat histogram and the totals (each row's bins add up to the flat one's,
``sum(k x steps)`` to ``num_draft_tokens``), and it stands in for the flat histogram where that is absent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Annotated, Any, Final

from pydantic import Field

from decoder.record import MAX_SPECULATIVE_TOKENS, FinishReason
from monitor.ingest.stacks.report import (
    OPENAI_FINISH,
    Count,
    Gamma,
    Histogram,
    Identifier,
    Lenient,
    Loc,
    Millis,
    ModelName,
    PerStep,
    Problem,
    PromptDetails,
    Reason,
    StackError,
    StackReport,
    agreed,
    cached_of,
    declared_plain,
    finish,
    missing,
    required,
    settle_gamma,
    spread,
    validated,
)

SPEC: Final[Loc] = ("metrics", "speculative_decoding")
BY_LENGTH: Final[Loc] = (*SPEC, "acceptance_histogram_by_draft_length")
# A proposed draft length, as the JSON object's key writes it.
DraftLength = Annotated[str, Field(pattern=r"^(0|[1-9][0-9]{0,3})$")]
ByLength = Annotated[dict[DraftLength, Histogram], Field(max_length=MAX_SPECULATIVE_TOKENS + 1)]
NO_SPEC: Final = (
    "vLLM reports per-request speculative decoding only when started with --per-request-spec-decode-metrics "
    "summary (or detailed), only for single-sequence requests (n == 1), and in a stream only on the final "
    "usage chunk (stream_options.include_usage)"
)
NO_USAGE: Final = (
    "post the whole response (for /v1/responses: usage.input_tokens and usage.output_tokens); a stream carries "
    "usage on its final chunk, and only when requested with stream_options.include_usage"
)
# The Responses API ends in a status; vLLM marks a response incomplete only at max_output_tokens.
RESPONSES_FINISH: Final[Mapping[str, FinishReason]] = {
    "completed": "stop",
    "incomplete": "length",
    "failed": "error",
    "cancelled": "error",
}


class VllmUsage(Lenient):
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    input_tokens: Count | None = None
    output_tokens: Count | None = None
    prompt_tokens_details: PromptDetails | None = None
    input_tokens_details: PromptDetails | None = None


class VllmSpecDecoding(Lenient):
    num_spec_steps: Count | None = None
    num_draft_tokens: Count | None = None
    num_accepted_draft_tokens: Count | None = None
    num_spec_tokens: Gamma | None = None
    acceptance_histogram: Histogram | None = None
    acceptance_histogram_by_draft_length: ByLength | None = None
    per_step_accepted: PerStep | None = None
    per_step_drafted: PerStep | None = None


class VllmMetrics(Lenient):
    time_to_first_token_ms: Millis | None = None
    generation_time_ms: Millis | None = None
    queue_time_ms: Millis | None = None
    speculative_decoding: VllmSpecDecoding | None = None


class VllmChoice(Lenient):
    finish_reason: Reason | None = None


class VllmResponse(Lenient):
    """A vLLM chat, completions or Responses object, or the final usage chunk of its stream."""

    id: Identifier | None = None
    model: ModelName | None = None
    object: Reason | None = None
    usage: VllmUsage | None = None
    metrics: VllmMetrics | None = None
    choices: tuple[VllmChoice, ...] = ()
    status: Reason | None = None


def parse_vllm(
    response: Mapping[str, Any], *, speculative: bool | None, num_speculative_tokens: int | None = None
) -> StackReport:
    """The report of one vLLM response; ``speculative`` is the deployment's mode (``None``: infer it)."""
    body = validated(VllmResponse, response)
    usage = body.usage or VllmUsage()
    prompt = agreed(
        "vllm", [(("usage", "prompt_tokens"), usage.prompt_tokens), (("usage", "input_tokens"), usage.input_tokens)]
    )
    output = agreed(
        "vllm",
        [(("usage", "completion_tokens"), usage.completion_tokens), (("usage", "output_tokens"), usage.output_tokens)],
    )
    prompt, output = required(
        "vllm", NO_USAGE, [(("usage", "prompt_tokens"), prompt), (("usage", "completion_tokens"), output)]
    )
    metrics = body.metrics or VllmMetrics()
    ttft, generation = metrics.time_to_first_token_ms, metrics.generation_time_ms
    report = StackReport(
        stack="vllm",
        request_id=body.id,
        model=body.model,
        mode="plain",
        prompt_tokens=prompt,
        output_tokens=output,
        num_speculative_tokens=num_speculative_tokens,
        finish_reason=_finish(body),
        ttft_ms=ttft,
        # Both count from scheduling (queue_time_ms is the wait before it), so their difference is the decoding.
        latency_ms=None if ttft is None or generation is None else ttft + generation,
        queue_ms=metrics.queue_time_ms,
        cached_prompt_tokens=agreed(
            "vllm",
            [
                (("usage", "prompt_tokens_details", "cached_tokens"), cached_of(usage.prompt_tokens_details)),
                (("usage", "input_tokens_details", "cached_tokens"), cached_of(usage.input_tokens_details)),
            ],
        ),
    )
    spec = metrics.speculative_decoding
    if spec is None:
        if speculative:
            raise missing("vllm", [SPEC], NO_SPEC)
        return report
    if speculative is False:
        raise declared_plain("vllm", (*SPEC, "num_draft_tokens"), spec.num_draft_tokens)
    drafted, accepted = required(
        "vllm",
        "vLLM's summary level reports both",
        [
            ((*SPEC, "num_draft_tokens"), spec.num_draft_tokens),
            ((*SPEC, "num_accepted_draft_tokens"), spec.num_accepted_draft_tokens),
        ],
    )
    histogram = _steps_histogram(spec) or spec.acceptance_histogram or _by_length_histogram(spec)
    steps = spec.num_spec_steps if spec.num_spec_steps is not None else sum(histogram or ())
    gamma = settle_gamma(spec.num_spec_tokens, num_speculative_tokens, "metrics.speculative_decoding.num_spec_tokens")
    _check_by_length(spec, histogram, gamma)
    gamma, bins, per_position = spread(histogram, gamma)
    return replace(
        report,
        mode="speculative",
        drafted=drafted,
        accepted=accepted,
        steps=steps,
        num_speculative_tokens=gamma,
        histogram=bins,
        per_position=per_position,
    )


def _steps_histogram(spec: VllmSpecDecoding) -> list[int] | None:
    """The ``detailed`` level's per-step arrays as a histogram, checked against the summary they refine."""
    accepted, drafted = spec.per_step_accepted, spec.per_step_drafted
    if accepted is None and drafted is None:
        return None
    if accepted is None or drafted is None or len(accepted) != len(drafted):
        msg = "per_step_accepted and per_step_drafted come together, one entry per verification step each"
        raise StackError([Problem(loc=(*SPEC, "per_step_drafted"), msg=msg, type="value_error")])
    problems = [
        Problem(loc=(*SPEC, "per_step_accepted", i), msg=f"{a} accepted exceeds {d} drafted", type="value_error")
        for i, (a, d) in enumerate(zip(accepted, drafted, strict=True))
        if a > d
    ][:10]
    for name, found, summary, total in (
        ("per_step_accepted", sum(accepted), "num_accepted_draft_tokens", spec.num_accepted_draft_tokens),
        ("per_step_drafted", sum(drafted), "num_draft_tokens", spec.num_draft_tokens),
        ("per_step_accepted", len(accepted), "num_spec_steps", spec.num_spec_steps),
    ):
        if total is not None and found != total:
            msg = f"gives {found}, but {summary} is {total}: the per-step arrays must add up to the summary"
            problems.append(Problem(loc=(*SPEC, name), msg=msg, type="value_error"))
    counts = Counter(accepted)
    histogram = [counts[j] for j in range(max(counts, default=-1) + 1)]
    reported = spec.acceptance_histogram
    if reported is not None and _padded(reported, len(histogram)) != _padded(histogram, len(reported)):
        msg = "disagrees with per_step_accepted: bin j counts the steps that accepted exactly j drafts"
        problems.append(Problem(loc=(*SPEC, "acceptance_histogram"), msg=msg, type="value_error"))
    if problems:
        raise StackError(problems)
    return histogram


def _by_length_histogram(spec: VllmSpecDecoding) -> list[int] | None:
    """The flat histogram the by-length rows add up to: bin ``j`` over every row."""
    rows = spec.acceptance_histogram_by_draft_length
    if not rows:
        return None
    flat: list[int] = []
    for bins in rows.values():
        flat = [a + b for a, b in zip(_padded(flat, len(bins)), _padded(bins, len(flat)), strict=True)]
    return flat


def _check_by_length(spec: VllmSpecDecoding, histogram: list[int] | None, gamma: int | None) -> None:
    """Each by-length row against its length, the draft length and the request's totals; every fault named."""
    rows = spec.acceptance_histogram_by_draft_length
    if not rows:
        return
    problems = []
    for key, bins in rows.items():
        k = int(key)
        if len(bins) != k + 1:
            msg = f"row {key} has {len(bins)} bins: a row of draft length k has k + 1 (0 to k accepted)"
            problems.append(Problem(loc=(*BY_LENGTH, key), msg=msg, type="value_error"))
        elif gamma is not None and k > gamma:
            msg = f"row {key} drafts more than the draft length {gamma}"
            problems.append(Problem(loc=(*BY_LENGTH, key), msg=msg, type="value_error"))
    if problems:
        raise StackError(problems)
    flat = _by_length_histogram(spec) or []
    drafted = sum(int(key) * sum(bins) for key, bins in rows.items())
    accepted = sum(j * n for bins in rows.values() for j, n in enumerate(bins))
    for found, summary, total in (
        (drafted, "num_draft_tokens", spec.num_draft_tokens),
        (accepted, "num_accepted_draft_tokens", spec.num_accepted_draft_tokens),
    ):
        if total is not None and found != total:
            msg = f"gives {found}, but {summary} is {total}: the rows must add up to the summary"
            problems.append(Problem(loc=BY_LENGTH, msg=msg, type="value_error"))
    if histogram is not None and _padded(histogram, len(flat)) != _padded(flat, len(histogram)):
        msg = "disagrees with acceptance_histogram: bin j of every row together counts the steps that accepted j"
        problems.append(Problem(loc=BY_LENGTH, msg=msg, type="value_error"))
    if problems:
        raise StackError(problems)


def _padded(values: list[int], length: int) -> list[int]:
    return values + [0] * (length - len(values))


def _finish(body: VllmResponse) -> FinishReason | None:
    if body.object == "response":
        return finish("vllm", ("status",), body.status, RESPONSES_FINISH)
    if not body.choices:
        return None
    return finish("vllm", ("choices", 0, "finish_reason"), body.choices[0].finish_reason, OPENAI_FINISH)
