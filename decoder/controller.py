"""The speculation controller: per workload, how far to speculate, and whether to speculate at all.

It keeps, per workload, exponentially forgotten sums of what the decoder measured and plugs them
into the expected speedup of Leviathan et al. (2023), extended with the verification cost:

    S(gamma) = (1 - alpha^(gamma + 1)) / ((1 - alpha) * (gamma * c + v(gamma)))

* ``alpha``: the chance that the target accepts a draft token, estimated as accepted drafts over
  drafts the target actually judged (a step stops judging at its first rejection, so dividing by
  all drafted tokens would understate it);
* ``c``: the time of one draft token over the time of a one-token target pass ``t1``;
* ``v(gamma)``: a verification pass over gamma drafts relative to ``t1``, measured per pass size
  where passes of that size were seen, else ``1 + gamma * b / t1`` with ``b`` the measured extra
  target time per verified draft. Near 1 on a GPU with spare compute; on a CPU with 4-bit weights
  it is neither small nor linear (PyTorch's int4 kernel works in blocks of 4 rows: a pass over 5
  tokens cost 2.8 one-token passes where 4 tokens cost 1.5), which is why sizes are kept apart.
* ``t1`` is measured on one-token passes. A model drafter drafts on every step, so a request the
  controller marks ``calibrate`` runs its first step without drafts to measure it.

The numerator is the expected tokens per step, the denominator its cost in one-token target
passes; ``S < 1`` means speculation would be slower than plain decoding, and it is switched off
for that workload, with a probe now and then so that recovery is noticed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

PlanMode = Literal["speculative", "plain", "holdout"]
MIN_WEIGHT = 0.5  # forgotten sums below this many passes count as not measured


@dataclass(frozen=True, slots=True)
class Plan:
    """What the next request of a workload should do."""

    mode: PlanMode
    gamma: int
    expected_speedup: float
    calibrate: bool = False  # run the first step without drafts: t1 has not been measured lately


@dataclass(frozen=True, slots=True)
class Observation:
    """What one request measured, in the units the controller keeps."""

    accepted: int = 0  # accepted drafts
    judged: int = 0  # drafts the target judged: accepted ones plus one per step that rejected
    draft_tokens: int = 0
    draft_ms: float = 0.0
    verify_passes: int = 0  # verification passes that carried at least one draft
    verify_drafts: int = 0  # drafts carried by those passes
    verify_ms: float = 0.0
    single_passes: int = 0  # one-token target passes (plain decoding, or steps without drafts)
    single_ms: float = 0.0
    sized_passes: Mapping[int, int] = field(default_factory=dict)  # verification passes by drafts carried
    sized_ms: Mapping[int, float] = field(default_factory=dict)  # their time by drafts carried


@dataclass(slots=True)
class WorkloadState:
    """Exponentially forgotten sums for one workload; every figure the formula needs derives from them."""

    accepted: float = 0.0
    judged: float = 0.0
    draft_tokens: float = 0.0
    draft_ms: float = 0.0
    verify_passes: float = 0.0
    verify_drafts: float = 0.0
    verify_ms: float = 0.0
    single_passes: float = 0.0
    single_ms: float = 0.0
    sized_passes: dict[str, float] = field(default_factory=dict)  # keys: drafts carried, as text (JSON keys)
    sized_ms: dict[str, float] = field(default_factory=dict)
    requests: int = 0
    plain_streak: int = 0  # plain requests since the last speculative one
    gamma: int = 0
    mode: PlanMode = "speculative"


@dataclass(slots=True)
class Priors:
    """Starting values before anything is measured (then replaced by measurements, at ``weight`` requests' worth)."""

    alpha: float = 0.6
    c: float = 0.3
    b_over_t1: float = 0.05
    weight: float = 1.0


class SpeculationController:
    """Choose gamma in ``[1, gamma_max]`` and the mode per workload from the decoder's own measurements.

    Parameters
    ----------
    gamma_max : int
        Largest number of drafts per step.
    forgetting : float
        Share of the old sums forgotten per observed request, in ``(0, 1]``; larger follows drift faster.
    holdout_share : float
        Share of requests decoded without speculation and recorded as ``holdout`` (control traffic).
    probe_every : int
        While speculation is off for a workload, every ``probe_every``-th request speculates anyway.
    seed : int
        Seeds the holdout draws, so a run is reproducible.

    Examples
    --------
    >>> controller = SpeculationController(gamma_max=8, seed=0)
    >>> for _ in range(20):  # a drafter that is nearly always right and nearly free
    ...     controller.observe("code-edit", Observation(accepted=90, judged=100, draft_tokens=100,
    ...         draft_ms=10, verify_passes=25, verify_drafts=100, verify_ms=2600, single_passes=5, single_ms=500))
    >>> controller.plan("code-edit").gamma >= 6
    True
    >>> for _ in range(20):  # a drafter that is always wrong and costs half a target pass
    ...     controller.observe("prose", Observation(accepted=0, judged=25, draft_tokens=100, draft_ms=5000,
    ...         verify_passes=25, verify_drafts=100, verify_ms=3000, single_passes=5, single_ms=500))
    >>> controller.plan("prose").mode
    'plain'
    """

    def __init__(
        self,
        gamma_max: int = 8,
        forgetting: float = 0.1,
        holdout_share: float = 0.0,
        probe_every: int = 10,
        seed: int = 0,
        priors: Priors | None = None,
    ) -> None:
        if not 1 <= gamma_max <= 32:
            raise ValueError(f"gamma_max must be in 1..32, got {gamma_max!r}")
        if not 0 < forgetting <= 1:
            raise ValueError(f"forgetting must be in (0, 1], got {forgetting!r}")
        if not 0 <= holdout_share <= 1:
            raise ValueError(f"holdout_share must be in [0, 1], got {holdout_share!r}")
        if probe_every < 1:
            raise ValueError(f"probe_every must be >= 1, got {probe_every!r}")
        self.gamma_max = gamma_max
        self.forgetting = forgetting
        self.holdout_share = holdout_share
        self.probe_every = probe_every
        self.seed = seed
        self.priors = priors or Priors()
        self._rng = random.Random(seed)
        self._workloads: dict[str, WorkloadState] = {}

    # Estimates

    def estimates(self, workload: str) -> dict[str, float]:
        """alpha, c, b/t1 and t1 (ms) for ``workload``: measurements blended with the priors."""
        state = self._state(workload)
        prior = self.priors
        alpha = (state.accepted + prior.alpha * prior.weight) / (state.judged + prior.weight)
        t1 = measured_t1 = self._single_pass_ms(state)
        if math.isnan(t1) and state.verify_passes:
            # No one-token pass seen yet: read t1 off the verification passes with the prior slope.
            per_pass = state.verify_ms / state.verify_passes
            t1 = per_pass / (1 + prior.b_over_t1 * state.verify_drafts / state.verify_passes)
        c, b_over_t1 = prior.c, prior.b_over_t1
        if not math.isnan(t1) and t1 > 0:
            if state.draft_tokens:
                c = (state.draft_ms / state.draft_tokens) / t1
            if state.verify_passes and not math.isnan(measured_t1):
                extra_per_draft = (state.verify_ms / state.verify_passes - t1) / (
                    state.verify_drafts / state.verify_passes
                )
                b_over_t1 = max(0.0, extra_per_draft / t1)
        return {"alpha": min(alpha, 1.0), "c": c, "b_over_t1": b_over_t1, "t1_ms": t1}

    def verification_cost(self, workload: str, gamma: int, estimates: Mapping[str, float] | None = None) -> float:
        """v(gamma): a pass over gamma drafts in one-token passes, measured at that size where seen."""
        state = self._state(workload)
        e = self.estimates(workload) if estimates is None else estimates
        passes = state.sized_passes.get(str(gamma), 0.0)
        if passes >= MIN_WEIGHT and e["t1_ms"] > 0:
            return max(1.0, state.sized_ms[str(gamma)] / passes / e["t1_ms"])
        return 1.0 + gamma * e["b_over_t1"]

    def expected_speedup(self, workload: str, gamma: int) -> float:
        """S(gamma) for ``workload`` from the current estimates."""
        e = self.estimates(workload)
        return expected_speedup(e["alpha"], e["c"], e["b_over_t1"], gamma, self.verification_cost(workload, gamma, e))

    def best_gamma(self, workload: str) -> tuple[int, float]:
        e = self.estimates(workload)
        speedups = {
            g: expected_speedup(e["alpha"], e["c"], e["b_over_t1"], g, self.verification_cost(workload, g, e))
            for g in range(1, self.gamma_max + 1)
        }
        gamma = max(speedups, key=lambda g: (speedups[g], -g))
        return gamma, speedups[gamma]

    def _single_pass_ms(self, state: WorkloadState) -> float:
        """t1: this workload's one-token passes, else every workload's (t1 belongs to the target), else NaN."""
        if state.single_passes >= MIN_WEIGHT:
            return state.single_ms / state.single_passes
        passes = sum(s.single_passes for s in self._workloads.values())
        return sum(s.single_ms for s in self._workloads.values()) / passes if passes > 0 else math.nan

    # Decisions

    def plan(self, workload: str) -> Plan:
        """The mode and gamma for the next request of ``workload``."""
        state = self._state(workload)
        gamma, speedup = self.best_gamma(workload)
        if self.holdout_share and self._rng.random() < self.holdout_share:
            return Plan("holdout", gamma, speedup)
        if speedup >= 1.0:
            state.mode, state.gamma = "speculative", gamma
            return Plan("speculative", gamma, speedup, calibrate=state.single_passes < MIN_WEIGHT)
        state.mode, state.gamma = "plain", gamma
        if state.plain_streak + 1 >= self.probe_every:
            return Plan("speculative", gamma, speedup)  # a probe: has the drafter recovered?
        return Plan("plain", gamma, speedup)

    def observe(self, workload: str, observation: Observation, mode: PlanMode = "speculative") -> None:
        """Fold one finished request into the workload's sums, forgetting a share of the old ones."""
        state = self._state(workload)
        keep = 1.0 - self.forgetting
        for name in (
            "accepted", "judged", "draft_tokens", "draft_ms", "verify_passes",
            "verify_drafts", "verify_ms", "single_passes", "single_ms",
        ):  # fmt: skip
            setattr(state, name, keep * getattr(state, name) + getattr(observation, name))
        for sums, new in ((state.sized_passes, observation.sized_passes), (state.sized_ms, observation.sized_ms)):
            for key in sums:
                sums[key] *= keep
            for drafts, value in new.items():
                sums[str(drafts)] = sums.get(str(drafts), 0.0) + value
        state.requests += 1
        state.plain_streak = state.plain_streak + 1 if mode != "speculative" else 0

    # State

    def state(self) -> dict[str, Any]:
        """Everything needed to resume: settings, the random generator and each workload's sums."""
        return {
            "gamma_max": self.gamma_max,
            "forgetting": self.forgetting,
            "holdout_share": self.holdout_share,
            "probe_every": self.probe_every,
            "seed": self.seed,
            "priors": asdict(self.priors),
            "rng": _encode_rng(self._rng.getstate()),
            "workloads": {name: asdict(state) for name, state in self._workloads.items()},
        }

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> SpeculationController:
        controller = cls(
            gamma_max=data["gamma_max"],
            forgetting=data["forgetting"],
            holdout_share=data["holdout_share"],
            probe_every=data["probe_every"],
            seed=data["seed"],
            priors=Priors(**data["priors"]),
        )
        controller._rng.setstate(_decode_rng(data["rng"]))
        controller._workloads = {name: WorkloadState(**values) for name, values in data["workloads"].items()}
        return controller

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per workload: the estimates, gamma, mode and expected speedup, for logs and dashboards."""
        out: dict[str, dict[str, Any]] = {}
        for name, state in self._workloads.items():
            gamma, speedup = self.best_gamma(name)
            out[name] = {**self.estimates(name), "gamma": gamma, "expected_speedup": speedup,
                         "mode": state.mode, "requests": state.requests}  # fmt: skip
        return out

    def _state(self, workload: str) -> WorkloadState:
        return self._workloads.setdefault(workload, WorkloadState())


def expected_speedup(alpha: float, c: float, b_over_t1: float, gamma: int, v: float | None = None) -> float:
    """Expected tokens per step over the step's cost in one-token target passes.

    ``v`` is the verification pass's measured cost; without it, ``1 + gamma * b_over_t1``.

    >>> round(expected_speedup(0.8, 0.05, 0.0, 4), 3)   # Leviathan et al.'s formula when v = 1
    2.801
    >>> expected_speedup(0.0, 0.5, 0.1, 3) < 1   # useless, costly drafts: a net loss
    True
    >>> expected_speedup(0.7, 0.0, 0.1, 4, v=2.8) < 1 < expected_speedup(0.7, 0.0, 0.1, 3, v=1.5)
    True
    """
    tokens_per_step = gamma + 1.0 if alpha >= 1.0 else (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)
    cost = gamma * c + (1.0 + gamma * b_over_t1 if v is None else v)
    return tokens_per_step / cost


def _encode_rng(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _decode_rng(data: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = data
    return (version, tuple(internal), gauss)
