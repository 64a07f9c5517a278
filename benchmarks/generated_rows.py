"""What the store benchmarks' generators write into ``requests``: the model's columns but those they leave NULL."""

from __future__ import annotations

from monitor.store.models import RequestRow

# The key is the database's; error, prompt hash and holdout reason are optional; the decode time apart from
# queueing, the replica's load and state and an inferred mode are a proxy's figures, which the embedded decoder's
# records leave NULL (mode_inferred: its default, false).
LEFT_NULL = (
    "id", "error", "prompt_hash", "holdout_reason", "decode_ms", "upstream_inflight", "mode_inferred",
    "replica", "cached_prompt_tokens", "style_hash", "prompt_copy_share", "engine_version", "replica_uptime_s",
    "uptime_from", "kv_cache_use",
)  # fmt: skip
GENERATED_COLUMNS: tuple[str, ...] = tuple(c.name for c in RequestRow.__table__.columns if c.name not in LEFT_NULL)
# The span counts (drafted / accepted by output position): store_scale.py fills them, as the embedded decoder
# does; drift_speed.py, whose tests read no spans, leaves them NULL, as a serving stack's records do.
SPAN_COLUMNS = ("drafted_by_span", "accepted_by_span")
WITHOUT_SPANS: tuple[str, ...] = tuple(c for c in GENERATED_COLUMNS if c not in SPAN_COLUMNS)
