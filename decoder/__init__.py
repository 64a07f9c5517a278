"""draftwatch's embedded speculative decoder: knows nothing about storage, hands records to a sink."""

from decoder.record import RecordError, RequestRecord, validate_workload

__all__ = ["RecordError", "RequestRecord", "validate_workload"]
