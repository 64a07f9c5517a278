"""Weight-only quantization of a model's linear layers: int8 per output channel, or int4 in groups.

Decoding one token reads every weight once, so at batch size one a CPU decodes about as fast as
its memory hands over the weights: 4-bit weights are read four times faster than bfloat16 ones.
Activations stay in the model's dtype (bfloat16 here); only the stored weights shrink, and
PyTorch's own kernels multiply by them without materialising a float copy:

* ``int4``: asymmetric 4-bit groups of ``group_size`` weights along the input dimension, one
  (scale, zero) pair per group, the form of gpt-fast / torchao's tinygemm:
  ``w = (q - 8) * scale + zero`` with ``q`` in 0..15. CPU: draftwatch's own AVX2 kernel
  (decoder/cpu/kernels/), else ``_weight_int4pack_mm_for_cpu``; CUDA: ``_weight_int4pack_mm``
  (tinygemm), where the build has it.
* ``int8``: symmetric per-output-channel ``w = q * scale`` with ``q`` in -127..127. CPU:
  draftwatch's own AVX2 kernel (decoder/cpu/kernels/, about twice as fast at decode time), else
  ``_weight_int8pack_mm``; CUDA: ``_weight_int8pack_mm``.

Both kernels compute every output row the same way whatever the number of rows, which keeps a
verification pass over several tokens bit-identical to one-token passes (greedy speculative
output stays identical to greedy plain output of the same quantized model; the tests check it).
Layers whose shapes a kernel cannot take (tiny test models) stay in floating point.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
from torch import nn
from tqdm.auto import tqdm

from decoder.cpu.kernels import kernels_for

logger = logging.getLogger(__name__)

Quantization = Literal["none", "int8", "int4"]
QUANTIZATIONS: tuple[Quantization, ...] = ("none", "int8", "int4")
GROUP_SIZES = (32, 64, 128, 256)


class QuantizationError(RuntimeError):
    """The requested quantization cannot run here (kernel missing or wrong results on this device)."""


class QuantizedLinear(nn.Module):
    """Base of the quantized linears: what loading, counting and caching need from each."""

    kind: str
    in_features: int
    out_features: int
    bias: torch.Tensor | None

    def extra_repr(self) -> str:
        return f"{self.kind}, in_features={self.in_features}, out_features={self.out_features}"

    def _finish(self, flat: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """(rows, out) kernel output back to the input's leading shape, plus the bias."""
        out = flat.reshape(*shape[:-1], self.out_features)
        return out + self.bias if self.bias is not None else out


class Int8Linear(QuantizedLinear):
    """y = x @ (q * scale)^T + b with q (out, in) int8 and scale (out,) in the activation dtype."""

    kind = "int8"
    weight_q: torch.Tensor
    scales: torch.Tensor

    def __init__(self, weight_q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = (int(n) for n in weight_q.shape)
        self.register_buffer("weight_q", weight_q)  # (out, in) int8
        self.register_buffer("scales", scales)  # (out,) activation dtype
        self.register_buffer("bias", bias)  # (out,) or None
        # decoder/kernels' int8 kernel, decided once: it takes float32 scales (a copy of 4 bytes per row).
        self._kernels = kernels_for(weight_q.device) if self.in_features % 32 == 0 else None
        self._kernel_scales = scales.float() if self._kernels is not None else None

    @classmethod
    def from_float(cls, linear: nn.Linear) -> Int8Linear:
        weight_q, scales = int8_qparams(linear.weight.detach())
        dtype = linear.weight.dtype
        bias = linear.bias.detach().clone() if linear.bias is not None else None
        return cls(weight_q, scales.to(dtype), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (..., in) -> (..., out)
        flat = x.reshape(-1, self.in_features)
        if self._kernels is not None:  # adds the bias and rounds to x's dtype once, in the kernel
            out = self._kernels.int8_linear(flat, self.weight_q, self._kernel_scales, self.bias)
            return out.reshape(*x.shape[:-1], self.out_features)  # type: ignore[no-any-return]
        else:
            out = torch.ops.aten._weight_int8pack_mm(flat, self.weight_q, self.scales)
        return self._finish(out, x.shape)


Int4Packing = Literal["draftwatch", "tinygemm"]


class Int4Linear(QuantizedLinear):
    """y = x @ W^T + b with W stored as packed 4-bit groups and (scale, zero) per group.

    Two packings, chosen by :func:`int4_packing` for the device:

    * ``draftwatch`` (a CPU with AVX2, decoder/cpu/kernels/): ``packed`` (out, in / 2) uint8,
      ``scales_and_zeros`` (out, 2, in / g) holding each row's scales, then its zeros, in
      bfloat16 when the activations are bfloat16 (else float32, which holds any other dtype's
      values exactly);
    * ``tinygemm`` (PyTorch's kernels, CUDA or a CPU without the above): the kernel's own packing
      of q, (out, in / 2) uint8 on a CPU or an int32 tile layout on CUDA, and
      ``scales_and_zeros`` (in / g, out, 2) in the activation dtype.
    """

    kind = "int4"
    packed: torch.Tensor
    scales_and_zeros: torch.Tensor

    def __init__(
        self,
        packed: torch.Tensor,
        scales_and_zeros: torch.Tensor,
        bias: torch.Tensor | None,
        in_features: int,
        out_features: int,
        group_size: int,
        packing: Int4Packing = "tinygemm",
    ) -> None:
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.packing = packing
        self._kernels = kernels_for(packed.device) if packing == "draftwatch" else None
        if packing == "draftwatch" and self._kernels is None:
            raise QuantizationError(f"int4 weights packed for draftwatch's CPU kernel cannot run on {packed.device}")
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.register_buffer("bias", bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, group_size={self.group_size}, packing={self.packing}"

    @staticmethod
    def fits(linear: nn.Linear, group_size: int) -> bool:
        """Whether the kernels take this shape: input a multiple of the group, output of 16 (CPU packing)."""
        return linear.in_features % group_size == 0 and linear.out_features % 16 == 0

    @classmethod
    def from_float(cls, linear: nn.Linear, group_size: int) -> Int4Linear:
        out_features, in_features = linear.out_features, linear.in_features
        q, scales, zeros = int4_qparams(linear.weight.detach(), group_size)
        dtype, device = linear.weight.dtype, linear.weight.device
        bias = linear.bias.detach().clone() if linear.bias is not None else None
        scales, zeros = scales.to(dtype), zeros.to(dtype)  # the precision the kernels keep them in
        packing = int4_packing(device, in_features)
        if packing == "draftwatch":
            from decoder.cpu.kernels import pack_int4

            # bfloat16 as they are (the kernel reads them in the bytes it streams), float32 for other dtypes.
            stored = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
            scales_zeros = torch.stack([scales, zeros], dim=1).to(stored).contiguous()  # (out, 2, in / g)
            return cls(pack_int4(q), scales_zeros, bias, in_features, out_features, group_size, packing)
        scales_and_zeros = (
            torch.cat([scales.reshape(out_features, -1, 1), zeros.reshape(out_features, -1, 1)], dim=2)
            .transpose(0, 1)
            .contiguous()
        )  # (in / g, out, 2)
        return cls(_pack_int4(q.to(device)), scales_and_zeros, bias, in_features, out_features, group_size, packing)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (..., in) -> (..., out)
        flat = x.reshape(-1, self.in_features)
        if self._kernels is not None:  # adds the bias and rounds to x's dtype once, in the kernel
            out = self._kernels.int4_linear(flat, self.packed, self.scales_and_zeros, self.group_size, self.bias)
            return out.reshape(*x.shape[:-1], self.out_features)  # type: ignore[no-any-return]
        if flat.is_cuda:
            out = torch.ops.aten._weight_int4pack_mm(flat, self.packed, self.group_size, self.scales_and_zeros)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, self.group_size, self.scales_and_zeros)
        return self._finish(out, x.shape)


def int4_packing(device: torch.device, in_features: int) -> Int4Packing:
    """draftwatch's packing on a CPU that runs decoder/kernels (inputs a multiple of 64), else tinygemm's."""
    return "draftwatch" if in_features % 64 == 0 and kernels_for(device) is not None else "tinygemm"


def int4_qparams(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight (out, in) -> q (out, in) int32 in 0..15, scales and zeros (out, in / g) float32.

    Asymmetric 16-level grid per group, the zero stored as the value of level 8 (tinygemm's form).
    The step is searched, not just (max - min) / 15: each group tries spans of 15 down to 8 steps
    from its minimum and keeps the one with the least squared error. Weights de-quantized from a
    GGUF k-quant lie on such a grid whose levels need not reach 0 and 15; finding the grid's own
    step reproduces them almost exactly, where plain min-max would re-round every one of them.
    """
    out_features, in_features = weight.shape
    groups = weight.detach().float().reshape(-1, group_size)  # (out * in / g, g); in-place passes need no grad
    q = torch.empty(groups.shape, dtype=torch.int32)
    scales = torch.empty(groups.shape[0], 1)
    lows = torch.empty(groups.shape[0], 1)
    # The search makes about 70 element-wise passes; over a block that stays in the CPU's cache they
    # ran 6x faster than over a whole layer's float copy from memory (quantizing the Qwen 1.5B took
    # minutes). Every group is computed with the same operations, so the result does not change.
    for start in range(0, groups.shape[0], QPARAMS_BLOCK_GROUPS):
        block = slice(start, start + QPARAMS_BLOCK_GROUPS)
        q[block], scales[block], lows[block] = _int4_search(groups[block])
    zeros = lows + scales * 8.0
    return q.reshape(out_features, in_features), scales.reshape(out_features, -1), zeros.reshape(out_features, -1)


QPARAMS_BLOCK_GROUPS = 8192  # 1 MiB of float32 per pass at a group size of 32


def _int4_search(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """groups (n, g) float32 -> levels (n, g) in 0..15 as floats, the best step (n, 1) and the minimum (n, 1)."""
    low, high = groups.amin(dim=1, keepdim=True), groups.amax(dim=1, keepdim=True)
    span = (high - low).clamp(min=1e-6)  # (n, 1)
    best_scale, best_error = span / 15.0, torch.full_like(span, float("inf"))
    shifted = groups - low
    work = torch.empty_like(groups)  # one buffer for every pass: no allocation per operation
    for steps in range(15, 7, -1):
        scale = span / steps
        torch.div(shifted, scale, out=work)
        work.round_().clamp_(0, 15).mul_(scale).add_(low).sub_(groups).square_()
        error = work.sum(dim=1, keepdim=True)  # (n, 1)
        better = error < best_error * (1 - 1e-6)  # ties keep the wider span (more headroom, same error)
        best_scale, best_error = torch.where(better, scale, best_scale), torch.where(better, error, best_error)
    levels = torch.div(shifted, best_scale, out=work).round_().clamp_(0, 15)
    return levels, best_scale, low


def int4_dequantized(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """The float weight (out, in) an int4 layer made from ``weight`` multiplies by, with scales and
    zeros rounded to ``weight``'s dtype as the kernel stores them: the reference for checks and tests."""
    q, scales, zeros = int4_qparams(weight, group_size)
    scales, zeros = scales.to(weight.dtype).float(), zeros.to(weight.dtype).float()
    groups = (q.float().reshape(weight.shape[0], -1, group_size) - 8.0) * scales[..., None] + zeros[..., None]
    return groups.reshape(weight.shape)


def int8_qparams(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight (out, in) -> q (out, in) int8 in -127..127 and scales (out,) float32.

    127, not 128: a symmetric grid keeps zero exact and -w the mirror of w.
    """
    scales = weight.float().abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(weight.float() / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def int8_dequantized(weight: torch.Tensor) -> torch.Tensor:
    """The float weight (out, in) an int8 layer made from ``weight`` multiplies by."""
    q, scales = int8_qparams(weight)
    return q.float() * scales.to(weight.dtype).float()[:, None]


def _pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q (out, in) int32 in 0..15 -> the kernel's packed layout on q's device."""
    if q.is_cuda:
        # tinygemm on CUDA takes two nibbles per byte, high nibble first, and 8 inner k-tiles.
        as_bytes = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)  # (out, in / 2)
        packed: torch.Tensor = torch.ops.aten._convert_weight_to_int4pack(as_bytes, 8)
        return packed
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)  # (out, in / 2) uint8
    return packed


# The output head is the most sensitive layer (its errors land directly on the logits), and the
# biggest one in models with large vocabularies: int8 keeps next-token agreement where int4 lost
# it (smollm2-135m: 91 % with an int4 head, 98 % with int8), at a third of bfloat16's bytes.
# llama.cpp's Q4_K_M makes the same choice (a 6-bit head).
HEAD_MODE: dict[Quantization, Quantization] = {"none": "none", "int8": "int8", "int4": "int8"}
DEFAULT_GROUP_SIZE = 32  # the GGUF 4-bit formats' own block size; 64 lost 10 points of agreement on smollm2


def quantize_model(
    model: nn.Module,
    mode: Quantization,
    group_size: int = DEFAULT_GROUP_SIZE,
    head_mode: Quantization | None = None,
    progress: bool = False,
) -> dict[str, QuantizedLinear]:
    """Replace the linear layers of ``model`` in place; return the new modules by name.

    ``head_mode`` is the output head's format (default: ``HEAD_MODE[mode]``). Embeddings, norms
    and attention arithmetic keep the model's dtype. With tied embeddings the head gets its own
    quantized copy and the (float) embedding table stays for the lookup. ``progress`` shows a
    bar per layer on stderr (a billion-parameter model takes tens of seconds on a CPU).
    """
    head_mode = HEAD_MODE[mode] if head_mode is None else head_mode
    for value in (mode, head_mode):
        if value not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {value!r}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size!r}")
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    replaced: dict[str, QuantizedLinear] = {}
    skipped: list[str] = []
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    for name, linear in tqdm(linears, desc=f"quantizing to {mode}", unit="layer", disable=not progress):
        layer_mode = head_mode if linear is head else mode
        if layer_mode == "none" or (layer_mode == "int4" and not Int4Linear.fits(linear, group_size)):
            skipped.append(name)
            continue
        new = Int8Linear.from_float(linear) if layer_mode == "int8" else Int4Linear.from_float(linear, group_size)
        set_submodule(model, name, new)
        replaced[name] = new
    if skipped and mode != "none":
        logger.info("%s: %d linear layers left in float: %s", mode, len(skipped), ", ".join(skipped[:5]))
    config = getattr(model, "config", None)
    if (
        config is not None
        and head is not None
        and head_mode != "none"
        and getattr(config, "tie_word_embeddings", False)
    ):
        # The head is no longer the embedding's weight; stop transformers from re-tying them.
        config.tie_word_embeddings = False
    return replaced


def set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def check_kernel(
    mode: Quantization, device: torch.device, dtype: torch.dtype, group_size: int = DEFAULT_GROUP_SIZE
) -> None:
    """Run the mode's kernel once on ``device`` against a float reference; raise QuantizationError if it fails.

    Guards the CUDA path in particular, which cannot be exercised on a CPU-only machine: a build
    without tinygemm, or a GPU it does not support, falls back to float weights instead of failing later.
    """
    if mode == "none":
        return
    generator = torch.Generator().manual_seed(0)
    linear = nn.Linear(256, 64, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(64, 256, generator=generator) * 0.05)
        linear.bias.copy_(torch.randn(64, generator=generator) * 0.05)
    linear = linear.to(device=device, dtype=dtype)
    x = torch.randn(3, 256, generator=generator).to(device=device, dtype=dtype)  # (3, 256)
    try:
        layer = Int8Linear.from_float(linear) if mode == "int8" else Int4Linear.from_float(linear, group_size)
        with torch.no_grad():
            got = layer(x).float()
    except (RuntimeError, NotImplementedError) as error:
        raise QuantizationError(f"{mode} kernels are not available on {device} ({dtype}): {error}") from error
    weight = int8_dequantized(linear.weight) if mode == "int8" else int4_dequantized(linear.weight, group_size)
    want = x.float() @ weight.T.to(device) + linear.bias.float()  # (3, 64)
    # Against the dequantized weights only the rounding of activations and sums to ``dtype`` remains.
    tolerance = 0.03 if dtype != torch.float32 else 1e-3
    if not torch.allclose(got, want, atol=tolerance, rtol=0):
        off = (got - want).abs().max().item()
        raise QuantizationError(f"{mode} kernel on {device} ({dtype}) is off by {off:.3g}: not used")
