"""Decoding on an accelerator: is a verification pass row-stable there, and what does each weight format cost?

Greedy speculative decoding is lossless only if the target's logits for a token do not depend on how
many tokens share its forward pass (decoder/cpu/row_stable.py, decoder/cpu/attention.py). On a CPU that had
to be built; this benchmark checks it on CUDA, where cuBLAS also picks its kernels by shape, and
measures the plain decoding speed of each weight format there, which is how the CUDA default of
decoder/cpu/quantized_store.py is chosen.

No model files are needed: the models are random, built from the presets' own architectures
(Qwen2.5-1.5B's for speed, a smaller one of the same family for the exactness runs), so the
check runs on a machine that reaches no model hub. Random weights give flat, near-tied logits,
which is the hardest case for row stability.

Sections:

* **rows** — one linear layer per format: the largest difference between a row computed in a pass
  of k rows and the same row alone, unpadded and padded (RowStableLinear).
* **exactness** — a random target and a perturbed copy as its draft: greedy speculative output
  against greedy plain output, per attention (the backend's default, or draftwatch's row-wise) and
  per linear layer (plain, or row-stable), for every weight format.
* **speed** — plain decoding tokens/s per weight format on the 1.5B architecture, with the backend's
  attention and with the layers ``load_model`` gives this device (row-wise attention; padded float
  linears on a CPU only), and the cost of a verification pass over k + 1 tokens in one-token
  passes (the controller's v(γ)).

Run it where a GPU is: ``python benchmarks/gpu_decoding.py``. ``--device cpu --small`` runs the same
code on a CPU in a minute (a check of the script, not a figure to quote).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from itertools import product
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import DynamicCache, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from benchmarks.results import write_section
from decoder import ModelDrafter, SpeculativeDecoder
from decoder.cpu.attention import register
from decoder.cpu.quantize import QUANTIZATIONS, Int4Linear, Int8Linear, Quantization, quantize_model
from decoder.cpu.quantized_store import kernel_works
from decoder.cpu.row_stable import RowStableLinear, make_row_stable, row_stable_passes
from decoder.models.loading import LoadedModel

QWEN_1_5B = {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "vocab_size": 151936}  # fmt: skip
EXACTNESS = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 6, "num_attention_heads": 14,
             "num_key_value_heads": 2, "vocab_size": 32000}  # fmt: skip
SMALL = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 512}  # fmt: skip


def word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """One word per token id ("w0" is end of text), so any id a random model emits decodes."""
    backend = Tokenizer(WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w1"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="w0", unk_token="w1")


def random_model(shape: dict[str, int], seed: int, device: torch.device, dtype: torch.dtype) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(**shape, max_position_embeddings=4096, tie_word_embeddings=True, eos_token_id=0,
                         bos_token_id=None, pad_token_id=None)  # fmt: skip
    with device:
        model = Qwen2ForCausalLM(config).to(dtype).eval()
    model.generation_config.eos_token_id = 0
    return model


def prepared(model: Qwen2ForCausalLM, name: str, tokenizer: PreTrainedTokenizerFast, quantization: Quantization,
             rowwise_attention: bool, row_stable: bool, device: torch.device) -> LoadedModel:  # fmt: skip
    model.set_attn_implementation(register() if rowwise_attention else "sdpa")
    if quantization != "none":
        quantize_model(model, quantization)
    elif row_stable:
        make_row_stable(model)
    return LoadedModel(name=name, version=name, model=model, tokenizer=tokenizer, device=device)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- rows -------------------------------------------------------------------------------------------


def row_differences(device: torch.device, dtype: torch.dtype, small: bool) -> str:
    """Per format: max |row in a k-row pass - the row alone| over k = 2..9, unpadded and padded."""
    out_features, in_features = (256, 128) if small else (8960, 1536)
    generator = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(out_features, in_features, generator=generator) * 0.02)
    linear = linear.to(device=device, dtype=dtype)
    x = torch.randn(9, in_features, generator=generator).to(device=device, dtype=dtype)  # (9, in)
    layers: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"none": linear}
    for mode, make in (
        ("int8", lambda: Int8Linear.from_float(linear)),
        ("int4", lambda: Int4Linear.from_float(linear, 32)),
    ):
        problem = kernel_works(mode, device.type, dtype)
        if problem is None:
            layers[mode] = make()
    lines = ["| format | largest difference, k rows against 1 (k = 2..9) | padded to 8 rows |", "|---|---|---|"]
    with torch.no_grad():
        for mode, layer in layers.items():
            worst = {False: 0.0, True: 0.0}
            for padded in (False, True) if isinstance(layer, torch.nn.Linear) else (False,):
                run = RowStableLinear(layer) if padded else layer
                with row_stable_passes():
                    alone = torch.cat([run(x[i : i + 1]) for i in range(9)]).float()  # (9, out)
                    for k in range(2, 10):
                        together = run(x[:k]).float()  # (k, out)
                        worst[padded] = max(worst[padded], (together - alone[:k]).abs().max().item())
            padded_text = f"{worst[True]:.3g}" if mode == "none" else "(not padded: quantized kernel)"
            lines.append(f"| {mode} | {worst[False]:.3g} | {padded_text} |")
    return "\n".join(lines)


# --- exactness --------------------------------------------------------------------------------------


def exactness(device: torch.device, dtype: torch.dtype, shape: dict[str, int], prompts: int, tokens: int) -> str:
    """Greedy speculative == greedy plain, per (format, attention, linear layers): prompts that differ."""
    tokenizer = word_tokenizer(shape["vocab_size"])
    rng = torch.Generator().manual_seed(1)
    texts = [" ".join(f"w{i}" for i in torch.randint(1, shape["vocab_size"], (48,), generator=rng).tolist())
             for _ in range(prompts)]  # fmt: skip
    lines = ["| format | attention | linear layers | prompts where speculative ≠ plain | acceptance |",
             "|---|---|---|---|---|"]  # fmt: skip
    for quantization, rowwise, row_stable in product(QUANTIZATIONS, (False, True), (False, True)):
        if quantization != "none" and row_stable:
            continue  # quantized layers are not wrapped; the float rows cover the question
        if quantization != "none" and kernel_works(quantization, device.type, dtype) is not None:
            lines.append(f"| {quantization} | | | kernel not available on {device.type} | |")
            continue
        target_model = random_model(shape, seed=0, device=device, dtype=dtype)
        draft_model = random_model(shape, seed=0, device=device, dtype=dtype)
        with torch.no_grad():
            for parameter in draft_model.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.0005)  # acceptance about 0.6
        target = prepared(target_model, "target", tokenizer, quantization, rowwise, row_stable, device)
        draft = prepared(draft_model, "draft", tokenizer, quantization, rowwise, row_stable, device)
        decoder = SpeculativeDecoder(target, ModelDrafter(draft, shape["vocab_size"]), gamma=4)
        differ, drafted, accepted = 0, 0, 0
        for text in texts:
            plain = decoder.generate(text, max_new_tokens=tokens, mode="plain")
            spec = decoder.generate(text, max_new_tokens=tokens, mode="speculative")
            differ += plain.token_ids != spec.token_ids
            drafted += spec.record.num_draft_tokens
            accepted += spec.record.num_accepted_tokens
        attention = "row-wise" if rowwise else "sdpa"
        linears = "row-stable (8-row blocks)" if row_stable else "plain"
        rate = f"{accepted / drafted:.2f}" if drafted else ""
        lines.append(f"| {quantization} | {attention} | {linears} | {differ} of {len(texts)} | {rate} |")
        del target_model, draft_model, decoder, target, draft
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return "\n".join(lines)


# --- speed ------------------------------------------------------------------------------------------


def timed_forward(model: Qwen2ForCausalLM, cache: DynamicCache, ids: torch.Tensor, device: torch.device) -> float:
    synchronize(device)
    started = time.perf_counter()
    model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=ids.shape[1])
    synchronize(device)
    seconds = time.perf_counter() - started
    cache.crop(-ids.shape[1])
    return seconds


def speed(device: torch.device, dtype: torch.dtype, shape: dict[str, int], tokens: int, repeats: int) -> str:
    """Plain tokens/s and v(k) = (pass over k + 1 tokens) / (one-token pass) per format and layer setup."""
    tokenizer = word_tokenizer(shape["vocab_size"])
    prompt = " ".join(f"w{i}" for i in range(1, 129))
    lines = ["| format | attention, linear layers | plain tokens/s | v(1) | v(2) | v(4) | v(8) |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for quantization, lossless in product(QUANTIZATIONS, (False, True)):
        if quantization != "none" and kernel_works(quantization, device.type, dtype) is not None:
            lines.append(f"| {quantization} | | kernel not available on {device.type} | | | | |")
            continue
        model = random_model(shape, seed=0, device=device, dtype=dtype)
        padded = lossless and device.type == "cpu"  # what load_model does: cuBLAS rows need no padding
        target = prepared(model, "speed", tokenizer, quantization, lossless, padded, device)
        decoder = SpeculativeDecoder(target)
        decoder.generate(prompt, max_new_tokens=8, mode="plain")  # warm-up: kernels, allocator
        rates = []
        for _ in range(repeats):
            synchronize(device)
            started = time.perf_counter()
            result = decoder.generate(prompt, max_new_tokens=tokens, mode="plain", stop=[])
            rates.append(len(result.token_ids) / (time.perf_counter() - started))
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=torch.arange(1, 257, device=device)[None], cache=cache, use_cache=True)
            costs = {}
            with row_stable_passes():
                one = statistics.median(timed_forward(model, cache, torch.ones(1, 1, dtype=torch.long, device=device),
                                                      device) for _ in range(5))  # fmt: skip
                for k in (1, 2, 4, 8):
                    ids = torch.ones(1, k + 1, dtype=torch.long, device=device)
                    costs[k] = statistics.median(timed_forward(model, cache, ids, device) for _ in range(5)) / one
        setup = ("row-wise, row-stable" if padded else "row-wise, plain") if lossless else "sdpa, plain"
        v = " | ".join(f"{costs[k]:.2f}" for k in (1, 2, 4, 8))
        lines.append(f"| {quantization} | {setup} | {statistics.median(rates):.1f} | {v} |")
        del model, target, decoder, cache
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="tiny models: checks the script, measures nothing")
    parser.add_argument("--sections", default="rows,exactness,speed", help="comma-separated: rows, exactness, speed")
    parser.add_argument("--no-write", action="store_true", help="print only; leave benchmarks/RESULTS.md alone")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16
    sections = set(args.sections.split(","))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    parts = [f"Device: {name}, {dtype}, torch {torch.__version__}. Random weights (see the script's docstring)."]
    if "rows" in sections:
        parts.append("### One linear layer, rows of a k-row pass against the row alone\n\n"
                     + row_differences(device, dtype, args.small))  # fmt: skip
        print(parts[-1], flush=True)
    if "exactness" in sections:
        shape, prompts, tokens = (SMALL, 2, 16) if args.small else (EXACTNESS, 6, 64)
        parts.append("### Greedy speculative against greedy plain (model draft, γ = 4)\n\n"
                     + exactness(device, dtype, shape, prompts, tokens))  # fmt: skip
        print(parts[-1], flush=True)
    if "speed" in sections:
        shape, tokens, repeats = (SMALL, 16, 1) if args.small else (QWEN_1_5B, 128, 3)
        parts.append("### Plain decoding speed and verification cost (Qwen2.5-1.5B architecture)\n\n"
                     + speed(device, dtype, shape, tokens, repeats))  # fmt: skip
        print(parts[-1], flush=True)
    if not args.no_write:
        write_section("Decoding on an accelerator", "\n\n".join(parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
