"""vLLM's ``acceptance_histogram_by_draft_length`` (acceptance_metrics.md at vllm-project/vllm 02cf515f).

The fixtures are tests/fixtures/stacks/vllm/*by-draft-length*.json (also run through the adapter by
test_stack_fixtures.py); here the parser alone, without the app.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from monitor.ingest.stacks import StackError, parse_vllm

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stacks" / "vllm"


def _response(name: str) -> dict[str, Any]:
    response: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())["response"]
    return response


def _spec(response: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = response["metrics"]["speculative_decoding"]
    return spec


def test_rows_of_varying_draft_lengths_give_the_flat_histogram_and_the_positions() -> None:
    report = parse_vllm(_response("chat-by-draft-length-only"), speculative=True)
    # Rows 0, 1 and 3 added bin by bin: 2 + 5 + 10 steps accepted none, 6 + 4 one, 2 two, 3 three.
    assert report.histogram == (17, 10, 2, 3)
    assert report.per_position == (15, 5, 3)
    assert (report.steps, report.drafted, report.accepted, report.num_speculative_tokens) == (32, 68, 23, 3)


def test_rows_agreeing_with_the_flat_histogram_change_nothing() -> None:
    with_rows = parse_vllm(_response("chat-summary-by-draft-length"), speculative=True)
    without = copy.deepcopy(_response("chat-summary-by-draft-length"))
    del _spec(without)["acceptance_histogram_by_draft_length"]
    assert with_rows == parse_vllm(without, speculative=True)


@pytest.mark.parametrize(
    ("rows", "said"),
    [
        ({"0": [2], "1": [5, 6], "3": [10, 4, 3, 2]}, "num_accepted_draft_tokens is 23"),
        ({"0": [2], "1": [5, 6], "2": [10, 4, 5]}, "num_draft_tokens is 68"),
        ({"0": [2], "1": [5, 6], "3": [10, 4, 2]}, "row 3 has 3 bins"),
        ({"4": [0, 0, 0, 0, 1]}, "drafts more than the draft length 3"),
        ({"0": [2], "1": [6, 5], "3": [10, 4, 2, 3]}, "disagrees with acceptance_histogram"),
    ],
)
def test_rows_that_contradict_the_summary_are_refused_by_name(rows: dict[str, list[int]], said: str) -> None:
    response = copy.deepcopy(_response("chat-summary-by-draft-length"))
    _spec(response)["acceptance_histogram_by_draft_length"] = rows
    with pytest.raises(StackError) as refused:
        parse_vllm(response, speculative=True)
    assert said in str(refused.value)
    assert all(p.loc[:3] == ("metrics", "speculative_decoding", "acceptance_histogram_by_draft_length")
               for p in refused.value.problems)  # fmt: skip


def test_a_key_that_is_not_a_length_is_refused() -> None:
    response = copy.deepcopy(_response("chat-summary-by-draft-length"))
    _spec(response)["acceptance_histogram_by_draft_length"] = {"three": [10, 4, 2, 3]}
    with pytest.raises(StackError):
        parse_vllm(response, speculative=True)
