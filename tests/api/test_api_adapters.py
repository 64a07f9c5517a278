"""The vLLM, llama.cpp and SGLang adapters: each stack's shape lands in the record field by field."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
from fastapi.testclient import TestClient

from monitor.api.ingest.adapters import map_response
from tests.api.conftest import INGEST, auth, recent, stored

H = auth(INGEST)

VLLM: dict[str, Any] = {
    "id": "chatcmpl-abc",
    "model": "qwen-coder-1.5b",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "never stored"}, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 42, "completion_tokens": 53, "total_tokens": 95},
    "metrics": {
        "time_to_first_token_ms": 85.0,
        "generation_time_ms": 1240.0,
        "queue_time_ms": 12.0,
        "speculative_decoding": {
            "mean_acceptance_length": 1.2325581395348837,
            "draft_acceptance_rate": 0.07751937984496124,
            "acceptance_histogram": [39, 1, 0, 3],
            "acceptance_histogram_by_draft_length": {"3": [39, 1, 0, 3]},
            "num_spec_steps": 43,
            "num_accepted_draft_tokens": 10,
            "num_draft_tokens": 129,
            "num_spec_tokens": 3,
        },
    },
}
LLAMACPP: dict[str, Any] = {
    "content": "never stored",
    "model": "qwen-coder-1.5b.gguf",
    "stop_type": "eos",
    "tokens_evaluated": 12,
    "tokens_predicted": 64,
    "timings": {
        "cache_n": 0,
        "prompt_n": 12,
        "prompt_ms": 40.5,
        "prompt_per_token_ms": 3.4,
        "predicted_n": 64,
        "predicted_ms": 2100.0,
        "predicted_per_second": 30.5,
        "draft_n": 80,
        "draft_n_accepted": 51,
    },
}
# As SGLang writes it today: the spec_num_* names, and the older ones as aliases (tokenizer_manager.py).
SGLANG: dict[str, Any] = {
    "text": "never stored",
    "meta_info": {
        "id": "sg-1",
        "prompt_tokens": 20,
        "completion_tokens": 30,
        "finish_reason": {"type": "length", "length": 30},
        "e2e_latency": 0.75,
        "spec_verify_ct": 10,
        "spec_num_correct_drafts": 19,
        "spec_num_proposed_drafts": 30,
        "spec_accepted_drafts": 19,
        "spec_proposed_drafts": 30,
        "spec_accept_rate": 0.633,
        "spec_accept_length": 3.0,
        "spec_correct_drafts_histogram": [1, 2, 4, 3],
        "spec_accept_histogram": [1, 2, 4, 3],
    },
}


def test_vllm_maps_field_by_field(client: TestClient, db_url: str) -> None:
    response = client.post("/v1/events/vllm", json={**VLLM, "workload": "code", "drafter": "ngram"}, headers=H)
    assert response.status_code == 202, response.text
    row = stored(db_url, "chatcmpl-abc")
    assert (row["num_spec_steps"], row["num_draft_tokens"], row["num_accepted_tokens"]) == (43, 129, 10)
    assert row["num_speculative_tokens"] == 3
    assert row["acceptance_histogram"] == [39, 1, 0, 3]
    assert row["accepted_per_position"] == [4, 3, 3]
    assert (row["prompt_tokens"], row["output_tokens"]) == (42, 53)
    assert row["ttft_ms"] == 85.0 and row["latency_ms"] == 1325.0
    assert row["draft_ms"] is None and row["verify_ms"] is None  # vLLM does not report them: null, not invented
    assert row["finish_reason"] == "length" and row["source"] == "proxy:vllm" and row["mode"] == "speculative"
    assert row["target_model"] == "qwen-coder-1.5b" and row["drafter"] == "ngram"
    assert (row["ts_end"] - row["ts_start"]).total_seconds() * 1000 == 1337.0  # queue + ttft + generation


def test_llamacpp_maps_field_by_field(client: TestClient, db_url: str) -> None:
    body = {**LLAMACPP, "workload": "chat", "request_id": "ll-1", "num_speculative_tokens": 8}
    assert client.post("/v1/events/llamacpp", json=body, headers=H).status_code == 202
    row = stored(db_url, "ll-1")
    assert (row["num_draft_tokens"], row["num_accepted_tokens"]) == (80, 51)
    assert (row["prompt_tokens"], row["output_tokens"]) == (12, 64)
    assert row["ttft_ms"] == 40.5 and row["latency_ms"] == 2140.5
    assert row["num_spec_steps"] == 0 and row["acceptance_histogram"] == [] and row["accepted_per_position"] == []
    assert row["num_speculative_tokens"] == 8 and row["finish_reason"] == "stop" and row["source"] == "proxy:llamacpp"
    assert row["target_model"] == "qwen-coder-1.5b.gguf"


def test_sglang_maps_field_by_field(client: TestClient, db_url: str) -> None:
    body = {**SGLANG, "workload": "chat", "target_model": "qwen", "ts_end": recent().isoformat()}
    assert client.post("/v1/events/sglang", json=body, headers=H).status_code == 202
    row = stored(db_url, "sg-1")
    assert (row["num_spec_steps"], row["num_draft_tokens"], row["num_accepted_tokens"]) == (10, 30, 19)
    assert row["num_speculative_tokens"] == 3 and row["acceptance_histogram"] == [1, 2, 4, 3]
    assert row["accepted_per_position"] == [9, 7, 3]
    assert row["latency_ms"] == 750.0 and row["ttft_ms"] is None and row["finish_reason"] == "length"


def test_sglang_timestamps_and_a_short_histogram() -> None:
    # --enable-metrics: the tokenizer manager's request_received_ts and request_finished_ts, the scheduler's
    # prefill_finished_time (the releases before called them prefill_finished_ts and decode_finished_ts).
    meta = {**SGLANG["meta_info"], "spec_correct_drafts_histogram": [1, 1, 8], "spec_accept_histogram": [1, 1, 8]}
    meta |= {"spec_num_correct_drafts": 17, "spec_accepted_drafts": 17, "request_received_ts": recent().timestamp()}
    meta |= {"prefill_finished_time": recent().timestamp() + 0.05, "request_finished_ts": recent().timestamp() + 0.75}
    record = map_response("sglang", {"meta_info": meta, "workload": "chat", "target_model": "qwen"})
    assert record.acceptance_histogram == [
        1,
        1,
        8,
        0,
    ]  # SGLang grows it as needed: padded to num_speculative_tokens + 1
    assert record.ttft_ms is not None and abs(record.ttft_ms - 50.0) < 1e-3
    assert record.ts_start == recent() and (record.ts_end - record.ts_start).total_seconds() == 0.75


def test_batches_of_stack_responses(client: TestClient, count_rows: Callable[[], int]) -> None:
    events = [{**VLLM, "id": f"v-{i}", "workload": "code"} for i in range(3)]
    assert client.post("/v1/events/vllm", json={"events": events}, headers=H).json()["stored"] == 3
    events.append({**VLLM, "workload": "code"})  # no distinct id: a duplicate of nothing stored yet, fine
    events.append({**VLLM, "id": "v-bad", "workload": "bad tag"})
    response = client.post("/v1/events/vllm", json={"events": events}, headers=H)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "events", 4, "workload"]
    assert count_rows() == 3


def test_adapter_errors(client: TestClient) -> None:
    cases: list[tuple[str, Any, list[Any]]] = [
        ("llamacpp", {**LLAMACPP, "workload": "chat"}, ["body", "request_id"]),
        ("llamacpp", {"workload": "chat", "request_id": "x"}, ["body", "timings"]),
        ("sglang", {**SGLANG, "workload": "chat"}, ["body", "target_model"]),
        ("vllm", {**VLLM}, ["body", "workload"]),
        ("vllm", [VLLM], ["body"]),
        ("vllm", {**VLLM, "workload": "c", "usage": {"prompt_tokens": -4}}, ["body", "usage", "prompt_tokens"]),
        (
            "vllm",
            {**VLLM, "workload": "c", "metrics": {"speculative_decoding": {"num_accepted_draft_tokens": 5}}},
            ["body", "metrics", "speculative_decoding", "num_draft_tokens"],
        ),
        (
            "vllm",
            {
                **VLLM,
                "workload": "c",
                "metrics": {"speculative_decoding": {"num_draft_tokens": 3, "num_accepted_draft_tokens": 5}},
            },
            ["body", "num_accepted_tokens"],
        ),
        (
            "llamacpp",
            {"workload": "chat", "request_id": "x", "timings": {"prompt_n": 3}},
            ["body", "usage", "prompt_tokens"],
        ),
    ]
    for stack, body, loc in cases:
        response = client.post(f"/v1/events/{stack}", json=body, headers=H)
        assert response.status_code == 422, (stack, response.text)
        assert response.json()["detail"][0]["loc"] == loc, (stack, response.json())


def test_plain_traffic_without_speculative_figures() -> None:
    plain = {**VLLM, "metrics": {"time_to_first_token_ms": 5.0, "generation_time_ms": 50.0}, "workload": "w"}
    record = map_response("vllm", plain)
    assert record.mode == "plain" and record.num_draft_tokens == 0 and record.acceptance_histogram == []
    timings = {"predicted_n": 3, "prompt_n": 2, "cache_n": 5}
    record = map_response(
        "llamacpp", {"workload": "w", "id": "l", "model": "m", "timings": timings, "stop_type": "eos"}
    )
    assert record.mode == "plain" and record.latency_ms is None and record.drafter == "unknown"
    assert record.prompt_tokens == 7  # the cached tokens count: timings.prompt_n alone leaves them out


def test_a_stream_s_final_chunk_says_no_finish_reason_so_the_caller_does(client: TestClient, db_url: str) -> None:
    # vLLM's final usage chunk (the one with metrics) has no choices: the finish reason came in an earlier chunk.
    chunk = {**VLLM, "object": "chat.completion.chunk", "choices": [], "workload": "chat"}
    response = client.post("/v1/events/vllm", json=chunk, headers=H)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", "finish_reason"]
    assert "send finish_reason" in response.json()["detail"][0]["msg"]
    assert client.post("/v1/events/vllm", json={**chunk, "finish_reason": "length"}, headers=H).status_code == 202
    assert stored(db_url, "chatcmpl-abc")["finish_reason"] == "length"
    unknown = {**VLLM, "workload": "chat", "choices": [{"index": 0, "finish_reason": "repetition"}]}
    problem = client.post("/v1/events/vllm", json=unknown, headers=H).json()["detail"][0]
    assert problem["loc"] == ["body", "choices", 0, "finish_reason"] and "'repetition'" in problem["msg"]


def test_the_deployment_s_mode_is_held_against_the_response(client: TestClient, count_rows: Callable[[], int]) -> None:
    cases: list[tuple[str, dict[str, Any], list[Any], str]] = [
        # Speculative figures from a deployment declared plain, directly or by the posted mode.
        (
            "vllm",
            {**VLLM, "speculative": False},
            ["body", "metrics", "speculative_decoding", "num_draft_tokens"],
            "declared plain",
        ),
        (
            "llamacpp",
            {**LLAMACPP, "request_id": "l", "mode": "holdout"},
            ["body", "timings", "draft_n"],
            "declared plain",
        ),
        (
            "sglang",
            {**SGLANG, "target_model": "m", "speculative": False},
            ["body", "meta_info", "spec_verify_ct"],
            "declared plain",
        ),
        # A speculative deployment whose response lacks what the stack reports when asked to.
        (
            "vllm",
            {**VLLM, "mode": "speculative", "metrics": None},
            ["body", "metrics", "speculative_decoding"],
            "--per-request-spec-decode-metrics",
        ),
    ]
    for stack, body, loc, fragment in cases:
        response = client.post(f"/v1/events/{stack}", json={**body, "workload": "chat"}, headers=H)
        assert response.status_code == 422, (stack, response.text)
        problem = response.json()["detail"][0]
        assert problem["loc"] == loc and fragment in problem["msg"], (stack, problem)
    assert count_rows() == 0


def test_a_figure_under_two_names_must_agree_and_so_must_the_draft_length(client: TestClient) -> None:
    meta = {**SGLANG["meta_info"], "spec_accepted_drafts": 18}
    problem = client.post(
        "/v1/events/sglang", json={"meta_info": meta, "workload": "c", "target_model": "m"}, headers=H
    )
    detail = problem.json()["detail"][0]
    assert detail["loc"] == ["body", "meta_info", "spec_accepted_drafts"], detail
    assert "is 18, but meta_info.spec_num_correct_drafts is 19" in detail["msg"]
    response = client.post("/v1/events/vllm", json={**VLLM, "workload": "c", "num_speculative_tokens": 5}, headers=H)
    detail = response.json()["detail"][0]
    assert detail["loc"] == ["body", "num_speculative_tokens"] and "num_spec_tokens = 3" in detail["msg"], detail


def test_the_detailed_level_must_add_up_to_the_summary(client: TestClient, db_url: str) -> None:
    spec = {**VLLM["metrics"]["speculative_decoding"], "per_step_drafted": [3] * 43}
    spec["per_step_accepted"] = [0] * 39 + [1] + [3] * 3
    detailed = {**VLLM, "id": "d-1", "workload": "c", "metrics": {**VLLM["metrics"], "speculative_decoding": spec}}
    assert client.post("/v1/events/vllm", json=detailed, headers=H).status_code == 202
    assert stored(db_url, "d-1")["accepted_per_position"] == [4, 3, 3]
    spec["per_step_accepted"] = [0] * 39 + [1] + [3, 3, 2]  # 9 accepted in all where the summary says 10
    response = client.post("/v1/events/vllm", json={**detailed, "id": "d-2"}, headers=H)
    assert response.status_code == 422
    locs = [p["loc"][-1] for p in response.json()["detail"]]
    assert locs == ["per_step_accepted", "acceptance_histogram"], response.json()


def test_the_document_requires_an_id_and_a_model_from_the_caller_or_the_stack() -> None:
    # map_response refuses a response without them; the document marked every one of them optional.
    document = json.loads((Path(__file__).resolve().parents[2] / "docs" / "openapi.json").read_text())

    def valid(name: str, body: dict[str, Any]) -> bool:
        schema = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
        return bool(jsonschema.Draft202012Validator(schema).is_valid(body))

    for name, extra in (("VllmIn", {}), ("LlamacppIn", {"timings": {}})):
        body = {"workload": "chat", **extra}
        assert not valid(name, body) and not valid(name, {**body, "id": "cmpl-1"})
        assert valid(name, {**body, "id": "cmpl-1", "model": "qwen"})
        assert valid(name, {**body, "request_id": "r-1", "target_model": "qwen"})
    sglang = {"workload": "chat", "meta_info": {"id": "abc"}}
    assert not valid("SglangIn", sglang)  # SGLang names no model: target_model is the caller's
    assert valid("SglangIn", {**sglang, "target_model": "qwen"})
    assert not valid("SglangIn", {"workload": "chat", "meta_info": {}, "target_model": "qwen"})
    assert valid("SglangIn", {"workload": "chat", "meta_info": {}, "target_model": "qwen", "request_id": "r-1"})
