"""draftwatch's own CPU kernels, built on first use: the int8 and int4 linear layers (cpu_linear.cpp),
and RMSNorm and one-row attention (cpu_layers.cpp, used by decoder/cpu/fused_norms.py and decoder/cpu/attention.py).

The kernels are compiled once per machine and torch version with PyTorch's C++ extension builder
(g++ and ninja) into the draftwatch cache, which takes about a minute; later processes load the
built library in milliseconds. They need an x86-64 CPU with AVX2 and FMA. Where that, or the
compiler, is missing, :func:`cpu_kernels` returns None, says why once in the log, and the
quantized layers use PyTorch's own kernels instead (``_weight_int8pack_mm``,
``_weight_int4pack_mm_for_cpu``): slower, equally row-stable. The int4 packing follows the
choice (decoder/cpu/quantize.py: ``int4_packing``), and the quantized cache is keyed by it.
``DRAFTWATCH_CPU_KERNELS=0`` turns them off.
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name(name) for name in ("cpu_linear.cpp", "cpu_layers.cpp")]
FLAGS = ["-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp"]  # no fast-math: rows must not depend on M


def _cpu_has_avx2_fma() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    return "avx2" in flags and "fma" in flags


def _put_ninja_on_path() -> None:
    """PyTorch's builder runs ``ninja`` from PATH; the pip package's copy sits beside the interpreter."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:
        return  # the build then fails with PyTorch's own message, which says to install ninja
    os.environ["PATH"] = os.pathsep.join([str(ninja.BIN_DIR), os.environ.get("PATH", "")])


@cache
def cpu_kernels() -> Any | None:
    """The compiled module (``int8_linear``, ``int4_linear``, ``rms_norm``, ``attend_one_row``), or None here."""
    if os.environ.get("DRAFTWATCH_CPU_KERNELS", "1") == "0":
        logger.info("DRAFTWATCH_CPU_KERNELS=0: quantized layers use PyTorch's kernels")
        return None
    if not _cpu_has_avx2_fma():
        logger.info("this CPU lacks AVX2/FMA: quantized layers use PyTorch's kernels")
        return None
    from torch.utils.cpp_extension import load

    from decoder.models.fetch import cache_dir

    _put_ninja_on_path()
    build = cache_dir() / "kernels" / f"torch-{torch.__version__}"
    build.mkdir(parents=True, exist_ok=True)
    if not any(build.glob("*.so")):
        logger.info("compiling decoder/kernels into %s (once per machine and torch version, about a minute)", build)
    try:
        return load(
            name="draftwatch_cpu_linear",
            sources=[str(source) for source in SOURCES],
            extra_cflags=FLAGS,
            extra_ldflags=["-fopenmp"],
            build_directory=str(build),
            verbose=False,
        )
    except (RuntimeError, OSError, ImportError) as error:  # no compiler, no ninja, a failed build
        logger.warning("draftwatch's CPU kernels could not be built (%s); using PyTorch's kernels", error)
        return None


def kernels_for(device: torch.device) -> Any | None:
    """:func:`cpu_kernels` when ``device`` is a CPU, else None: what every caller on a device asks."""
    return cpu_kernels() if device.type == "cpu" else None


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q (N, K) integers in 0..15, K a multiple of 64 -> (N, K / 2) uint8, the layout of cpu_linear.cpp.

    Each 64 weights become 16 little-endian uint16 words: word j < 8 holds weights j, 8 + j,
    16 + j and 24 + j in its four nibbles, word 8 + j weights 32 + j, 40 + j, 48 + j and 56 + j.
    One load and masks and shifts then give the kernel 16 weights at a time whose two 128-bit
    halves come from the block's two halves (two groups of 32, side by side in one vector).
    """
    n, k = q.shape
    runs = q.to(torch.int32).reshape(n, k // 64, 2, 4, 8)  # (N, blocks, half, run, j)
    nibbles = runs[:, :, :, 0] | (runs[:, :, :, 1] << 4) | (runs[:, :, :, 2] << 8) | (runs[:, :, :, 3] << 12)
    words = nibbles.reshape(n, k // 64, 16)  # (N, blocks, word)
    low, high = (words & 0xFF).to(torch.uint8), (words >> 8).to(torch.uint8)
    return torch.stack([low, high], dim=3).reshape(n, k // 2).contiguous()
