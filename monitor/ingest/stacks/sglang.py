"""SGLang's native ``/generate`` response: its ``meta_info``.

Follows SGLang's python/sglang/srt/managers/tokenizer_manager.py at commit 001067ff
(``_handle_batch_output`` and ``_calculate_spec_decoding_metrics``) and
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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Final

from decoder.record import FinishReason
from monitor.ingest.stacks.report import (
    Count,
    Histogram,
    Identifier,
    Lenient,
    Loc,
    Reason,
    Seconds,
    StackReport,
    UnixSeconds,
    agreed,
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


def parse_sglang(
    response: Mapping[str, Any], *, speculative: bool | None, num_speculative_tokens: int | None = None
) -> StackReport:
    """The report of one SGLang response; ``speculative`` is the deployment's mode (``None``: infer it)."""
    m = validated(SglangResponse, response).meta_info
    prompt, output = required(
        "sglang",
        "post the finished request's whole response (or its stream's last chunk)",
        [((*META, "prompt_tokens"), m.prompt_tokens), ((*META, "completion_tokens"), m.completion_tokens)],
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
        num_speculative_tokens=num_speculative_tokens,
        finish_reason=finish("sglang", (*META, "finish_reason", "type"), reason, FINISH),
        ttft_ms=None if received is None or prefilled is None else max(0.0, prefilled - received) * 1000,
        # e2e_latency runs from the request's arrival at the tokenizer manager, as does TTFT above.
        latency_ms=None if m.e2e_latency is None else m.e2e_latency * 1000,
        ts_start=_utc(received),
        ts_end=_utc(finished),
    )
    steps = m.spec_verify_ct
    accepted: int | None = _aliased(m, ACCEPTED)
    drafted: int | None = _aliased(m, DRAFTED)
    histogram: list[int] | None = _aliased(m, HISTOGRAM)
    if steps is None and accepted is None and drafted is None and histogram is None:
        if speculative and output > 1:
            raise missing("sglang", [STEPS, (*META, ACCEPTED[0]), (*META, DRAFTED[0])], NO_SPEC)
        return report if not speculative else _speculative(report, 0, 0, 0, None, num_speculative_tokens)
    if speculative is False:
        raise declared_plain("sglang", STEPS, steps)
    if steps == 0:  # releases before the rename wrote spec_verify_ct at 0 steps, the counts only after a step
        accepted, drafted = accepted or 0, drafted or 0
    steps, accepted, drafted = required(
        "sglang",
        "SGLang reports spec_verify_ct with both counts",
        [(STEPS, steps), ((*META, ACCEPTED[0]), accepted), ((*META, DRAFTED[0]), drafted)],
    )
    return _speculative(report, steps, accepted, drafted, histogram, num_speculative_tokens)


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


def _aliased(m: SglangMetaInfo, names: tuple[str, ...]) -> Any:
    return agreed("sglang", [((*META, name), getattr(m, name)) for name in names])


def _utc(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)
