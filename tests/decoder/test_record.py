"""The record's contract: what check() accepts, what it rejects, and the field it names."""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from decoder.record import (
    COUNT_FIELDS,
    LIMITS,
    MAX_COUNT,
    MAX_ERROR_TEXT,
    MAX_MS,
    MAX_SPECULATIVE_TOKENS,
    MAX_TEXT,
    MEASURE_FIELDS,
    MODES,
    RecordError,
    RequestRecord,
    quick_pass,
)
from monitor.api.app import create_app
from monitor.api.ingest.adapters import AdapterFields
from monitor.ingest.scrape.targets import parse_targets
from monitor.store.writes.rows import validate
from tests.api.conftest import INGEST, auth, make_settings
from tests.proxy.upstream import Upstream


def valid(**overrides: Any) -> RequestRecord:
    start = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    values: dict[str, Any] = {
        "request_id": "r1",
        "ts_start": start,
        "ts_end": start + timedelta(seconds=1),
        "workload": "code",
        "target_model": "t",
        "drafter": "model",
        "num_speculative_tokens": 3,
        "output_tokens": 9,
        "num_spec_steps": 3,
        "num_draft_tokens": 9,
        "num_accepted_tokens": 5,
        "accepted_per_position": [3, 1, 1],
        "acceptance_histogram": [0, 2, 0, 1],
        "latency_ms": 100.0,
    }
    values.update(overrides)
    return RequestRecord(**values)


def test_valid_record_and_derived_figures() -> None:
    record = valid().check()
    assert record.acceptance_rate == pytest.approx(5 / 9)
    assert record.mean_acceptance_length == pytest.approx(1 + 5 / 3)
    assert record.tokens_per_second == pytest.approx(90.0)
    assert record.decode_ms_per_token is None  # no TTFT: the decode phase cannot be told apart


def test_decode_speed_leaves_prompt_reading_out() -> None:
    # 9 tokens in 100 ms, 60 of them before the first token: 40 ms over the 8 tokens after it.
    assert valid(ttft_ms=60.0).decode_ms_per_token == pytest.approx(40 / 8)
    assert valid(ttft_ms=60.0, output_tokens=1, num_spec_steps=0, num_draft_tokens=0, num_accepted_tokens=0,
                 accepted_per_position=[], acceptance_histogram=[]).decode_ms_per_token is None  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"num_accepted_tokens": 10, "accepted_per_position": [3, 3, 4]}, "num_accepted_tokens"),
        ({"num_draft_tokens": -1}, "num_draft_tokens"),
        ({"accepted_per_position": [3, 1, 0]}, "accepted_per_position"),
        ({"acceptance_histogram": [1, 2, 0, 1]}, "acceptance_histogram"),
        ({"acceptance_histogram": [0, 2, 1]}, "acceptance_histogram"),
        ({"latency_ms": math.nan}, "latency_ms"),
        ({"ttft_ms": math.inf}, "ttft_ms"),
        ({"workload": "x" * 65}, "workload"),
        ({"workload": "bad tag!"}, "workload"),
        ({"mode": "turbo"}, "mode"),
        ({"finish_reason": "done"}, "finish_reason"),
        ({"output_tokens": 7}, "output_tokens"),
        ({"ts_end": datetime(2026, 11, 30, 11, 0, tzinfo=UTC)}, "ts_end"),
        ({"request_id": ""}, "request_id"),
        ({"holdout_reason": "target"}, "holdout_reason"),  # a speculative request was not held out
        ({"num_draft_tokens": 10}, "num_draft_tokens"),  # 3 steps of at most 3 drafts
        ({"num_draft_tokens": 10**7, "num_spec_steps": 1, "acceptance_histogram": [0, 0, 0, 1]}, "num_draft_tokens"),
        # Valid ISO times whose UTC conversion leaves the calendar: the store keeps UTC and could not write them.
        ({"ts_end": datetime.fromisoformat("9999-12-31T23:00:00-05:00")}, "ts_end"),
        ({"ts_start": datetime.fromisoformat("0001-01-01T00:00:00+05:00")}, "ts_start"),
        # The rest of the rules, one case each, so that the quick pass is held to every one of them.
        ({"workload": ""}, "workload"),
        ({"workload": 7}, "workload"),
        ({"request_id": "r" * 129}, "request_id"),
        ({"request_id": "r\x00"}, "request_id"),
        ({"target_model": 5}, "target_model"),
        ({"drafter": "a\x00b"}, "drafter"),
        ({"draft_model": b"bytes"}, "draft_model"),
        ({"target_version": "v\x00"}, "target_version"),
        ({"draft_version": 1.5}, "draft_version"),
        ({"error": "e\x00"}, "error"),
        ({"source": 0}, "source"),
        ({"prompt_hash": "\x00"}, "prompt_hash"),
        ({"mode": "holdout", "holdout_reason": "coin"}, "holdout_reason"),
        ({"num_speculative_tokens": True}, "num_speculative_tokens"),
        ({"prompt_tokens": -1}, "prompt_tokens"),
        ({"prompt_tokens": 3.0}, "prompt_tokens"),
        ({"num_spec_steps": -3}, "num_spec_steps"),
        ({"draft_ms": -1.0}, "draft_ms"),
        ({"verify_ms": -math.inf}, "verify_ms"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": -0.5}, "top_p"),
        ({"accepted_per_position": [3, 1, True]}, "accepted_per_position"),
        ({"accepted_per_position": [3, 1, 1.0]}, "accepted_per_position"),
        ({"accepted_per_position": [4, 2, -1]}, "accepted_per_position"),
        ({"accepted_per_position": [2, 1, 1, 1]}, "accepted_per_position"),  # 4 positions, 3 drafts a step
        ({"acceptance_histogram": [0, 2, 0, 1, 0]}, "acceptance_histogram"),
        ({"acceptance_histogram": [0, 3, -1, 1]}, "acceptance_histogram"),
        ({"stopped_mid_step": True}, "output_tokens"),  # 9 tokens, but a stop inside a step leaves 8
        # What the engine watch gives: an uptime says where it starts, and only then.
        ({"uptime_from": "process"}, "uptime_from"),
        ({"replica_uptime_s": 5.0}, "uptime_from"),
        ({"replica_uptime_s": 5.0, "uptime_from": "boot"}, "uptime_from"),
        ({"replica_uptime_s": -1.0, "uptime_from": "process"}, "replica_uptime_s"),
        ({"replica_uptime_s": math.inf, "uptime_from": "first_sight"}, "replica_uptime_s"),
        ({"kv_cache_use": 1.5}, "kv_cache_use"),
        ({"kv_cache_use": math.nan}, "kv_cache_use"),
        ({"engine_version": "b\x00"}, "engine_version"),
    ],
)
def test_broken_records_name_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(RecordError) as caught:
        valid(**overrides).check()
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")


def test_drafts_are_bounded_only_where_steps_and_draft_length_are_known() -> None:
    # llama.cpp reports drafts but not steps; a record without num_speculative_tokens does not say the bound.
    no_steps = {"num_spec_steps": 0, "acceptance_histogram": [], "source": "proxy:llamacpp"}
    valid(num_draft_tokens=80, **no_steps).check()
    valid(num_draft_tokens=80, num_speculative_tokens=0, accepted_per_position=[], acceptance_histogram=[]).check()


def test_round_trip_through_dict() -> None:
    record = valid()
    again = RequestRecord.from_dict(record.to_dict())
    assert again == record
    assert isinstance(record.to_dict()["ts_start"], str)


def test_from_dict_rejects_unknown_fields_and_bad_timestamps() -> None:
    data = valid().to_dict()
    with pytest.raises(RecordError, match="prompt_text"):
        RequestRecord.from_dict({**data, "prompt_text": "secret"})
    with pytest.raises(RecordError) as caught:
        RequestRecord.from_dict({**data, "ts_start": "yesterday"})
    assert caught.value.field == "ts_start"


def test_naive_and_aware_times_do_not_compare() -> None:
    with pytest.raises(RecordError) as caught:
        valid(ts_end=datetime(2026, 11, 30, 13, 0)).check()
    assert caught.value.field == "ts_end" and "time zone" in str(caught.value)


# The quick pass (quick_pass) must agree with the rules one by one (_check_rules) on every record: the
# same outcome, the same field, the same message. Records here are valid ones with one to three fields
# swapped for values from these pools, which hold each rule's edges and the types the rules meet.
_EST = timezone(timedelta(hours=-5))
_BAD_TZ_TIME = datetime(2026, 11, 30, 12, 0, tzinfo=_EST)
TEXTS: list[Any] = [None, "", "t", "x" * 129, "a\x00b", 5, b"b", "code\n", "bad tag", type("S", (str,), {})("s"),
                    "\ud800", "caf\u00e9", "m" * MAX_TEXT, "m" * (MAX_TEXT + 1)]  # fmt: skip
COUNTS: list[Any] = [-1, 0, 1, 2, 3, 4, 5, 9, 10, 10**7, 2**60, True, False, 3.0, None, "3", MAX_COUNT, MAX_COUNT + 1]
LISTS: list[Any] = [[], [1], [3, 1, 1], [3, 1, 0], [4, 1, 0], [0, 2, 0, 1], [0, 3, 0, 0], [3, 1, True],
                    [3, 1, 1.0], [3, 1, -1, 2], (3, 1, 1), [0, 2, 0, 1, 0], [0, 0, 0], [6, 3, 0], [4, 1, 0],
                    [1, 4, 0], [9, 0, 0], [5, 0, 0], [5, 0], None]  # fmt: skip
MEASURES: list[Any] = [None, 0.0, -0.0, 1.5, 1e308, -1.0, math.nan, math.inf, -math.inf, 0, 7, -2, True, 10**400, "1",
                       1.0, 100.0, 100.5, MAX_MS, MAX_MS * 2]  # fmt: skip
TIMES: list[Any] = [
    datetime(2026, 11, 30, 12, 0, tzinfo=UTC),
    datetime(2026, 11, 30, 11, 0, tzinfo=UTC),
    datetime(2026, 11, 30, 12, 0, 1, tzinfo=UTC),
    datetime(2026, 11, 30, 12, 0),
    _BAD_TZ_TIME,
    datetime.fromisoformat("9999-12-31T23:00:00-05:00"),
    datetime.fromisoformat("0001-01-01T00:00:00+05:00"),
    datetime(9999, 12, 31, tzinfo=UTC),
    "2026-11-30T12:00:00Z",
]
POOLS: dict[str, list[Any]] = {
    "request_id": [*TEXTS, "r" * 128],
    "ts_start": TIMES,
    "ts_end": TIMES,
    "workload": [*TEXTS, "w" * 64, "w" * 65, "a.b:c-d_e", "-lead", ["code"]],
    "target_model": TEXTS,
    "drafter": TEXTS,
    "draft_model": TEXTS,
    "target_version": TEXTS,
    "draft_version": TEXTS,
    "mode": [*MODES, "turbo", None, ["plain"], "Plain"],
    "finish_reason": ["stop", "length", "error", "done", None, {}],
    "error": [*TEXTS, "e" * MAX_ERROR_TEXT, "e" * (MAX_ERROR_TEXT + 1)],
    "source": ["embedded", "api", "proxy:llamacpp", *TEXTS, "s" * 64, "s" * 65],
    "prompt_hash": [*TEXTS, "h" * 128],
    "holdout_reason": [None, "target", "share", "coin", []],
    "stopped_mid_step": [False, True, 0, 1, None, "yes"],
    "mode_inferred": [False, True, 0, 1, None, "yes"],
    **{name: COUNTS for name in COUNT_FIELDS},
    "num_speculative_tokens": [*COUNTS, MAX_SPECULATIVE_TOKENS, MAX_SPECULATIVE_TOKENS + 1],
    "upstream_inflight": [None, 0, 1, 2, True, 1.0, MAX_COUNT, MAX_COUNT + 1],
    **{name: MEASURES for name in MEASURE_FIELDS},
    **{
        name: LISTS for name in ("accepted_per_position", "acceptance_histogram", "drafted_by_span", "accepted_by_span")
    },
}
BASES: list[dict[str, Any]] = [
    {},
    {"drafted_by_span": [6, 3, 0], "accepted_by_span": [4, 1, 0], "ttft_ms": 20.0, "temperature": 0.7},
    {"mode": "holdout", "holdout_reason": "share", "num_draft_tokens": 0, "num_accepted_tokens": 0,
     "num_spec_steps": 0, "accepted_per_position": [], "acceptance_histogram": [], "source": "api"},
    {"mode": "plain", "mode_inferred": True, "num_draft_tokens": 0, "num_accepted_tokens": 0, "num_spec_steps": 0,
     "accepted_per_position": [], "acceptance_histogram": [], "source": "proxy:llamacpp"},
    {"stopped_mid_step": True, "output_tokens": 8, "finish_reason": "stop", "draft_model": "d", "error": None},
    {"num_spec_steps": 0, "acceptance_histogram": [], "source": "proxy:llamacpp", "num_draft_tokens": 80,
     "accepted_per_position": [], "num_speculative_tokens": 0},
    {"ts_start": _BAD_TZ_TIME, "ts_end": _BAD_TZ_TIME + timedelta(seconds=2)},
]  # fmt: skip


def outcome(call: Callable[[], object]) -> tuple[object, ...]:
    try:
        call()
    except RecordError as error:
        return ("RecordError", error.field, str(error))
    except Exception as error:
        return (type(error).__name__, str(error))
    return ("ok",)


def mutated_records(count: int, seed: int) -> Iterator[RequestRecord]:
    rng = random.Random(seed)
    names = sorted(POOLS)
    for base in BASES:
        yield valid(**base)
    for _ in range(count):
        changes = {name: rng.choice(POOLS[name]) for name in rng.sample(names, rng.randint(1, 3))}
        yield valid(**{**rng.choice(BASES), **changes})


def test_valid_records_take_the_quick_pass() -> None:
    # Otherwise check() would still be right, only slow: the recorder's p99 depends on it.
    for base in BASES:
        assert quick_pass(valid(**base)), base


def test_the_quick_pass_agrees_with_the_rules() -> None:
    accepted = 0
    for record in mutated_records(6000, seed=23):
        rules = outcome(record._check_rules)
        if quick_pass_or_none(record):
            assert rules == ("ok",), record
            accepted += 1
        assert outcome(record.check) == rules, record
    assert accepted > 300  # the pools reach the quick pass's accepting side, not only its refusals


def quick_pass_or_none(record: RequestRecord) -> bool:
    try:
        return quick_pass(record)
    except Exception:
        return False


def test_each_pooled_value_on_each_valid_record() -> None:
    # Every edge of every limit, one field at a time: the random mixes above may pass one by.
    for base in BASES:
        for name, values in POOLS.items():
            for value in values:
                record = valid(**{**base, name: value})
                rules = outcome(record._check_rules)
                assert not quick_pass_or_none(record) or rules == ("ok",), (name, value)
                assert outcome(record.check) == rules, (name, value)


# Every entrance a record comes in by refuses a record that breaks the contract, for the same reason:
# the embedded decoder's (the record built and checked), the recorder's (monitor.store.writes.rows.validate),
# POST /v1/events, an adapter (POST /v1/events/llamacpp) and the proxy's record of a forwarded answer;
# scrape takes no records, only a workload tag per target. A rule changed in decoder/record.py moves
# them all, which is what these tests hold them to.
REPORTED_DRAFTS = 80
_INGEST_HEADERS = auth(INGEST)


def _llamacpp_answer(accepted: int) -> dict[str, Any]:
    """A llama-server answer (/completion's shape) reporting ``accepted`` of its 80 drafted tokens."""
    timings = {"prompt_n": 12, "prompt_ms": 40.5, "predicted_n": 64, "predicted_ms": 2100.0}
    timings |= {"draft_n": REPORTED_DRAFTS, "draft_n_accepted": accepted}
    return {
        "model": "qwen.gguf",
        "stop_type": "eos",
        "tokens_evaluated": 12,
        "tokens_predicted": 64,
        "timings": timings,
    }


def _posted(**changes: Any) -> dict[str, Any]:
    """The record of that answer as POST /v1/events takes it: times a minute ago, as the wire's clock wants."""
    start = datetime.now(UTC) - timedelta(minutes=1)
    values: dict[str, Any] = {
        "request_id": "entrance-1", "ts_start": start, "ts_end": start + timedelta(seconds=2), "workload": "code",
        "target_model": "qwen.gguf", "drafter": "upstream", "prompt_tokens": 12, "output_tokens": 64,
        "num_draft_tokens": REPORTED_DRAFTS, "num_accepted_tokens": 51, "source": "proxy:llamacpp",
    }  # fmt: skip
    return {**values, **changes}


@pytest.fixture
def sidecar(tmp_path: Path, upstream: tuple[Upstream, str]) -> Iterator[tuple[TestClient, Upstream]]:
    """The app in proxy mode in front of the stub upstream, serving /v1/events and the adapters beside it."""
    stub, url = upstream
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'draftwatch.db'}", DRAFTWATCH_PROXY_UPSTREAM=url)
    with TestClient(create_app(settings)) as client:
        yield client, stub


def _refused_over_http(response: httpx.Response) -> tuple[str, str]:
    assert response.status_code == 422, response.text
    problem = response.json()["detail"][0]
    return str(problem["loc"][-1]), str(problem["msg"])


def _refused_record(values: dict[str, Any]) -> tuple[str, str]:
    with pytest.raises(RecordError) as caught:
        validate(RequestRecord(**values))
    return caught.value.field, str(caught.value).split(": ", 1)[1]


def test_a_cross_field_rule_refuses_the_same_record_at_every_entrance(
    sidecar: tuple[TestClient, Upstream], caplog: pytest.LogCaptureFixture
) -> None:
    client, stub = sidecar
    expected = ("num_accepted_tokens", f"90 accepted exceeds {REPORTED_DRAFTS} drafted")
    bad = _posted(num_accepted_tokens=90)
    with pytest.raises(RecordError) as caught:
        RequestRecord(**bad).check()  # as the embedded decoder checks the record it built
    refusals = {"embedded": (caught.value.field, str(caught.value).split(": ", 1)[1]), "recorder": _refused_record(bad)}
    events = client.post("/v1/events", content=json.dumps(bad, default=str), headers=_INGEST_HEADERS)
    refusals["/v1/events"] = _refused_over_http(events)
    adapter = {**_llamacpp_answer(accepted=90), "workload": "code", "request_id": "entrance-2"}
    refusals["/v1/events/llamacpp"] = _refused_over_http(client.post("/v1/events/llamacpp", json=adapter,
                                                                     headers=_INGEST_HEADERS))  # fmt: skip
    stub.chat = _llamacpp_answer(accepted=90)
    with caplog.at_level(logging.WARNING, logger="monitor.proxy.forward.exchange"):
        answered = client.post("/v1/chat/completions", json={"model": "qwen.gguf", "messages": []})
    assert answered.status_code == 200 and answered.json() == stub.chat  # the monitor never fails a request
    assert client.app.state.api.proxy_unrecorded == 1  # type: ignore[attr-defined]
    (line,) = [r.getMessage() for r in caplog.records if "not recorded" in r.getMessage()]
    where, why = line.split("not recorded: ", 1)[1].split(": ", 1)
    refusals["proxy"] = (where.rsplit(".", 1)[-1], why)
    assert refusals == dict.fromkeys(refusals, expected)
    # The same answer with its counts in order is recorded by each: the refusals were the rule's, not the path's.
    good = _posted(request_id="entrance-3")
    assert validate(RequestRecord(**good)).request_id == "entrance-3"
    assert client.post("/v1/events", content=json.dumps(good, default=str), headers=_INGEST_HEADERS).status_code == 202
    adapter["timings"] = _llamacpp_answer(accepted=51)["timings"]
    assert client.post("/v1/events/llamacpp", json=adapter, headers=_INGEST_HEADERS).status_code == 202
    stub.chat = _llamacpp_answer(accepted=51)
    assert client.post("/v1/chat/completions", json={"model": "qwen.gguf", "messages": []}).status_code == 200
    assert client.app.state.api.recorder.flush(10)  # type: ignore[attr-defined]
    assert client.app.state.api.proxy_unrecorded == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "name", ["request_id", "workload", "target_model", "prompt_hash", "temperature", "top_p", "num_speculative_tokens"]
)
def test_a_declared_limit_holds_at_its_edge_and_refuses_past_it_at_every_entrance(
    sidecar: tuple[TestClient, Upstream], name: str
) -> None:
    # The wire schemas are built from LIMITS: a bound moved there moves pydantic's too (its wording, the
    # same field). The proxy is not here: it takes these from its own settings and the client's body,
    # clamped, and refuses nothing a client sends.
    client, _ = sidecar
    limit = LIMITS[name]
    edge: Any = limit.le if limit.le is not None else "w" * (limit.max_length or 0)
    past: Any = edge + 1 if limit.le is not None else edge + "w"
    for value, accepted in ((edge, True), (past, False)):
        record = _posted(**{"request_id": f"edge-{name}-{accepted}", name: value})
        events = client.post("/v1/events", content=json.dumps(record, default=str), headers=_INGEST_HEADERS)
        caller = {**_llamacpp_answer(accepted=51), "workload": "code", "request_id": f"edge-{name}-{accepted}-a"}
        caller |= {name: value} if name in AdapterFields.model_fields else {}
        adapter = client.post("/v1/events/llamacpp", json=caller, headers=_INGEST_HEADERS)
        if accepted:
            assert validate(RequestRecord(**record)).request_id == record["request_id"]
            assert events.status_code == 202, events.text
            assert adapter.status_code == 202, adapter.text
            continue
        assert _refused_record(record)[0] == name
        assert _refused_over_http(events)[0] == name
        if name in AdapterFields.model_fields:
            assert _refused_over_http(adapter)[0] == name
        if name == "workload":
            with pytest.raises(ValueError, match="workload"):
                parse_targets([{"url": "http://engine:8000/metrics", "kind": "vllm", "workload": value}])
