"""Loading target and draft models: presets, GGUF files, local directories and hub ids.

GGUF files are de-quantized by transformers on load, which costs tens of seconds; the first load
keeps a converted copy (safetensors, in the chosen dtype) in the cache so that later loads take
about a second. The dtype is chosen per device: on CUDA bfloat16 where supported; on a CPU a short
matmul measurement decides between bfloat16 and float32 once per machine, cached beside the models.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from decoder.cpu.row_stable import BLOCK_ROWS
from decoder.models.fetch import cache_dir, fetch_preset, get_preset
from decoder.models.presets import PRESETS

if TYPE_CHECKING:
    from decoder.cpu.quantize import Quantization

logger = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


class ModelLoadError(RuntimeError):
    """A model could not be found or loaded; the message says which and what to do."""


class TokenizerMismatchError(ModelLoadError):
    """Target and draft do not share a tokenizer, so draft tokens would mean something else."""


@dataclass(slots=True)
class LoadedModel:
    """A model ready to decode, with what it takes to describe it in a record."""

    name: str
    version: str | None
    model: Any  # transformers.PreTrainedModel
    tokenizer: Any  # transformers.PreTrainedTokenizerBase
    device: torch.device
    quantization: str = "none"  # "none", "int8" or "int4": the weights the model decodes with

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (quantized layers keep theirs in buffers, not parameters)."""
        return next(self.model.parameters()).dtype  # type: ignore[no-any-return]

    @property
    def num_parameters(self) -> int:
        """Weights the model computes with, counting a quantized layer's as its float shape."""
        from decoder.cpu.quantize import QuantizedLinear

        modules = self.model.modules()
        quantized = sum(m.in_features * m.out_features for m in modules if isinstance(m, QuantizedLinear))
        return int(quantized + sum(p.numel() for p in self.model.parameters()))

    @property
    def vocab_size(self) -> int:
        """Width of the logits, which may exceed the tokenizer's size (padded embeddings)."""
        return int(self.model.get_output_embeddings().out_features)


def choose_device(environ: Mapping[str, str] | None = None) -> torch.device:
    env = os.environ if environ is None else environ
    if env.get("DRAFTWATCH_DEVICE"):
        return torch.device(env["DRAFTWATCH_DEVICE"])
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def choose_dtype(device: torch.device, environ: Mapping[str, str] | None = None) -> torch.dtype:
    """The faster dtype on ``device``; ``$DRAFTWATCH_DTYPE`` overrides the choice."""
    env = os.environ if environ is None else environ
    requested = env.get("DRAFTWATCH_DTYPE")
    if requested:
        if requested not in DTYPES:
            raise ModelLoadError(f"DRAFTWATCH_DTYPE={requested!r} is not one of {', '.join(DTYPES)}")
        return DTYPES[requested]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type != "cpu":
        return torch.float32
    return _measured_cpu_dtype()


def _measured_cpu_dtype() -> torch.dtype:
    """Time a decode pass's matmul in both dtypes, once per CPU.

    The shape is the one float decode passes run: BLOCK_ROWS rows (row-stable padding, see
    decoder/cpu/row_stable.py) against an 8960x1536 weight. One row would mislead: without AVX-512
    BF16, bfloat16 won at one row (1.8 against 3.5 ms) and lost at eight (13.9 against 12.3 ms).
    """
    key = (
        f"{platform.machine()}-{platform.processor() or 'cpu'}-{torch.__version__}-{torch.get_num_threads()}"
        f"-rows{BLOCK_ROWS}"
    )
    store = cache_dir() / "cpu-dtype.json"
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known and known[key] in DTYPES:
        return DTYPES[known[key]]
    timings: dict[str, float] = {}
    for name in ("float32", "bfloat16"):
        weight = torch.randn(8960, 1536).to(DTYPES[name])
        rows = torch.randn(BLOCK_ROWS, 1536).to(DTYPES[name])
        for _ in range(3):
            torch.nn.functional.linear(rows, weight)
        start = time.perf_counter()
        for _ in range(20):
            torch.nn.functional.linear(rows, weight)
        timings[name] = time.perf_counter() - start
    best = min(timings, key=lambda name: timings[name])
    logger.info("CPU matmul timings %s: using %s", timings, best)
    known[key] = best
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text(json.dumps(known, indent=1))
    return DTYPES[best]


def load_model(
    spec: str,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
    progress: bool = True,
    attn_implementation: str | None = None,
    quantize: str | None = None,
) -> LoadedModel:
    """Load a preset name, a ``.gguf`` file, a local model directory or a Hugging Face model id.

    ``progress`` shows progress bars on stderr for fetching and quantizing (the GGUF conversion
    shows transformers' own).

    ``quantize`` is ``"none"``, ``"int8"`` or ``"int4"`` (weight-only, see decoder/cpu/quantize.py);
    the default is measured per device (``$DRAFTWATCH_QUANTIZE`` overrides it). A quantized model
    carries ``+int4`` / ``+int8`` in its version, so the monitor sees a quantization change as a
    model change. Where the kernel does not work on the device, an explicit request fails and the
    default falls back to float weights.

    ``attn_implementation`` defaults to decoder/cpu/attention.py's row-wise eager attention on every
    device: fused attention (PyTorch's CPU kernel, SDPA on CUDA) and eager attention over a block
    of rows round a row differently depending on how many query rows share the pass, so in
    bfloat16 a verification pass over several tokens could disagree with one-token passes and
    break greedy equivalence (measured on CUDA too: benchmarks/gpu_decoding.py). Float weights on
    a CPU also get decoder/cpu/row_stable.py's padded linear layers for the same reason; cuBLAS gave
    identical rows for passes of 1 to 9 rows, so CUDA needs no padding.
    """
    if not spec or not spec.strip():
        raise ModelLoadError("model name is empty: give a preset, a .gguf file, a directory or a hub id")
    device = device or choose_device()
    dtype = dtype or choose_dtype(device)
    mode = _quantization(quantize, device, dtype)
    loaded = _load(spec, device, dtype, progress)
    if attn_implementation is None:
        from decoder.cpu.attention import register

        attn_implementation = register()
    loaded.model.set_attn_implementation(attn_implementation)
    if mode != "none":
        from decoder.cpu.quantized_store import quantize_loaded

        quantize_loaded(loaded.model, loaded.version, mode, device, progress=progress)
        loaded.quantization = mode
        loaded.version = f"{loaded.version or 'unversioned'}+{mode}"
    elif device.type == "cpu":
        from decoder.cpu.row_stable import make_row_stable

        make_row_stable(loaded.model)  # float GEMMs on a CPU round a row by how many share the pass
    from decoder.cpu.kernels import kernels_for

    kernels = kernels_for(device)
    if kernels is not None:
        from decoder.cpu.fused_norms import fuse_norms

        fuse_norms(loaded.model, kernels)
    return loaded


def _quantization(requested: str | None, device: torch.device, dtype: torch.dtype) -> Quantization:
    from decoder.cpu.quantized_store import choose_quantization, kernel_works, parse_quantization

    try:
        mode = choose_quantization(device) if requested is None else parse_quantization(requested)
    except ValueError as error:
        raise ModelLoadError(str(error)) from error
    if mode == "none":
        return mode
    problem = kernel_works(mode, device.type, dtype)
    if problem is None:
        return mode
    if requested is not None:
        raise ModelLoadError(f"--quantize {mode}: {problem}; use --quantize none")
    logger.warning("%s; decoding with float weights", problem)
    return "none"


def _load(spec: str, device: torch.device, dtype: torch.dtype, progress: bool) -> LoadedModel:
    if spec in PRESETS:
        preset = get_preset(spec)
        gguf = fetch_preset(spec, progress=progress)
        model, tokenizer = _load_gguf(gguf, preset.sha256[:16], dtype)
        return _ready(spec, preset.version_label, model, tokenizer, device)
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"{spec!r} is a file but not a .gguf file; give a GGUF file or a model directory")
        model, tokenizer = _load_gguf(path, _file_key(path), dtype)
        return _ready(spec, f"gguf:{_file_key(path)[:12]}", model, tokenizer, device)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").is_file() and len(ggufs) == 1:
            model, tokenizer = _load_gguf(ggufs[0], _file_key(ggufs[0]), dtype)
            return _ready(spec, f"gguf:{_file_key(ggufs[0])[:12]}", model, tokenizer, device)
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"directory {spec!r} holds no config.json (and not exactly one .gguf file): "
                "point at a Hugging Face model directory or at the .gguf file itself"
            )
        model, tokenizer = _load_pretrained(str(path), dtype)
        return _ready(spec, _directory_version(path), model, tokenizer, device)
    if _looks_like_path(spec):
        raise ModelLoadError(f"model path {spec!r} does not exist")
    if spec.count("/") != 1:
        raise ModelLoadError(
            f"unknown model {spec!r}: not a preset ({', '.join(sorted(PRESETS))}), not an existing file "
            "or directory, and not a Hugging Face id of the form owner/name"
        )
    model, tokenizer = _load_pretrained(spec, dtype)
    return _ready(spec, getattr(model.config, "_commit_hash", None), model, tokenizer, device)


def _looks_like_path(spec: str) -> bool:
    """A file name or a path, as opposed to a hub id, which is exactly ``owner/name``."""
    return spec.endswith(".gguf") or spec.startswith((".", "/", "~")) or spec.count("/") > 1


def _file_key(path: Path) -> str:
    stat = path.resolve().stat()
    return hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()


def _directory_version(path: Path) -> str:
    config = (path / "config.json").read_bytes()
    return f"dir:{hashlib.sha256(config).hexdigest()[:12]}"


def _load_pretrained(source: str, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except (OSError, ValueError) as error:
        raise ModelLoadError(
            f"could not load {source!r}: {error}. Without access to a model hub use a preset "
            f"({', '.join(sorted(PRESETS))}), a .gguf file or a local model directory"
        ) from error
    return model, tokenizer


def _load_gguf(path: Path, key: str, dtype: torch.dtype) -> tuple[Any, Any]:
    """Load a GGUF file through its converted copy in the cache, making that copy on first use."""
    dtype_name = str(dtype).removeprefix("torch.")
    converted = cache_dir() / "converted" / f"{key[:16]}-{dtype_name}"
    if (converted / "config.json").is_file():
        return _load_pretrained(str(converted), dtype)
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    logger.info("de-quantizing %s once (about a minute for a billion parameters)", path.name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent),
            gguf_file=path.name,
            dtype=dtype,
            quantization_config=GgufConfig(dequantize=True),
        )
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        raise ModelLoadError(f"could not read GGUF file {str(path)!r}: {error}") from error
    # The weights are plain dense tensors now; drop the GGUF marker so they can be saved as such.
    setattr(model, "hf_quantizer", None)  # noqa: B010 (typed as a module attribute by transformers)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    converted.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=converted.name + ".", dir=converted.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.replace(converted)
    except OSError as error:
        logger.warning("could not cache the converted model in %s: %s", converted, error)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return model, tokenizer


def _ready(name: str, version: str | None, model: Any, tokenizer: Any, device: torch.device) -> LoadedModel:
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return LoadedModel(name=name, version=version, model=model, tokenizer=tokenizer, device=device)


PROBE_TEXT = "def add(a, b):\n    return a + b  # Grüße, 你好 🙂 0123456789"


def check_pair(target: LoadedModel, draft: LoadedModel) -> None:
    """Fail unless target and draft share a tokenizer; warn when the draft is not smaller."""
    target_size, draft_size = len(target.tokenizer), len(draft.tokenizer)
    if target_size != draft_size:
        raise TokenizerMismatchError(
            f"target {target.name!r} and draft {draft.name!r} do not share a tokenizer: vocabulary sizes "
            f"{target_size} and {draft_size}. Pick a draft from the target's model family "
            "(e.g. qwen-coder-0.5b for qwen-coder-1.5b) or use --drafter ngram"
        )
    target_ids = target.tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
    draft_ids = draft.tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
    if target_ids != draft_ids:
        index = next(
            (i for i, (a, b) in enumerate(zip(target_ids, draft_ids, strict=False)) if a != b),
            min(len(target_ids), len(draft_ids)),
        )
        first_target = target_ids[index] if index < len(target_ids) else None
        first_draft = draft_ids[index] if index < len(draft_ids) else None
        raise TokenizerMismatchError(
            f"target {target.name!r} and draft {draft.name!r} do not share a tokenizer: the probe text "
            f"first differs at token {index} (target id {first_target}, draft id {first_draft}). "
            "Pick a draft from the target's model family or use --drafter ngram"
        )
    if draft.num_parameters >= target.num_parameters:
        logger.warning(
            "draft %r (%.0fM parameters) is not smaller than target %r (%.0fM): speculation is unlikely to pay",
            draft.name, draft.num_parameters / 1e6, target.name, target.num_parameters / 1e6,
        )  # fmt: skip
