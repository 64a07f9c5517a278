"""The store's validate(): its quick pass decides as its tests one by one do, on every record."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from decoder.record import RecordError
from monitor.store.rows import MAX_COUNT, MAX_ERROR_TEXT, MAX_SPECULATIVE_TOKENS, MAX_TEXT, validate, validate_rules
from tests.decoder.test_record import BASES, mutated_records, outcome, valid

# validate's own bounds on top of check()'s pools: long texts, large counts, non-bool flags.
STORE_POOLS: dict[str, list[Any]] = {
    "target_model": ["m" * MAX_TEXT, "m" * (MAX_TEXT + 1), None],
    "drafter": ["d" * (MAX_TEXT + 1), None],
    "source": ["s" * (MAX_TEXT + 1), None],
    "draft_model": ["d" * (MAX_TEXT + 1)],
    "target_version": ["v" * (MAX_TEXT + 1)],
    "draft_version": ["v" * (MAX_TEXT + 1)],
    "prompt_hash": ["h" * (MAX_TEXT + 1), "h" * MAX_TEXT],
    "error": ["e" * MAX_ERROR_TEXT, "e" * (MAX_ERROR_TEXT + 1), "e" * (MAX_TEXT + 1)],
    "num_speculative_tokens": [MAX_SPECULATIVE_TOKENS, MAX_SPECULATIVE_TOKENS + 1],
    "prompt_tokens": [MAX_COUNT, MAX_COUNT + 1],
    "output_tokens": [MAX_COUNT + 1],
    "num_spec_steps": [MAX_COUNT + 1],
    "num_draft_tokens": [MAX_COUNT + 1],
    "stopped_mid_step": [0, 1, None],
    "ttft_ms": [True, 3, "3"],
    "temperature": [False, 1],
}


def test_valid_records_take_validates_quick_pass() -> None:
    # validate() returns at once for them; the tests one by one agree that they are valid.
    for base in BASES:
        record = valid(**base)
        assert validate(record) is record
        assert validate_rules(record) is record


def test_validate_agrees_with_its_tests_one_by_one() -> None:
    rng = random.Random(2323)
    stored = 0
    for record in mutated_records(3000, seed=2323):
        for candidate in (record, _with_store_values(record, rng)):
            result = outcome(lambda c=candidate: validate(c))
            assert result == outcome(lambda c=candidate: validate_rules(c)), candidate
            stored += result == ("ok",)
    assert stored > 300  # both sides are reached: records validate() stores, and records it refuses


def test_each_store_bound_on_each_valid_record() -> None:
    for base in BASES:
        for name, values in STORE_POOLS.items():
            for value in values:
                candidate = replace(valid(**base), **{name: value})
                assert outcome(lambda c=candidate: validate(c)) == outcome(lambda c=candidate: validate_rules(c)), (
                    name,
                    value,
                )


def _with_store_values(record: Any, rng: random.Random) -> Any:
    name = rng.choice(sorted(STORE_POOLS))
    return replace(record, **{name: rng.choice(STORE_POOLS[name])})


@pytest.mark.parametrize("thing", [None, {"request_id": "r1"}, "r1"])
def test_validate_names_a_non_record(thing: object) -> None:
    with pytest.raises(RecordError) as caught:
        validate(thing)
    assert caught.value.field == "record"
