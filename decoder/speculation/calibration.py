"""What the model pair's passes cost, timed once before the first request the controller plans.

The controller decides from relative costs: ``c`` (a draft token over a one-token target pass
``t1``) and ``v(k)`` (a verification pass over k drafts over ``t1``). Learned from requests
alone, a new pair's first request must speculate to find them out, and where the pair cannot pay
that request is slower than plain decoding: on a 2-core AVX2 CPU the int4 Qwen2.5-Coder-1.5B
target with its 0.5B draft measured c ≈ 0.7 and v(1) ≈ 1.35, a loss at any acceptance rate. Timing the
passes on a fixed text costs the target ``(rounds + 1) * (gamma_max + 1)`` passes once, at start,
and lets the controller plan every request, the first included, from measured costs.

The drafter's prefill (a draft model reading the prompt, once per request) is timed per prompt
token, apart from its steps: the controller weighs it against the request's expected length.
Acceptance is not measured here: it depends on the text, so it stays with the requests.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from tqdm.auto import trange

from decoder.cpu.row_stable import row_stable_passes
from decoder.drafters.base import Drafter
from decoder.models.loading import LoadedModel
from decoder.sampling import SamplingParams
from decoder.speculation.controller import Observation
from decoder.speculation.target_pass import target_logits

# Said twice, so that an n-gram drafter finds a continuation to propose, as it would on code edits.
CALIBRATION_TEXT = 2 * (
    "def moving_average(values: list[float], window: int) -> list[float]:\n"
    '    """The mean of each run of `window` consecutive values."""\n'
    "    if window <= 0:\n"
    '        raise ValueError(f"window must be positive, got {window}")\n'
    "    return [sum(values[i : i + window]) / window for i in range(len(values) - window + 1)]\n"
)
T = TypeVar("T")

CALIBRATION_ROUNDS = 3
GREEDY = SamplingParams()


def measure_pair_costs(
    target: LoadedModel, drafter: Drafter, gamma_max: int, rounds: int = CALIBRATION_ROUNDS
) -> Observation:
    """Time one-token target passes, verification passes over 1..``gamma_max`` drafts, the drafter's prefill and steps.

    Every size is timed ``rounds`` times after one untimed warm-up round; the median of each is
    kept (counted ``rounds`` times), so one pass slowed by another process does not set the cost.
    The passes run exactly as the decode loop runs them: on a KV cache over the text, row-stable,
    cropped back after each.

    A progress bar per round goes to stderr when stderr is a terminal: a person waiting at one sees
    the seconds pass (seconds to a minute, longer with a draft model), a service's log file gets none.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds!r}")
    ids = list(target.tokenizer.encode(CALIBRATION_TEXT))
    if len(ids) <= gamma_max + 1:
        raise ValueError(f"the calibration text is {len(ids)} tokens, too short for gamma_max={gamma_max}")
    from transformers import DynamicCache

    pass_ms: dict[int, list[float]] = {k: [] for k in range(gamma_max + 1)}  # by drafts carried
    prefills: list[float] = []  # ms for the drafter to read ids[:-1]
    proposals: list[tuple[float, int]] = []  # (ms, tokens)
    with torch.inference_mode():
        cache = DynamicCache()
        context = torch.tensor([ids[:-1]], dtype=torch.long, device=target.device)  # (1, n - 1)
        target_logits(target.model, context, cache, keep=1)  # the cache now holds all but the pending token
        for _ in trange(rounds + 1, desc="timing the model pair", unit="round", disable=None):  # None: tty only
            for k in range(gamma_max + 1):
                block = torch.tensor([ids[-1:] + ids[:k]], dtype=torch.long, device=target.device)  # (1, k + 1)
                pass_ms[k].append(_timed_pass(target, block, cache))
            prefills.append(_timed(drafter.begin, ids[:-1])[0])
            proposals.append(_timed(lambda: len(drafter.propose(ids, gamma_max, GREEDY, None))))
    kept = {k: statistics.median(times[1:]) for k, times in pass_ms.items()}  # the warm-up round left out
    sized_ms = {k: rounds * kept[k] for k in range(1, gamma_max + 1)}
    return Observation(
        draft_prefill_tokens=rounds * (len(ids) - 1),
        draft_prefill_ms=rounds * statistics.median(prefills[1:]),
        draft_tokens=sum(tokens for _, tokens in proposals[1:]),
        draft_ms=sum(ms for ms, _ in proposals[1:]),
        verify_passes=rounds * gamma_max,
        verify_drafts=rounds * sum(range(1, gamma_max + 1)),
        verify_ms=sum(sized_ms.values()),
        single_passes=rounds,
        single_ms=rounds * kept[0],
        sized_passes={k: rounds for k in sized_ms},
        sized_ms=sized_ms,
    )


def _timed_pass(target: LoadedModel, block: torch.Tensor, cache: object) -> float:
    """Milliseconds of one decode-loop target pass over ``block`` (1, k + 1); the cache is cropped back after."""
    with row_stable_passes():
        elapsed_ms, _ = _timed(target_logits, target.model, block, cache, block.shape[1])
    cache.crop(-block.shape[1])  # type: ignore[attr-defined]
    return elapsed_ms


def _timed(call: Callable[..., T], *args: Any) -> tuple[float, T]:
    """Milliseconds that ``call(*args)`` took, and what it returned."""
    started = time.perf_counter()
    result = call(*args)
    return (time.perf_counter() - started) * 1000, result
