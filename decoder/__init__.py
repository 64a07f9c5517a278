"""draftwatch's embedded speculative decoder: knows nothing about storage, hands records to a sink."""

from decoder.drafters import Drafter, ModelDrafter, NgramDrafter, Proposal
from decoder.loading import LoadedModel, ModelLoadError, TokenizerMismatchError, check_pair, load_model
from decoder.record import RecordError, RequestRecord, validate_workload
from decoder.sampling import SamplingParams
from decoder.speculative import GenerationResult, SpeculativeDecoder

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
    "SpeculativeDecoder",
    "TokenizerMismatchError",
    "check_pair",
    "load_model",
    "validate_workload",
]
