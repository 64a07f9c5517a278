"""A rollout's candidate drafter in the embedded decoder: its share drawn per workload, its own arm, its own name.

The staging is the store's own :class:`~monitor.store.rollouts.Rollout` (the decoder reads it
through a protocol and never imports the monitor); the models are the tiny ones, so each test runs
in a second.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from decoder import LoadedModel, ModelDrafter, NgramDrafter, SpeculativeDecoder
from decoder.candidate import CANDIDATE_LABEL, Candidate, CandidateDraw, parse_candidate
from decoder.holdout import HoldoutPolicy
from decoder.speculation.controller import SpeculationController
from monitor.store.rollouts import Rollout
from tests.decoder.test_controller import measured
from tests.draws import assert_share

T0 = datetime(2026, 12, 6, tzinfo=UTC)
STAGED = "ngram-wide"
# Half of copy's requests to the candidate at the first step; per workload, so that a workload can be kept.
ROLLOUT = Rollout("*", STAGED, (0.5, 1.0), 60.0, True, T0, T0, current_drafters=("model", "ngram"))
HOLDOUT = HoldoutPolicy(share=0.2)
PROMPT = "a b c a b c a b"


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("ngram", Candidate("ngram")),
        ("ngram:2-2", Candidate("ngram", ngram_min=2, ngram_max=2)),
        (" model:qwen-coder-0.5b ", Candidate("model", model="qwen-coder-0.5b")),
        ("", None),
    ],
)
def test_a_candidate_is_named_as_the_setting_says(text: str, parsed: Candidate | None) -> None:
    assert parse_candidate(text) == parsed
    if parsed is not None:
        assert parse_candidate(str(parsed)) == parsed  # what the banner and the rollout's pool print reads back


@pytest.mark.parametrize("text", ["ngram:0-2", "ngram:4-2", "ngram:a-b", "model:", "eagle", "ngram:2"])
def test_a_bad_candidate_is_refused_naming_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match="ngram:MIN-MAX"):
        parse_candidate(text)


def test_the_draw_follows_the_rollouts_share_per_workload() -> None:
    draw = CandidateDraw(seed=0)
    copy = [draw.draw(ROLLOUT, "copy") for _ in range(2000)]
    assert 0.46 < copy.count(STAGED) / len(copy) < 0.54  # sd 0.011
    kept = replace(ROLLOUT, workloads={"chat": "current"})
    assert {draw.draw(kept, "chat") for _ in range(200)} == {None}
    promoted = replace(ROLLOUT, status="promoted", workloads={"copy": "candidate", "chat": "current"})
    assert {draw.draw(promoted, "copy") for _ in range(200)} == {STAGED}
    assert {draw.draw(promoted, "story") for _ in range(200)} == {None}  # per workload: only where it won
    assert {draw.draw(replace(ROLLOUT, status="rolled_back"), "copy") for _ in range(200)} == {None}


def test_two_decoders_draw_the_candidates_share_each_of_their_own() -> None:
    """Unseeded, each draw (each server, each restart) has its own generator: none replays another's requests."""
    n = 2000
    first, second = ([d.draw(ROLLOUT, "copy") == STAGED for _ in range(n)] for d in (CandidateDraw(), CandidateDraw()))
    assert first != second  # equal everywhere with probability 2**-2000
    for drawn in (first, second):
        assert_share(drawn, 0.5)


def test_the_controller_plans_the_candidate_on_its_own_arm_after_the_same_holdout_draw() -> None:
    """The holdout schedule is the portfolio's with or without a rollout; a held-out request stays the portfolio's."""
    alone, staged = SpeculationController(holdout=HOLDOUT, seed=3), SpeculationController(holdout=HOLDOUT, seed=3)
    for controller in (alone, staged):
        for _ in range(20):
            controller.observe("copy", measured(alpha=0.9, c=0.0), drafter="ngram")
            controller.observe("copy", measured(alpha=0.05, c=0.0, b_over_t1=0.3), drafter="candidate:ngram")
    plans = [alone.plan("copy", drafters=("ngram",)) for _ in range(50)]
    drawn = [staged.plan("copy", drafters=("ngram",), candidate="candidate:ngram") for _ in range(50)]
    assert [p.holdout_reason for p in plans] == [p.holdout_reason for p in drawn]
    assert 5 <= sum(p.mode == "holdout" for p in drawn) <= 15
    assert {p.drafter for p in drawn if p.mode == "holdout"} == {"ngram"}
    # Not held out: the candidate serves, as its own measurements say: it loses, so it decodes plain.
    served = [p for p in drawn if p.mode != "holdout"]
    assert {(p.drafter, p.mode) for p in served} == {("candidate:ngram", "plain")}
    assert {(p.drafter, p.mode) for p in plans if p.mode != "holdout"} == {("ngram", "speculative")}


def test_the_decoder_records_the_candidates_requests_under_the_rollouts_name(
    tiny_target: LoadedModel, tiny_draft: LoadedModel
) -> None:
    model, ngram = ModelDrafter(tiny_draft, tiny_target.vocab_size), NgramDrafter()
    candidate = NgramDrafter(min_n=1, max_n=1)
    controller = SpeculationController(holdout=HOLDOUT, seed=0)
    decoder = SpeculativeDecoder(tiny_target, [model, ngram], controller=controller, candidate=candidate)
    assert decoder.candidate_label == f"{CANDIDATE_LABEL}ngram"
    plain = SpeculativeDecoder(tiny_target, None).generate(PROMPT, max_new_tokens=8).token_ids

    def served(workload: str, n: int) -> list[tuple[str, str, str | None]]:
        records = [decoder.generate(PROMPT, max_new_tokens=8, workload=workload) for _ in range(n)]
        assert all(r.token_ids == plain for r in records)  # lossless whoever drafts
        return [(r.record.drafter, r.record.mode, r.record.draft_model) for r in records]

    before = served("copy", 20)
    assert {drafter for drafter, _, _ in before} <= {"model", "ngram"}
    decoder.staging = ROLLOUT
    during = served("copy", 60) + served("chat", 20)
    copy, chat = during[:60], during[60:]
    staged = [mode for drafter, mode, _ in copy if drafter == STAGED]
    assert 15 <= len(staged) <= 45 and "holdout" not in staged
    assert all(draft is None for drafter, _, draft in copy if drafter == STAGED)  # an n-gram drafter: no model
    assert {drafter for drafter, mode, _ in copy if mode == "holdout"} <= {"model", "ngram"}
    assert {drafter for drafter, _, _ in chat if drafter == STAGED} == {STAGED}  # the same share on chat
    # Its requests taught its own arm, under its label; the portfolio's arms are the portfolio's.
    assert controller.summary(f"{CANDIDATE_LABEL}ngram")["copy"]["requests"] >= len(staged)
    decoder.staging = replace(ROLLOUT, status="promoted", workloads={"copy": "candidate", "chat": "current"})
    promoted = served("copy", 20) + served("chat", 10)
    assert {d for d, mode, _ in promoted[:20] if mode != "holdout"} == {STAGED}
    assert STAGED not in {d for d, _, _ in promoted[20:]}
    decoder.staging = None
    assert STAGED not in {d for d, _, _ in served("copy", 10)}


def test_a_request_that_names_its_drafter_or_mode_is_never_drawn(tiny_target: LoadedModel) -> None:
    decoder = SpeculativeDecoder(tiny_target, NgramDrafter(), controller=SpeculationController(seed=0),
                                 candidate=NgramDrafter(min_n=2, max_n=2))  # fmt: skip
    decoder.staging = replace(ROLLOUT, status="promoted", per_workload=False)  # every request of every workload
    assert decoder.generate(PROMPT, max_new_tokens=4, workload="copy").record.drafter == STAGED
    for options in ({"drafter": "ngram"}, {"mode": "speculative"}, {"mode": "plain"}):
        record = decoder.generate(PROMPT, max_new_tokens=4, workload="copy", **options).record
        assert record.drafter == "ngram", options
