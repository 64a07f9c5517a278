"""SGLang's OpenAI-compatible routes: the parser, and what the proxy asks for and takes out again.

Shapes follow sgl-project/sglang 004c82e0 (python/sglang/srt/entrypoints/openai/protocol.py,
serving_chat.py, serving_completions.py: per-choice ``meta_info`` on a non-streamed chat with
``return_meta_info``) and SGLang PR #33518 (``return_spec_tokens_details`` ->
``sglext.spec_tokens_details``, on its own event in a stream); the fixtures are
tests/fixtures/stacks/sglang/chat-*.json and completions-*.json.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from monitor.ingest.stacks import StackError, parse_sglang
from monitor.proxy.asks import ask_sglang, cleaned_sglang, cleaned_sglang_json, gathered_sglang
from monitor.proxy.forward.exchange import stack_of

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stacks" / "sglang"


def _response(name: str) -> dict[str, Any]:
    response: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())["response"]
    return response


def test_a_chat_with_meta_info_reads_the_native_figures_timings_included() -> None:
    report = parse_sglang(_response("chat-meta-info"), speculative=True)
    assert (report.drafted, report.accepted, report.steps, report.num_speculative_tokens) == (30, 19, 10, 3)
    assert report.per_position == (9, 7, 3)
    assert (report.ttft_ms, report.latency_ms) == pytest.approx((125.0, 875.0))
    assert report.model == "meta-llama/Llama-3.1-8B-Instruct" and report.finish_reason == "length"


def test_sglext_details_read_with_usage_for_the_tokens() -> None:
    report = parse_sglang(_response("completions-spec-tokens-details"), speculative=None)
    assert report.mode == "speculative"
    assert (report.prompt_tokens, report.output_tokens, report.drafted, report.accepted) == (12, 29, 30, 19)
    assert report.histogram == (1, 2, 4, 3) and report.finish_reason == "stop"


def test_n2_details_are_summed_over_the_choices() -> None:
    report = parse_sglang(_response("chat-n2-spec-tokens-details"), speculative=True)
    assert (report.steps, report.drafted, report.accepted, report.histogram) == (14, 42, 24, (2, 4, 4, 4))


def test_a_plain_answer_declared_speculative_names_the_choice_field() -> None:
    with pytest.raises(StackError) as refused:
        parse_sglang(_response("chat-meta-info-no-spec-speculative"), speculative=True)
    assert ("choices", 0, "meta_info", "spec_verify_ct") in [p.loc for p in refused.value.problems]


def test_counts_from_a_deployment_declared_plain_are_refused() -> None:
    with pytest.raises(StackError, match="declared plain"):
        parse_sglang(_response("completions-spec-tokens-details"), speculative=False)


def test_the_openai_shapes_are_told_from_vllm_by_auto_detection() -> None:
    assert stack_of("auto", "/v1/chat/completions", _response("chat-meta-info")) == "sglang"
    assert stack_of("auto", "/v1/completions", _response("completions-spec-tokens-details")) == "sglang"
    plain = {k: v for k, v in _response("completions-spec-tokens-details").items() if k != "sglext"}
    assert stack_of("auto", "/v1/completions", plain) == "vllm"


@pytest.mark.parametrize(
    ("path", "stream", "added"),
    [
        ("/v1/chat/completions", False, {"return_meta_info", "return_spec_tokens_details"}),
        # A streamed chat answers return_meta_info with a 400 (serving_chat.py at 004c82e0).
        ("/v1/chat/completions", True, {"return_spec_tokens_details"}),
        ("/v1/completions", False, {"return_spec_tokens_details"}),
        ("/v1/completions", True, {"return_spec_tokens_details"}),
        ("/generate", False, set()),
    ],
)
def test_asks_add_only_what_the_route_takes(path: str, stream: bool, added: set[str]) -> None:
    payload: dict[str, Any] = {"model": "m", "stream": stream}
    assert ask_sglang(payload, path) == added
    assert payload == {"model": "m", "stream": stream, **dict.fromkeys(added, True)}


def test_what_the_client_asked_for_itself_is_not_added_nor_taken_out() -> None:
    payload: dict[str, Any] = {"return_meta_info": True}
    added = ask_sglang(payload, "/v1/chat/completions")
    assert added == {"return_spec_tokens_details"}
    body = _response("chat-meta-info")
    assert cleaned_sglang(body, added) == body


def test_a_cleaned_body_is_what_sglang_writes_unasked() -> None:
    asked = _response("chat-meta-info")
    unasked = copy.deepcopy(asked)
    del unasked["choices"][0]["meta_info"]
    added = frozenset({"return_meta_info", "return_spec_tokens_details"})
    assert cleaned_sglang(asked, added) == unasked
    compact = json.dumps(asked, separators=(",", ":")).encode()
    assert cleaned_sglang_json(compact, added) == json.dumps(unasked, separators=(",", ":")).encode()


def test_sglext_keeps_what_the_client_asked_for() -> None:
    ext = {"spec_tokens_details": {"spec_verify_ct": 1}, "routed_experts": "x"}
    body = {"choices": [], "usage": None, "sglext": ext}
    assert cleaned_sglang(body, {"return_spec_tokens_details"}) == {
        "choices": [],
        "usage": None,
        "sglext": {"routed_experts": "x"},
    }


def test_an_event_that_only_carried_the_details_is_dropped() -> None:
    event = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [], "usage": None,
             "sglext": {"spec_tokens_details": {"spec_verify_ct": 10}}}  # fmt: skip
    assert cleaned_sglang(event, {"return_spec_tokens_details"}) is None
    assert cleaned_sglang_json(json.dumps(event).encode(), {"return_spec_tokens_details"}) is None
    # Nothing added: nothing taken, the bytes as they came.
    raw = json.dumps(event).encode()
    assert cleaned_sglang_json(raw, frozenset()) is raw


def test_a_stream_gathered_event_by_event_is_read_whole() -> None:
    details = _response("completions-spec-tokens-details")["sglext"]["spec_tokens_details"]
    base = {"id": "cmpl-s", "object": "text_completion", "created": 1, "model": "m"}
    events = [
        {**base, "choices": [{"index": 0, "text": "Hel", "finish_reason": None}], "usage": None},
        {**base, "choices": [{"index": 0, "text": "lo", "finish_reason": "length"}], "usage": None},
        {**base, "choices": [], "usage": None, "sglext": {"spec_tokens_details": details}},
        {**base, "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 29, "total_tokens": 41}},
    ]
    report: dict[str, Any] | None = None
    seen = []
    for event in events:
        report = gathered_sglang(report, event)
        seen.append(report is not None)
    assert seen == [False, False, True, True]
    assert report is not None
    parsed = parse_sglang(report, speculative=True)
    assert (parsed.prompt_tokens, parsed.output_tokens, parsed.drafted, parsed.accepted) == (12, 29, 30, 19)
    assert parsed.request_id == "cmpl-s" and parsed.model == "m"
