"""What the store benchmarks' generators write into ``requests``: the model's columns but those they leave NULL."""

from __future__ import annotations

from monitor.store.models import RequestRow

# The key is the database's; error, prompt hash and holdout reason are optional; generated records,
# like a serving stack's, do not know output positions.
LEFT_NULL = ("id", "error", "prompt_hash", "holdout_reason", "drafted_by_span", "accepted_by_span")
GENERATED_COLUMNS: tuple[str, ...] = tuple(c.name for c in RequestRow.__table__.columns if c.name not in LEFT_NULL)
