"""Row-invariant eager attention: a verification pass computes each row as a one-token pass would.

Greedy speculative decoding is lossless only if the target's logits for a token do not depend on
how many tokens shared its forward pass. The quantized linear kernels keep that on a CPU
(tests/decoder/test_quantize.py), float ones do once padded (decoder/cpu/row_stable.py), but
attention does not: in a pass over k + 1 new tokens,
row i multiplies against all past + k + 1 keys (the later ones masked), where the one-token pass
multiplies against exactly past + i + 1; the BLAS kernels and the softmax reduce those different
lengths in different orders, and in bfloat16 a near-tie then flips (seen on smollm2-135m at a few
cache lengths, with and without quantization; on CUDA, SDPA changed 2 to 3 of 6 random-model
continuations in benchmarks/gpu_decoding.py, this attention none). So when a pass carries several new tokens on top
of a cache, each row is computed separately over exactly its own keys, by the same code a
one-token pass runs. A prompt's prefill (no cache) is one fused call: both decoding modes share it.
On a CPU with decoder/kernels, a single row is one call to ``attend_one_row`` (cpu_layers.cpp)
instead of about fifteen PyTorch operations.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from decoder.cpu.kernels import kernels_for

NAME = "draftwatch_rowwise"


def _eager(
    module: nn.Module,
    query: torch.Tensor,  # (B, H, q, d)
    key: torch.Tensor,  # (B, H_kv, kv, d)
    value: torch.Tensor,  # (B, H_kv, kv, d)
    attention_mask: torch.Tensor | None,  # (B, 1, q, kv) additive, or None
    scaling: float,
) -> torch.Tensor:
    """Eager attention in float32 with grouped queries; output (B, q, H, d) in the query's dtype.

    Why not transformers' eager function: it copies every key and value head ``H / H_kv`` times
    per layer and step (repeat_kv) and multiplies in bfloat16, which this CPU has no native
    arithmetic for; together that was a quarter of a Qwen decode step. Here the query heads that
    share a key head are stacked as rows against that one key head, in float32.
    """
    batch, heads, rows, dim = query.shape
    kernels = kernels_for(query.device)
    mask_fits = attention_mask is None or attention_mask.shape[-1] == key.shape[2]
    fits = query.dtype in (torch.bfloat16, torch.float32) and dim % 8 == 0 and mask_fits
    if kernels is not None and rows == 1 and fits:  # one call instead of about fifteen PyTorch operations
        return kernels.attend_one_row(query, key, value, attention_mask, scaling)  # type: ignore[no-any-return]
    heads_kv, length = key.shape[1], key.shape[2]
    groups = heads // heads_kv  # query heads h * groups .. (h + 1) * groups - 1 read key head h
    q = query.float().reshape(batch, heads_kv, groups * rows, dim)
    weights = torch.matmul(q, key.float().transpose(2, 3)) * scaling  # (B, H_kv, groups * q, kv)
    if attention_mask is not None:
        weights = (weights.view(batch, heads_kv, groups, rows, length) + attention_mask[:, :, None]).view(
            batch, heads_kv, groups * rows, length
        )
    weights = nn.functional.softmax(weights, dim=-1)
    out = torch.matmul(weights, value.float())  # (B, H_kv, groups * q, d)
    return out.view(batch, heads, rows, dim).to(query.dtype).transpose(1, 2).contiguous()  # (B, q, H, d)


def _prefill(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float) -> torch.Tensor:
    """A whole prompt of one sequence, causal: PyTorch's fused attention, output (1, q, H, d).

    The eager form materialises every (query, key) weight in float32: 0.8 GB a layer at 4,000
    tokens, and a sixth of a 1,000-token prefill's time. The fused kernel works in tiles and
    never builds the causal mask; the prefill is the same call in both decoding modes, so it
    need not be row-invariant.
    """
    out = nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous()


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
    if rows == length and rows > 1 and query.shape[0] == 1:
        return _prefill(query, key, value, scale), None
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
