"""Row-invariant eager attention for the CPU: a verification pass computes each row as a one-token pass would.

Greedy speculative decoding is lossless only if the target's logits for a token do not depend on
how many tokens shared its forward pass. Linear layers keep that on a CPU (the quantized kernels
too: tests/decoder/test_quantize.py), but attention does not: in a pass over k + 1 new tokens,
row i multiplies against all past + k + 1 keys (the later ones masked), where the one-token pass
multiplies against exactly past + i + 1; the BLAS kernels and the softmax reduce those different
lengths in different orders, and in bfloat16 a near-tie then flips (seen on smollm2-135m at a few
cache lengths, with and without quantization). So when a pass carries several new tokens on top
of a cache, each row is computed separately over exactly its own keys, by the same code a
one-token pass runs. A prompt's prefill (no cache) is one call: both decoding modes share it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

NAME = "draftwatch_rowwise"


def _eager(
    module: nn.Module,
    query: torch.Tensor,  # (B, H, q, d)
    key: torch.Tensor,  # (B, H_kv, kv, d)
    value: torch.Tensor,  # (B, H_kv, kv, d)
    attention_mask: torch.Tensor | None,  # (B, 1, q, kv) additive, or None
    scaling: float,
) -> torch.Tensor:
    """transformers' eager attention (llama/qwen2), output (B, q, H, d)."""
    groups = int(getattr(module, "num_key_value_groups", 1))
    batch, heads_kv, length, dim = key.shape
    if groups > 1:  # (B, H_kv, kv, d) -> (B, H, kv, d), as transformers' repeat_kv does
        key = key[:, :, None].expand(batch, heads_kv, groups, length, dim).reshape(batch, -1, length, dim)
        value = value[:, :, None].expand(batch, heads_kv, groups, length, dim).reshape(batch, -1, length, dim)
    # Contiguous either way, so that a sliced cache and a whole one reach the kernels in the same layout.
    key, value = key.contiguous(), value.contiguous()
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, H, q, kv)
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value).transpose(1, 2).contiguous()  # (B, q, H, d)


def rowwise_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The attention function transformers calls per layer; returns (output (B, q, H, d), no weights)."""
    scale = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
    rows, length = query.shape[2], key.shape[2]
    if rows == 1 or rows == length:
        return _eager(module, query, key, value, attention_mask, scale), None
    past = length - rows
    outputs = []
    for i in range(rows):
        end = past + i + 1  # row i sees the cache and the new tokens up to itself, as its one-token pass would
        mask = attention_mask[:, :, i : i + 1, :end] if attention_mask is not None else None
        outputs.append(_eager(module, query[:, :, i : i + 1], key[:, :, :end], value[:, :, :end], mask, scale))
    return torch.cat(outputs, dim=1), None


def register() -> str:
    """Make ``NAME`` an attention implementation transformers accepts (with eager's additive masks)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, rowwise_attention)
    AttentionMaskInterface.register(NAME, eager_mask)
    return NAME
