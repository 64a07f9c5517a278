"""Level 2 of the acceptance split: a workload's within part shared among the factor groups that moved.

Inside one workload, R = Σ accepted / Σ drafted over its drafting requests. Each request carries one
label per factor group (:data:`GROUPS`, made by :func:`label_requests`). For a set S of groups the cells
are the joint labels of S, and

    v(S) = Σ_k r̄_k (w1_k − w0_k)

is the change the composition of S alone explains: w_k the cell's share of a window's drafted tokens,
r̄_k its rate over both windows together (so a cell seen in one window only, a new drafter version or
system prompt, still has one). v(∅) = 0. Each group's part is its Shapley value,

    φ_g = Σ_{S ∌ g} |S|! (G − |S| − 1)! / G! · (v(S ∪ {g}) − v(S)),

which does not depend on an order of the groups (Das Gupta's many-factor decomposition is this split);
Σ_g φ_g = v(every group), and the rest, rates moving inside the finest cells, is ``unexplained``. A cell
with fewer than ``min_requests`` requests over both windows is merged with the thin cells that share its
labels of the least fragmenting groups (:func:`_cells_of`), for every S.

Causality is said only where the data shows it: a version (or replica) part is an effect when its
cells served side by side in the current window; after a full switch it only coincides with it.

Intervals: every request of both windows weighted Poisson(1) per replicate (requests, never tokens),
the whole computation repeated per replicate. Benjamini–Hochberg across a workload's parts decides with
the interval and the size floor which are named. The parts are scaled by the workload's mean share of
drafts, so that they and the workload's ``unexplained`` add up to its Level 1 within part exactly.

>>> rng = np.random.default_rng(5)
>>> def window(n, copied):
...     share = np.where(rng.random(n) < copied, 0.8, 0.05)  # an answer copies its prompt or not
...     d = rng.integers(8, 40, n).astype(float)
...     rows = [RequestFactors(100, 50, 0.0, 1.0, 4, None, s, "ngram", None, None, None, None) for s in share]
...     return label_requests(d, rng.binomial(d.astype(int), 0.1 + 0.8 * share).astype(float), rows)
>>> parts = split_within((window(800, 0.7), window(800, 0.2)), "extract", 1.0,
...                      min_requests=30, n_boot=200, seed=1, fdr_level=0.01)
>>> [(p.cause, p.named) for p in parts]
[('content', True), ('unexplained', False)]
>>> round(parts[0].value, 2), parts[0].detail["lead"]
(-0.31, 'copy share <10 %')
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Final, NamedTuple, cast

import numpy as np
from scipy import sparse
from scipy import stats as st

from monitor.drift.explain import NAMED_FLOOR, Cause, Explanation, Part, interval, usable
from monitor.drift.result import benjamini_hochberg
from monitor.drift.stats import FloatArray

GROUPS: Final[tuple[Cause, ...]] = ("length", "sampling", "style", "content", "version", "health")
# Decode speed moves with the load on the engine and with acceptance itself (fewer accepted drafts, more passes).
SPEED_GROUPS: Final[tuple[Cause, ...]] = (*GROUPS, "load", "acceptance")
MERGED: Final = "other (thin cells)"
# Token-count buckets: powers of four read well ("prompt 256-1023") and keep the cells few.
_LENGTH_EDGES: Final = (64, 256, 1024, 4096, 16384)
_COPY_EDGES: Final = ((0.1, "<10 %"), (0.3, "10-30 %"), (0.6, "30-60 %"))
_CACHED_EDGES: Final = ((0.0, "none"), (0.5, "under half"))
# Uptime: a decay over hours (vLLM #41838) or a day (SGLang #37326) shows as the later buckets accepting less.
_UPTIME_EDGES: Final = ((3_600.0, "under an hour"), (6 * 3_600.0, "1-6 h"), (86_400.0, "6-24 h"))
# KV-cache use: SGLang #36537 collapses past 0.6.
_KV_EDGES: Final = ((0.6, "under 0.6"), (0.8, "0.6-0.8"))
# Requests in flight at the engine when this one was sent: doubling buckets, as batch sizes grow.
_INFLIGHT_EDGES: Final = ((2, "1"), (4, "2-3"), (8, "4-7"), (16, "8-15"), (32, "16-31"))
_ACCEPTED_EDGES: Final = ((0.25, "under 0.25"), (0.5, "0.25-0.5"), (0.75, "0.5-0.75"))


class RequestFactors(NamedTuple):
    """What one request says about each factor group (None: the engine or the request did not give it)."""

    prompt_tokens: int
    output_tokens: int
    temperature: float | None
    top_p: float | None
    draft_tokens: int | None  # k, the draft length asked for
    style_hash: str | None
    copy_share: float | None
    drafter: str
    draft_model: str | None
    draft_version: str | None
    target_version: str | None
    replica: str | None
    cached_prompt_tokens: int | None = None
    engine_version: str | None = None
    replica_uptime_s: float | None = None
    kv_cache_use: float | None = None
    upstream_inflight: int | None = None
    accepted: int | None = None  # the request's accepted draft tokens, for a split of decode speed
    drafted: int | None = None


@dataclass(frozen=True, slots=True)
class Requests:
    """One window's requests of a workload: the ratio's tokens and numerator, one label per request and group.

    For acceptance, drafted and accepted tokens; for decode speed, decode tokens and decode ms.
    """

    drafted: FloatArray
    accepted: FloatArray
    labels: dict[str, list[str]]

    def __len__(self) -> int:
        return len(self.drafted)


def label_requests(
    drafted: FloatArray,
    accepted: FloatArray,
    rows: Sequence[RequestFactors],
    groups: Sequence[Cause] = GROUPS,
    bounded: bool = True,
) -> Requests:
    """Each request's label per group; requests without a usable token count are left out.

    ``bounded``: the numerator never exceeds the tokens (acceptance; not decode ms).
    """
    d, a = np.asarray(drafted, dtype=float), np.asarray(accepted, dtype=float)
    keep = usable(d, a, bounded)
    kept = [r for r, k in zip(rows, keep, strict=True) if k]
    return Requests(d[keep], a[keep], {group: [_LABEL[group](r) for r in kept] for group in groups})


def _length(r: RequestFactors) -> str:
    return f"prompt {_tokens(r.prompt_tokens)}, output {_tokens(r.output_tokens)}"


def _style(r: RequestFactors) -> str:
    return f"system prompt {r.style_hash}" if r.style_hash else "no template"


def _load(r: RequestFactors) -> str:
    n = r.upstream_inflight
    if n is None:
        return "in flight unknown"
    return "in flight " + next((name for edge, name in _INFLIGHT_EDGES if n < edge), "32 or more")


def _acceptance(r: RequestFactors) -> str:
    if not r.drafted or r.accepted is None:
        return "no drafts"
    return "acceptance " + next((name for edge, name in _ACCEPTED_EDGES if r.accepted / r.drafted < edge), "0.75+")


def _tokens(n: int) -> str:
    low = 0
    for edge in _LENGTH_EDGES:
        if n < edge:
            return f"{low}-{edge - 1} tokens"
        low = edge
    return f"{low}+ tokens"


def _sampling(r: RequestFactors) -> str:
    t = "T ?" if r.temperature is None or not math.isfinite(r.temperature) else f"T {_temperature(r.temperature)}"
    p = "" if r.top_p is None or not math.isfinite(r.top_p) or r.top_p >= 1 else ", top_p < 1"
    k = f", k {r.draft_tokens}" if r.draft_tokens else ""
    return t + p + k


def _temperature(t: float) -> str:
    if t <= 1e-6:
        return "0"
    return "0-0.5" if t <= 0.5 else "0.5-1" if t <= 1.0 else "> 1"


def _content(r: RequestFactors) -> str:
    return _copy(r.copy_share)


def _copy(share: float | None) -> str:
    if share is None or not math.isfinite(share):
        return "copy share unknown"
    return "copy share " + next((name for edge, name in _COPY_EDGES if share < edge), ">= 60 %")


def _version(r: RequestFactors) -> str:
    drafter = r.drafter if r.draft_model is None else f"{r.drafter} {r.draft_model}"
    named = (("drafter", r.draft_version), ("target", r.target_version), ("engine", r.engine_version))
    return ", ".join([drafter, *(f"{name} {v}" for name, v in named if v)])


def _health(r: RequestFactors) -> str:
    """The replica, how long it had been up, its KV-cache use and its prefix cache's share, where known."""
    parts = [f"replica {r.replica}" if r.replica else "replica unknown"]
    if r.replica_uptime_s is not None and math.isfinite(r.replica_uptime_s):
        parts.append("up " + next((name for edge, name in _UPTIME_EDGES if r.replica_uptime_s < edge), "a day or more"))
    if r.kv_cache_use is not None and math.isfinite(r.kv_cache_use):
        parts.append("KV cache " + next((name for edge, name in _KV_EDGES if r.kv_cache_use < edge), "0.8 or more"))
    if r.cached_prompt_tokens is not None and r.prompt_tokens > 0:
        share = r.cached_prompt_tokens / r.prompt_tokens
        parts.append("prefix cache " + next((name for edge, name in _CACHED_EDGES if share <= edge), "half or more"))
    return ", ".join(parts)


_LABEL: Final[dict[Cause, Callable[[RequestFactors], str]]] = {
    "length": _length,
    "sampling": _sampling,
    "style": _style,
    "content": _content,
    "version": _version,
    "health": _health,
    "load": _load,
    "acceptance": _acceptance,
}


@dataclass(frozen=True, slots=True)
class _Sums:
    """Accepted and drafted sums per finest cell, window and replicate (column 0: the estimate)."""

    codes: np.ndarray[Any, np.dtype[np.int64]]  # (cells, groups): each finest cell's label code per group
    names: list[list[str]]  # per group: the label of each code
    accepted: FloatArray  # (2, cells, replicates)
    drafted: FloatArray
    requests: np.ndarray[Any, np.dtype[np.int64]]  # (2, cells)


def split_within(
    windows: tuple[Requests, Requests],
    workload: str,
    weight: float,
    *,
    min_requests: int,
    n_boot: int,
    seed: int,
    fdr_level: float,
    ci_level: float = 0.95,
    floor: float = NAMED_FLOOR,
    total: float | None = None,
) -> list[Part]:
    """The parts of ``workload``'s within change, each scaled by ``weight`` (its mean share of drafts).

    One part per group whose labels vary, then ``unexplained``: the change inside the finest cells,
    shifted so that the parts add up to ``total`` (the Level 1 within part) exactly where it is given.
    """
    if min(len(w) for w in windows) == 0:
        return []
    groups = list(windows[0].labels)
    sums = _sums(windows, n_boot, seed)
    varying = [g for g in range(len(groups)) if len(sums.names[g]) > 1]
    value = {0: np.zeros(1 + n_boot)}
    for size in range(1, len(varying) + 1):
        for subset in combinations(varying, size):
            value[_mask(subset)] = _composition(sums, subset, min_requests)
    g_count = len(varying)
    shapley = np.zeros((g_count, 1 + n_boot))
    for j, g in enumerate(varying):
        others = [h for h in varying if h != g]
        for size in range(len(others) + 1):
            coef = math.factorial(size) * math.factorial(g_count - size - 1) / math.factorial(g_count)
            for subset in combinations(others, size):
                shapley[j] += coef * (value[_mask((*subset, g))] - value[_mask(subset)])
    rate = sums.accepted.sum(axis=1) / sums.drafted.sum(axis=1)  # (2, replicates)
    draws = weight * np.vstack([shapley, rate[1] - rate[0] - value[_mask(tuple(varying))]])
    # The rest adds up to ``total``: the Level 1 figure is exact where this sample is not.
    if total is not None:
        draws[-1] += total - draws[:, 0].sum()
    z = draws[:, 0] / np.maximum(draws[:, 1:].std(axis=1), 1e-300)
    qs = benjamini_hochberg(list(2 * st.norm.sf(np.abs(z))))
    unvarying = [groups[g] for g in range(len(groups)) if g not in varying]
    parts = []
    for j, (q, row) in enumerate(zip(qs, draws, strict=True)):
        low, high = interval(row[1:], ci_level)
        named = q < fdr_level and (low > 0 or high < 0) and abs(row[0]) >= floor
        if j < len(varying):
            cause, detail = cast(Cause, groups[varying[j]]), _detail(sums, varying[j], float(row[0]), min_requests)
        else:
            cause = "unexplained"
            detail = {
                "reason": "rates moving inside the finest cells",
                **({"constant": unvarying} if unvarying else {}),
            }
        parts.append(Part(cause, workload, float(row[0]), low, high, bool(named), q, detail))
    return parts


def split_named(
    explanation: Explanation,
    requests_of: Callable[[str], tuple[Requests, Requests]],
    *,
    min_requests: int,
    n_boot: int,
    seed_of: Callable[[str], int],
    fdr_level: float,
) -> Explanation:
    """Level 2 for every workload whose within part is named: ``requests_of(workload)`` gives its windows."""
    for part in explanation.parts:
        if part.cause != "within" or not part.named or part.workload is None:
            continue
        parts = split_within(
            requests_of(part.workload),
            part.workload,
            (part.detail["share_ref"] + part.detail["share_cur"]) / 2,
            min_requests=min_requests,
            n_boot=n_boot,
            seed=seed_of(part.workload),
            fdr_level=fdr_level,
            floor=explanation.floor,
            total=part.value,
        )
        if parts:
            explanation = explanation.with_split(part, parts)
    return explanation


def _mask(groups: Sequence[int]) -> int:
    return sum(1 << g for g in groups)


def _sums(windows: tuple[Requests, Requests], n_boot: int, seed: int) -> _Sums:
    names: list[list[str]] = []
    columns = []
    for group in windows[0].labels:
        uniq, inverse = np.unique(np.array(windows[0].labels[group] + windows[1].labels[group]), return_inverse=True)
        names.append([str(u) for u in uniq])
        columns.append(inverse.astype(np.int64))
    codes = np.column_stack(columns)  # (requests, groups)
    cells, cell_of = np.unique(codes, axis=0, return_inverse=True)
    cell_of = cell_of.reshape(-1)
    n = len(cell_of)
    window = np.repeat([0, 1], [len(windows[0]), len(windows[1])])
    accepted = np.concatenate([windows[0].accepted, windows[1].accepted])
    drafted = np.concatenate([windows[0].drafted, windows[1].drafted])
    rng = np.random.default_rng(seed)
    weights = np.vstack([np.ones((1, n)), rng.poisson(1.0, (n_boot, n)).astype(float)]).T  # (requests, replicates)
    out_a = np.zeros((2, len(cells), 1 + n_boot))
    out_d = np.zeros_like(out_a)
    requests = np.zeros((2, len(cells)), dtype=np.int64)
    for k in (0, 1):
        mine = window == k
        index = np.flatnonzero(mine)
        for out, values in ((out_a, accepted), (out_d, drafted)):
            onehot = sparse.csr_matrix((values[index], (cell_of[index], index)), shape=(len(cells), n))
            out[k] = onehot @ weights
        requests[k] = np.bincount(cell_of[mine], minlength=len(cells))
    return _Sums(cells.astype(np.int64), names, out_a, out_d, requests)


def _cells_of(
    sums: _Sums, groups: Sequence[int], min_requests: int
) -> tuple[np.ndarray[Any, Any], int, np.ndarray[Any, np.dtype[np.bool_]]]:
    """Each finest cell's cell under ``groups``, how many cells, and which cells are thin ones merged.

    A thin joint cell is not thrown into one ``other`` cell for all: it keeps its labels of the groups
    with the fewest values and is merged with the other thin cells that share them, dropping the most
    fragmenting group first, until the merged cell is big enough (at last: every group dropped). Thrown
    together, thin cells of a busy and an idle replica, say, would lose the one label that explains
    them, and every group that fragments the cells would seem to take part of the change back.
    """
    counts = sums.requests.sum(axis=0)
    order = sorted(groups, key=lambda g: (-len(sums.names[g]), g))
    columns = list(groups)
    key = np.full((len(counts), len(columns)), -1, dtype=np.int64)
    pending = np.arange(len(counts))
    for dropped in range(len(columns) + 1):
        active = [j for j, g in enumerate(columns) if g not in order[:dropped]]
        trial = np.full((len(pending), len(columns)), -1, dtype=np.int64)
        chosen = np.array([columns[j] for j in active], dtype=np.int64)
        trial[:, active] = sums.codes[np.ix_(pending, chosen)]
        _, inverse = np.unique(trial, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        big = np.bincount(inverse, weights=counts[pending])[inverse] >= min_requests
        if dropped == len(columns):
            big[:] = True
        key[pending[big]] = trial[big]
        pending = pending[~big]
        if not len(pending):
            break
    cells, cell = np.unique(key, axis=0, return_inverse=True)
    merged = (cells == -1).any(axis=1) if len(columns) else np.zeros(len(cells), dtype=bool)
    return cell.reshape(-1), len(cells), merged


def _aggregate(sums: _Sums, cell: np.ndarray[Any, Any], count: int) -> tuple[FloatArray, FloatArray]:
    to = sparse.csr_matrix((np.ones(len(cell)), (cell, np.arange(len(cell)))), shape=(count, len(cell)))
    return np.stack([to @ sums.accepted[k] for k in (0, 1)]), np.stack([to @ sums.drafted[k] for k in (0, 1)])


def _composition(sums: _Sums, groups: Sequence[int], min_requests: int) -> FloatArray:
    """v(S) per replicate: Σ_k r̄_k (w1_k − w0_k) over the cells of ``groups``."""
    cell, count, _ = _cells_of(sums, groups, min_requests)
    a, d = _aggregate(sums, cell, count)  # (2, cells, replicates)
    both = d.sum(axis=0)
    pooled = np.divide(a.sum(axis=0), both, out=np.zeros_like(both), where=both > 0)
    share = d / np.maximum(d.sum(axis=1, keepdims=True), 1e-300)
    return np.asarray((pooled * (share[1] - share[0])).sum(axis=0), dtype=float)


def _detail(sums: _Sums, g: int, value: float, min_requests: int) -> dict[str, Any]:
    """The group's cells alone: each one's share of drafts and rate per window, and the lead one.

    The lead is the cell whose centred term (r̄_k − R̄)(w1_k − w0_k) goes furthest in the part's direction,
    among the cells whose share grew where one did (the new system prompt rather than the old one it displaced).
    ``same_window``: the lead and another cell each served ``min_requests`` requests in the current window,
    so their rates there compare like for like (``versus``: the biggest such other cell).
    """
    cell, count, merged = _cells_of(sums, (g,), min_requests)
    names = [MERGED] * count
    for finest, c in enumerate(cell):
        if not merged[c]:
            names[c] = sums.names[g][sums.codes[finest, g]]
    a, d = (x[:, :, 0] for x in _aggregate(sums, cell, count))  # (2, cells)
    n = np.stack([np.bincount(cell, weights=sums.requests[k], minlength=count) for k in (0, 1)])
    share = d / d.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = a / d
    pooled, overall = a.sum(axis=0) / np.maximum(d.sum(axis=0), 1e-300), a.sum() / d.sum()
    terms = (pooled - overall) * (share[1] - share[0])
    direction = math.copysign(1.0, value)
    # A cell that grew is the news (a new system prompt, answers that stopped copying); else the biggest term.
    grew = [c for c in range(count) if share[1, c] > share[0, c] and terms[c] * direction > 0]
    lead = max(grew or range(count), key=lambda c: float(terms[c] * direction))
    rivals = [c for c in range(count) if c != lead and n[1, c] >= min_requests and names[c] != MERGED]
    detail: dict[str, Any] = {
        "cells": {
            names[c]: {
                "share_ref": float(share[0, c]),
                "share_cur": float(share[1, c]),
                "rate": float(pooled[c]),
                "rate_ref": _number(rate[0, c]),
                "rate_cur": _number(rate[1, c]),
            }
            for c in range(count)
        },
        "lead": names[lead],
        "same_window": bool(n[1, lead] >= min_requests and rivals),
    }
    if detail["same_window"]:
        detail["versus"] = names[max(rivals, key=lambda c: n[1, c])]
    return detail


def _number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None
