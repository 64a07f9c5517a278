"""Greedy speculative decoding must emit exactly the target's own greedy tokens, whatever the drafter."""

from __future__ import annotations

import pytest
import torch

from decoder import LoadedModel, ModelDrafter, NgramDrafter, SpeculativeDecoder
from tests.decoder.tiny import random_prompt


def hf_greedy(model: LoadedModel, prompt: str, max_new_tokens: int) -> list[int]:
    ids = torch.tensor([model.tokenizer.encode(prompt)])
    out = model.model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("gamma", range(1, 9))
def test_model_drafter_matches_plain_greedy(tiny_target: LoadedModel, near_draft: LoadedModel, gamma: int) -> None:
    decoder = SpeculativeDecoder(tiny_target, ModelDrafter(near_draft, tiny_target.vocab_size), gamma=gamma)
    rng = torch.Generator().manual_seed(gamma)
    accepted_total = 0
    for _ in range(6):
        prompt = random_prompt(rng, length=int(torch.randint(1, 12, (1,), generator=rng)))
        plain = decoder.generate(prompt, max_new_tokens=30, mode="plain")
        speculative = decoder.generate(prompt, max_new_tokens=30)
        assert speculative.token_ids == plain.token_ids, prompt
        assert speculative.text == plain.text
        accepted_total += speculative.record.num_accepted_tokens
    # The comparison only means something if drafts were both accepted and rejected.
    assert accepted_total > 0


def test_plain_mode_matches_transformers_generate(tiny_target: LoadedModel) -> None:
    decoder = SpeculativeDecoder(tiny_target, None)
    rng = torch.Generator().manual_seed(11)
    for _ in range(5):
        prompt = random_prompt(rng, length=6)
        expected = hf_greedy(tiny_target, prompt, 25)
        assert decoder.generate(prompt, max_new_tokens=25).token_ids == expected


@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_ngram_drafter_matches_plain_greedy(tiny_target: LoadedModel, gamma: int) -> None:
    decoder = SpeculativeDecoder(tiny_target, NgramDrafter(min_n=1, max_n=3), gamma=gamma)
    rng = torch.Generator().manual_seed(100 + gamma)
    for _ in range(6):
        prompt = random_prompt(rng, length=10)
        prompt = f"{prompt} {prompt}"  # repetition gives the n-gram drafter something to find
        plain = decoder.generate(prompt, max_new_tokens=30, mode="plain")
        speculative = decoder.generate(prompt, max_new_tokens=30)
        assert speculative.token_ids == plain.token_ids


def test_disagreeing_draft_is_still_lossless(tiny_target: LoadedModel, tiny_draft: LoadedModel) -> None:
    decoder = SpeculativeDecoder(tiny_target, ModelDrafter(tiny_draft, tiny_target.vocab_size), gamma=5)
    result = decoder.generate("a b c", max_new_tokens=40)
    assert result.token_ids == decoder.generate("a b c", max_new_tokens=40, mode="plain").token_ids
    assert result.record.acceptance_rate is not None and result.record.acceptance_rate < 0.5
