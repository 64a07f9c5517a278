"""The decoder on a CUDA device: loaded the way users load it, greedy speculative output equals plain.

Skipped where no CUDA device is (CI has none); run on a GPU machine with
``python -m pytest tests/decoder/test_cuda.py``. The models are small random llamas saved as local
directories, so the test needs no model files; random weights give near-tied logits, the hardest
case for row stability (decoder/cpu/attention.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from decoder import ModelDrafter, NgramDrafter, SpeculativeDecoder, load_model
from decoder.cpu.attention import NAME as ROWWISE
from decoder.cpu.quantize import QUANTIZATIONS, QuantizedLinear
from decoder.cpu.row_stable import RowStableLinear
from decoder.models.loading import LoadedModel
from tests.decoder.tiny import perturbed_copy, tiny_model, word_tokenizer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

VOCAB = ["<eos>", *[f"w{i}" for i in range(2047)]]
CUDA = torch.device("cuda")


def saved(model: LoadedModel, directory: Path) -> Path:
    model.model.save_pretrained(directory)
    model.tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cuda-models")
    tokenizer = word_tokenizer(VOCAB)
    target = tiny_model(seed=1, vocab_size=len(VOCAB), hidden_size=256, layers=4, init_range=0.05, tokenizer=tokenizer)
    draft = perturbed_copy(target, noise=0.002, seed=2)
    return saved(target, root / "target"), saved(draft, root / "draft")


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_speculative_equals_plain_on_cuda(
    quantization: str, model_dirs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTWATCH_CACHE_DIR", str(tmp_path / "cache"))
    target_dir, draft_dir = model_dirs
    first = load_model(str(target_dir), device=CUDA, quantize=quantization, progress=False)
    target = load_model(str(target_dir), device=CUDA, quantize=quantization, progress=False)  # the quantized cache
    draft = load_model(str(draft_dir), device=CUDA, quantize=quantization, progress=False)
    layers = list(target.model.modules())
    assert target.model.config._attn_implementation == ROWWISE
    assert not any(isinstance(m, RowStableLinear) for m in layers)  # cuBLAS rows need no padding
    assert any(isinstance(m, QuantizedLinear) for m in layers) == (quantization != "none")
    assert next(target.model.parameters()).device.type == "cuda"

    rng = torch.Generator().manual_seed(0)
    prompts = [
        " ".join(VOCAB[i] for i in torch.randint(1, len(VOCAB), (40,), generator=rng).tolist()) for _ in range(4)
    ]
    accepted = 0
    for drafter in (ModelDrafter(draft, len(VOCAB)), NgramDrafter()):
        decoder = SpeculativeDecoder(target, drafter, gamma=4)
        for prompt in prompts:
            plain = decoder.generate(prompt, max_new_tokens=48, mode="plain")
            spec = decoder.generate(prompt, max_new_tokens=48, mode="speculative")
            assert spec.token_ids == plain.token_ids, f"{quantization}, {type(drafter).__name__}: {prompt!r}"
            accepted += spec.record.num_accepted_tokens
    assert accepted > 0  # verification passes carried several rows, not only rejected drafts
    reference = SpeculativeDecoder(first).generate(prompts[0], max_new_tokens=48, mode="plain")
    assert (
        reference.token_ids
        == SpeculativeDecoder(target).generate(prompts[0], max_new_tokens=48, mode="plain").token_ids
    )
