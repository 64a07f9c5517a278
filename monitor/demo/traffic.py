"""What the demo's requests showed, per workload: acceptance and decode speed, for its progress bar and summary."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from decoder.record import decode_ms_per_token

# One holdout request is one prompt's decode speed; two make the summary's speedup less of an anecdote.
MIN_HOLDOUTS: Final = 2


@dataclass
class Traffic:
    """Per-workload acceptance and decode speed of the requests the demo sent, for the progress bar and summary."""

    accepted: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    drafted: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    requests: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # Speculative requests are the drift test's evidence on acceptance (holdout and plain ones draft nothing).
    speculative: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # (workload, mode) -> [sum of per-request decode ms per token, requests that have one]
    decode: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0]))

    def add(self, workload: str, record: dict[str, Any]) -> None:
        self.requests[workload] += 1
        self.accepted[workload] += int(record["num_accepted_tokens"])
        self.drafted[workload] += int(record["num_draft_tokens"])
        self.speculative[workload] += record["mode"] == "speculative"
        ms = decode_ms_per_token(record["latency_ms"], record["ttft_ms"], int(record["output_tokens"]))
        if ms is not None:
            spent = self.decode[(workload, record["mode"])]
            spent[0] += ms
            spent[1] += 1

    def acceptance(self, workload: str) -> float | None:
        return self.accepted[workload] / self.drafted[workload] if self.drafted[workload] else None

    def speedup(self, workload: str) -> float | None:
        """Mean decode ms per token of holdout requests over that of speculative ones; None until both modes
        have one. Prompt reading (TTFT) is left out: it is the same work in both modes, and the prompts'
        lengths differ."""
        held, spec = self.decode.get((workload, "holdout")), self.decode.get((workload, "speculative"))
        if not held or not held[1] or not spec or not spec[1]:
            return None
        return (held[0] / held[1]) / (spec[0] / spec[1])

    def timed(self, workload: str, mode: str) -> int:
        """Requests of ``workload`` in ``mode`` with a decode time per token, the speedup's evidence."""
        return int(self.decode[(workload, mode)][1]) if (workload, mode) in self.decode else 0

    def unmeasured(self, workloads: Sequence[str], holdouts: int = MIN_HOLDOUTS) -> list[str]:
        """The ``workloads`` whose speedup lacks evidence: fewer than ``holdouts`` timed holdout requests,
        or no timed speculative one."""
        return [w for w in workloads if self.timed(w, "holdout") < holdouts or not self.timed(w, "speculative")]

    def since(self, earlier: Traffic) -> Traffic:
        """The traffic added after ``earlier`` was copied from this one."""
        out = Traffic()
        for name in ("accepted", "drafted", "requests", "speculative"):
            mine, theirs = getattr(self, name), getattr(earlier, name)
            getattr(out, name).update({k: v - theirs.get(k, 0) for k, v in mine.items()})
        for key, (ms, count) in self.decode.items():
            old = earlier.decode.get(key, [0.0, 0.0])
            out.decode[key] = [ms - old[0], count - old[1]]
        return out

    def copy(self) -> Traffic:
        return self.since(Traffic())

    def line(self) -> str:
        return " ".join(
            f"{w}={self.accepted[w] / self.drafted[w]:.2f}" if self.drafted[w] else f"{w}=n/a"
            for w in sorted(self.requests)
        )
