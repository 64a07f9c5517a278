"""A drafter portfolio: the controller picks the drafter per workload, probes the others, and the record says which."""

from __future__ import annotations

import json

import pytest

from decoder import LoadedModel, ModelDrafter, NgramDrafter, SpeculativeDecoder
from decoder.drafters import drafter_label
from decoder.holdout import HoldoutPolicy
from decoder.speculation.controller import Observation, SpeculationController
from tests.decoder.test_controller import measured

NO_HOLDOUT = HoldoutPolicy(share=0.0, max_share=0.0, target=0)
PAIR = ("model:draft", "ngram")


def trained() -> SpeculationController:
    """The model drafter is good on prose and poor on code; the n-gram drafter the other way round."""
    controller = SpeculationController(holdout=NO_HOLDOUT, probe_every=5, seed=0)
    for _ in range(20):
        controller.observe("prose", measured(alpha=0.8, c=0.1), drafter="model:draft")
        controller.observe("prose", measured(alpha=0.05, c=0.0), drafter="ngram")
        controller.observe("code", measured(alpha=0.3, c=0.1), drafter="model:draft")
        controller.observe("code", measured(alpha=0.9, c=0.0), drafter="ngram")
    return controller


def test_each_workload_gets_the_drafter_that_measured_best() -> None:
    controller = trained()
    assert controller.plan("prose", drafters=PAIR).drafter == "model:draft"
    assert controller.plan("code", drafters=PAIR).drafter == "ngram"
    assert controller.plan("code", drafters=PAIR).mode == "speculative"


def test_the_other_drafter_is_probed_every_probe_every_requests() -> None:
    controller = trained()
    served = []
    for _ in range(15):
        plan = controller.plan("code", drafters=PAIR)
        served.append(plan.drafter)
        alpha = 0.9 if plan.drafter == "ngram" else 0.3
        controller.observe("code", measured(alpha=alpha, c=0.0), plan.mode, drafter=plan.drafter)
    # The model drafter last served code one request before trained() ended; it comes back every fifth request.
    assert [i for i, label in enumerate(served) if label == "model:draft"] == [3, 8, 13]


def test_a_drafter_that_recovers_takes_the_workload_back() -> None:
    controller = trained()
    for _ in range(60):  # the n-gram drafter stops finding anything on code; the model drafter's probes see it
        plan = controller.plan("code", drafters=PAIR)
        alpha = 0.0 if plan.drafter == "ngram" else 0.6
        controller.observe("code", measured(alpha=alpha, c=0.0), plan.mode, drafter=plan.drafter)
    assert controller.plan("code", drafters=PAIR).drafter == "model:draft"


def test_when_every_drafter_loses_the_request_is_plain_and_names_the_best() -> None:
    controller = SpeculationController(holdout=NO_HOLDOUT, probe_every=50, seed=0)
    for _ in range(20):
        controller.observe("chat", measured(alpha=0.05, c=0.5), drafter="model:draft")
        controller.observe("chat", measured(alpha=0.02, c=0.0, b_over_t1=0.3), drafter="ngram")
    plan = controller.plan("chat", drafters=PAIR)
    assert plan.mode == "plain" and plan.drafter in PAIR and plan.expected_speedup < 1


def test_a_plain_request_teaches_every_drafter_the_target_alone() -> None:
    controller = trained()
    before = {label: controller.pair_costs(label)["t1_ms"] for label in PAIR}
    for _ in range(30):
        controller.observe("code", Observation(single_passes=10, single_ms=10 * 200.0), "plain", drafter="ngram")
    after = {label: controller.pair_costs(label)["t1_ms"] for label in PAIR}
    assert all(after[label] > before[label] * 1.5 for label in PAIR)  # t1 is the target's, whoever was named


def test_a_single_drafters_saved_state_is_taken_over_by_the_first_drafter_named() -> None:
    single = SpeculationController(seed=0)
    for _ in range(10):
        single.observe("code", measured(alpha=0.9, c=0.1))
    old = json.loads(json.dumps(single.state()))
    arm = old.pop("arms")[""]
    old.update(costs=arm["costs"], workloads=arm["workloads"])  # the format before portfolios
    restored = SpeculationController.from_state(old)
    assert restored.estimates("code", drafter="model:draft") == pytest.approx(single.estimates("code"))
    assert restored.estimates("code", drafter="ngram")["alpha"] == pytest.approx(restored.priors.alpha)
    assert set(restored.state()["arms"]) == {"model:draft"}


def test_the_decoder_serves_each_workload_with_its_drafter_and_stays_lossless(
    tiny_target: LoadedModel, tiny_draft: LoadedModel
) -> None:
    model, ngram = ModelDrafter(tiny_draft, tiny_target.vocab_size), NgramDrafter()
    labels = (drafter_label(model), drafter_label(ngram))
    controller = SpeculationController(holdout=NO_HOLDOUT, probe_every=1000, seed=0)
    for _ in range(20):  # as if measured: the model drafter wins prose, the n-gram drafter wins code
        controller.observe("prose", measured(alpha=0.9, c=0.01), drafter=labels[0])
        controller.observe("prose", measured(alpha=0.0, c=0.0), drafter=labels[1])
        controller.observe("code", measured(alpha=0.0, c=0.01), drafter=labels[0])
        controller.observe("code", measured(alpha=0.9, c=0.0), drafter=labels[1])
    portfolio = SpeculativeDecoder(tiny_target, [model, ngram], controller=controller, auto_calibrate=False)
    plain = SpeculativeDecoder(tiny_target, None)
    prompt = "a b c a b c a b"
    expected = plain.generate(prompt, max_new_tokens=10).token_ids
    for workload, kind in (("prose", "model"), ("code", "ngram")):
        result = portfolio.generate(prompt, max_new_tokens=10, workload=workload)
        assert result.token_ids == expected
        assert result.record.mode == "speculative" and result.record.drafter == kind
        assert (result.record.draft_model is not None) == (kind == "model")
    fixed = portfolio.generate(prompt, max_new_tokens=10, workload="prose", drafter="ngram", mode="speculative")
    assert fixed.record.drafter == "ngram" and fixed.token_ids == expected
    with pytest.raises(ValueError, match="'eagle' is not one of this decoder's drafters"):
        portfolio.generate(prompt, max_new_tokens=4, drafter="eagle")
    with pytest.raises(ValueError, match="each drafter must be different"):
        SpeculativeDecoder(tiny_target, [ngram, NgramDrafter()])
