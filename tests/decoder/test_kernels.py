"""draftwatch's own CPU kernels (decoder/cpu/kernels/): close to a float reference, rows independent of M.

Tolerances, against the de-quantized weights (relative Frobenius error):

* both round each activation row to int16 (step max|x| / 32767, about 4e-5 relative for
  Gaussian rows) and sum exactly in int32, then in float32: <= 2e-4.
"""

from __future__ import annotations

import pytest
import torch

from decoder.cpu.kernels import _cpu_has_avx2_fma, cpu_kernels
from decoder.cpu.quantize import Int4Linear, Int8Linear, int4_dequantized, int4_packing, int8_dequantized, int8_qparams

needs_kernel = pytest.mark.skipif(not _cpu_has_avx2_fma(), reason="the kernel needs an x86-64 CPU with AVX2 and FMA")


@needs_kernel
def test_kernel_builds_where_the_cpu_can_run_it() -> None:
    assert cpu_kernels() is not None, "g++ and ninja are installed by `make setup`; see the log for the build error"


@needs_kernel
@pytest.mark.parametrize(("out_features", "in_features"), [(37, 32), (130, 96), (1000, 1536), (24, 4160)])
def test_int8_kernel_against_reference_and_row_independent(out_features: int, in_features: int) -> None:
    kernels = cpu_kernels()
    assert kernels is not None
    generator = torch.Generator().manual_seed(out_features)
    weight = torch.randn(out_features, in_features, generator=generator) * 0.05
    q, scales = int8_qparams(weight)
    x = torch.randn(11, in_features, generator=generator)  # (11 rows, in): float32, the kernel's own error shows
    got = kernels.int8_linear(x, q, scales)  # (11, out) float32
    want = x @ int8_dequantized(weight).T
    assert float((got - want).norm() / want.norm()) <= 2e-4
    # Rows fall into blocks of 4 plus a remainder; whatever block a row lands in, it is bit-identical
    # to the same row computed alone or in any other pass (what keeps verification lossless).
    alone = torch.cat([kernels.int8_linear(x[i : i + 1], q, scales) for i in range(11)])
    assert torch.equal(alone, got)
    for rows in range(2, 11):
        assert torch.equal(kernels.int8_linear(x[:rows], q, scales), got[:rows]), rows
        assert torch.equal(kernels.int8_linear(x[11 - rows :], q, scales), got[11 - rows :]), rows


@needs_kernel
def test_int8_layer_adds_its_bias_and_rounds_once_in_the_kernel() -> None:
    """A bfloat16 layer: the float32 path's arithmetic, bias included, rounded to bfloat16 once."""
    kernels = cpu_kernels()
    assert kernels is not None
    linear = torch.nn.Linear(64, 48, bias=True).to(torch.bfloat16).requires_grad_(False)
    layer = Int8Linear.from_float(linear)
    x = torch.randn(2, 3, 64).to(torch.bfloat16)  # (batch, rows, in)
    got = layer(x)
    assert got.dtype == torch.bfloat16 and got.shape == (2, 3, 48)
    as_float = kernels.int8_linear(x.reshape(6, 64).float(), layer.weight_q, layer.scales.float())
    assert torch.equal(got.reshape(6, 48), (as_float + layer.bias.float()).to(torch.bfloat16))
    with pytest.raises(RuntimeError, match="bias must have out_features"):
        kernels.int8_linear(x.reshape(6, 64), layer.weight_q, layer.scales.float(), torch.zeros(5))


@needs_kernel
def test_int8_kernel_refuses_bad_shapes_with_a_message() -> None:
    kernels = cpu_kernels()
    assert kernels is not None
    q, scales = int8_qparams(torch.randn(8, 32))
    with pytest.raises(RuntimeError, match="q must be"):
        kernels.int8_linear(torch.randn(2, 16), q, scales)  # in_features 16 against weights of 32
    with pytest.raises(RuntimeError, match="multiple of 32"):
        kernels.int8_linear(torch.randn(2, 48), int8_qparams(torch.randn(8, 48))[0], scales)


@needs_kernel
@pytest.mark.parametrize(
    ("out_features", "in_features", "group_size"), [(37, 64, 32), (130, 256, 64), (130, 256, 128), (1000, 1536, 32)]
)
def test_int4_kernel_against_reference_and_row_independent(
    out_features: int, in_features: int, group_size: int
) -> None:
    kernels = cpu_kernels()
    assert kernels is not None
    generator = torch.Generator().manual_seed(out_features)
    weight = torch.randn(out_features, in_features, generator=generator) * 0.05
    linear = torch.nn.Linear(in_features, out_features, bias=False).requires_grad_(False)
    linear.weight.copy_(weight)
    layer = Int4Linear.from_float(linear, group_size)  # float32 activations: the kernel's own error shows
    assert layer.packing == "draftwatch"
    x = torch.randn(11, in_features, generator=generator)  # (11 rows, in)
    got = layer(x)
    want = x @ int4_dequantized(weight, group_size).T
    assert float((got - want).norm() / want.norm()) <= 2e-4
    alone = torch.cat([layer(x[i : i + 1]) for i in range(11)])
    assert torch.equal(alone, got)
    for rows in range(2, 11):
        assert torch.equal(layer(x[:rows]), got[:rows]), rows
        assert torch.equal(layer(x[11 - rows :]), got[11 - rows :]), rows


@needs_kernel
@pytest.mark.parametrize(
    ("out_features", "in_features", "group_size"), [(200, 576, 32), (136, 1536, 32), (72, 256, 64)]
)
def test_int4_kernel_over_a_prompt_gives_each_row_what_a_one_row_pass_gives(
    out_features: int, in_features: int, group_size: int
) -> None:
    """Many rows (a prefill) run in column chunks, on the AVX-512 form where the CPU has it: each
    output is still bit for bit that of the row alone and of the AVX2 form. The shapes cover a
    partial last chunk (200 columns), an unpaired last block of 64 weights (576), G = 64, and at
    1536 inputs more rows than one tile (168)."""
    kernels = cpu_kernels()
    assert kernels is not None
    generator = torch.Generator().manual_seed(in_features)
    linear = torch.nn.Linear(in_features, out_features, bias=True).requires_grad_(False)
    linear.weight.copy_(torch.randn(out_features, in_features, generator=generator) * 0.05)
    linear.bias.copy_(torch.randn(out_features, generator=generator))
    layer = Int4Linear.from_float(linear.to(torch.bfloat16), group_size)
    x = torch.randn(181, in_features, generator=generator).to(torch.bfloat16)  # (rows, in)
    got = layer(x)
    alone = torch.cat([layer(x[i : i + 1]) for i in range(181)])
    assert torch.equal(got, alone)
    args = (layer.packed, layer.scales_and_zeros, group_size, layer.bias)
    assert torch.equal(kernels.int4_linear(x, *args, isa="avx2"), got)
    want = x.float() @ int4_dequantized(linear.weight, group_size).T + linear.bias.float()
    assert float((got.float() - want).norm() / want.norm()) <= 5e-3  # bfloat16 output
    with pytest.raises(RuntimeError, match="isa must be auto or avx2"):
        kernels.int4_linear(x, *args, isa="neon")


@needs_kernel
def test_int4_kernel_in_bfloat16_matches_its_float32_path_bit_for_bit() -> None:
    # A bfloat16 model stores its scales and zeros in bfloat16 and gets bfloat16 rows back with the
    # bias added in the kernel: the same arithmetic as float32 storage and output, rounded once.
    kernels = cpu_kernels()
    assert kernels is not None
    generator = torch.Generator().manual_seed(7)
    linear = torch.nn.Linear(1536, 256, bias=True).requires_grad_(False)
    linear.weight.copy_(torch.randn(256, 1536, generator=generator) * 0.05)
    linear.bias.copy_(torch.randn(256, generator=generator))
    layer = Int4Linear.from_float(linear.to(torch.bfloat16), 32)
    assert layer.scales_and_zeros.dtype == torch.bfloat16
    x = torch.randn(2, 5, 1536, generator=generator).to(torch.bfloat16)  # (batch, rows, in)
    got = layer(x)  # (2, 5, 256) bfloat16
    assert got.dtype == torch.bfloat16 and got.shape == (2, 5, 256)
    as_float = kernels.int4_linear(x.reshape(10, 1536).float(), layer.packed, layer.scales_and_zeros.float(), 32)
    assert torch.equal(got.reshape(10, 256), (as_float + layer.bias.float()).to(torch.bfloat16))
    assert torch.equal(torch.cat([layer(x[:, i : i + 1]) for i in range(5)], dim=1), got)


@needs_kernel
def test_int4_packing_follows_the_device_and_shape() -> None:
    assert int4_packing(torch.device("cpu"), 1536) == "draftwatch"
    assert int4_packing(torch.device("cpu"), 32) == "tinygemm"  # the kernel reads 64 weights at a time
    assert int4_packing(torch.device("cuda"), 1536) == "tinygemm"  # PyTorch's tinygemm there (not run here)


@needs_kernel
def test_int4_kernel_refuses_bad_shapes_with_a_message() -> None:
    kernels = cpu_kernels()
    assert kernels is not None
    packed, offsets = torch.zeros(8, 32, dtype=torch.uint8), torch.zeros(8, 2, 2)  # (N, K / 2), (N, 2, K / G)
    with pytest.raises(RuntimeError, match="group size must be 32 or a multiple of 64"):
        kernels.int4_linear(torch.randn(1, 64), packed, offsets, 48)
    with pytest.raises(RuntimeError, match="sz must be"):
        kernels.int4_linear(torch.randn(1, 64), packed, offsets.to(torch.float16), 32)
    with pytest.raises(RuntimeError, match="bias must have out_features"):
        kernels.int4_linear(torch.randn(1, 64), packed, torch.zeros(8, 2, 2), 32, torch.zeros(5))
