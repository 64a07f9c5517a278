"""Weight-only quantization: layers against float references, losslessness on quantized targets, the cache.

Tolerances (random Gaussian weights, so they hold for any seed with a wide margin):

* against the *dequantized* weights the kernels may differ only by the rounding of activations and
  sums to the activation dtype: relative error (Frobenius) <= 1e-2 in bfloat16, <= 1e-4 in float32;
* against the *original* float weights, quantization error included: <= 2 % for int8 per channel
  (step max|w|/127), <= 15 % for int4 in groups of 64 (step range/15; about 10 % expected).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from decoder import LoadedModel, ModelDrafter, NgramDrafter, SpeculativeDecoder
from decoder.cpu import quantize
from decoder.cpu.quantize import (
    Int4Linear,
    Int8Linear,
    QuantizedLinear,
    check_kernel,
    int4_dequantized,
    int8_dequantized,
    quantize_model,
)
from decoder.models.quality import agreement
from tests.decoder.tiny import perturbed_copy, random_prompt, tiny_model


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def make_linear(dtype: torch.dtype, out_features: int = 192, in_features: int = 256) -> nn.Linear:
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features, bias=True)
    with torch.no_grad():
        linear.weight.normal_(0, 0.05)
        linear.bias.normal_(0, 0.05)
    return linear.to(dtype).requires_grad_(False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("mode", "group_size"), [("int8", 0), ("int4", 32), ("int4", 64), ("int4", 128)])
def test_quantized_linear_against_float_references(dtype: torch.dtype, mode: str, group_size: int) -> None:
    linear = make_linear(dtype)
    layer: QuantizedLinear
    if mode == "int8":
        layer, weight = Int8Linear.from_float(linear), int8_dequantized(linear.weight)
    else:
        layer, weight = Int4Linear.from_float(linear, group_size), int4_dequantized(linear.weight, group_size)
    x = torch.randn(1, 7, 256).to(dtype)  # (batch, rows, in)
    with torch.no_grad():
        got = layer(x)  # (1, 7, 192)
        exact = x.float() @ linear.weight.float().T + linear.bias.float()
    assert got.shape == (1, 7, 192) and got.dtype == dtype
    assert relative_error(got, x.float() @ weight.T + linear.bias.float()) <= (
        1e-2 if dtype == torch.bfloat16 else 1e-4
    )
    assert relative_error(got, exact) <= (0.02 if mode == "int8" else 0.15)
    # Row invariance: each row of a 7-row pass is bit-identical to that row alone (verification = plain steps).
    with torch.no_grad():
        rows = torch.cat([layer(x[:, i : i + 1]) for i in range(7)], dim=1)
    assert torch.equal(rows, got)


def test_int4_search_does_not_depend_on_its_block_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # Blocks keep the search in the CPU's cache; a block edge inside a row must not change any group.
    weight = make_linear(torch.bfloat16, out_features=48, in_features=256).weight  # 384 groups of 32
    whole = quantize.int4_qparams(weight, 32)
    monkeypatch.setattr(quantize, "QPARAMS_BLOCK_GROUPS", 5)
    blocked = quantize.int4_qparams(weight, 32)
    assert all(torch.equal(a, b) for a, b in zip(whole, blocked, strict=True))
    q, scales, zeros = blocked
    assert q.shape == (48, 256) and scales.shape == zeros.shape == (48, 8)
    # Levels span the grid: each group's minimum sits on level 0.
    assert int(q.min()) == 0 and int(q.max()) == 15 and bool((q.reshape(-1, 32).amin(dim=1) == 0).all())


def test_kernels_pass_their_own_check_on_this_cpu() -> None:
    for mode in ("int8", "int4"):
        check_kernel(mode, torch.device("cpu"), torch.bfloat16)  # type: ignore[arg-type]


def quantized(model: LoadedModel, mode: str) -> LoadedModel:
    model.model.to(torch.bfloat16)
    quantize_model(model.model, mode, group_size=32)  # type: ignore[arg-type]
    model.quantization = mode
    return model


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_greedy_speculative_equals_plain_on_quantized_tiny_target(mode: str) -> None:
    # hidden 64: every layer's shape fits the int4 kernel (inputs a multiple of the group, outputs of 16).
    target = quantized(tiny_model(seed=11, hidden_size=64), mode)
    assert sum(isinstance(m, QuantizedLinear) for m in target.model.modules()) == 2 * 7 + 1  # every linear + head
    draft = quantized(perturbed_copy(tiny_model(seed=11, hidden_size=64), noise=0.02, seed=12), mode)
    decoder = SpeculativeDecoder(target, ModelDrafter(draft, target.vocab_size), gamma=4)
    rng = torch.Generator().manual_seed(5)
    accepted = rejected = 0
    for _ in range(6):
        prompt = random_prompt(rng, length=int(torch.randint(1, 10, (1,), generator=rng)))
        plain = decoder.generate(prompt, max_new_tokens=30, mode="plain")
        speculative = decoder.generate(prompt, max_new_tokens=30)
        assert speculative.token_ids == plain.token_ids, prompt
        accepted += speculative.record.num_accepted_tokens
        rejected += speculative.record.num_draft_tokens - speculative.record.num_accepted_tokens
    assert accepted > 0 and rejected > 0  # both branches of verification ran


def test_agreement_of_a_model_with_itself_is_complete() -> None:
    reference = tiny_model(seed=11, hidden_size=64)
    reference.tokenizer.chat_template = None
    result = agreement(reference, reference, ["a b c d", "e f"], new_tokens=8)
    assert result.positions > 0 and result.rate == 1.0
    assert result.candidate_perplexity == pytest.approx(result.reference_perplexity)


@pytest.mark.models
@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_quantized_smollm_is_lossless_and_cached(mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding from the cached copy as well: int8 layers read straight from the file crashed the kernel."""
    import decoder.cpu.quantized_store as store
    from decoder.models.loading import load_model

    monkeypatch.setattr(store, "cache_dir", lambda: tmp_path)  # a fresh quantized cache; converted models stay shared
    first = load_model("smollm2-135m", progress=False, quantize=mode)
    assert first.quantization == mode and first.version is not None and first.version.endswith(f"+{mode}")
    assert len(list((tmp_path / "quantized").glob("*.safetensors"))) == 1
    prompts = ["Rename x to total:\ndef f(x):\n    x = x + 1\n    return x\n", "Write a short poem about the sea."]
    for drafter in (NgramDrafter(), ModelDrafter(first, first.vocab_size)):
        decoder = SpeculativeDecoder(first, drafter, gamma=4)
        for prompt in prompts:
            plain = decoder.generate(prompt, chat=True, max_new_tokens=32, mode="plain")
            assert decoder.generate(prompt, chat=True, max_new_tokens=32).token_ids == plain.token_ids, prompt

    def no_requantizing(*args: object, **kwargs: object) -> None:
        raise AssertionError("the second load must read the cache, not quantize again")

    monkeypatch.setattr(store, "quantize_model", no_requantizing)
    second = load_model("smollm2-135m", progress=False, quantize=mode)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.inference_mode():
        assert torch.equal(first.model(ids).logits, second.model(ids).logits)
    cached = SpeculativeDecoder(second, NgramDrafter(), gamma=4).generate(prompts[0], chat=True, max_new_tokens=32)
    assert (
        cached.token_ids == SpeculativeDecoder(first, None).generate(prompts[0], chat=True, max_new_tokens=32).token_ids
    )
    assert first.num_parameters == second.num_parameters > 100_000_000
