"""How much a quantized model departs from its float original: next-token agreement and perplexity.

Agreement is measured teacher-forced: the float model decodes each prompt greedily, then both
models score that same sequence in one pass each, and a position agrees when both put their
argmax on the same token. That is the question greedy decoding asks at every step, without one
early disagreement sending the two continuations apart. Perplexity is taken on the prompts' own
tokens (text a person wrote), for both models.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from decoder.models.loading import LoadedModel


@dataclass(slots=True)
class Agreement:
    """Next-token agreement and prompt perplexity of a candidate model against a reference."""

    positions: int = 0  # continuation positions compared
    agreed: int = 0
    reference_nll: float = 0.0  # summed over prompt tokens
    candidate_nll: float = 0.0
    prompt_tokens: int = 0

    @property
    def rate(self) -> float:
        return self.agreed / self.positions if self.positions else math.nan

    @property
    def reference_perplexity(self) -> float:
        return math.exp(self.reference_nll / self.prompt_tokens) if self.prompt_tokens else math.nan

    @property
    def candidate_perplexity(self) -> float:
        return math.exp(self.candidate_nll / self.prompt_tokens) if self.prompt_tokens else math.nan

    def add(self, other: Agreement) -> None:
        self.positions += other.positions
        self.agreed += other.agreed
        self.reference_nll += other.reference_nll
        self.candidate_nll += other.candidate_nll
        self.prompt_tokens += other.prompt_tokens


def chat_prompt_ids(model: LoadedModel, prompt: str) -> list[int]:
    """The token ids of ``prompt`` as a user message in the model's chat template (or raw, without one)."""
    tokenizer = model.tokenizer
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer.encode(prompt))


def _logits(model: LoadedModel, ids: Sequence[int]) -> torch.Tensor:
    """One pass over ``ids``; float logits (len(ids), V)."""
    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=model.device)  # (1, n)
    return model.model(input_ids=input_ids, use_cache=False).logits[0].float().cpu()  # type: ignore[no-any-return]


def _greedy(model: LoadedModel, ids: list[int], new_tokens: int) -> list[int]:
    input_ids = torch.tensor([ids], dtype=torch.long, device=model.device)  # (1, n)
    out = model.model.generate(input_ids, max_new_tokens=new_tokens, do_sample=False)
    return list(out[0].tolist())


def agreement(
    reference: LoadedModel, candidate: LoadedModel, prompts: Sequence[str], new_tokens: int = 32, progress: bool = True
) -> Agreement:
    """Teacher-forced next-token agreement of ``candidate`` with ``reference`` on ``prompts`` (chat template)."""
    total = Agreement()
    label = f"agreement {candidate.version} with {reference.version}"
    with torch.inference_mode():
        for prompt in tqdm(prompts, desc=label, unit="prompt", disable=not progress):
            ids = chat_prompt_ids(reference, prompt)
            sequence = _greedy(reference, ids, new_tokens)  # prompt + up to new_tokens
            ref, cand = _logits(reference, sequence), _logits(candidate, sequence)  # (n, V) each
            width = min(ref.shape[1], cand.shape[1])
            ref, cand = ref[:, :width], cand[:, :width]
            start = len(ids) - 1  # the logits at position i predict token i + 1
            span = slice(start, len(sequence) - 1)
            total.positions += span.stop - span.start
            total.agreed += int((ref[span].argmax(-1) == cand[span].argmax(-1)).sum())
            targets = torch.tensor(sequence[1 : len(ids)])  # prompt tokens after the first
            total.reference_nll += float(torch.nn.functional.cross_entropy(ref[:start], targets, reduction="sum"))
            total.candidate_nll += float(torch.nn.functional.cross_entropy(cand[:start], targets, reduction="sum"))
            total.prompt_tokens += int(targets.shape[0])
    return total
