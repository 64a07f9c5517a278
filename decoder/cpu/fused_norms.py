"""transformers' RMSNorm modules swapped for draftwatch's fused CPU kernel (decoder/kernels/cpu_layers.cpp).

A Qwen2 / Llama RMSNorm is seven PyTorch operations on a tensor of one row at decode time, and on
a 2-core CPU each costs microseconds of dispatch whatever its size: qwen-coder-1.5b spent about
4.8 ms of an 80 ms token in its 57 norms. The kernel computes the same formula in one call, row by
row (so a row's result does not depend on the pass it is in), rounding where transformers rounds;
only the order of the sum of squares differs. Only classes known to use that exact formula are
swapped (Gemma's, for one, scales by ``1 + weight``).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from decoder.cpu.quantize import set_submodule

logger = logging.getLogger(__name__)

SAME_FORMULA = frozenset({"Qwen2RMSNorm", "Qwen3RMSNorm", "LlamaRMSNorm", "MistralRMSNorm"})


class FusedRMSNorm(nn.Module):
    """``weight * (x * rsqrt(mean(x ** 2) + eps)).to(dtype)``, the float part in float32, in one kernel call."""

    def __init__(self, weight: nn.Parameter, eps: float, kernels: Any) -> None:
        super().__init__()
        self.weight = weight
        self.variance_epsilon = eps
        self._kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._kernels.rms_norm(x, self.weight, self.variance_epsilon)  # type: ignore[no-any-return]

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, fused"


def fuse_norms(model: nn.Module, kernels: Any) -> int:
    """Swap each RMSNorm of a known formula (CPU, bfloat16 or float32) for :class:`FusedRMSNorm`; return how many."""
    swapped = 0
    for name, module in list(model.named_modules()):
        weight = getattr(module, "weight", None)
        if (
            type(module).__name__ in SAME_FORMULA
            and isinstance(weight, nn.Parameter)
            and weight.device.type == "cpu"
            and weight.dtype in (torch.bfloat16, torch.float32)
            and weight.dim() == 1
            and weight.numel() % 8 == 0
        ):
            set_submodule(model, name, FusedRMSNorm(weight, float(module.variance_epsilon), kernels))
            swapped += 1
    logger.debug("fused %d RMSNorm modules", swapped)
    return swapped
