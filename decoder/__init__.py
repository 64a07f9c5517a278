"""draftwatch's embedded speculative decoder: knows nothing about storage, hands records to a sink.

The public names load lazily, so that ``import decoder.record`` (all the monitor needs) does not
pay for importing torch and transformers.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from decoder.drafters import Drafter, ModelDrafter, NgramDrafter, Proposal
    from decoder.models.loading import LoadedModel, ModelLoadError, TokenizerMismatchError, check_pair, load_model
    from decoder.record import RecordError, RequestRecord, validate_workload
    from decoder.sampling import SamplingParams
    from decoder.speculation.controller import SpeculationController
    from decoder.speculation.speculative import GenerationResult, SpeculativeDecoder

_EXPORTS = {
    "Drafter": "decoder.drafters",
    "ModelDrafter": "decoder.drafters",
    "NgramDrafter": "decoder.drafters",
    "Proposal": "decoder.drafters",
    "LoadedModel": "decoder.models.loading",
    "ModelLoadError": "decoder.models.loading",
    "TokenizerMismatchError": "decoder.models.loading",
    "check_pair": "decoder.models.loading",
    "load_model": "decoder.models.loading",
    "RecordError": "decoder.record",
    "RequestRecord": "decoder.record",
    "validate_workload": "decoder.record",
    "SamplingParams": "decoder.sampling",
    "GenerationResult": "decoder.speculation.speculative",
    "SpeculativeDecoder": "decoder.speculation.speculative",
    "SpeculationController": "decoder.speculation.controller",
}

__all__ = [
    "Drafter",
    "GenerationResult",
    "LoadedModel",
    "ModelDrafter",
    "ModelLoadError",
    "NgramDrafter",
    "Proposal",
    "RecordError",
    "RequestRecord",
    "SamplingParams",
    "SpeculationController",
    "SpeculativeDecoder",
    "TokenizerMismatchError",
    "check_pair",
    "load_model",
    "validate_workload",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'decoder' has no attribute {name!r}")
