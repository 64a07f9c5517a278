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
(decoder/speculation/calibration.py) and hands them to :meth:`SpeculationController.calibrate`, so even the
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
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    drafter: str = ""  # which of the decoder's drafters serves it (its label); for plain and holdout, the best one


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
    """Per workload and drafter: forgotten sums of accepted and judged drafts (alpha), and the last decisions."""

    accepted: float = 0.0
    judged: float = 0.0
    output_tokens: float = 0.0  # forgotten like the others, over the forgotten count of requests below
    weighted_requests: float = 0.0
    requests: int = 0
    plain_streak: int = 0  # requests since this drafter last speculated for the workload
    gamma: int = 0
    mode: Mode = "speculative"


@dataclass(slots=True)
class Arm:
    """One drafter's view: the pass costs of target + this drafter, and each workload's acceptance with it."""

    costs: PairCosts = field(default_factory=PairCosts)
    workloads: dict[str, WorkloadState] = field(default_factory=dict)

    def state(self, workload: str) -> WorkloadState:
        return self.workloads.setdefault(workload, WorkloadState())


UNNAMED = ""  # the label of a controller's drafter when there is only one and the caller names none


class SpeculationController:
    """Choose the drafter, gamma in ``[1, gamma_max]`` and the mode per workload from the decoder's own measurements.

    A decoder may hold several drafters (a portfolio, e.g. a draft model and the n-gram drafter).
    Each drafter, named by its label, is an :class:`Arm`: costs are the pair's (target + that
    drafter), acceptance is per workload and drafter. A request goes to the drafter with the best
    expected request speedup, or decodes plain when none reaches 1; a drafter that has not served a
    workload for ``probe_every`` requests serves the next one (a probe), so that its estimates stay
    current while another one wins. Plain and holdout requests measure the target alone, so every
    drafter's costs learn from them. With one drafter the label may be left out everywhere.

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
        A drafter that has not speculated on a workload for this many requests speculates on the next.
    loss_budget : float
        How much slower than plain decoding a request's drafting steps may run, as a share of the
        request's plain decode time, before the request stops drafting (:meth:`loss_budget_ms`).
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

    Two drafters: the one that measured better on a workload serves it.

    >>> portfolio = SpeculationController(gamma_max=8, seed=0)
    >>> for _ in range(20):
    ...     portfolio.observe("prose", request(accepted=70, judged=100), drafter="model")
    ...     portfolio.observe("prose", request(accepted=0, judged=25), drafter="ngram")
    >>> plan = portfolio.plan("prose", drafters=("model", "ngram"))
    >>> plan.mode, plan.drafter
    ('speculative', 'model')
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
        loss_budget: float = 0.05,
    ) -> None:
        if not 1 <= gamma_max <= 32:
            raise ValueError(f"gamma_max must be in 1..32, got {gamma_max!r}")
        if not 0 < forgetting <= 1:
            raise ValueError(f"forgetting must be in (0, 1], got {forgetting!r}")
        if probe_every < 1:
            raise ValueError(f"probe_every must be >= 1, got {probe_every!r}")
        if not 0 <= loss_budget < 1:
            raise ValueError(f"loss_budget must be in [0, 1), got {loss_budget!r}")
        self.loss_budget = loss_budget
        self.gamma_max = gamma_max
        self.forgetting = forgetting
        self.holdout = Holdout(holdout or HoldoutPolicy(), seed, clock)
        self.probe_every = probe_every
        self.seed = seed
        self.priors = priors or Priors()
        self._arms: dict[str, Arm] = {}

    # Estimates

    def estimates(self, workload: str, running: Observation | None = None, drafter: str = UNNAMED) -> dict[str, float]:
        """alpha, c, b/t1 and t1 (ms) for ``workload`` with ``drafter``: measurements blended with the priors.

        ``running``: what the request in progress has measured so far, counted in without forgetting.
        """
        alpha, _ = self._alpha(workload, running, drafter)
        return {"alpha": alpha, **self._costs_with(running, drafter).terms(self.priors)}

    def pair_costs(self, drafter: str = UNNAMED) -> dict[str, float]:
        """c, b/t1, t1 (ms) and the drafter's prefill per prompt token (over t1): the pair's, for all workloads."""
        return self._arm(drafter).costs.terms(self.priors)

    def cost_summary(self, drafter: str = UNNAMED) -> str:
        """The pair's costs in one line, for logs: t1, c, the prefill and v at 1 and gamma_max drafts."""
        terms, widest = self.pair_costs(drafter), self.gamma_max
        v1, v_widest = self.verification_cost(1, drafter), self.verification_cost(widest, drafter)
        return (
            f"t1 {terms['t1_ms']:.1f} ms, c {terms['c']:.3f}, prefill {terms['prefill_per_token']:.3f} t1 a prompt "
            f"token, v(1) {v1:.2f}, v({widest}) {v_widest:.2f}"
        )

    def needs_calibration_for(self, drafter: str = UNNAMED) -> bool:
        """True until any verification pass of ``drafter`` has been measured (by :meth:`calibrate` or by requests).

        Faded sums do not count as unmeasured: calibrating again would stall a request for seconds,
        and requests keep the costs current (probes included) once there are any.
        """
        return self._arm(drafter).costs.verify_passes == 0

    @property
    def needs_calibration(self) -> bool:
        """True while no drafter has been measured, or any drafter seen has not been."""
        return not self._arms or any(arm.costs.verify_passes == 0 for arm in self._arms.values())

    def verification_cost(self, gamma: int, drafter: str = UNNAMED) -> float:
        """v(gamma): a pass over gamma drafts in one-token passes, measured at that size where seen."""
        costs = self._arm(drafter).costs
        return costs.verification_cost(gamma, costs.terms(self.priors))

    def best_gamma(
        self, workload: str, running: Observation | None = None, drafter: str = UNNAMED
    ) -> tuple[int, float]:
        """The gamma in ``1..gamma_max`` with the largest S(gamma), and that S."""
        return self._best(self._alpha(workload, running, drafter)[0], self._costs_with(running, drafter))

    def _alpha(self, workload: str, running: Observation | None, drafter: str = UNNAMED) -> tuple[float, float]:
        """alpha's estimate, and how many judged drafts (the prior's included) it rests on."""
        state, prior = self._arm(drafter).workloads.get(workload) or WorkloadState(), self.priors
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

    def _costs_with(self, running: Observation | None, drafter: str = UNNAMED) -> PairCosts:
        costs = self._arm(drafter).costs
        return costs if running is None else costs.plus(running)

    # Decisions

    def plan(
        self,
        workload: str,
        prompt_tokens: int = 0,
        max_new_tokens: int | None = None,
        drafters: Sequence[str] = (UNNAMED,),
        candidate: str | None = None,
    ) -> Plan:
        """The drafter, mode and gamma for the next request of ``workload``, among ``drafters`` (labels).

        ``prompt_tokens`` and ``max_new_tokens`` describe the request: the drafter's prefill of a long
        prompt before a short answer can cost more than speculation saves. ``candidate``: the label
        of a rollout's candidate drafter (decoder/candidate.py) that serves this request unless the
        holdout draws it (a held-out request is the portfolio's, as without a rollout); it is then
        planned as a portfolio of its own, so that it serves as it would once promoted.
        """
        if not drafters:
            raise ValueError("plan needs at least one drafter to choose from")
        options = {label: self._option(workload, label, prompt_tokens, max_new_tokens) for label in drafters}
        best = max(drafters, key=lambda label: options[label][1])  # the first listed wins a tie
        gamma, speedup = options[best]
        reason = self.holdout.draw(workload)
        if reason is not None:
            return Plan("holdout", gamma, speedup, holdout_reason=reason, drafter=best)
        if candidate is not None:
            drafters, best = (candidate,), candidate
            options = {candidate: self._option(workload, candidate, prompt_tokens, max_new_tokens)}
            gamma, speedup = options[best]
        for drafter in drafters:
            state = self._arm(drafter, create=True).state(workload)
            state.gamma = options[drafter][0]
            state.mode = "speculative" if drafter == best and speedup >= 1.0 else "plain"
        stale = max(drafters, key=lambda label: self._arm(label).state(workload).plain_streak)
        due = self._arm(stale).state(workload).plain_streak + 1 >= self.probe_every
        if due and (stale != best or speedup < 1.0):
            return Plan("speculative", *options[stale], drafter=stale)  # a probe: is it better than thought?
        if speedup < 1.0:
            return Plan("plain", gamma, speedup, drafter=best)
        measure_t1 = self._arm(best).costs.single_passes < MIN_WEIGHT
        return Plan("speculative", gamma, speedup, measure_t1=measure_t1, drafter=best)

    def _option(self, workload: str, drafter: str, prompt_tokens: int, max_new_tokens: int | None) -> tuple[int, float]:
        """``drafter``'s best gamma for ``workload`` and the request speedup it expects there."""
        gamma, step_speedup = self.best_gamma(workload, drafter=drafter)
        return gamma, self._request_speedup(workload, step_speedup, prompt_tokens, max_new_tokens, drafter)

    def loss_budget_ms(self, workload: str, max_new_tokens: int, drafter: str = UNNAMED) -> tuple[float, float] | None:
        """``(t1, budget)`` in ms: what a token costs plain, and how much a request's drafting may lose in all.

        The cost model predicts from forward passes; what a step costs in the loop (the drafter's
        call, the verification, cropping the caches) is measured as it runs. A request charges each
        drafting step its time minus ``t1`` per token it emitted and stops drafting once the sum
        passes ``loss_budget`` of the request's plain decode time (``t1`` times its expected output
        length), so a request whose drafts mostly fail, a new workload's first one included, ends at
        most about that much slower than plain, whatever its acceptance. ``None`` while ``t1`` is unknown.
        """
        t1 = self.pair_costs(drafter)["t1_ms"]
        if math.isnan(t1) or t1 <= 0:
            return None
        state = self._arm(drafter).workloads.get(workload)
        expected = state.output_tokens / state.weighted_requests if state and state.weighted_requests else math.inf
        return t1, self.loss_budget * t1 * min(expected, max_new_tokens)

    def _request_speedup(
        self,
        workload: str,
        step_speedup: float,
        prompt_tokens: int,
        max_new_tokens: int | None = None,
        drafter: str = UNNAMED,
    ) -> float:
        """A whole request's speedup: ``1 / (1 / S + D / T)``, the drafter's prefill ``D`` spread over ``T`` tokens."""
        prefill = prompt_tokens * self.pair_costs(drafter)["prefill_per_token"]  # D, in one-token passes
        state = self._arm(drafter).workloads.get(workload)
        expected = state.output_tokens / state.weighted_requests if state and state.weighted_requests else math.inf
        tokens = min(expected, max_new_tokens or math.inf)  # T
        if prefill <= 0 or math.isinf(tokens):
            return step_speedup
        return 1.0 / (1.0 / step_speedup + prefill / max(tokens, 1.0))

    def replan(self, workload: str, running: Observation, drafter: str = UNNAMED) -> Plan:
        """Mid-request: with what this request has measured so far, should it go on speculating, and how far?

        A request that finds speculation losing stops drafting for its remaining steps, so that trying
        a new workload, or probing one switched off, costs a few steps rather than a whole request.
        A few rejected drafts are weak evidence, so it stops only when speculation would lose even at
        a one-sided 90 % upper bound of alpha (Wilson's), not at its point estimate. Draws nothing
        from the holdout generator and changes no state.
        """
        alpha = wilson_upper(*self._alpha(workload, running, drafter))
        gamma, speedup = self._best(alpha, self._costs_with(running, drafter))
        mode: Mode = "speculative" if speedup >= 1.0 else "plain"  # the prefill is paid by now
        return Plan(mode, gamma, speedup, drafter=drafter)

    def calibrate(self, observation: Observation, drafter: str = UNNAMED) -> None:
        """Add passes timed outside any request (calibration.py) to the pair's costs; alpha is untouched."""
        if observation.accepted or observation.judged:
            raise ValueError(
                f"a calibration measures costs, not acceptance: got accepted={observation.accepted!r}, "
                f"judged={observation.judged!r}"
            )
        self._arm(drafter, create=True).costs.fold(observation, keep=1.0)

    def observe(
        self, workload: str, observation: Observation, mode: Mode = "speculative", drafter: str = UNNAMED
    ) -> None:
        """Fold one finished request into the sums, forgetting a share of the old ones.

        A speculative request measured ``drafter`` and only that one; a plain or holdout request
        measured the target alone, which every drafter's costs share.
        """
        serving = self._arm(drafter, create=True)
        for arm in self._arms.values():
            state = arm.state(workload)
            if mode == "speculative" and arm is not serving:
                state.plain_streak += 1
                continue
            keep = 1.0 - self.forgetting
            state.accepted = keep * state.accepted + observation.accepted
            state.judged = keep * state.judged + observation.judged
            state.output_tokens = keep * state.output_tokens + observation.output_tokens
            state.weighted_requests = keep * state.weighted_requests + 1
            arm.costs.fold(observation, keep)
            state.requests += 1
            state.plain_streak = state.plain_streak + 1 if mode != "speculative" else 0

    # State

    def state(self) -> dict[str, Any]:
        """Everything needed to resume: settings, the random generator, and per drafter its costs and workloads."""
        return {
            "gamma_max": self.gamma_max,
            "forgetting": self.forgetting,
            "holdout": asdict(self.holdout.policy),
            "probe_every": self.probe_every,
            "seed": self.seed,
            "priors": asdict(self.priors),
            "holdout_draws": self.holdout.state(),
            "arms": {
                label: {"costs": asdict(arm.costs), "workloads": {w: asdict(s) for w, s in arm.workloads.items()}}
                for label, arm in self._arms.items()
            },
        }

    @classmethod
    def from_state(cls, data: dict[str, Any], holdout: HoldoutPolicy | None = None) -> SpeculationController:
        """The controller :meth:`state` described, with ``holdout`` instead of the saved policy if given.

        A state from before portfolios (one drafter's ``costs`` and ``workloads``) becomes the unnamed
        drafter, which the first drafter named later takes over; one from before costs were shared
        has them summed; one from before holdout targets (``holdout_share`` and ``rng``) resumes its
        draws with a share-only policy.
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
        arms = (
            data["arms"] if "arms" in data else {UNNAMED: {"costs": data.get("costs"), "workloads": data["workloads"]}}
        )
        for label, saved_arm in arms.items():
            workloads = {name: dict(values) for name, values in saved_arm["workloads"].items()}
            costs = saved_arm["costs"] or _pooled_costs(workloads.values())
            controller._arms[label] = Arm(
                PairCosts(**costs), {name: WorkloadState(**values) for name, values in workloads.items()}
            )
        return controller

    def summary(self, drafter: str = UNNAMED) -> dict[str, dict[str, Any]]:
        """Per workload with ``drafter``: the estimates, gamma, mode and expected speedup, for logs and dashboards."""
        out: dict[str, dict[str, Any]] = {}
        for name, state in self._arm(drafter).workloads.items():
            gamma, speedup = self.best_gamma(name, drafter=drafter)
            out[name] = {**self.estimates(name, drafter=drafter), "gamma": gamma, "expected_speedup": speedup,
                         "mode": state.mode, "requests": state.requests}  # fmt: skip
        return out

    def _arm(self, drafter: str, create: bool = False) -> Arm:
        """The arm of ``drafter`` (kept when ``create``, else a blank one stands in for an unknown drafter).

        With one arm, the unnamed drafter is that arm, and an unnamed arm (a single drafter's state
        saved before portfolios) becomes the first drafter named.
        """
        arm = self._arms.get(drafter)
        if arm is not None:
            return arm
        if len(self._arms) == 1:
            ((only_label, only),) = self._arms.items()
            if drafter == UNNAMED:
                return only
            if only_label == UNNAMED:
                self._arms[drafter] = self._arms.pop(UNNAMED)
                return only
        arm = Arm()
        if create:
            self._arms[drafter] = arm
        return arm


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
    return wilson_interval(share, trials, z)[1]


def wilson_interval(share: float, trials: float, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion (z = 1.96: two-sided 95 %); ``(0, 1)`` without trials.

    >>> [round(bound, 3) for bound in wilson_interval(0.5, 100)]
    [0.404, 0.596]
    """
    if trials <= 0:
        return 0.0, 1.0
    z2 = z * z
    centre = share + z2 / (2 * trials)
    spread = z * math.sqrt(share * (1 - share) / trials + z2 / (4 * trials * trials))
    scale = 1 + z2 / trials
    return max(0.0, (centre - spread) / scale), min(1.0, (centre + spread) / scale)
