"""SGLang's responses: native ``/generate`` (its ``meta_info``) and the OpenAI-compatible routes.

Native ``/generate`` follows SGLang's python/sglang/srt/managers/tokenizer_manager.py at commit
001067ff (``_handle_batch_output`` and ``_calculate_spec_decoding_metrics``) and
python/sglang/srt/observability/req_time_stats.py at 00ce49e0 (``convert_to_output_meta_info``).
With ``--speculative-algorithm`` set, a finished request that ran at least one verification step
carries ``spec_verify_ct``, ``spec_num_correct_drafts`` and ``spec_num_proposed_drafts``
(``spec_verify_ct x (speculative_num_draft_tokens - 1)``), and ``spec_correct_drafts_histogram``
when it is not empty (grown as needed, index = drafts accepted in a step). The source still
writes ``spec_accepted_drafts``, ``spec_proposed_drafts`` and ``spec_accept_histogram`` as
aliases marked for removal; releases before the rename wrote ``spec_accept_token_num`` and
``spec_draft_token_num`` (and ``spec_verify_ct`` even at 0). Timestamps need ``--enable-metrics``:
``request_received_ts`` and ``request_finished_ts`` (``decode_finished_ts`` before), the
scheduler's ``prefill_finished_time`` (``prefill_finished_ts`` before).

The OpenAI-compatible ``/v1/chat/completions`` and ``/v1/completions`` report the counts only
when asked (:mod:`monitor.proxy.asks` asks and cleans up). Following
python/sglang/srt/entrypoints/openai/protocol.py and serving_chat.py at 004c82e0: a non-streamed
chat with ``return_meta_info: true`` carries each choice's whole ``meta_info`` (the native
figures above) as ``choices[i].meta_info``; a streamed chat refuses that flag with a 400, and
``/v1/completions`` has no such flag. Builds that carry SGLang PR #33518 take
``return_spec_tokens_details: true`` on both routes, streamed or not, and answer with a
response-level ``sglext.spec_tokens_details`` (``spec_verify_ct``, ``spec_num_correct_drafts``,
``spec_num_proposed_drafts``, ``spec_correct_drafts_histogram``, absent figures written as 0 or
``[]``; one object for ``n == 1``, a list for ``n > 1``); a stream carries it on an event of its
own (``choices: []``) before the usage chunk. Token counts come from ``usage`` there; an
``n > 1`` request's counts are the sum over its choices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Final

from decoder.record import FinishReason
from monitor.ingest.stacks.report import (
    OPENAI_FINISH,
    Count,
    Histogram,
    Identifier,
    Lenient,
    Loc,
    ModelName,
    PromptDetails,
    Reason,
    Seconds,
    StackReport,
    UnixSeconds,
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

META: Final[Loc] = ("meta_info",)
STEPS: Final[Loc] = (*META, "spec_verify_ct")
# Each figure's current name first, then its older names (see the module's docstring).
ACCEPTED: Final = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
DRAFTED: Final = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
HISTOGRAM: Final = ("spec_correct_drafts_histogram", "spec_accept_histogram")
NO_SPEC: Final = (
    "SGLang reports it in meta_info for every request that ran a verification step when started with "
    "--speculative-algorithm (a request that stopped at its first token has none)"
)
FINISH: Final[Mapping[str, FinishReason]] = {"stop": "stop", "length": "length", "abort": "error"}


class SglangFinish(Lenient):
    type: Reason | None = None


class SglangMetaInfo(Lenient):
    id: Identifier | None = None
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    finish_reason: SglangFinish | None = None
    e2e_latency: Seconds | None = None
    cached_tokens: Count | None = None
    spec_verify_ct: Count | None = None
    spec_num_correct_drafts: Count | None = None
    spec_accepted_drafts: Count | None = None
    spec_accept_token_num: Count | None = None
    spec_num_proposed_drafts: Count | None = None
    spec_proposed_drafts: Count | None = None
    spec_draft_token_num: Count | None = None
    spec_correct_drafts_histogram: Histogram | None = None
    spec_accept_histogram: Histogram | None = None
    request_received_ts: UnixSeconds | None = None
    request_finished_ts: UnixSeconds | None = None
    decode_finished_ts: UnixSeconds | None = None
    prefill_finished_time: UnixSeconds | None = None
    prefill_finished_ts: UnixSeconds | None = None


class SglangResponse(Lenient):
    """An SGLang ``/generate`` response (one request's, or the final chunk of its stream)."""

    meta_info: SglangMetaInfo


class SglangSpecDetails(Lenient):
    """``sglext.spec_tokens_details``: SGLang writes 0 and ``[]`` for what it did not count."""

    spec_verify_ct: Count | None = None
    spec_num_correct_drafts: Count | None = None
    spec_num_proposed_drafts: Count | None = None
    spec_correct_drafts_histogram: Histogram | None = None


class SglangExt(Lenient):
    spec_tokens_details: SglangSpecDetails | tuple[SglangSpecDetails, ...] | None = None


class SglangUsage(Lenient):
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    # Written by SGLang started with --enable-cache-report.
    prompt_tokens_details: PromptDetails | None = None


class SglangChoice(Lenient):
    finish_reason: Reason | None = None
    meta_info: SglangMetaInfo | None = None


class SglangOpenAIResponse(Lenient):
    """A chat or completions object of SGLang's OpenAI-compatible routes (or a stream's gathered report)."""

    id: Identifier | None = None
    model: ModelName | None = None
    usage: SglangUsage | None = None
    choices: tuple[SglangChoice, ...] = ()
    sglext: SglangExt | None = None


Counts = tuple[int | None, int | None, int | None, list[int] | None]  # steps, accepted, drafted, histogram


def parse_sglang(
    response: Mapping[str, Any], *, speculative: bool | None, num_speculative_tokens: int | None = None
) -> StackReport:
    """The report of one SGLang response; ``speculative`` is the deployment's mode (``None``: infer it)."""
    if "meta_info" not in response and any(key in response for key in ("choices", "usage", "sglext")):
        return _openai(response, speculative, num_speculative_tokens)
    m = validated(SglangResponse, response).meta_info
    return _native(m, META, speculative, num_speculative_tokens)


def is_sglang_openai(response: Mapping[str, Any]) -> bool:
    """Whether an OpenAI-shaped response carries SGLang's own figures (per-choice ``meta_info``, ``sglext``)."""
    choices = response.get("choices")
    per_choice = isinstance(choices, list) and any(isinstance(c, dict) and "meta_info" in c for c in choices)
    return per_choice or isinstance(response.get("sglext"), dict)


def _native(m: SglangMetaInfo, meta: Loc, speculative: bool | None, given: int | None) -> StackReport:
    prompt, output = required(
        "sglang",
        "post the finished request's whole response (or its stream's last chunk)",
        [((*meta, "prompt_tokens"), m.prompt_tokens), ((*meta, "completion_tokens"), m.completion_tokens)],
    )
    received = m.request_received_ts
    prefilled = m.prefill_finished_time if m.prefill_finished_time is not None else m.prefill_finished_ts
    reason = m.finish_reason.type if m.finish_reason is not None else None
    finished = m.request_finished_ts if m.request_finished_ts is not None else m.decode_finished_ts
    report = StackReport(
        stack="sglang",
        request_id=m.id,
        model=None,
        mode="plain",
        prompt_tokens=prompt,
        output_tokens=output,
        num_speculative_tokens=given,
        finish_reason=finish("sglang", (*meta, "finish_reason", "type"), reason, FINISH),
        ttft_ms=None if received is None or prefilled is None else max(0.0, prefilled - received) * 1000,
        # e2e_latency runs from the request's arrival at the tokenizer manager, as does TTFT above.
        latency_ms=None if m.e2e_latency is None else m.e2e_latency * 1000,
        ts_start=_utc(received),
        ts_end=_utc(finished),
        cached_prompt_tokens=m.cached_tokens,
    )
    return _settled(report, [(meta, _meta_counts(m, meta))], speculative, given)


def _openai(response: Mapping[str, Any], speculative: bool | None, given: int | None) -> StackReport:
    body = validated(SglangOpenAIResponse, response)
    metas: list[tuple[Loc, SglangMetaInfo]] = [
        (("choices", i, "meta_info"), c.meta_info) for i, c in enumerate(body.choices) if c.meta_info
    ]
    if len(body.choices) == 1 and len(metas) == 1:
        # n == 1 with return_meta_info: the native figures, timings and all.
        loc, meta = metas[0]
        report = _native(meta, loc, speculative, given)
        return replace(report, model=body.model, request_id=report.request_id or body.id)
    usage = body.usage or SglangUsage()
    prompt, output = required(
        "sglang",
        "post the whole response; a stream carries usage on its final chunk (stream_options.include_usage)",
        [(("usage", "prompt_tokens"), usage.prompt_tokens), (("usage", "completion_tokens"), usage.completion_tokens)],
    )
    reason = body.choices[0].finish_reason if body.choices else None
    report = StackReport(
        stack="sglang",
        request_id=body.id,
        model=body.model,
        mode="plain",
        prompt_tokens=prompt,
        output_tokens=output,
        num_speculative_tokens=given,
        finish_reason=finish("sglang", ("choices", 0, "finish_reason"), reason, OPENAI_FINISH),
        cached_prompt_tokens=cached_of(usage.prompt_tokens_details),
    )
    figures: list[tuple[Loc, Counts]] = [(loc, _meta_counts(m, loc)) for loc, m in metas]
    details = body.sglext.spec_tokens_details if body.sglext is not None else None
    if not figures and details is not None:
        where: Loc = ("sglext", "spec_tokens_details")
        listed = details if isinstance(details, tuple) else (details,)
        figures = [
            ((*where, i) if isinstance(details, tuple) else where, _detail_counts(d)) for i, d in enumerate(listed)
        ]
    return _settled(report, figures, speculative, given, steps_loc=("sglext", "spec_tokens_details", "spec_verify_ct"))


def _meta_counts(m: SglangMetaInfo, meta: Loc) -> Counts:
    def aliased(names: tuple[str, ...]) -> Any:
        return agreed("sglang", [((*meta, name), getattr(m, name)) for name in names])

    return m.spec_verify_ct, aliased(ACCEPTED), aliased(DRAFTED), aliased(HISTOGRAM)


def _detail_counts(d: SglangSpecDetails) -> Counts:
    return d.spec_verify_ct, d.spec_num_correct_drafts, d.spec_num_proposed_drafts, d.spec_correct_drafts_histogram


def _settled(
    report: StackReport,
    figures: list[tuple[Loc, Counts]],
    speculative: bool | None,
    given: int | None,
    *,
    steps_loc: Loc = STEPS,
) -> StackReport:
    """``report`` with the speculative counts of each choice (summed), or plain where there are none."""
    counted = [(loc, counts) for loc, counts in figures if any(value is not None for value in counts)]
    if not counted:
        if speculative and report.output_tokens > 1:
            where = figures[0][0] if figures else steps_loc[:-1]
            raise missing("sglang", [(*where, "spec_verify_ct"), (*where, ACCEPTED[0]), (*where, DRAFTED[0])], NO_SPEC)
        return report if not speculative else _speculative(report, 0, 0, 0, None, given)
    if speculative is False:
        loc, (steps, *_) = counted[0]
        raise declared_plain("sglang", (*loc, "spec_verify_ct"), steps)
    totals = [0, 0, 0]
    histogram: list[int] | None = None
    for loc, (steps, accepted, drafted, bins) in counted:
        if steps == 0:  # releases before the rename wrote spec_verify_ct at 0 steps, the counts only after a step
            accepted, drafted = accepted or 0, drafted or 0
        found = required(
            "sglang",
            "SGLang reports spec_verify_ct with both counts",
            [((*loc, "spec_verify_ct"), steps), ((*loc, ACCEPTED[0]), accepted), ((*loc, DRAFTED[0]), drafted)],
        )
        totals = [total + value for total, value in zip(totals, found, strict=True)]
        if bins:
            histogram = _summed(histogram or [], bins)
    steps, accepted, drafted = totals
    return _speculative(report, steps, accepted, drafted, histogram, given)


def _summed(a: list[int], b: list[int]) -> list[int]:
    longer, shorter = (a, b) if len(a) >= len(b) else (b, a)
    return [x + (shorter[i] if i < len(shorter) else 0) for i, x in enumerate(longer)]


def _speculative(
    report: StackReport, steps: int, accepted: int, drafted: int, histogram: list[int] | None, given: int | None
) -> StackReport:
    # SGLang drafts the same number every step: drafted = steps x (speculative_num_draft_tokens - 1).
    reported = drafted // steps if steps and drafted % steps == 0 else None
    gamma = settle_gamma(reported, given, "meta_info.spec_num_proposed_drafts / spec_verify_ct")
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


def _utc(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)
