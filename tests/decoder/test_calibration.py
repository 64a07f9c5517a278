"""Timing the pair's passes before the first request: what is measured, that it runs once, that outputs stay."""

from __future__ import annotations

import pytest
import torch

import decoder.speculation.speculative
from decoder import LoadedModel, ModelDrafter, NgramDrafter, SpeculationController, SpeculativeDecoder
from decoder.speculation.calibration import CALIBRATION_TEXT, measure_pair_costs
from decoder.speculation.controller import Observation


@pytest.mark.parametrize("kind", ["model", "ngram"])
def test_every_pass_size_and_the_drafter_are_timed(
    kind: str, tiny_target: LoadedModel, tiny_draft: LoadedModel
) -> None:
    drafter = ModelDrafter(tiny_draft, tiny_target.vocab_size) if kind == "model" else NgramDrafter()
    passes: list[int] = []  # tokens the draft model read per forward pass
    if isinstance(drafter, ModelDrafter):
        forward = drafter._forward

        def counted(input_ids: torch.Tensor) -> torch.Tensor:
            passes.append(input_ids.shape[1])
            return forward(input_ids)

        drafter._forward = counted  # type: ignore[method-assign]
    observation = measure_pair_costs(tiny_target, drafter, gamma_max=5, rounds=2)
    assert (observation.accepted, observation.judged) == (0, 0)
    assert observation.single_passes == 2 and observation.single_ms > 0
    assert observation.sized_passes == {k: 2 for k in range(1, 6)}
    assert all(ms > 0 for ms in observation.sized_ms.values())
    assert observation.verify_passes == 10 and observation.verify_drafts == 2 * (1 + 2 + 3 + 4 + 5)
    assert observation.verify_ms == pytest.approx(sum(observation.sized_ms.values()))
    assert observation.draft_ms > 0
    text_tokens = len(tiny_target.tokenizer.encode(CALIBRATION_TEXT))
    assert observation.draft_prefill_tokens == 2 * (text_tokens - 1)
    if kind == "model":
        assert observation.draft_tokens == 2 * 5
        # The prefill is one pass over the whole text, in the warm-up round and in each timed one; the
        # steps read one token each (a time comparison of the two is noise at this model's size).
        assert passes.count(text_tokens - 1) == 3 and observation.draft_prefill_ms > 0
        assert sorted(set(passes)) == [1, text_tokens - 1]
    else:  # the text is said twice, so n-grams find a continuation (short here: the tiny vocabulary has 16 words)
        assert 2 <= observation.draft_tokens <= 2 * 5


def test_rounds_must_be_positive(tiny_target: LoadedModel) -> None:
    with pytest.raises(ValueError, match="rounds must be >= 1, got 0"):
        measure_pair_costs(tiny_target, NgramDrafter(), gamma_max=4, rounds=0)


def test_the_decoder_calibrates_once_before_the_first_planned_request(
    tiny_target: LoadedModel, tiny_draft: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    timed: list[Observation] = []

    def counting(*args: object, **kwargs: object) -> Observation:
        timed.append(measure_pair_costs(*args, **kwargs))  # type: ignore[arg-type]
        return timed[-1]

    monkeypatch.setattr(decoder.speculation.speculative, "measure_pair_costs", counting)
    controller = SpeculationController(seed=0)
    speculative = SpeculativeDecoder(
        tiny_target, ModelDrafter(tiny_draft, tiny_target.vocab_size), controller=controller
    )
    plain = SpeculativeDecoder(tiny_target, None)

    for prompt in ("a b c d e f", "b c d e f g", "c d e f g h"):
        result = speculative.generate(prompt, max_new_tokens=12, workload="code")
        assert result.token_ids == plain.generate(prompt, max_new_tokens=12).token_ids
    assert len(timed) == 1 and not controller.needs_calibration

    # A controller that already knows the pair (restored from its saved state, say) is not calibrated again,
    restored = SpeculationController.from_state(controller.state())
    again = SpeculativeDecoder(tiny_target, ModelDrafter(tiny_draft, tiny_target.vocab_size), controller=restored)
    again.generate("a b c d", max_new_tokens=6)
    assert len(timed) == 1
    # but a drafter it has not measured is: its costs are its own.
    SpeculativeDecoder(tiny_target, NgramDrafter(), controller=restored).generate("a b c d", max_new_tokens=6)
    assert len(timed) == 2

    # Nor is one whose requests measured verification passes: a caller fixed this one's mode and gamma.
    taught = SpeculationController(seed=0)
    fixed = SpeculativeDecoder(tiny_target, NgramDrafter(), controller=taught)
    fixed.generate("a b a b a b", max_new_tokens=12, mode="speculative", gamma=2)
    assert not taught.needs_calibration
    fixed.generate("a b a b a b", max_new_tokens=12)
    assert len(timed) == 2


def test_a_pair_known_to_lose_never_drafts(tiny_target: LoadedModel, tiny_draft: LoadedModel) -> None:
    """Calibrated costs that no acceptance rate can pay for: the first request of every workload decodes plain."""
    controller = SpeculationController(seed=0)
    slow = SpeculativeDecoder(tiny_target, ModelDrafter(tiny_draft, tiny_target.vocab_size), controller=controller)
    slow.calibrate()
    controller.calibrate(Observation(draft_tokens=1000, draft_ms=10**6))  # drafts as slow as 1 s each
    for workload in ("code", "prose"):
        record = slow.generate("a b c d e f", max_new_tokens=12, workload=workload).record
        assert record.mode == "plain" and record.num_draft_tokens == 0


def test_calibration_without_a_controller_or_drafter_is_a_no_op(tiny_target: LoadedModel) -> None:
    assert SpeculativeDecoder(tiny_target, NgramDrafter()).calibrate() == []
    off = SpeculativeDecoder(tiny_target, NgramDrafter(), controller=SpeculationController(), auto_calibrate=False)
    assert off.calibrate_if_needed() == [] and off.controller is not None and off.controller.needs_calibration
    assert SpeculativeDecoder(tiny_target, None, controller=SpeculationController()).calibrate() == []


def test_a_request_times_the_drafters_prefill_apart_from_its_steps(
    tiny_target: LoadedModel, tiny_draft: LoadedModel
) -> None:
    controller = SpeculationController(seed=0)
    speculative = SpeculativeDecoder(
        tiny_target, ModelDrafter(tiny_draft, tiny_target.vocab_size), controller=controller, auto_calibrate=False
    )
    prompt_length = len(tiny_target.tokenizer.encode("a b c d e f g h"))
    record = speculative.generate("a b c d e f g h", max_new_tokens=8, mode="speculative", gamma=2).record
    (arm,) = controller.state()["arms"].values()
    costs = arm["costs"]
    assert costs["draft_prefill_tokens"] == prompt_length and costs["draft_prefill_ms"] > 0
    assert record.draft_ms == pytest.approx(costs["draft_prefill_ms"] + costs["draft_ms"])  # the record keeps both
    assert arm["workloads"]["default"]["output_tokens"] == record.output_tokens

    speculative.generate("a b c d e f g h", max_new_tokens=8, mode="plain")  # no drafter, no prefill
    (arm,) = controller.state()["arms"].values()
    assert arm["costs"]["draft_prefill_tokens"] == pytest.approx(0.9 * prompt_length)
