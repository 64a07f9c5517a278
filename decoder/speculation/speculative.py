"""The speculative decoder: prefill, then draft-and-verify steps until a stop.

One request runs as a chain of small steps:

* :func:`prefill` runs the target over the prompt and yields the first token (the TTFT);
* :func:`speculative_step` asks the drafter for up to gamma tokens, verifies them all in one
  target pass over ``[last token, d_1 .. d_gamma]``, keeps the accepted prefix plus the target's
  own token, and crops both KV caches back to exactly the tokens that were kept;
* plain decoding is the same step with no drafts, so both modes share one code path.

Invariant between steps: the target's cache holds every token of the sequence but the last
(``pending``), whose logits the next pass computes.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from decoder.candidate import CANDIDATE_LABEL, CandidateDraw, Staging
from decoder.causes import MAX_TEXT_CHARS, copy_share, prompt_text, style_fingerprint
from decoder.cpu.row_stable import row_stable_passes
from decoder.drafters.base import Drafter, drafter_label
from decoder.holdout import HoldoutReason
from decoder.models.loading import LoadedModel
from decoder.record import Mode, RequestRecord, validate_workload
from decoder.sampling import SamplingParams, choose
from decoder.speculation.accounting import RequestStats
from decoder.speculation.calibration import CALIBRATION_ROUNDS, measure_pair_costs
from decoder.speculation.controller import Observation, Plan, SpeculationController
from decoder.speculation.stopping import Stopper, eos_token_ids
from decoder.speculation.target_pass import target_logits
from decoder.verify import Verdict, verify_greedy, verify_sampled

logger = logging.getLogger(__name__)

Sink = Callable[[RequestRecord], None]
Prompt = str | Sequence[dict[str, str]]
MAX_GAMMA = 32
REPLAN_STEPS = 8  # a request the controller planned re-plans after every this many steps
Replan = Callable[[Observation], Plan]


@dataclass(slots=True)
class LossGuard:
    """A request's running loss from drafting against plain decoding (SpeculationController.loss_budget_ms)."""

    t1_ms: float  # what a token costs plain
    budget_ms: float
    excess_ms: float = 0.0

    def charge(self, step_ms: float, emitted: int) -> bool:
        """Add one drafting step; True once the request has lost more than its budget."""
        self.excess_ms += step_ms - self.t1_ms * emitted
        return self.excess_ms > self.budget_ms


@dataclass(slots=True)
class GenerationResult:
    text: str
    token_ids: list[int]
    record: RequestRecord


@dataclass(slots=True)
class _Sequence:
    """The growing token sequence and the target's cache over all of it but the last token."""

    tokens: list[int]
    prompt_length: int
    cache: Any

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.prompt_length :]


@dataclass(slots=True)
class _RequestPlan:
    """How one request decodes: its drafter (label and object), mode, gamma, and what may steer it midway.

    ``staged``: the name a rollout records the candidate's requests under, when the candidate serves this one.
    """

    label: str | None
    drafter: Drafter | None
    mode: Mode
    gamma: int
    holdout_reason: HoldoutReason | None
    measure_t1: bool
    replan: Replan | None
    guard: LossGuard | None
    staged: str | None = None


@dataclass(slots=True)
class _Decoding:
    """One request in the loop: what it decodes, with what, and what steers it.

    ``drafter``: the drafter of a speculative request; None for plain and holdout, and from the
    moment ``replan`` answers ``plain`` (asked every ``REPLAN_STEPS`` steps with what the request
    measured so far; a lower gamma it answers caps the request's) or ``guard`` (charged after every
    step that drafted) is over budget.
    ``measure_t1``: the first step carries no drafts, so the controller sees a one-token pass.
    """

    prompt_ids: list[int]
    max_new_tokens: int
    params: SamplingParams
    seed: int | None
    stats: RequestStats
    stopper: Stopper
    drafter: Drafter | None
    measure_t1: bool = False
    replan: Replan | None = None
    guard: LossGuard | None = None


def _check_options(workload: str, max_new_tokens: int, mode: Mode | None) -> None:
    validate_workload(workload)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if mode is not None and mode not in ("speculative", "plain", "holdout"):
        raise ValueError(f"mode must be speculative, plain or holdout, got {mode!r}")


def _begin_drafting(request: _Decoding) -> None:
    """Let a speculative request's drafter read the prompt, timed as drafting.

    After the first token, not before: TTFT stays the target's prompt reading, as in plain
    decoding, and the draft model's prompt reading lands in the decode phase it serves.
    """
    if request.drafter is None:
        return
    started = time.perf_counter()
    request.drafter.begin(request.prompt_ids)
    request.stats.draft_prefill_seconds = time.perf_counter() - started
    request.stats.draft_prefill_tokens = len(request.prompt_ids)


def _replanned(request: _Decoding, gamma_now: int) -> int:
    """Every ``REPLAN_STEPS`` drafting steps, the controller's new plan: stop drafting, or a new gamma cap."""
    stats = request.stats
    due = stats.num_spec_steps % REPLAN_STEPS == 0 < stats.num_spec_steps
    if request.drafter is None or request.replan is None or not due:
        return gamma_now
    plan = request.replan(stats.observation())
    if plan.mode == "plain":
        request.drafter = None
        logger.debug("speculation stopped after %d steps (S = %.2f)", stats.num_spec_steps, plan.expected_speedup)
    return min(stats.gamma, plan.gamma)


def prefill(target: LoadedModel, seq: _Sequence, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Run the target over the prompt and choose the first output token."""
    prompt = torch.tensor([seq.tokens], dtype=torch.long, device=target.device)  # (1, prompt_len)
    logits = target_logits(target.model, prompt, seq.cache, keep=1)[0]  # (V,)
    return choose(logits, params, generator)


def speculative_step(
    target: LoadedModel,
    drafter: Drafter | None,
    seq: _Sequence,
    gamma: int,
    params: SamplingParams,
    generator: torch.Generator | None,
    stats: RequestStats,
) -> tuple[list[int], int]:
    """Draft up to ``gamma`` tokens, verify them in one target pass; return (emitted tokens, drafts proposed)."""
    started = time.perf_counter()
    if drafter is not None and gamma > 0:
        proposal = drafter.propose(seq.tokens, gamma, params, generator)
        drafts, draft_probs = proposal.tokens, proposal.probs  # (k,), (k, V) | None
    else:
        drafts, draft_probs = torch.empty(0, dtype=torch.long), None
    verifying = time.perf_counter()
    stats.draft_seconds += verifying - started

    k = int(drafts.shape[0])
    block = torch.cat([torch.tensor([seq.tokens[-1]]), drafts]).to(target.device)[None]  # (1, k + 1)
    with row_stable_passes():  # this row's logits must not depend on how many rows share the pass
        logits = target_logits(target.model, block, seq.cache, keep=k + 1)  # (k + 1, V)
    verdict: Verdict = (
        verify_greedy(drafts, logits)
        if params.greedy
        else verify_sampled(drafts, draft_probs, logits, params, generator)
    )
    # The cache now covers pending + k drafts; keep pending + the accepted ones.
    if k > verdict.num_accepted:
        seq.cache.crop(verdict.num_accepted - k)
    if drafter is not None:
        drafter.rollback(len(seq.tokens) + verdict.num_accepted)
    stats.target_pass(k, verdict.num_accepted, time.perf_counter() - verifying)
    return [*drafts[: verdict.num_accepted].tolist(), verdict.next_token], k


class SpeculativeDecoder:
    """A target model, no, one or several drafters, and the loop that runs requests through them.

    With several drafters (a portfolio) the controller picks one per request; without a
    controller, or when the caller fixes mode and gamma, the first one serves.

    Every finished request, failed ones included, becomes a :class:`RequestRecord` handed to
    ``sink`` (errors raised by the sink are logged, never passed to the caller). With a
    ``controller``, each request's mode and gamma come from it (unless the caller fixes them) and
    what the request measured goes back to it; before the first such request, the pair's pass costs
    are timed once (:meth:`calibrate`) unless the controller already knows them or
    ``auto_calibrate`` is off (then the first requests measure them, speculating at the priors).

    A ``candidate`` drafter (decoder/candidate.py) serves nothing until :attr:`staging` is set (by
    the embedded server, from the store's active rollout): then a share of each workload's requests
    that the controller plans, drawn by :class:`CandidateDraw`, goes to it instead of the portfolio,
    planned by the controller on an arm of its own and recorded under the staging's drafter name.
    """

    def __init__(
        self,
        target: LoadedModel,
        drafter: Drafter | Sequence[Drafter] | None = None,
        *,
        gamma: int = 4,
        sink: Sink | None = None,
        source: str = "embedded",
        controller: SpeculationController | None = None,
        auto_calibrate: bool = True,
        candidate: Drafter | None = None,
    ) -> None:
        if not 1 <= gamma <= MAX_GAMMA:
            raise ValueError(f"gamma must be in 1..{MAX_GAMMA}, got {gamma!r}")
        self.target = target
        self.drafters: tuple[Drafter, ...] = (
            () if drafter is None else tuple(drafter) if isinstance(drafter, Sequence) else (drafter,)
        )
        self.labels = tuple(drafter_label(d) for d in self.drafters)
        if len(set(self.labels)) < len(self.labels):
            raise ValueError(f"each drafter must be different, got {', '.join(self.labels)}")
        self.candidate = candidate
        self.candidate_label = None if candidate is None else CANDIDATE_LABEL + drafter_label(candidate)
        # Replaced whole by the embedded server's refresh, read once per request by the decoding thread.
        self.staging: Staging | None = None
        self._candidate_draw = CandidateDraw()
        self.gamma = gamma
        self.sink = sink
        self.source = source
        self.controller = controller
        self.auto_calibrate = auto_calibrate
        self.eos_token_ids = eos_token_ids(target.model, target.tokenizer)
        self.max_positions = int(getattr(target.model.config, "max_position_embeddings", 0) or 0)

    @property
    def drafter(self) -> Drafter | None:
        """The first drafter: the one that serves when the controller does not choose."""
        return self.drafters[0] if self.drafters else None

    # Public API

    def calibrate(self, rounds: int = CALIBRATION_ROUNDS, only_unmeasured: bool = False) -> list[Observation]:
        """Time each pair's passes, the candidate's too (decoder/speculation/calibration.py), for the controller.

        Empty without a controller or a drafter. :meth:`calibrate_if_needed` is the usual entry.
        """
        if self.controller is None:
            return []
        timed = []
        pairs = list(zip(self.drafters, self.labels, strict=True))
        if self.candidate is not None and self.candidate_label is not None:
            pairs.append((self.candidate, self.candidate_label))
        for drafter, label in pairs:
            if only_unmeasured and not self.controller.needs_calibration_for(label):
                continue
            started = time.perf_counter()
            observation = measure_pair_costs(self.target, drafter, self.controller.gamma_max, rounds)
            self.controller.calibrate(observation, drafter=label)
            logger.info(
                "calibrated %s (%s) with %s drafts in %.1f s: %s", self.target.name, self.target.version,
                label, time.perf_counter() - started, self.controller.cost_summary(label),
            )  # fmt: skip
            timed.append(observation)
        return timed

    def calibrate_if_needed(self) -> list[Observation]:
        """Calibrate each drafter the controller has never measured, when ``auto_calibrate`` is on.

        Runs by itself before the first request the controller plans; call it at start-up to keep
        that time out of the first request. Empty when nothing was timed.
        """
        if not self.auto_calibrate:
            return []
        return self.calibrate(only_unmeasured=True)

    def generate(self, prompt: Prompt, **options: Any) -> GenerationResult:
        """Decode one request; ``options`` are those of :meth:`stream`."""
        pieces: list[str] = []
        record: RequestRecord | None = None
        token_ids: list[int] = []
        for item in self._run(prompt, token_ids, **options):
            if isinstance(item, RequestRecord):
                record = item
            else:
                pieces.append(item)
        assert record is not None  # _run always ends with the record
        return GenerationResult(text="".join(pieces), token_ids=token_ids, record=record)

    def stream(self, prompt: Prompt, **options: Any) -> Iterator[str | RequestRecord]:
        """Yield text pieces as they are decoded, then the request's record.

        Options: ``workload`` (tag, default ``"default"``), ``max_new_tokens`` (128),
        ``temperature`` (0 = greedy), ``top_p`` (1.0), ``top_k`` (0 = off), ``seed``, ``chat``
        (apply the chat template to a string prompt), ``stop`` (stop strings), ``mode``
        (``speculative``, ``plain`` or ``holdout``; default: the controller's choice, else
        speculative), ``gamma`` (default: the controller's choice, else the decoder's), ``drafter``
        (a label of :attr:`labels` or a kind such as ``ngram``; default: the controller's choice,
        else the first), ``request_id``.
        """
        return self._run(prompt, [], **options)

    # The request loop

    def _run(
        self,
        prompt: Prompt,
        token_ids: list[int],
        *,
        workload: str = "default",
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        chat: bool = False,
        stop: Sequence[str] = (),
        mode: Mode | None = None,
        gamma: int | None = None,
        drafter: str | None = None,
        request_id: str | None = None,
    ) -> Iterator[str | RequestRecord]:
        """Check, plan, stream the text, then hand the record over (a failed request's too) and yield it."""
        _check_options(workload, max_new_tokens, mode)
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
        prompt_ids, prompt_hash = self._encode(prompt, chat)
        self._check_context(len(prompt_ids), max_new_tokens)
        plan = self._plan(workload, len(prompt_ids), max_new_tokens, mode, gamma, drafter)
        stats = RequestStats(gamma=plan.gamma, mode=plan.mode, holdout_reason=plan.holdout_reason)
        if request_id:
            stats.request_id = request_id
        stats.prompt_tokens = len(prompt_ids)
        identity = self._identity(workload, plan.drafter, temperature, top_p, prompt_hash, plan.staged)
        request = _Decoding(
            prompt_ids=prompt_ids,
            max_new_tokens=max_new_tokens,
            params=params,
            seed=seed,
            stats=stats,
            stopper=Stopper(self.target.tokenizer, self.eos_token_ids, stop),
            drafter=plan.drafter if plan.mode == "speculative" else None,
            measure_t1=plan.measure_t1,
            replan=plan.replan,
            guard=plan.guard,
        )
        try:
            finish = yield from self._stream(request, token_ids)
        except Exception as error:
            record = stats.to_record(
                finish_reason="error", error=f"{type(error).__name__}: {error}", **identity,
                style_hash=_causes(prompt, chat, "")["style_hash"],
            )  # fmt: skip
            self._hand_over(record)
            raise
        answer = request.stopper.visible_text(token_ids, final=True)
        record = stats.to_record(finish_reason=finish, **identity, **_causes(prompt, chat, answer))
        if self.controller is not None and plan.label is not None:
            self.controller.observe(workload, stats.observation(), plan.mode, drafter=plan.label)
        self._hand_over(record)
        yield record

    def _check_context(self, prompt_tokens: int, max_new_tokens: int) -> None:
        if self.max_positions and prompt_tokens + max_new_tokens > self.max_positions:
            raise ValueError(
                f"prompt ({prompt_tokens} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                f"target's context of {self.max_positions} tokens"
            )

    def _plan(
        self,
        workload: str,
        prompt_tokens: int,
        max_new_tokens: int,
        mode: Mode | None,
        gamma: int | None,
        drafter: str | None,
    ) -> _RequestPlan:
        """The request's drafter, mode and gamma: the caller's where given, else the controller's, else the defaults.

        Only a request the controller plans whole (neither mode nor gamma fixed) gets ``replan`` and
        ``guard``: the controller may stop its drafting midway. A request whose mode and drafter are
        left to the decoder may be drawn for a rollout's candidate (``staged``: its recorded name).
        """
        candidates = self.labels if drafter is None else (self._label_of(drafter),)
        staged: str | None = None
        if self.candidate_label is not None and drafter is None and mode is None:
            staged = self._candidate_draw.draw(self.staging, workload)
        label = self.candidate_label if staged is not None else candidates[0] if candidates else None
        measure_t1 = False
        holdout_reason = None
        replan: Replan | None = None
        guard: LossGuard | None = None
        if self.controller is not None and candidates and (mode is None or gamma is None):
            self.calibrate_if_needed()
            plan = self.controller.plan(
                workload, prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens, drafters=candidates,
                candidate=self.candidate_label if staged is not None else None,
            )  # fmt: skip
            label = plan.drafter
            if mode is None and gamma is None:
                replan = partial(self.controller.replan, workload, drafter=label)
                budget = self.controller.loss_budget_ms(workload, max_new_tokens, drafter=label)
                guard = LossGuard(*budget) if budget is not None else None
            if mode is None:
                mode, holdout_reason = plan.mode, plan.holdout_reason
            gamma = plan.gamma if gamma is None else gamma
            measure_t1 = plan.measure_t1
        mode = "speculative" if mode is None else mode
        gamma = self.gamma if gamma is None else gamma
        if not 1 <= gamma <= MAX_GAMMA:
            raise ValueError(f"gamma must be in 1..{MAX_GAMMA}, got {gamma!r}")
        if staged is not None and label == self.candidate_label:
            chosen = self.candidate
        else:  # the portfolio's, a request the holdout drew after the candidate's draw included
            staged = None
            chosen = self.drafters[self.labels.index(label)] if label is not None else None
        if mode == "speculative" and chosen is None:
            mode = "plain"
        return _RequestPlan(label, chosen, mode, gamma, holdout_reason, measure_t1, replan, guard, staged)

    def _identity(
        self, workload: str, drafter: Drafter | None, temperature: float, top_p: float, prompt_hash: str,
        staged: str | None = None,
    ) -> dict[str, object]:  # fmt: skip
        """The record's fields that say what served the request (the drafter chosen, even when it did not draft).

        A portfolio drafter is named by its kind; the candidate by the name its rollout gave it (``staged``).
        """
        return {
            "workload": workload,
            "target_model": self.target.name,
            "target_version": self.target.version,
            "drafter": staged or (drafter.kind if drafter is not None else "none"),
            "draft_model": drafter.name if drafter is not None else None,
            "draft_version": drafter.version if drafter is not None else None,
            "temperature": float(temperature),
            "top_p": float(top_p),
            "source": self.source,
            "prompt_hash": prompt_hash,
        }

    def _stream(self, request: _Decoding, token_ids: list[int]) -> Generator[str, None, str]:
        """Decode ``request`` into ``token_ids``, yielding each new piece of visible text; return the finish reason."""
        finish = "length"
        shown = 0  # characters of text already yielded
        with torch.inference_mode():
            for finished in self._decode(request, token_ids):
                text = request.stopper.visible_text(token_ids, final=finished is not None)
                if len(text) > shown:
                    yield text[shown:]
                    shown = len(text)
                if finished is not None:
                    finish = finished
        return finish

    def _decode(self, request: _Decoding, output: list[int]) -> Iterator[str | None]:
        """Run prefill and steps, appending to ``output``; yield after each, the finish reason at the end."""
        from transformers import DynamicCache

        generator = torch.Generator().manual_seed(request.seed) if request.seed is not None else None
        prompt_ids, stats, stopper = request.prompt_ids, request.stats, request.stopper
        seq = _Sequence(tokens=list(prompt_ids), prompt_length=len(prompt_ids), cache=DynamicCache())
        first = prefill(self.target, seq, request.params, generator)
        seq.tokens.append(first)
        output.append(first)
        stats.first_token()
        if stopper.keep(output, 1) is not None:
            yield "stop"
            return
        yield None
        _begin_drafting(request)
        gamma_now = stats.gamma
        while len(output) < request.max_new_tokens:
            gamma_now = _replanned(request, gamma_now)
            # Never draft past max_new_tokens: the step's own token needs one slot.
            gamma = 0 if request.measure_t1 else min(gamma_now, request.max_new_tokens - len(output) - 1)
            request.measure_t1 = False
            emitted, drafted = self._step(request, seq, gamma, generator)
            accepted = len(emitted) - 1
            output.extend(emitted)
            keep = stopper.keep(output, len(emitted))
            if keep is not None:
                del output[len(output) - len(emitted) + keep :]
                stats.step(drafted, min(accepted, keep), keep, stopped_mid_step=keep <= accepted)
                yield "stop"
                return
            seq.tokens.extend(emitted)
            stats.step(drafted, accepted, len(emitted), stopped_mid_step=False)
            yield None
        yield "length"

    def _step(
        self, request: _Decoding, seq: _Sequence, gamma: int, generator: torch.Generator | None
    ) -> tuple[list[int], int]:
        """One draft-and-verify step; one that drafted is charged to the loss guard, which may stop the drafting."""
        started = time.perf_counter()
        emitted, drafted = speculative_step(
            self.target, request.drafter, seq, gamma, request.params, generator, request.stats
        )
        guard = request.guard
        if guard is not None and drafted and guard.charge((time.perf_counter() - started) * 1000, len(emitted)):
            request.drafter = None
            logger.debug("speculation stopped after %d steps: %.1f ms lost to drafting",
                         request.stats.num_spec_steps + 1, guard.excess_ms)  # fmt: skip
        return emitted, drafted

    # Helpers

    def _label_of(self, name: str) -> str:
        """The label of the drafter a request asked for by label or by kind; ValueError naming the choices."""
        matches = [label for label, d in zip(self.labels, self.drafters, strict=True) if name in (label, d.kind)]
        if len(matches) != 1:
            known = ", ".join(self.labels) or "none: the decoder has no drafter"
            raise ValueError(f"drafter {name!r} is not one of this decoder's drafters ({known})")
        return matches[0]

    def _encode(self, prompt: Prompt, chat: bool) -> tuple[list[int], str]:
        tokenizer = self.target.tokenizer
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("prompt is empty")
            text = prompt
            if chat:
                text = tokenizer.apply_chat_template(
                    [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
                )
                ids = tokenizer.encode(text, add_special_tokens=False)
            else:
                ids = tokenizer.encode(text)
        else:
            messages = list(prompt)
            if not messages or not any(str(m.get("content", "")).strip() for m in messages):
                raise ValueError("messages are empty")
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = tokenizer.encode(text, add_special_tokens=False)
        # Prompt text is never stored; its hash lets identical prompts be grouped.
        return list(ids), hashlib.sha256(text.encode()).hexdigest()[:16]

    def _hand_over(self, record: RequestRecord) -> None:
        if self.sink is None:
            return
        try:
            self.sink(record)
        except Exception:
            logger.exception("the record sink failed for request %s", record.request_id)


def _causes(prompt: Prompt, chat: bool, answer: str) -> dict[str, object]:
    """The record's style fingerprint and copy share (decoder/causes.py), as the proxy computes them.

    Messages are a chat's template and turns; a string under ``chat`` is one user turn; a plain string
    prompt has no template to name (no fingerprint).
    """
    if isinstance(prompt, str):
        payload = {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    else:
        payload = {"messages": list(prompt)}
    return {
        "style_hash": style_fingerprint(payload),
        "prompt_copy_share": copy_share(prompt_text(payload), answer[:MAX_TEXT_CHARS]) if answer else None,
    }
