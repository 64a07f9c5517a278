"""The speculation controller: per workload, how far to speculate, and whether to speculate at all.

It keeps exponentially forgotten sums of what the decoder measured and plugs them into the
expected speedup of Leviathan et al. (2023), extended with the verification cost:

    S(gamma) = (1 - alpha^(gamma + 1)) / ((1 - alpha) * (gamma * c + v(gamma)))

* ``alpha``: the chance that the target accepts a draft token, estimated per workload as accepted
  drafts over drafts the target actually judged (a step stops judging at its first rejection, so
  dividing by all drafted tokens would understate it);
* ``c``: the time of one draft token over the time of a one-token target pass ``t1``;
* ``v(gamma)``: a verification pass over gamma drafts relative to ``t1``, measured per pass size
  where passes of that size were seen, else ``1 + gamma * b / t1`` with ``b`` the measured extra
  target time per verified draft. Near 1 on a GPU with spare compute; on a CPU with 4-bit weights
  it is neither small nor linear (PyTorch's int4 kernel works in blocks of 4 rows: a pass over 5
  tokens cost 2.8 one-token passes where 4 tokens cost 1.5), which is why sizes are kept apart.
* ``t1`` is measured on one-token passes. A model drafter drafts on every step, so a request the
  controller marks ``measure_t1`` runs its first step without drafts to measure it.

Before the first request, the decoder times the pair's passes on a fixed text
(decoder/calibration.py) and hands them to :meth:`SpeculationController.calibrate`, so even the
first request of a pair that cannot pay is planned plain, rather than speculating to find out.

``c``, ``v`` and ``t1`` are properties of the model pair, so all workloads share one set of cost
sums (:class:`PairCosts`); only ``alpha`` is kept per workload (:class:`WorkloadState`).

The numerator is the expected tokens per step, the denominator its cost in one-token target
passes. A model drafter also reads the prompt once per request (its prefill), a cost that does
not scale with the steps: a request of ``T`` output tokens pays ``D`` one-token passes for it, so
the request as a whole runs at ``1 / (1 / S + D / T)`` times plain decoding; ``D`` is measured per
prompt token and ``T`` is the workload's mean output length, at most the request's
``max_new_tokens``. Below 1, speculation would be slower than plain decoding, and it is switched off
for that workload, with a probe now and then so that recovery is noticed. A request re-plans
every few steps with what it has measured so far (:meth:`SpeculationController.replan`), so a
losing first request or probe stops drafting early instead of paying for a whole request.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from decoder.holdout import Holdout, HoldoutPolicy, HoldoutReason
from decoder.record import Mode

MIN_WEIGHT = 0.5  # forgotten sums below this many passes count as not measured


@dataclass(frozen=True, slots=True)
class Plan:
    """What the next request of a workload should do."""

    mode: Mode
    gamma: int
    expected_speedup: float
    measure_t1: bool = False  # run the first step without drafts: t1 has not been measured lately
    holdout_reason: HoldoutReason | None = None  # why a holdout request was held out (decoder/holdout.py)


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
    draft_prefill_tokens: int = 0  # prompt tokens the drafter read when the request began
    draft_prefill_ms: float = 0.0  # and how long that took (not in draft_ms)
    output_tokens: int = 0


@dataclass(slots=True)
class Priors:
    """Starting values before anything is measured (then replaced by measurements, at ``weight`` requests' worth)."""

    alpha: float = 0.6
    c: float = 0.3
    b_over_t1: float = 0.05
    weight: float = 1.0


COST_SUMS = (
    "draft_tokens", "draft_ms", "verify_passes", "verify_drafts", "verify_ms", "single_passes", "single_ms",
    "draft_prefill_tokens", "draft_prefill_ms",
)  # fmt: skip


@dataclass(slots=True)
class PairCosts:
    """Exponentially forgotten sums of what the passes cost: c, b, v(k) and t1 derive from them.

    Costs belong to the target and drafter, not to the text, so every workload shares one set: a
    workload seen for the first time is planned with what the others measured, and does not pay
    for its own calibration.
    """

    draft_tokens: float = 0.0
    draft_ms: float = 0.0
    verify_passes: float = 0.0
    verify_drafts: float = 0.0
    verify_ms: float = 0.0
    single_passes: float = 0.0
    single_ms: float = 0.0
    sized_passes: dict[str, float] = field(default_factory=dict)  # keys: drafts carried, as text (JSON keys)
    sized_ms: dict[str, float] = field(default_factory=dict)
    draft_prefill_tokens: float = 0.0
    draft_prefill_ms: float = 0.0

    def fold(self, observation: Observation, keep: float) -> None:
        """Keep a share ``keep`` of the old sums and add what ``observation`` measured."""
        for name in COST_SUMS:
            setattr(self, name, keep * getattr(self, name) + getattr(observation, name))
        for sums, new in ((self.sized_passes, observation.sized_passes), (self.sized_ms, observation.sized_ms)):
            for key in sums:
                sums[key] *= keep
            for drafts, value in new.items():
                sums[str(drafts)] = sums.get(str(drafts), 0.0) + value

    def terms(self, prior: Priors) -> dict[str, float]:
        """c, b/t1, t1 (ms) and the drafter's prefill per prompt token (over t1) from the sums.

        The priors stand in for c and b/t1 where they were not measured; an unmeasured prefill counts as free.
        """
        t1 = measured_t1 = self.single_ms / self.single_passes if self.single_passes > 0 else math.nan
        if math.isnan(t1) and self.verify_passes:
            # No one-token pass seen yet: read t1 off the verification passes with the prior slope.
            t1 = (self.verify_ms / self.verify_passes) / (1 + prior.b_over_t1 * self.verify_drafts / self.verify_passes)
        c, b_over_t1 = prior.c, prior.b_over_t1
        if not math.isnan(t1) and t1 > 0:
            if self.draft_tokens:
                c = (self.draft_ms / self.draft_tokens) / t1
            if self.verify_passes and not math.isnan(measured_t1):
                drafts_per_pass = self.verify_drafts / self.verify_passes
                b_over_t1 = max(0.0, (self.verify_ms / self.verify_passes - t1) / drafts_per_pass / t1)
        prefill = 0.0
        if self.draft_prefill_tokens and not math.isnan(t1) and t1 > 0:
            prefill = self.draft_prefill_ms / self.draft_prefill_tokens / t1
        return {"c": c, "b_over_t1": b_over_t1, "t1_ms": t1, "prefill_per_token": prefill}

    def verification_cost(self, gamma: int, terms: Mapping[str, float]) -> float:
        """v(gamma) in one-token passes: measured at this pass size where seen, else ``1 + gamma * b / t1``."""
        passes = self.sized_passes.get(str(gamma), 0.0)
        if passes >= MIN_WEIGHT and terms["t1_ms"] > 0:
            return max(1.0, self.sized_ms[str(gamma)] / passes / terms["t1_ms"])
        return 1.0 + gamma * terms["b_over_t1"]

    def plus(self, observation: Observation) -> PairCosts:
        """A copy with ``observation`` added and nothing forgotten: the view from inside a running request."""
        merged = replace(self, sized_passes=dict(self.sized_passes), sized_ms=dict(self.sized_ms))
        merged.fold(observation, keep=1.0)
        return merged


@dataclass(slots=True)
class WorkloadState:
    """Per workload: forgotten sums of accepted and judged drafts (alpha), and the last decisions."""

    accepted: float = 0.0
    judged: float = 0.0
    output_tokens: float = 0.0  # forgotten like the others, over the forgotten count of requests below
    weighted_requests: float = 0.0
    requests: int = 0
    plain_streak: int = 0  # plain requests since the last speculative one
    gamma: int = 0
    mode: Mode = "speculative"


class SpeculationController:
    """Choose gamma in ``[1, gamma_max]`` and the mode per workload from the decoder's own measurements.

    Parameters
    ----------
    gamma_max : int
        Largest number of drafts per step.
    forgetting : float
        Share of the old sums forgotten per observed request, in ``(0, 1]``; larger follows drift faster.
    holdout : HoldoutPolicy
        Which requests decode without speculation and are recorded as ``holdout`` (control traffic):
        a floor share, and a per-workload target per window reached at a higher share.
    probe_every : int
        While speculation is off for a workload, every ``probe_every``-th request speculates anyway.
    seed : int
        Seeds the holdout draws, so a run is reproducible.
    clock : callable
        Wall-clock seconds, for counting a workload's holdout requests in the policy's window.

    Examples
    --------
    >>> controller = SpeculationController(gamma_max=8, seed=0)
    >>> def request(accepted: int, judged: int) -> Observation:  # 25 steps of 4 drafts; t1 = 100 ms, c = 0.05
    ...     return Observation(accepted=accepted, judged=judged, draft_tokens=100, draft_ms=500,
    ...         verify_passes=25, verify_drafts=100, verify_ms=2600, single_passes=5, single_ms=500)
    >>> for _ in range(20):  # one drafter: nearly always right on code edits, always wrong on prose
    ...     controller.observe("code-edit", request(accepted=90, judged=100))
    ...     controller.observe("prose", request(accepted=0, judged=25))
    >>> controller.plan("code-edit").gamma >= 6
    True
    >>> controller.plan("prose").mode
    'plain'
    >>> controller.replan("german", request(accepted=0, judged=25)).mode  # new: 0 of 25 could be bad luck
    'speculative'
    >>> controller.replan("prose", request(accepted=0, judged=25)).mode  # 0 of 25, as in prose's history
    'plain'
    """

    def __init__(
        self,
        gamma_max: int = 8,
        forgetting: float = 0.1,
        holdout: HoldoutPolicy | None = None,
        probe_every: int = 10,
        seed: int = 0,
        priors: Priors | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 1 <= gamma_max <= 32:
            raise ValueError(f"gamma_max must be in 1..32, got {gamma_max!r}")
        if not 0 < forgetting <= 1:
            raise ValueError(f"forgetting must be in (0, 1], got {forgetting!r}")
        if probe_every < 1:
            raise ValueError(f"probe_every must be >= 1, got {probe_every!r}")
        self.gamma_max = gamma_max
        self.forgetting = forgetting
        self.holdout = Holdout(holdout or HoldoutPolicy(), seed, clock)
        self.probe_every = probe_every
        self.seed = seed
        self.priors = priors or Priors()
        self._workloads: dict[str, WorkloadState] = {}
        self._costs = PairCosts()

    # Estimates

    def estimates(self, workload: str, running: Observation | None = None) -> dict[str, float]:
        """alpha, c, b/t1 and t1 (ms) for ``workload``: measurements blended with the priors.

        ``running``: what the request in progress has measured so far, counted in without forgetting.
        """
        alpha, _ = self._alpha(workload, running)
        return {"alpha": alpha, **self._costs_with(running).terms(self.priors)}

    def pair_costs(self) -> dict[str, float]:
        """c, b/t1, t1 (ms) and the drafter's prefill per prompt token (over t1): the model pair's, shared by all."""
        return self._costs.terms(self.priors)

    def cost_summary(self) -> str:
        """The pair's costs in one line, for logs: t1, c, the prefill and v at 1 and gamma_max drafts."""
        terms, widest = self.pair_costs(), self.gamma_max
        return (
            f"t1 {terms['t1_ms']:.1f} ms, c {terms['c']:.3f}, prefill {terms['prefill_per_token']:.3f} t1 a prompt "
            f"token, v(1) {self.verification_cost(1):.2f}, v({widest}) {self.verification_cost(widest):.2f}"
        )

    @property
    def needs_calibration(self) -> bool:
        """True until any verification pass has been measured (by :meth:`calibrate` or by requests).

        Faded sums do not count as unmeasured: calibrating again would stall a request for seconds,
        and requests keep the costs current (probes included) once there are any.
        """
        return self._costs.verify_passes == 0

    def verification_cost(self, gamma: int) -> float:
        """v(gamma): a pass over gamma drafts in one-token passes, measured at that size where seen."""
        return self._costs.verification_cost(gamma, self._costs.terms(self.priors))

    def best_gamma(self, workload: str, running: Observation | None = None) -> tuple[int, float]:
        """The gamma in ``1..gamma_max`` with the largest S(gamma), and that S."""
        return self._best(self._alpha(workload, running)[0], self._costs_with(running))

    def _alpha(self, workload: str, running: Observation | None) -> tuple[float, float]:
        """alpha's estimate, and how many judged drafts (the prior's included) it rests on."""
        state, prior = self._workloads.get(workload) or WorkloadState(), self.priors
        accepted = state.accepted + (running.accepted if running else 0)
        judged = state.judged + (running.judged if running else 0) + prior.weight
        return min((accepted + prior.alpha * prior.weight) / judged, 1.0), judged

    def _best(self, alpha: float, costs: PairCosts) -> tuple[int, float]:
        terms = costs.terms(self.priors)
        speedups = {
            g: expected_speedup(alpha, terms["c"], terms["b_over_t1"], g, costs.verification_cost(g, terms))
            for g in range(1, self.gamma_max + 1)
        }
        gamma = max(speedups, key=lambda g: (speedups[g], -g))
        return gamma, speedups[gamma]

    def _costs_with(self, running: Observation | None) -> PairCosts:
        return self._costs if running is None else self._costs.plus(running)

    # Decisions

    def plan(self, workload: str, prompt_tokens: int = 0, max_new_tokens: int | None = None) -> Plan:
        """The mode and gamma for the next request of ``workload``.

        ``prompt_tokens`` and ``max_new_tokens`` describe the request: the drafter's prefill of a long
        prompt before a short answer can cost more than speculation saves.
        """
        state = self._state(workload)
        gamma, step_speedup = self.best_gamma(workload)
        speedup = self._request_speedup(workload, step_speedup, prompt_tokens, max_new_tokens)
        reason = self.holdout.draw(workload)
        if reason is not None:
            return Plan("holdout", gamma, speedup, holdout_reason=reason)
        if speedup >= 1.0:
            state.mode, state.gamma = "speculative", gamma
            return Plan("speculative", gamma, speedup, measure_t1=self._costs.single_passes < MIN_WEIGHT)
        state.mode, state.gamma = "plain", gamma
        if state.plain_streak + 1 >= self.probe_every:
            return Plan("speculative", gamma, speedup)  # a probe: has the drafter recovered?
        return Plan("plain", gamma, speedup)

    def _request_speedup(
        self, workload: str, step_speedup: float, prompt_tokens: int, max_new_tokens: int | None = None
    ) -> float:
        """A whole request's speedup: ``1 / (1 / S + D / T)``, the drafter's prefill ``D`` spread over ``T`` tokens."""
        prefill = prompt_tokens * self.pair_costs()["prefill_per_token"]  # D, in one-token passes
        state = self._workloads.get(workload)
        expected = state.output_tokens / state.weighted_requests if state and state.weighted_requests else math.inf
        tokens = min(expected, max_new_tokens or math.inf)  # T
        if prefill <= 0 or math.isinf(tokens):
            return step_speedup
        return 1.0 / (1.0 / step_speedup + prefill / max(tokens, 1.0))

    def replan(self, workload: str, running: Observation) -> Plan:
        """Mid-request: with what this request has measured so far, should it go on speculating, and how far?

        A request that finds speculation losing stops drafting for its remaining steps, so that trying
        a new workload, or probing one switched off, costs a few steps rather than a whole request.
        A few rejected drafts are weak evidence, so it stops only when speculation would lose even at
        a one-sided 90 % upper bound of alpha (Wilson's), not at its point estimate. Draws nothing
        from the holdout generator and changes no state.
        """
        gamma, speedup = self._best(wilson_upper(*self._alpha(workload, running)), self._costs.plus(running))
        return Plan("speculative" if speedup >= 1.0 else "plain", gamma, speedup)  # the prefill is paid by now

    def calibrate(self, observation: Observation) -> None:
        """Add passes timed outside any request (decoder/calibration.py) to the pair's costs; alpha is untouched."""
        if observation.accepted or observation.judged:
            raise ValueError(
                f"a calibration measures costs, not acceptance: got accepted={observation.accepted!r}, "
                f"judged={observation.judged!r}"
            )
        self._costs.fold(observation, keep=1.0)

    def observe(self, workload: str, observation: Observation, mode: Mode = "speculative") -> None:
        """Fold one finished request into the sums, forgetting a share of the old ones."""
        state = self._state(workload)
        keep = 1.0 - self.forgetting
        state.accepted = keep * state.accepted + observation.accepted
        state.judged = keep * state.judged + observation.judged
        state.output_tokens = keep * state.output_tokens + observation.output_tokens
        state.weighted_requests = keep * state.weighted_requests + 1
        self._costs.fold(observation, keep)
        state.requests += 1
        state.plain_streak = state.plain_streak + 1 if mode != "speculative" else 0

    # State

    def state(self) -> dict[str, Any]:
        """Everything needed to resume: settings, the random generator, the pair's costs and each workload's sums."""
        return {
            "gamma_max": self.gamma_max,
            "forgetting": self.forgetting,
            "holdout": asdict(self.holdout.policy),
            "probe_every": self.probe_every,
            "seed": self.seed,
            "priors": asdict(self.priors),
            "holdout_draws": self.holdout.state(),
            "costs": asdict(self._costs),
            "workloads": {name: asdict(state) for name, state in self._workloads.items()},
        }

    @classmethod
    def from_state(cls, data: dict[str, Any], holdout: HoldoutPolicy | None = None) -> SpeculationController:
        """The controller :meth:`state` described, with ``holdout`` instead of the saved policy if given.

        A state from before costs were shared has them summed; one from before holdout targets
        (``holdout_share`` and ``rng``) resumes its draws with a share-only policy.
        """
        saved = HoldoutPolicy(**data["holdout"]) if "holdout" in data else HoldoutPolicy(data["holdout_share"])
        controller = cls(
            gamma_max=data["gamma_max"],
            forgetting=data["forgetting"],
            holdout=holdout or saved,
            probe_every=data["probe_every"],
            seed=data["seed"],
            priors=Priors(**data["priors"]),
        )
        controller.holdout.restore(data.get("holdout_draws") or {"rng": data["rng"], "recent": {}})
        workloads = {name: dict(values) for name, values in data["workloads"].items()}
        costs = data.get("costs") or _pooled_costs(workloads.values())
        controller._costs = PairCosts(**costs)
        controller._workloads = {name: WorkloadState(**values) for name, values in workloads.items()}
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


def _pooled_costs(workloads: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Move per-workload cost sums (the state format before costs were shared) into one pooled set."""
    pooled = PairCosts()
    for values in workloads:
        sized = {key: values.pop(key, {}) for key in ("sized_passes", "sized_ms")}
        sums = {name: values.pop(name, 0.0) for name in COST_SUMS}
        pooled.fold(Observation(accepted=0, judged=0, **sums, **sized), keep=1.0)
    return asdict(pooled)


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


def wilson_upper(share: float, trials: float, z: float = 1.2816) -> float:
    """One-sided upper confidence bound of a proportion (Wilson score; z = 1.2816: 90 %).

    >>> round(wilson_upper(0.0, 3), 2), round(wilson_upper(0.0, 8), 2), round(wilson_upper(0.5, 100), 2)
    (0.35, 0.17, 0.56)
    """
    if trials <= 0:
        return 1.0
    z2 = z * z
    centre = share + z2 / (2 * trials)
    spread = z * math.sqrt(share * (1 - share) / trials + z2 / (4 * trials * trials))
    return min(1.0, (centre + spread) / (1 + z2 / trials))
