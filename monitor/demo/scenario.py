"""What the demo does: which models, which workloads, and the real change that hurts one of them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from decoder.workloads import builtin_workloads

if TYPE_CHECKING:
    from decoder.candidate import Candidate
    from decoder.speculation.speculative import SpeculativeDecoder


@dataclass(frozen=True, slots=True)
class Scenario:
    """One demo run's plan. Durations are seconds."""

    name: str
    target: str
    drafter_arguments: tuple[str, ...]  # ``draftwatch serve``'s: what drafts for the target
    workloads: tuple[str, ...]
    changed: str  # the workload whose prompts change midway
    max_new_tokens: int
    before_seconds: float  # at least this long before the change, so the reference window has data
    min_per_window: int  # requests per workload and window before a drift test speaks
    after_timeout: float  # how long to keep sending changed traffic while waiting for the alert
    drift_interval: str
    # The drift run's current window: long enough to hold min_per_window speculative requests of the
    # changed workload at the pair's speed, short enough that the traffic before the change leaves it soon.
    current_window: str
    # ``demo --rollout``'s candidate drafter (serve --candidate-drafter) and the name its requests are stored under.
    candidate: str
    candidate_name: str
    # The rollout's step length at the pair's speed (monitor/demo/rollout.py), and how long the act may take
    # before the demo gives up on it.
    rollout_interval: str
    rollout_timeout: float

    @property
    def drafter(self) -> str:
        """What drafts, in words: the n-gram drafter, a draft model's name, or both."""
        names = [value for flag, value in zip(self.drafter_arguments[::2], self.drafter_arguments[1::2], strict=True)
                 if flag in ("--draft", "--drafter")]  # fmt: skip
        return " and ".join("the n-gram drafter" if name == "ngram" else name for name in names)

    @property
    def model_arguments(self) -> tuple[str, ...]:
        """The pair as ``draftwatch serve`` takes it; the demo's own preparation parses the same."""
        return ("--target", self.target, *self.drafter_arguments)

    @property
    def change_description(self) -> str:
        return (
            f"workload '{self.changed}' changes style: its prompts stop asking to copy sentences out of a "
            "given text and ask for open-ended stories, essays and letters instead, so the drafter has "
            "little left to predict"
        )

    def decoder(self, progress: bool = True, candidate: Candidate | None = None) -> SpeculativeDecoder:
        """The decoder ``draftwatch serve`` builds from :attr:`model_arguments` (and ``--candidate-drafter``)."""
        from decoder.cli import add_model_arguments, build_decoder

        parser = argparse.ArgumentParser(add_help=False)
        add_model_arguments(parser)
        return build_decoder(parser.parse_args(self.model_arguments), progress=progress, candidate=candidate)

    def prompts(self, workload: str, changed: bool) -> list[str]:
        """The prompts of ``workload``, before or after the change."""
        prompts = builtin_workloads()
        if changed and workload == self.changed:
            return prompts["prose"]
        return prompts[workload]


QUICK = Scenario(
    name="quick",
    target="smollm2-135m",
    drafter_arguments=("--drafter", "ngram"),
    workloads=("code-edit", "extract", "prose"),
    changed="extract",
    max_new_tokens=32,
    before_seconds=70.0,
    min_per_window=10,
    after_timeout=150.0,
    drift_interval="10s",
    current_window="2m",
    # The target as its own draft model: every draft costs a target pass, so its controller arm decodes
    # plain; slower than the n-gram drafter where prompt lookup pays (extract, code-edit), as fast elsewhere.
    candidate="model:smollm2-135m",
    candidate_name="self-draft",
    rollout_interval="30s",
    rollout_timeout=300.0,
)

# A portfolio: the n-gram drafter pays on a CPU where the 0.5B draft model costs more than it saves
# (benchmarks/RESULTS.md, "Decoder speed": n-gram 1.42x plain on extract, the 0.5B draft 1.01x), so
# the controller serves with the n-gram drafter where it pays and probes the draft model now and then.
FULL = Scenario(
    name="full",
    target="qwen-coder-1.5b",
    drafter_arguments=("--draft", "qwen-coder-0.5b", "--drafter", "ngram"),
    workloads=("code-edit", "extract", "prose"),
    changed="extract",
    # As in the quick run: a request costs its prompt's prefill plus about one pass per new token,
    # and the drift test needs the changed workload's requests soon after the change.
    max_new_tokens=32,
    before_seconds=100.0,
    min_per_window=6,
    after_timeout=300.0,
    drift_interval="20s",
    # With other work on this 2-core machine a request took 9-12 s, and 2 minutes held only 4
    # speculative extract requests (fewer than min_per_window): no test spoke, no alert came.
    current_window="3m",
    # The draft model alone, without the n-gram drafter: 0.45x the portfolio's decode speed on extract and
    # 1.03x on prose (benchmarks/RESULTS.md, "Rollout on the Qwen pair").
    candidate="model:qwen-coder-0.5b",
    candidate_name="draft-only",
    rollout_interval="1m",
    rollout_timeout=600.0,
)
