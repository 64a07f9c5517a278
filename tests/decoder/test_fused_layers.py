"""decoder/kernels/cpu_layers.cpp: the fused RMSNorm and one-row attention against PyTorch's own arithmetic.

Tolerances: the norm rounds where transformers rounds, so it differs only where the sum of squares,
summed in another order, moves a value across a bfloat16 rounding boundary (at most one step of
bfloat16, 2^-8 relative); attention sums in float32 in its own order: within 1e-5 in float32 and
one bfloat16 step in bfloat16.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from decoder.cpu.attention import rowwise_attention
from decoder.cpu.fused_norms import FusedRMSNorm, fuse_norms
from decoder.cpu.kernels import _cpu_has_avx2_fma, cpu_kernels

pytestmark = pytest.mark.skipif(not _cpu_has_avx2_fma(), reason="the kernels need an x86-64 CPU with AVX2 and FMA")


def reference_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                        scale: float) -> torch.Tensor:  # fmt: skip
    """(B, H, 1, d) against (B, H_kv, L, d) in float32 -> (B, 1, H, d) float32."""
    groups = query.shape[1] // key.shape[1]
    k = key.float().repeat_interleave(groups, dim=1)
    v = value.float().repeat_interleave(groups, dim=1)
    weights = query.float() @ k.transpose(2, 3) * scale  # (B, H, 1, L)
    if mask is not None:
        weights = weights + mask.float()
    return (weights.softmax(dim=-1) @ v).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rms_norm_matches_transformers_and_keeps_rows_independent(dtype: torch.dtype) -> None:
    kernels = cpu_kernels()
    assert kernels is not None
    generator = torch.Generator().manual_seed(3)
    norm = Qwen2RMSNorm(1536, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(1536, generator=generator) + 0.5)
    norm = norm.to(dtype)
    x = (torch.randn(2, 7, 1536, generator=generator) * 4).to(dtype)  # (batch, rows, hidden)
    got = kernels.rms_norm(x, norm.weight, norm.variance_epsilon)
    want = norm(x)
    assert got.dtype == dtype and got.shape == x.shape
    step = 2.0**-7 if dtype == torch.bfloat16 else 1e-6  # relative
    assert torch.allclose(got.float(), want.float(), rtol=step, atol=0)
    assert torch.equal(torch.cat([kernels.rms_norm(x[:, i : i + 1], norm.weight, 1e-6) for i in range(7)], 1), got)


def test_fuse_norms_swaps_only_the_known_formula() -> None:
    kernels = cpu_kernels()
    assert kernels is not None

    class GemmaLikeRMSNorm(torch.nn.Module):  # scales by 1 + weight: must not be swapped
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(64))
            self.variance_epsilon = 1e-6

    model = torch.nn.ModuleDict(
        {"qwen": Qwen2RMSNorm(64), "llama": LlamaRMSNorm(64), "gemma": GemmaLikeRMSNorm(), "odd": Qwen2RMSNorm(60)}
    )
    assert fuse_norms(model, kernels) == 2
    assert isinstance(model["qwen"], FusedRMSNorm) and isinstance(model["llama"], FusedRMSNorm)
    assert isinstance(model["gemma"], GemmaLikeRMSNorm) and isinstance(model["odd"], Qwen2RMSNorm)
    x = torch.randn(3, 64)
    assert torch.allclose(model["qwen"](x), LlamaRMSNorm(64)(x), rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_mask", [False, True])
def test_attend_one_row_matches_float32_attention(dtype: torch.dtype, with_mask: bool) -> None:
    kernels = cpu_kernels()
    assert kernels is not None
    generator = torch.Generator().manual_seed(5)
    query = torch.randn(2, 12, 1, 64, generator=generator).to(dtype)  # (B, H, 1, d), 6 query heads per key head
    cache = torch.randn(2, 2, 40, 64, generator=generator).to(dtype)  # (B, H_kv, L, d)
    key, value = cache, torch.randn(2, 2, 40, 64, generator=generator).to(dtype)
    mask = None
    if with_mask:  # the last 5 positions hidden, as a padded batch would
        mask = torch.zeros(2, 1, 1, 40, dtype=dtype)
        mask[..., 35:] = torch.finfo(dtype).min
    scale = 1 / math.sqrt(64)
    got = kernels.attend_one_row(query, key, value, mask, scale)  # (B, 1, H, d)
    want = reference_attention(query, key, value, mask, scale)
    assert got.dtype == dtype and got.shape == (2, 1, 12, 64)
    tolerance = 2.0**-7 if dtype == torch.bfloat16 else 1e-5
    assert torch.allclose(got.float(), want, rtol=tolerance, atol=tolerance)
    # a verification row reads a prefix of the cache: a narrowed, non-contiguous view
    key_prefix, value_prefix = key[:, :, :17], value[:, :, :17]
    prefix = kernels.attend_one_row(query, key_prefix, value_prefix, None, scale)
    assert torch.equal(prefix, kernels.attend_one_row(query, key_prefix.clone(), value_prefix.clone(), None, scale))
    want_prefix = reference_attention(query, key_prefix, value_prefix, None, scale)
    assert torch.allclose(prefix.float(), want_prefix, rtol=tolerance, atol=tolerance)


def test_fused_kernels_refuse_bad_input_with_a_message() -> None:
    kernels = cpu_kernels()
    assert kernels is not None
    with pytest.raises(RuntimeError, match="multiple of 8"):
        kernels.rms_norm(torch.randn(2, 12), torch.ones(12), 1e-6)
    with pytest.raises(RuntimeError, match="same dtype"):
        kernels.rms_norm(torch.randn(2, 16), torch.ones(16, dtype=torch.bfloat16), 1e-6)
    with pytest.raises(RuntimeError, match="query must be"):
        kernels.attend_one_row(torch.randn(1, 4, 2, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), None, 1.0)
    with pytest.raises(RuntimeError, match="H a multiple of H_kv"):
        kernels.attend_one_row(torch.randn(1, 3, 1, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), None, 1.0)


def test_rowwise_attention_runs_each_row_through_the_fused_kernel() -> None:
    # A verification pass over 3 new tokens must give each row what its own one-token pass gives.
    kernels = cpu_kernels()
    assert kernels is not None
    generator = torch.Generator().manual_seed(9)
    query = torch.randn(1, 4, 3, 32, generator=generator).to(torch.bfloat16)  # (B, H, 3 new rows, d)
    key = torch.randn(1, 2, 10, 32, generator=generator).to(torch.bfloat16)  # 7 cached + 3 new
    value = torch.randn(1, 2, 10, 32, generator=generator).to(torch.bfloat16)
    block, _ = rowwise_attention(torch.nn.Module(), query, key, value, None, 0.5)  # (B, 3, H, d)
    for i in range(3):
        alone = kernels.attend_one_row(query[:, :, i : i + 1], key[:, :, : 8 + i], value[:, :, : 8 + i], None, 0.5)
        assert torch.equal(block[:, i : i + 1], alone), i


def test_a_prompt_attends_causally_with_grouped_queries() -> None:
    # A prefill (no cache) is one fused call: row i sees keys 0..i only, query head h reads key head
    # h // (H / H_kv), as the float32 reference computes it row by row.
    generator = torch.Generator().manual_seed(11)
    query = torch.randn(1, 6, 9, 32, generator=generator).to(torch.bfloat16)  # (B, H, 9 prompt rows, d)
    key = torch.randn(1, 2, 9, 32, generator=generator).to(torch.bfloat16)
    value = torch.randn(1, 2, 9, 32, generator=generator).to(torch.bfloat16)
    got, _ = rowwise_attention(torch.nn.Module(), query, key, value, None, 0.3)  # (B, 9, H, d)
    assert got.shape == (1, 9, 6, 32) and got.dtype == torch.bfloat16
    for i in range(9):
        want = reference_attention(query[:, :, i : i + 1], key[:, :, : i + 1], value[:, :, : i + 1], None, 0.3)
        assert torch.allclose(got[:, i : i + 1].float(), want, atol=2e-2, rtol=0), i
