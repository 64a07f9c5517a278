"""Speculative sampling must preserve the target's distribution.

Each test draws many sequences with the rule under test and compares their empirical distribution
with the exact one by a chi-square goodness-of-fit test. A correct rule fails with probability
alpha = 1e-3 (the false-failure rate; the seeds are fixed, so a given run is deterministic). Two
deliberately wrong rules are run through the same check and must fail it, which shows the test
has the power to catch a broken acceptance rule.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from scipy.stats import chisquare

from decoder import LoadedModel, ModelDrafter, SamplingParams, SpeculativeDecoder
from decoder.sampling import logits_to_probs, sample
from decoder.verify import Verdict, verify_sampled

ALPHA = 1e-3
V, GAMMA, LENGTH = 4, 3, 3

Rule = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor, SamplingParams, torch.Generator | None], Verdict]


def accept_always(drafts, q, logits, params, generator):  # type: ignore[no-untyped-def]
    gamma = drafts.shape[0]
    return Verdict(gamma, sample(logits_to_probs(logits[gamma], params), generator))


def resample_from_p(drafts, q, logits, params, generator):  # type: ignore[no-untyped-def]
    """Right acceptance test, wrong correction: samples the rejection from p instead of max(0, p - q)."""
    verdict = verify_sampled(drafts, q, logits, params, generator)
    if verdict.num_accepted == drafts.shape[0]:
        return verdict
    p = logits_to_probs(logits[verdict.num_accepted], params)
    return Verdict(verdict.num_accepted, sample(p, generator))


def goodness_of_fit(observed: Counter[tuple[int, ...]], expected: dict[tuple[int, ...], float], n: int) -> float:
    """Chi-square p-value; cells expected fewer than 5 times are pooled so the test stays valid."""
    obs, exp, pooled_obs, pooled_exp = [], [], 0.0, 0.0
    for cell, probability in expected.items():
        if probability * n >= 5:
            obs.append(observed[cell])
            exp.append(probability * n)
        else:
            pooled_obs += observed[cell]
            pooled_exp += probability * n
    if pooled_exp > 0:
        obs.append(pooled_obs)
        exp.append(pooled_exp)
    total = sum(exp)
    return float(chisquare(obs, [e * sum(obs) / total for e in exp]).pvalue)


def markov_chain(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random target and draft chains over V states; rows are P(next | previous)."""
    torch.manual_seed(seed)
    prior = torch.distributions.Dirichlet(torch.full((V,), 0.7))
    return prior.sample((V,)), prior.sample((V,))  # (V, V), (V, V)


def sample_sequences(rule: Rule, target: torch.Tensor, draft: torch.Tensor, n: int, seed: int) -> Counter:
    """Run draft-and-verify steps on a Markov chain until LENGTH tokens are emitted, n times."""
    generator = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=1.0)
    counts: Counter[tuple[int, ...]] = Counter()
    for _ in range(n):
        emitted: list[int] = []
        last = 0
        while len(emitted) < LENGTH:
            drafts, q_rows, previous = [], [], last
            for _ in range(GAMMA):
                token = sample(draft[previous], generator)
                drafts.append(token)
                q_rows.append(draft[previous])
                previous = token
            contexts = [last, *drafts]  # row i judges draft i given the tokens before it
            logits = torch.log(target[contexts])  # (GAMMA + 1, V)
            verdict = rule(torch.tensor(drafts), torch.stack(q_rows), logits, params, generator)
            emitted += [*drafts[: verdict.num_accepted], verdict.next_token]
            last = emitted[-1]
        counts[tuple(emitted[:LENGTH])] += 1
    return counts


def exact_chain_distribution(target: torch.Tensor) -> dict[tuple[int, ...], float]:
    exact = {}
    for seq in itertools.product(range(V), repeat=LENGTH):
        probability, previous = 1.0, 0
        for token in seq:
            probability *= float(target[previous, token])
            previous = token
        exact[seq] = probability
    return exact


@pytest.fixture(scope="module")
def chain() -> tuple[torch.Tensor, torch.Tensor]:
    return markov_chain(7)


def test_rule_preserves_target_distribution(chain: tuple[torch.Tensor, torch.Tensor]) -> None:
    target, draft = chain
    n = 12_000
    counts = sample_sequences(verify_sampled, target, draft, n, seed=1)
    assert goodness_of_fit(counts, exact_chain_distribution(target), n) > ALPHA


@pytest.mark.parametrize("broken_rule", [accept_always, resample_from_p])
def test_wrong_rules_are_caught(chain: tuple[torch.Tensor, torch.Tensor], broken_rule: Rule) -> None:
    target, draft = chain
    n = 12_000
    counts = sample_sequences(broken_rule, target, draft, n, seed=1)
    assert goodness_of_fit(counts, exact_chain_distribution(target), n) < ALPHA


def test_deterministic_proposals_preserve_distribution(chain: tuple[torch.Tensor, torch.Tensor]) -> None:
    """An n-gram-style drafter (q = one-hot) through the same rule."""
    target, _ = chain
    generator = torch.Generator().manual_seed(5)
    params = SamplingParams(temperature=1.0)
    n = 12_000
    counts: Counter[tuple[int, ...]] = Counter()
    for _ in range(n):
        drafts = torch.tensor([1, 2])  # always the same guess
        logits = torch.log(target[[0, 1, 2]])
        verdict = verify_sampled(drafts, None, logits, params, generator)
        emitted = [*drafts[: verdict.num_accepted].tolist(), verdict.next_token]
        if len(emitted) == 1:  # continue from the correction with plain sampling
            emitted.append(sample(target[emitted[0]], generator))
        counts[tuple(emitted[:2])] += 1
    exact = {(a, b): float(target[0, a] * target[a, b]) for a in range(V) for b in range(V)}
    assert goodness_of_fit(counts, exact, n) > ALPHA


def test_decoder_end_to_end_sampling(tiny_target: LoadedModel, near_draft: LoadedModel) -> None:
    """Through the real decoder (caches, rollback, wiring): the first three tokens follow the target."""
    params = SamplingParams(temperature=1.0)
    prompt = "a b"
    prompt_ids = tiny_target.tokenizer.encode(prompt)
    exact: dict[tuple[int, ...], float] = {}
    with torch.inference_mode():

        def next_probs(ids: list[int]) -> torch.Tensor:
            logits = tiny_target.model(input_ids=torch.tensor([ids])).logits[0, -1]
            return logits_to_probs(logits, params)

        first = next_probs(prompt_ids)
        for a in range(first.shape[0]):
            if a == 0:  # end of sequence stops the request
                exact[(a,)] = float(first[a])
                continue
            second = next_probs([*prompt_ids, a])
            for b in range(second.shape[0]):
                if b == 0:
                    exact[(a, b)] = float(first[a] * second[b])
                    continue
                third = next_probs([*prompt_ids, a, b])
                for c in range(third.shape[0]):
                    exact[(a, b, c)] = float(first[a] * second[b] * third[c])
    decoder = SpeculativeDecoder(tiny_target, ModelDrafter(near_draft, tiny_target.vocab_size), gamma=2)
    n = 2_500
    counts: Counter[tuple[int, ...]] = Counter()
    for seed in range(n):
        result = decoder.generate(prompt, max_new_tokens=3, temperature=1.0, seed=seed)
        counts[tuple(result.token_ids)] += 1
    assert sum(counts.values()) == n
    assert goodness_of_fit(counts, exact, n) > ALPHA
