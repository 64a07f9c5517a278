"""Quantizing a loaded model, with the packed weights cached so that later loads take seconds.

The float model loads from its converted copy (about a second), then each linear layer is swapped
for its quantized twin read from ``<cache>/quantized/<key>.safetensors``: no re-quantization, no
re-packing. The key covers the weights' identity (the model's version label), dtype, mode, group
size, head choice, device type (the packed layouts differ between CPU and CUDA) and torch version
(the packing is an internal format of PyTorch's kernels).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import torch

from decoder.cpu.quantize import (
    DEFAULT_GROUP_SIZE,
    HEAD_MODE,
    QUANTIZATIONS,
    Int4Linear,
    Int8Linear,
    Quantization,
    QuantizationError,
    QuantizedLinear,
    check_kernel,
    int4_packing,
    quantize_model,
    set_submodule,
)
from decoder.models.fetch import cache_dir

logger = logging.getLogger(__name__)

# What measurement picked per device type (docs/quantization.md has the figures): on a CPU int4 is
# the fastest and keeps next-token agreement above 97 %; on CUDA (an H200, benchmarks/gpu_decoding.py)
# a model of this size is bound by kernel launches, not by reading weights: int4 was no faster than
# float beyond the run's scatter and int8 slower, so weights stay float.
DEFAULT_QUANTIZATION: dict[str, Quantization] = {"cpu": "int4", "cuda": "none"}
FORMAT_VERSION = 6  # 3: int4 layers record their packing; 4: draftwatch's packing in 64-weight words;
# 5: draftwatch's int4 keeps scales and zeros in the activation dtype; 6: its words pair the block's halves


def choose_quantization(device: torch.device, environ: dict[str, str] | None = None) -> Quantization:
    """The default for ``device``; ``$DRAFTWATCH_QUANTIZE`` overrides it."""
    env = os.environ if environ is None else environ
    requested = env.get("DRAFTWATCH_QUANTIZE")
    if requested:
        return parse_quantization(requested)
    return DEFAULT_QUANTIZATION.get(device.type, "none")


def parse_quantization(value: str) -> Quantization:
    for mode in QUANTIZATIONS:
        if value == mode:
            return mode
    raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {value!r}")


@cache
def kernel_works(mode: Quantization, device_type: str, dtype: torch.dtype) -> str | None:
    """None when ``mode``'s kernel gives right answers on this device, else why not (checked once)."""
    try:
        check_kernel(mode, torch.device(device_type), dtype)
    except QuantizationError as error:
        return str(error)
    return None


def store_key(version: str, dtype: torch.dtype, mode: Quantization, group_size: int, head_mode: Quantization,
              device: torch.device) -> str:  # fmt: skip
    # Whether draftwatch's kernels pack int4 here (the packing of any input width a multiple of 64).
    packing = int4_packing(device, 64)
    parts = [version, str(dtype), mode, str(group_size), head_mode, device.type, packing, torch.__version__,
             str(FORMAT_VERSION)]  # fmt: skip
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def quantize_loaded(
    model: Any,
    version: str | None,
    mode: Quantization,
    device: torch.device,
    group_size: int = DEFAULT_GROUP_SIZE,
    head_mode: Quantization | None = None,
    progress: bool = False,
) -> None:
    """Quantize ``model`` in place, through the cache when the weights have a version to key it by.

    ``progress`` shows the quantization's progress bar (a cached model loads without one).
    """
    dtype = next(model.parameters()).dtype
    head_mode = HEAD_MODE[mode] if head_mode is None else head_mode
    path = None
    if version is not None:
        key = store_key(version, dtype, mode, group_size, head_mode, device)
        path = cache_dir() / "quantized" / f"{key}.safetensors"
        if path.is_file():
            try:
                _load_packed(model, path, device)
                return
            except (OSError, ValueError, KeyError, AttributeError, RuntimeError) as error:
                # A torn or foreign file: quantize again and overwrite it.
                logger.warning("ignoring unreadable quantized cache %s: %s", path, error)
    replaced = quantize_model(model, mode, group_size, head_mode, progress=progress)
    if path is not None:
        _save_packed(replaced, path)


def _save_packed(modules: dict[str, QuantizedLinear], path: Path) -> None:
    tensors: dict[str, torch.Tensor] = {}
    layout: dict[str, dict[str, Any]] = {}
    for name, module in modules.items():
        layout[name] = {"kind": module.kind, "in": module.in_features, "out": module.out_features,
                        "group": getattr(module, "group_size", 0),
                        "packing": getattr(module, "packing", "")}  # fmt: skip
        for buffer_name, buffer in module.named_buffers(recurse=False):
            tensors[f"{name}.{buffer_name}"] = buffer.detach().contiguous().cpu()
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    # Written aside and renamed: a reader (another process loading the same model) sees all or nothing.
    handle, staging = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    os.close(handle)
    try:
        save_file(tensors, staging, metadata={"layout": json.dumps(layout), "format": str(FORMAT_VERSION)})
        os.replace(staging, path)
    except OSError as error:
        logger.warning("could not cache the quantized model in %s: %s", path, error)
    finally:
        Path(staging).unlink(missing_ok=True)


def _load_packed(model: Any, path: Path, device: torch.device) -> None:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as handle:
        layout: dict[str, dict[str, Any]] = json.loads(handle.metadata()["layout"])
        # Copies that own their memory: the kernels must not read a view of the file once it is closed.
        tensors = {name: handle.get_tensor(name).clone() for name in handle.keys()}  # noqa: SIM118 (not a dict)
    modules: dict[str, QuantizedLinear] = {}
    for name, info in layout.items():
        model.get_submodule(name)  # the layer must exist (AttributeError otherwise)
        bias = tensors.get(f"{name}.bias")
        bias = bias.to(device) if bias is not None else None
        if info["kind"] == "int8":
            modules[name] = Int8Linear(tensors[f"{name}.weight_q"].to(device), tensors[f"{name}.scales"].to(device),
                                       bias)  # fmt: skip
        elif info["kind"] == "int4":
            modules[name] = Int4Linear(
                tensors[f"{name}.packed"].to(device), tensors[f"{name}.scales_and_zeros"].to(device), bias,
                int(info["in"]), int(info["out"]), int(info["group"]), info["packing"],
            )  # fmt: skip
        else:
            raise ValueError(f"unknown quantized layer kind {info['kind']!r}")
    # Swapped only once every layer was read, so a bad file leaves the float model untouched.
    for name, module in modules.items():
        set_submodule(model, name, module)
    if getattr(model.config, "tie_word_embeddings", False) and any(
        module is model.get_output_embeddings() for module in modules.values()
    ):
        model.config.tie_word_embeddings = False
