"""What the decoder benchmarks share: one timed request, and the runs of one method on one workload."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from decoder.drafters.base import Drafter
from decoder.models.loading import LoadedModel
from decoder.record import Mode
from decoder.speculation.controller import SpeculationController
from decoder.speculation.speculative import SpeculativeDecoder


@dataclass
class Outcome:
    """One timed request: wall seconds, the tokens it produced and what speculation did."""

    seconds: float
    tokens: list[int]
    accepted: int = 0
    drafted: int = 0
    steps: int = 0
    gamma: int = 0
    mode: str = "-"
    first_token_seconds: float = 0.0  # prefill: what the decode-only speed leaves out


class SpeculationColumns(NamedTuple):
    """A cell's speculation figures, formatted for the markdown tables ('' where they do not apply)."""

    acceptance: str
    mean_acceptance_length: str
    gamma: str
    modes: str
    greedy_equals_plain: str


@dataclass
class Cell:
    """Every outcome of one method on one workload (and weight format)."""

    outcomes: list[Outcome] = field(default_factory=list)
    mismatches: int = 0

    def tokens_per_second(self) -> float:
        """End to end, prefill included: what a caller waits for."""
        return statistics.median(len(o.tokens) / o.seconds for o in self.outcomes)

    def decode_tokens_per_second(self) -> float:
        """After the first token: the decode loop's own speed, comparable with llama.cpp's reported rate."""
        return statistics.median(
            (len(o.tokens) - 1) / (o.seconds - o.first_token_seconds)
            for o in self.outcomes
            if len(o.tokens) > 1 and o.seconds > o.first_token_seconds
        )

    def speculation_columns(self) -> SpeculationColumns:
        """Acceptance, mean acceptance length, mean γ, requests per mode and the greedy check, as table text."""
        drafted = sum(o.drafted for o in self.outcomes)
        accepted = sum(o.accepted for o in self.outcomes)
        steps = sum(o.steps for o in self.outcomes)
        gammas = [o.gamma for o in self.outcomes if o.mode == "speculative" and o.gamma]
        modes = Counter(o.mode for o in self.outcomes if o.mode != "-")
        return SpeculationColumns(
            f"{accepted / drafted:.2f}" if drafted else "",
            f"{1 + accepted / steps:.2f}" if steps else "",
            f"{statistics.mean(gammas):.1f}" if gammas else "",
            ", ".join(f"{mode} {count}" for mode, count in sorted(modes.items())),
            "yes" if self.mismatches == 0 else f"NO ({self.mismatches})",
        )


def decode_once(
    decoder: SpeculativeDecoder, prompt: str, workload: str, max_new_tokens: int, mode: Mode | None = None
) -> Outcome:
    """Decode ``prompt`` as a chat message through draftwatch and time it end to end."""
    started = time.perf_counter()
    result = decoder.generate(prompt, chat=True, workload=workload, max_new_tokens=max_new_tokens, mode=mode)
    record = result.record
    return Outcome(
        time.perf_counter() - started, result.token_ids, record.num_accepted_tokens, record.num_draft_tokens,
        record.num_spec_steps, record.num_speculative_tokens, record.mode, (record.ttft_ms or 0.0) / 1000,
    )  # fmt: skip


def controlled_decoder(target: LoadedModel, drafter: Drafter | Sequence[Drafter]) -> SpeculativeDecoder:
    """A decoder with a fresh controller whose pair costs are timed at start, as the sidecar does, not in a request.

    Several drafters make a portfolio: the controller picks one per request, each pair timed at start.
    """
    decoder = SpeculativeDecoder(target, drafter, controller=SpeculationController(seed=0))
    decoder.calibrate()  # logged by decoder.speculation.speculative at INFO
    return decoder
