"""Verification: which draft tokens the target accepts, and which token of its own it adds.

Both rules see the target's logits for the ``gamma + 1`` positions of one verification pass:
row ``i`` is the target's prediction after the last accepted token and the first ``i`` drafts, so
row ``i`` judges draft ``i`` and row ``gamma`` is the bonus position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decoder.sampling import SamplingParams, logits_to_probs, sample


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one verification pass."""

    num_accepted: int  # drafts accepted, a prefix of the proposal
    next_token: int  # the target's own token: the correction, or the bonus when all were accepted


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """Accept the longest prefix of the drafts that equals the target's argmax, then the target's token.

    draft_tokens: (gamma,) int64; target_logits: (gamma + 1, V).

    >>> logits = torch.tensor([[0., 9.], [9., 0.], [0., 9.]])   # target argmax: 1, 0, 1
    >>> verify_greedy(torch.tensor([1, 1]), logits)
    Verdict(num_accepted=1, next_token=0)
    """
    target_choice = torch.argmax(target_logits, dim=-1).tolist()  # (gamma + 1,), the one host sync
    drafts = draft_tokens.tolist()
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == target_choice[accepted]:
        accepted += 1
    return Verdict(num_accepted=accepted, next_token=int(target_choice[accepted]))


def verify_sampled(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> Verdict:
    """The rejection-sampling rule of Leviathan et al. (2023) and Chen et al. (2023).

    For draft token x_i proposed with probability q_i(x_i), where the target gives p_i(x_i):

        accept x_i with probability min(1, p_i(x_i) / q_i(x_i));
        at the first rejection, emit a token drawn from norm(max(0, p_i - q_i)) and stop;
        if all gamma drafts are accepted, emit a bonus token drawn from p_gamma.

    Every emitted token is then distributed exactly as the target alone would sample it. p and q
    are both shaped by the same temperature / top-k / top-p. A drafter without probabilities (the
    n-gram drafter proposes deterministically) has q_i = one-hot(x_i), so acceptance is p_i(x_i) and
    the residual is p_i with x_i removed.

    draft_tokens: (gamma,) int64; draft_probs: (gamma, V) or None; target_logits: (gamma + 1, V).
    """
    gamma = draft_tokens.shape[0]
    p = logits_to_probs(target_logits, params)  # (gamma + 1, V)
    positions = torch.arange(gamma)
    p_draft = p[positions, draft_tokens]  # (gamma,)
    q_draft = torch.ones(gamma) if draft_probs is None else draft_probs[positions, draft_tokens]  # (gamma,)
    ratio = p_draft / q_draft.clamp_min(1e-20)
    uniforms = torch.rand(gamma, generator=generator)
    rejected = (uniforms >= ratio).tolist()  # (gamma,), the one host sync
    accepted = rejected.index(True) if True in rejected else gamma
    if accepted == gamma:
        return Verdict(num_accepted=gamma, next_token=sample(p[gamma], generator))
    if draft_probs is None:
        residual = p[accepted].clone()
        residual[draft_tokens[accepted]] = 0.0
    else:
        residual = (p[accepted] - draft_probs[accepted]).clamp_min(0.0)
    total = residual.sum()
    # p == q up to rounding leaves nothing to renormalise; then p itself is the right distribution.
    residual = residual / total if total > 0 else p[accepted]
    return Verdict(num_accepted=accepted, next_token=sample(residual, generator))
