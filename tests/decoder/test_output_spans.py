"""Acceptance by output position: the record's span counts, their contract and how the decoder fills them."""

from __future__ import annotations

from typing import Any

import pytest

from decoder.record import OUTPUT_SPAN_EDGES, RecordError
from decoder.speculation.accounting import RequestStats
from tests.decoder.test_record import valid


def test_spans_are_optional_and_must_add_up() -> None:
    assert valid().check().drafted_by_span is None  # a stack that knows no positions sends none
    ok = valid(drafted_by_span=[6, 3, 0], accepted_by_span=[4, 1, 0]).check()
    assert ok.to_dict()["accepted_by_span"] == [4, 1, 0]


@pytest.mark.parametrize(
    ("spans", "field", "message"),
    [
        ({"drafted_by_span": [6, 3, 0]}, "accepted_by_span", "both, or neither"),
        ({"accepted_by_span": [4, 1, 0]}, "drafted_by_span", "both, or neither"),
        ({"drafted_by_span": [6, 3], "accepted_by_span": [4, 1]}, "drafted_by_span", "list of 3"),
        ({"drafted_by_span": [6, 3, 1], "accepted_by_span": [4, 1, 0]}, "drafted_by_span", "num_draft_tokens is 9"),
        ({"drafted_by_span": [0, 0, 0], "accepted_by_span": [0, 0, 0]}, "drafted_by_span", "sums to 0"),
        ({"drafted_by_span": [6, 3, 0], "accepted_by_span": [4, 0, 0]}, "accepted_by_span", "num_accepted_tokens"),
        ({"drafted_by_span": [6, 3, 0], "accepted_by_span": [1, 4, 0]}, "accepted_by_span", "span 1: 4 accepted"),
        ({"drafted_by_span": [6, 3, 0], "accepted_by_span": [4, 1, -0.0]}, "accepted_by_span", "non-negative int"),
    ],
)
def test_bad_spans_name_their_field(spans: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(RecordError, match=message) as caught:
        valid(**spans).check()
    assert caught.value.field == field


def test_the_decoder_counts_a_step_where_it_starts() -> None:
    # γ = 4; the first token comes from the prompt pass (position 0), so the first step starts at 1.
    stats = RequestStats(gamma=4, mode="speculative")
    stats.first_token()
    position, drafted, accepted = 1, [0, 0, 0], [0, 0, 0]
    # Steps accepting 3 of 4 emit 4 tokens: they start at 1, 5, ..., 29 (span 0), then 33 ... 125, 129 ...
    while position < 200:
        span = 0 if position < OUTPUT_SPAN_EDGES[0] else 1 if position < OUTPUT_SPAN_EDGES[1] else 2
        stats.step(drafted=4, accepted=3, emitted=4, stopped_mid_step=False)
        drafted[span] += 4
        accepted[span] += 3
        position += 4
    stats.step(drafted=4, accepted=4, emitted=5, stopped_mid_step=False)
    drafted[2], accepted[2] = drafted[2] + 4, accepted[2] + 4
    record = stats.to_record(workload="code", target_model="t", drafter="model")
    assert record.drafted_by_span == drafted and record.accepted_by_span == accepted
    # Steps starting at 1..29 (8 steps), 33..125 (24 steps: the one at 29 straddles 32 but counts in span 0).
    assert drafted[:2] == [8 * 4, 24 * 4]
    assert sum(drafted) == record.num_draft_tokens and sum(accepted) == record.num_accepted_tokens


def test_plain_decoding_reports_zero_drafts_per_span() -> None:
    stats = RequestStats(gamma=4, mode="plain")
    stats.first_token()
    for _ in range(40):
        stats.step(drafted=0, accepted=0, emitted=1, stopped_mid_step=False)
    record = stats.to_record(workload="code", target_model="t", drafter="none")
    assert record.drafted_by_span == [0, 0, 0] and record.accepted_by_span == [0, 0, 0]
