"""Drafting with a small causal LM that shares the target's tokenizer and keeps its own KV cache."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from decoder.drafters.base import Proposal
from decoder.models.loading import LoadedModel
from decoder.sampling import SamplingParams, logits_to_probs, sample


class ModelDrafter:
    """Propose gamma tokens autoregressively with a draft model, keeping each token's q for verification.

    The cache holds the first ``cached`` tokens of the sequence. A proposal feeds the tokens the
    cache lacks (one or two: the target's last token, and the last draft when all were accepted)
    in one pass, then one token per pass; :meth:`rollback` crops the cache back to what was accepted.
    """

    kind = "model"

    def __init__(self, draft: LoadedModel, target_vocab_size: int) -> None:
        from transformers import DynamicCache

        self.draft = draft
        self.name: str | None = draft.name
        self.version: str | None = draft.version
        self.target_vocab_size = target_vocab_size
        self._cache_class = DynamicCache
        self._cache = DynamicCache()
        self._cached = 0

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Read the prompt now, so that its cost is timed apart from the steps' (it does not grow with them)."""
        self._cache = self._cache_class()
        self._cached = 0
        if prompt_ids:
            with torch.inference_mode():
                self._forward(torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.draft.device))

    def propose(
        self,
        tokens: Sequence[int],
        gamma: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Proposal:
        device = self.draft.device
        pending = torch.tensor([list(tokens[self._cached :])], dtype=torch.long, device=device)  # (1, n)
        drafted: list[int] = []
        draft_probs: list[torch.Tensor] = []
        for _ in range(gamma):
            logits = self._forward(pending)  # (V_draft,)
            if params.greedy:
                token = int(torch.argmax(logits[: self.target_vocab_size]).item())
            else:
                q = self._align(logits_to_probs(logits, params))  # (V_target,)
                token = sample(q, generator)
                draft_probs.append(q)
            drafted.append(token)
            pending = torch.tensor([[token]], dtype=torch.long, device=device)
        return Proposal(
            tokens=torch.tensor(drafted, dtype=torch.long),
            probs=torch.stack(draft_probs) if draft_probs else None,
        )

    def rollback(self, num_valid: int) -> None:
        if self._cached > num_valid:
            self._cache.crop(num_valid - self._cached)
            self._cached = num_valid

    def _forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Run the draft over ``input_ids`` (1, n) with the cache; return the last position's logits (V,)."""
        output = self.draft.model(input_ids=input_ids, cache=self._cache, use_cache=True,
                                  logits_to_keep=1)  # fmt: skip
        self._cached += input_ids.shape[1]
        return output.logits[0, -1].float().cpu()  # type: ignore[no-any-return]

    def _align(self, q: torch.Tensor) -> torch.Tensor:
        """Put q on the target's vocabulary: padded embeddings may make the two widths differ."""
        width = q.shape[0]
        if width == self.target_vocab_size:
            return q
        if width > self.target_vocab_size:
            q = q[: self.target_vocab_size]
            return q / q.sum()
        return torch.nn.functional.pad(q, (0, self.target_vocab_size - width))
