"""What to set in the engine: each engine's own load cut-off for speculation, from a measured curve.

``upstream_inflight`` counts the requests a replica had in flight, which bounds its running batch
(a request queued inside the engine is in flight but not yet batched), so the cut-off is read as a
batch size: speculation on below the crossover's in-flight count C, off from C. Each engine's knob,
as its source declares it (the versions followed are named in ``source``):

* vLLM ``speculative_config.num_speculative_tokens_per_batch_size``: a list of inclusive
  ``[range_start, range_end, num_speculative_tokens]`` batch ranges, 0 turning speculation off
  (vllm/config/speculative.py, ``list[tuple[int, int, int]]``, vLLM PR #32374; a gap or the tail
  past the last range keeps the previous count).
* TensorRT-LLM ``speculative_config.max_concurrency`` (PyTorch back end): speculation is disabled at
  batch sizes above it; or ``draft_len_schedule``, ``{batch_size: draft_len}`` applying from each
  key up, which must hold ``{1: max_draft_len}`` (tensorrt_llm/llmapi/llm_args.py, DecodingBaseConfig).
* Arctic Inference ``speculative_config.disable_by_batch_size``: a soft cap, above it only the first
  N requests draft (default 64 for the arctic and suffix methods); ``hard_disable_by_batch_size``:
  no request drafts once the running batch reaches it (ArcticSpeculativeConfig.effective_draft_limit).
* SGLang ``--speculative-adaptive --speculative-adaptive-config FILE``: a JSON file whose digit keys
  are batch-size lower bounds (``[key, next key)``, the last one open), each holding
  ``{"candidate_steps": [...]}``, a slot of ``[0]`` keeping speculation off (SGLang PR #24055:
  python/sglang/srt/speculative/adaptive_spec_params.py ``_load_adaptive_config`` and
  adaptive_step_router.py, read at commit 015c872). SGLang rounds a batch up to its next captured
  CUDA-graph size before it picks the slot, and runs the adaptive mode only for EAGLE/EAGLE3 with
  topk 1 (otherwise it logs and keeps its static steps).

Where no level loses there is no cut-off to set ("none seen up to N": leave speculation on; above N
nothing was measured); where every level loses, the setting is off from batch 1.

>>> from monitor.drift.detectors.crossover import Crossover, Curve, Level
>>> levels = [Level(1, 2, 80, 60, 1.3, 1.2, 1.4), Level(3, 3, 50, 40, 0.8, 0.7, 0.9)]
>>> advice = engine_settings(Curve(levels, Crossover(4, 1, 7), "speculation loses from 4 in flight"))
>>> for a in advice[:3]:
...     print(a.engine, a.setting)
vllm "num_speculative_tokens_per_batch_size": [[1, 3, K], [4, 4, 0]]
tensorrt-llm "max_concurrency": 3
tensorrt-llm "draft_len_schedule": {"1": K, "4": 0}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from monitor.drift.detectors.crossover import Curve, Level

SOURCES: Final = {
    "vllm": "vllm/config/speculative.py SpeculativeConfig (vLLM PR #32374; K: your num_speculative_tokens)",
    "tensorrt-llm": "tensorrt_llm/llmapi/llm_args.py DecodingBaseConfig, PyTorch back end (K: your max_draft_len)",
    "arctic-inference": "arctic_inference ArcticSpeculativeConfig.effective_draft_limit",
    "sglang": "SGLang PR #24055 adaptive_spec_params.py _load_adaptive_config, commit 015c872; EAGLE/EAGLE3, topk 1 "
    "(K: your speculative_num_steps)",
}


@dataclass(frozen=True, slots=True)
class EngineSetting:
    engine: str
    setting: str
    meaning: str
    source: str

    def to_json(self) -> dict[str, str]:
        return {"engine": self.engine, "setting": self.setting, "meaning": self.meaning, "source": self.source}


def engine_settings(curve: Curve) -> list[EngineSetting]:
    """Each engine's setting for this curve; empty when no level was measured."""
    measured = curve.measured
    if not measured:
        return []
    if curve.crossover is not None:
        cut = curve.crossover.inflight
    elif all(level.family_loses for level in measured):
        cut = 1
    else:
        top = measured[-1].inflight_high
        said = f"speculation does not lose up to {top} in flight: leave it on (above {top} nothing was measured)"
        return [EngineSetting(engine, "no change", said, SOURCES[engine]) for engine in SOURCES]
    on = f"speculation on up to batch {cut - 1}, off from {cut}" if cut > 1 else "speculation off at every batch size"
    rows = [
        ("vllm", f'"num_speculative_tokens_per_batch_size": {_vllm(cut)}'),
        ("tensorrt-llm", f'"max_concurrency": {cut - 1}' if cut > 1 else '"max_concurrency": 0'),
        ("tensorrt-llm", f'"draft_len_schedule": {{"1": K, "{cut}": 0}}' if cut > 1 else '"draft_len_schedule": n/a'),
        ("arctic-inference", f'"hard_disable_by_batch_size": {cut}'),
        ("arctic-inference", f'"disable_by_batch_size": {max(cut - 1, 1)}'),
        (
            "sglang",
            "--speculative-adaptive --speculative-adaptive-config FILE, FILE holding "
            f'{{"1": {{"candidate_steps": [K]}}, "{cut}": {{"candidate_steps": [0]}}}}',
        ),
    ]
    if cut == 1:
        rows[3:] = [
            ("arctic-inference", '"hard_disable_by_batch_size": 1'),
            ("sglang", "serve without --speculative-algorithm"),
        ]
    soft = f"a soft cap: above batch {max(cut - 1, 1)} only that many requests draft; the hard one above turns it off"
    padded = (
        f"{on}; SGLang pads a batch up to its next captured CUDA-graph size before choosing: make {cut} one of them "
        "(--cuda-graph-bs), or a batch just below it is padded past it and loses speculation early"
    )

    def meaning(setting: str) -> str:
        return soft if '"disable_by' in setting else padded if "candidate_steps" in setting else on

    return [EngineSetting(engine, setting, meaning(setting), SOURCES[engine]) for engine, setting in rows]


def _vllm(cut: int) -> str:
    return f"[[1, {cut - 1}, K], [{cut}, {cut}, 0]]" if cut > 1 else "[[1, 1, 0]]"


def evidence(curve: Curve) -> list[dict[str, Any]]:
    """The levels the setting stands on: the last that did not lose before the cut and the first that lost."""
    cross = curve.crossover
    if cross is None:
        return [_said(level) for level in curve.measured]
    return [_said(level) for level in curve.measured if cross.low <= level.inflight_low <= cross.high]


def _said(level: Level) -> dict[str, Any]:
    return {k: v for k, v in level.to_json().items() if k != "note"}
