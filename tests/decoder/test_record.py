"""The record's contract: what check() accepts, what it rejects, and the field it names."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from decoder.record import RecordError, RequestRecord


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
