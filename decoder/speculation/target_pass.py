"""One forward pass of the target over new tokens with its KV cache: the unit every step and measurement times."""

from __future__ import annotations

from typing import Any

import torch


def target_logits(model: Any, input_ids: torch.Tensor, cache: Any, keep: int) -> torch.Tensor:
    """One target pass over ``input_ids`` (1, n) with the cache; the logits of the last ``keep`` positions (keep, V)."""
    output = model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=keep)
    return output.logits[0, -keep:].float().cpu()  # type: ignore[no-any-return]
