"""Row-stable float linear layers for the CPU: a verification pass computes each row as a one-token pass would.

Greedy speculative decoding is lossless only if the target's logits for a token do not depend on
how many tokens shared its forward pass. PyTorch's float GEMM on a CPU does not promise that: it
picks its kernel and blocking by the number of rows, so a row of a 5-row product can differ in its
last bits from the same row computed alone (measured here, 2 threads: up to 0.008 in bfloat16 on a
1536×8960 layer, about 1e-6 in float32; in bfloat16 a near-tie then flips a greedy token, which the
decoder benchmark caught on smollm2-135m at ``--quantize none``). Padding every decode pass to the
same block of rows makes every row go through the same kernel with the same blocking, and its
result no longer depends on the others (checked bit for bit in tests/decoder/test_row_stable.py).

Only passes inside :func:`row_stable_passes` are padded: the decode loop's steps, plain and
speculative alike. A prompt's prefill is the same call in both modes, so it runs unpadded, as one
product. The int8 and int4 kernels (decoder/cpu/quantize.py) are row-stable as they are and need none
of this; the attention is made row-stable by decoder/cpu/attention.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

BLOCK_ROWS = 8  # a verification pass carries up to gamma + 1 rows; wider passes run in blocks of this many
_padding: ContextVar[bool] = ContextVar("draftwatch_row_stable", default=False)


@contextmanager
def row_stable_passes() -> Iterator[None]:
    """Within this block, row-stable layers pad their input to whole blocks of ``BLOCK_ROWS`` rows."""
    token = _padding.set(True)
    try:
        yield
    finally:
        _padding.reset(token)


class RowStableLinear(nn.Module):
    """A float ``nn.Linear`` whose rows, inside :func:`row_stable_passes`, do not depend on each other."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear
        self.in_features, self.out_features = linear.in_features, linear.out_features

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (..., in) -> (..., out)
        flat = x.reshape(-1, self.in_features)  # (rows, in)
        if not _padding.get():
            # As a 2-D product: a 3-D input that is a strided view (the last row of a pass, as
            # logits_to_keep slices it) sends PyTorch's CPU matmul to a batched path that copies the
            # whole transposed weight first: 375 ms a call for a 151936x896 output head, not 11.
            return self.linear(flat).reshape(*x.shape[:-1], self.out_features)  # type: ignore[no-any-return]
        rows = flat.shape[0]
        padded = (rows + BLOCK_ROWS - 1) // BLOCK_ROWS * BLOCK_ROWS
        if padded != rows:
            flat = torch.cat([flat, flat.new_zeros(padded - rows, self.in_features)])
        blocks = [self.linear(flat[start : start + BLOCK_ROWS]) for start in range(0, padded, BLOCK_ROWS)]
        return torch.cat(blocks)[:rows].reshape(*x.shape[:-1], self.out_features)


def make_row_stable(model: nn.Module) -> int:
    """Wrap every float ``nn.Linear`` of ``model`` in place; return how many were wrapped."""
    from decoder.cpu.quantize import set_submodule

    inner = {id(m.linear) for m in model.modules() if isinstance(m, RowStableLinear)}  # already wrapped
    linears = [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear and id(m) not in inner]
    for name, linear in linears:
        set_submodule(model, name, RowStableLinear(linear))
    return len(linears)
