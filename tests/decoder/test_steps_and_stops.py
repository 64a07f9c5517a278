"""Cache rollback, stop conditions and the record's counting rules."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

import pytest
import torch
from transformers import DynamicCache

from decoder import LoadedModel, ModelDrafter, NgramDrafter, Proposal, SamplingParams, SpeculativeDecoder
from decoder.speculation.accounting import RequestStats
from decoder.speculation.speculative import _Sequence, prefill, speculative_step
from tests.decoder.tiny import random_prompt, tiny_model


class ScriptedDrafter:
    """Proposes a fixed list every step: a drafter kind the verification code has never seen."""

    kind = "scripted"
    name = None
    version = None

    def __init__(self, proposal: list[int]) -> None:
        self.proposal = proposal

    def begin(self, prompt_ids: Sequence[int]) -> None:
        return None

    def propose(self, tokens: Sequence[int], gamma: int, params: SamplingParams, generator: object) -> Proposal:
        return Proposal(tokens=torch.tensor(self.proposal[:gamma], dtype=torch.long), probs=None)

    def rollback(self, num_valid: int) -> None:
        return None


def cache_matches_recomputation(model: LoadedModel, cache: DynamicCache, tokens: list[int]) -> bool:
    fresh = DynamicCache()
    model.model(input_ids=torch.tensor([tokens]), cache=fresh)
    return all(
        torch.allclose(a.keys, b.keys, atol=1e-4) and torch.allclose(a.values, b.values, atol=1e-4)
        for a, b in zip(cache.layers, fresh.layers, strict=True)
    )


@torch.inference_mode()
def test_target_cache_rolls_back_exactly(tiny_target: LoadedModel) -> None:
    prompt = tiny_target.tokenizer.encode("a b c d e")
    seq = _Sequence(tokens=list(prompt), prompt_length=len(prompt), cache=DynamicCache())
    params = SamplingParams()
    seq.tokens.append(prefill(tiny_target, seq, params, None))
    stats = RequestStats(gamma=4, mode="speculative")
    wrong = [t for t in range(1, 6)]  # almost certainly rejected early
    for _ in range(5):
        emitted, drafted = speculative_step(tiny_target, ScriptedDrafter(wrong), seq, 4, params, None, stats)
        assert drafted == 4
        seq.tokens.extend(emitted)
        # The cache holds every token but the last, exactly as a fresh pass would compute it.
        assert seq.cache.get_seq_length() == len(seq.tokens) - 1
        assert cache_matches_recomputation(tiny_target, seq.cache, seq.tokens[:-1])


@torch.inference_mode()
def test_draft_cache_rolls_back_exactly(tiny_target: LoadedModel, near_draft: LoadedModel) -> None:
    drafter = ModelDrafter(near_draft, tiny_target.vocab_size)
    prompt = tiny_target.tokenizer.encode("c a b f")
    seq = _Sequence(tokens=list(prompt), prompt_length=len(prompt), cache=DynamicCache())
    drafter.begin(prompt)
    params = SamplingParams()
    seq.tokens.append(prefill(tiny_target, seq, params, None))
    stats = RequestStats(gamma=3, mode="speculative")
    for _ in range(8):
        emitted, drafted = speculative_step(tiny_target, drafter, seq, 3, params, None, stats)
        stats.step(drafted, len(emitted) - 1, len(emitted), stopped_mid_step=False)
        seq.tokens.extend(emitted)
        cached = drafter._cache.get_seq_length()
        assert cached == drafter._cached <= len(seq.tokens) - 1
        assert cache_matches_recomputation(near_draft, drafter._cache, seq.tokens[:cached])
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # both branches were exercised


def test_max_new_tokens_is_exact(tiny_target: LoadedModel, near_draft: LoadedModel) -> None:
    no_eos = tiny_model(seed=1, name="no-eos", eos_token_id=None)
    decoder = SpeculativeDecoder(no_eos, ModelDrafter(near_draft, no_eos.vocab_size), gamma=8)
    for limit in (1, 2, 5, 9, 17):
        result = decoder.generate("a b c", max_new_tokens=limit)
        assert len(result.token_ids) == limit
        assert result.record.finish_reason == "length"
        assert result.record.output_tokens == limit


def test_end_of_sequence_stops_and_is_never_passed(tiny_target: LoadedModel) -> None:
    plain = SpeculativeDecoder(tiny_target, None).generate("a b c", max_new_tokens=30)
    # Pretend the token at position 6 ends sequences: generation must stop right after it.
    eos = plain.token_ids[6]
    model = tiny_model(seed=1, name="eos-at-6", eos_token_id=eos)
    drafter = NgramDrafter(min_n=1, max_n=2)
    for mode in ("plain", "speculative"):
        result = SpeculativeDecoder(model, drafter, gamma=6).generate("a b c", max_new_tokens=30, mode=mode)
        first = plain.token_ids.index(eos)
        assert result.token_ids == plain.token_ids[: first + 1]
        assert result.record.finish_reason == "stop"


def test_stop_string_cuts_text_and_tokens(tiny_target: LoadedModel, near_draft: LoadedModel) -> None:
    reference = SpeculativeDecoder(tiny_target, None).generate("b d f", max_new_tokens=30)
    words = reference.text.split(" ")
    stop = " ".join(words[8:10])
    cut = reference.text.index(stop)
    for drafter in (None, ModelDrafter(near_draft, tiny_target.vocab_size), NgramDrafter()):
        decoder = SpeculativeDecoder(tiny_target, drafter, gamma=5)
        result = decoder.generate("b d f", max_new_tokens=30, stop=[stop])
        assert result.text == reference.text[:cut]
        assert result.record.finish_reason == "stop"
        # Token ids end with the token that completes the stop string, and no later one.
        completes = next(k for k in range(1, 31) if stop in tiny_target.tokenizer.decode(reference.token_ids[:k]))
        assert result.token_ids == reference.token_ids[:completes]
        streamed = list(decoder.stream("b d f", max_new_tokens=30, stop=[stop]))
        assert "".join(p for p in streamed if isinstance(p, str)) == reference.text[:cut]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_record_invariants(tiny_target: LoadedModel, near_draft: LoadedModel, temperature: float) -> None:
    rng = torch.Generator().manual_seed(3)
    for gamma in (1, 2, 4, 7):
        for drafter in (ModelDrafter(near_draft, tiny_target.vocab_size), NgramDrafter()):
            decoder = SpeculativeDecoder(tiny_target, drafter, gamma=gamma)
            for seed in range(4):
                prompt = random_prompt(rng, 8)
                record = decoder.generate(
                    prompt, max_new_tokens=25, temperature=temperature, seed=seed, stop=["e f"]
                ).record
                assert record.num_accepted_tokens <= record.num_draft_tokens
                assert sum(record.accepted_per_position) == record.num_accepted_tokens
                assert sum(record.acceptance_histogram) == record.num_spec_steps
                assert len(record.acceptance_histogram) == gamma + 1
                assert record.output_tokens == (
                    1 + record.num_accepted_tokens + record.num_spec_steps - int(record.stopped_mid_step)
                )
                positions = record.accepted_per_position
                assert all(a >= b for a, b in itertools.pairwise(positions))
                assert record.num_speculative_tokens == gamma
                assert record.ttft_ms is not None and record.latency_ms is not None
                assert record.ttft_ms <= record.latency_ms


def test_drafts_accepted_past_a_stop_count_as_drafted_not_accepted() -> None:
    plain = SpeculativeDecoder(tiny_model(seed=1, eos_token_id=None), None).generate("a b c", max_new_tokens=12)
    eos = plain.token_ids[3]
    first = plain.token_ids.index(eos)
    target = tiny_model(seed=1, name="eos-early", eos_token_id=eos)
    # The target as its own draft accepts everything, so the stop falls inside the first step.
    decoder = SpeculativeDecoder(target, ModelDrafter(target, target.vocab_size), gamma=8)
    record = decoder.generate("a b c", max_new_tokens=12).record
    assert record.output_tokens == first + 1
    assert record.num_spec_steps == 1 and record.num_draft_tokens == 8
    assert record.num_accepted_tokens == first  # drafts after the stop are not counted as accepted
    assert record.stopped_mid_step
    assert record.acceptance_histogram[first] == 1


def test_every_request_reaches_the_sink_failures_included(tiny_target: LoadedModel) -> None:
    received = []
    decoder = SpeculativeDecoder(tiny_target, NgramDrafter(), sink=received.append)
    decoder.generate("a b", max_new_tokens=4, workload="code")

    class Exploding(NgramDrafter):
        def propose(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise RuntimeError("drafter broke")

    failing = SpeculativeDecoder(tiny_target, Exploding(), sink=received.append)
    with pytest.raises(RuntimeError, match="drafter broke"):
        failing.generate("a b", max_new_tokens=4, workload="chat")
    assert [r.workload for r in received] == ["code", "chat"]
    assert received[1].finish_reason == "error" and "drafter broke" in (received[1].error or "")

    def broken_sink(record: object) -> None:
        raise OSError("disk full")

    # A sink that fails never fails the request.
    assert SpeculativeDecoder(tiny_target, None, sink=broken_sink).generate("a", max_new_tokens=2).token_ids


def test_the_draft_models_prompt_reading_is_decode_time_not_ttft(tiny_target: LoadedModel) -> None:
    """Plain decoding shares the target's prompt reading, not the drafter's: TTFT holds only the former."""

    class SlowReader(NgramDrafter):
        def begin(self, prompt_ids: Sequence[int]) -> None:
            time.sleep(0.3)
            super().begin(prompt_ids)

    record = (
        SpeculativeDecoder(tiny_target, SlowReader(), gamma=2)
        .generate("a b c a b c", max_new_tokens=8, mode="speculative")
        .record
    )
    assert record.ttft_ms is not None and record.latency_ms is not None and record.draft_ms is not None
    assert record.ttft_ms < 300 <= record.latency_ms - record.ttft_ms
    assert record.draft_ms >= 300  # still charged to the drafter
