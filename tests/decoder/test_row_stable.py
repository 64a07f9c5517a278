"""Float linear layers on a CPU: inside a decode pass, a row's result does not depend on its neighbours."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from decoder import LoadedModel, NgramDrafter, SpeculativeDecoder, load_model
from decoder.cpu.row_stable import BLOCK_ROWS, RowStableLinear, make_row_stable, row_stable_passes
from decoder.workloads import builtin_workloads


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(1536, 8960), (8960, 1536), (1536, 576)])
def test_rows_equal_their_one_row_pass_bit_for_bit(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    """Shapes where a plain GEMM of several rows differed from one-row products on this CPU."""
    torch.manual_seed(0)
    layer = RowStableLinear(nn.Linear(*shape, bias=True).to(dtype))
    for rows in (2, 3, 5, BLOCK_ROWS, BLOCK_ROWS + 3):
        x = torch.randn(1, rows, shape[0], dtype=dtype)
        with torch.inference_mode(), row_stable_passes():
            together = layer(x)  # (1, rows, out)
            alone = torch.cat([layer(x[:, i : i + 1]) for i in range(rows)], dim=1)
        assert together.shape == (1, rows, shape[1])
        assert torch.equal(together, alone), f"{rows} rows"


def test_a_strided_last_row_runs_as_one_matrix_product() -> None:
    """``logits_to_keep`` hands the output head a strided view of the pass's last row.

    Given that 3-D view, PyTorch's CPU matmul took a batched path that first copied the whole
    transposed weight (375 ms a call for a 151936x896 head; it made a float 0.5B draft 9x slower
    after every fully accepted step). The layer multiplies it as a 2-D product, with no weight copy.
    """
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(2)
    layer = RowStableLinear(nn.Linear(64, 4096, bias=False).to(torch.bfloat16).requires_grad_(False))  # as loaded
    hidden = torch.randn(1, 2, 64, dtype=torch.bfloat16)
    last = hidden[:, -1:, :]  # (1, 1, 64), strided
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        out = layer(last)
    assert out.shape == (1, 1, 4096)
    assert torch.equal(out[0], layer.linear(last[0].contiguous()))
    ops = {event.key for event in prof.key_averages()}
    assert "aten::bmm" not in ops and "aten::clone" not in ops, sorted(ops)


def test_outside_decode_passes_the_layer_is_the_plain_linear() -> None:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16))
    x = torch.randn(40, 64)
    before = model(x)
    assert make_row_stable(model) == 2
    assert make_row_stable(model) == 0  # wrapping twice wraps nothing more
    assert all(isinstance(model[i], RowStableLinear) for i in (0, 2))
    assert torch.equal(model(x), before)
    with row_stable_passes():
        assert torch.allclose(model(x), before, atol=1e-6)


@pytest.mark.models
def test_float_smollm2_speculative_equals_plain_on_long_outputs() -> None:
    """The decoder benchmark found 4 of 5 code prompts differing at --quantize none before this layer."""
    model: LoadedModel = load_model("smollm2-135m", quantize="none", progress=False)
    assert isinstance(model.model.get_output_embeddings(), RowStableLinear)
    decoder = SpeculativeDecoder(model, NgramDrafter(), gamma=4)
    for prompt in builtin_workloads()["code"][:2]:
        plain = decoder.generate(prompt, chat=True, max_new_tokens=96, mode="plain")
        speculative = decoder.generate(prompt, chat=True, max_new_tokens=96)
        assert speculative.token_ids == plain.token_ids, prompt
        assert speculative.record.num_draft_tokens > 0
