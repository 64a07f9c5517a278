"""Validate candidate drafters on a prompt sample before they serve: ``draftwatch evaluate``.

Per workload the sample is split in two, in file order:

* **learn**: each candidate decodes the first half under a fresh controller of its own (its pair
  timed first, as the sidecar does), plain decoding beside it, so that the controller measures
  alpha and the costs on this very text; from them it predicts the request speedup and gamma;
* **held out**: the second half decodes plain and with every candidate at its predicted gamma,
  in turn per prompt, so that a slow drift of the machine hits every candidate alike; the
  measured speedup is plain's decode time per token over the candidate's (decoder/record.py's
  ``decode_ms_per_token``: the target's prompt reading is left out, the draft model's is in).

The recommendation is the candidate with the best *predicted* speedup, or plain when none
predicts at least 1; the report puts the measured figures beside it and says whether the
recommendation is the measured best, which is how the prediction is checked.

A candidate can also be a remote server (``CandidateResult.server``, measured by
``monitor/commands/evaluate/servers.py``): it has no prediction and no gamma of ours, and it takes no
part in the recommendation, which checks this controller's predictions against its own candidates.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from decoder.holdout import HoldoutPolicy
from decoder.record import OUTPUT_SPANS, Mode, RequestRecord, pooled_decode_ms_per_token, validate_workload
from decoder.speculation.controller import SpeculationController, wilson_interval

if TYPE_CHECKING:  # the model code loads in evaluate(): a sample and a report need no torch (a remote candidate)
    from decoder.drafters.base import Drafter
    from decoder.models.loading import LoadedModel
    from decoder.speculation.speculative import Prompt, SpeculativeDecoder

PLAIN = "plain"
NO_HOLDOUT = HoldoutPolicy(share=0.0, max_share=0.0, target=0)
NEVER_PROBE = 1_000_000  # an evaluation measures each candidate on its own, so no drafter is probed


class SampleError(ValueError):
    """A prompt sample that cannot be evaluated; the message names the line and what to change."""


@dataclass(frozen=True, slots=True)
class SampleRow:
    """One prompt of the sample, with the sampling settings its workload usually runs at."""

    workload: str
    prompt: Prompt
    chat: bool = True
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int | None = None


@dataclass(slots=True)
class CandidateResult:
    """What one candidate did on one workload's held-out prompts, and what its controller predicted.

    ``predicted_speedup`` and ``gamma`` are ``None`` for a remote server's candidate: no controller
    of ours plans its requests.
    """

    drafter: str
    predicted_speedup: float | None
    gamma: int | None
    measured_speedup: float | None = None
    ms_per_token: float | None = None  # decode time per output token after the first, pooled (record.py)
    acceptance: float | None = None
    acceptance_interval: tuple[float, float] | None = None  # Wilson, 95 %
    mean_acceptance_length: float | None = None  # tokens per target pass, the step's own token included
    drafted: int = 0
    accepted: int = 0
    # Acceptance of the steps starting in each output span (record.py's OUTPUT_SPAN_EDGES); None: nothing drafted.
    by_output_position: list[float | None] = field(default_factory=list)
    server: str | None = None  # the remote server's URL; None: the embedded decoder


@dataclass(slots=True)
class WorkloadReport:
    """One workload's candidates; without an embedded candidate there is no recommendation (``None``)."""

    workload: str
    learn_prompts: int
    held_out_prompts: int
    plain_ms_per_token: float | None  # the embedded decoder's plain decoding
    candidates: list[CandidateResult] = field(default_factory=list)
    recommendation: str | None = PLAIN  # a drafter's label, or "plain"
    recommended_gamma: int | None = None
    measured_best: str | None = PLAIN
    plain_server_ms_per_token: float | None = None  # the remote candidates' plain baseline, where one was given

    @property
    def recommendation_matches(self) -> bool:
        return self.recommendation is not None and self.recommendation == self.measured_best

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "recommendation_matches": self.recommendation_matches}


# A row's sampling settings and the values it may hold: (type, lowest, highest).
SAMPLING_RANGES: dict[str, tuple[type, float, float]] = {
    "temperature": (float, 0.0, 10.0),
    "top_p": (float, 1e-9, 1.0),
    "max_new_tokens": (int, 1, 1 << 20),
}


def read_sample(path: Path) -> list[SampleRow]:
    """Rows of a JSONL file: ``{"workload", "prompt" | "messages", "chat"?, "temperature"?, "top_p"?, ...}``.

    ``prompt`` is a user message, wrapped in the chat template unless ``"chat": false``; ``messages``
    is a whole chat. Raises :class:`SampleError` naming the line of the first bad row.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise SampleError(f"cannot read the prompt sample {path}: {error.strerror or error}") from None
    return parse_sample(lines, str(path))


def parse_sample(lines: Sequence[str], source: str) -> list[SampleRow]:
    """:func:`read_sample`'s rows from lines already read; ``source`` names them in errors."""
    rows = [_row(source, number, line) for number, line in enumerate(lines, 1) if line.strip()]
    if not rows:
        raise SampleError(f"{source} holds no prompts: write one JSON object per line, e.g. "
                          '{"workload": "code", "prompt": "Write a function that ..."}')  # fmt: skip
    return rows


def _row(source: str, number: int, line: str) -> SampleRow:
    where = f"{source}, line {number}"
    try:
        data = json.loads(line)
    except json.JSONDecodeError as error:
        raise SampleError(f"{where}: not JSON ({error.msg})") from None
    if not isinstance(data, dict):
        raise SampleError(f"{where}: expected a JSON object, got {type(data).__name__}")
    try:
        workload = validate_workload(data.get("workload", ""))
    except ValueError as error:
        raise SampleError(f"{where}: {error}") from None
    prompt: Prompt
    if isinstance(data.get("messages"), list) and data["messages"]:
        prompt = [{"role": str(m.get("role", "user")), "content": str(m.get("content", ""))}
                  for m in data["messages"] if isinstance(m, dict)]  # fmt: skip
    elif isinstance(data.get("prompt"), str) and data["prompt"].strip():
        prompt = data["prompt"]
    else:
        raise SampleError(f'{where}: needs a non-empty "prompt" (text) or "messages" (a chat)')
    numbers: dict[str, Any] = {}
    for key, (kind, low, high) in SAMPLING_RANGES.items():
        if key in data:
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
                raise SampleError(f"{where}: {key} must be a number in [{low:g}, {high:g}], got {value!r}")
            numbers[key] = kind(value)
    return SampleRow(workload=workload, prompt=prompt, chat=bool(data.get("chat", True)), **numbers)


def evaluate(
    target: LoadedModel,
    candidates: Sequence[Drafter],
    rows: Iterable[SampleRow],
    *,
    max_new_tokens: int = 64,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[WorkloadReport]:
    """Learn, predict and measure each candidate per workload (see the module's docstring)."""
    from decoder.drafters.base import drafter_label
    from decoder.speculation.speculative import SpeculativeDecoder

    if not candidates:
        raise ValueError("evaluate needs at least one candidate drafter")
    labels = [drafter_label(d) for d in candidates]
    if len(set(labels)) < len(labels):
        raise ValueError(f"each candidate must be different, got {', '.join(labels)}")
    by_workload = by_workload_of(rows)
    if short := sorted(w for w, r in by_workload.items() if len(r) < 2):
        raise SampleError(
            f"workloads {', '.join(short)} have fewer than 2 prompts: an evaluation learns on half of a "
            "workload's prompts and measures on the other half; add prompts or leave the workload out"
        )
    plain = SpeculativeDecoder(target, None)
    reports = []
    for workload, workload_rows in by_workload.items():
        learn, held_out = split(workload_rows)
        decoders = {}
        for drafter, label in zip(candidates, labels, strict=True):
            controller = SpeculationController(holdout=NO_HOLDOUT, probe_every=NEVER_PROBE, seed=seed)
            decoder = SpeculativeDecoder(target, drafter, controller=controller)
            decoder.calibrate_if_needed()
            for row in learn:
                _say(progress, f"{workload}: learning {label}")
                _decode(decoder, row, max_new_tokens, seed, mode="plain")
                _decode(decoder, row, max_new_tokens, seed, mode="speculative")
            decoders[label] = decoder
        results = {}
        for label, decoder in decoders.items():
            assert decoder.controller is not None
            plan = decoder.controller.plan(workload, max_new_tokens=max_new_tokens, drafters=(label,))
            results[label] = CandidateResult(label, predicted_speedup=plan.expected_speedup, gamma=plan.gamma)
        plain_records: list[RequestRecord] = []
        spec_records: dict[str, list[RequestRecord]] = {label: [] for label in labels}
        for row in held_out:
            _say(progress, f"{workload}: measuring plain and {len(labels)} candidate(s)")
            plain_records.append(_decode(plain, row, max_new_tokens, seed, mode="plain"))
            for label, decoder in decoders.items():
                record = _decode(decoder, row, max_new_tokens, seed, mode="speculative", gamma=results[label].gamma)
                spec_records[label].append(record)
        plain_ms = pooled_decode_ms_per_token(plain_records)
        for label, result in results.items():
            measure(result, spec_records[label], plain_ms)
        reports.append(_report(workload, len(learn), len(held_out), plain_ms, list(results.values())))
    return reports


def by_workload_of(rows: Iterable[SampleRow]) -> dict[str, list[SampleRow]]:
    """The sample's rows per workload, in file order."""
    grouped: dict[str, list[SampleRow]] = {}
    for row in rows:
        grouped.setdefault(row.workload, []).append(row)
    return grouped


def split(rows: Sequence[SampleRow]) -> tuple[Sequence[SampleRow], Sequence[SampleRow]]:
    """A workload's rows as (learn, held out): the first half, rounded up, and the rest."""
    half = math.ceil(len(rows) / 2)
    return rows[:half], rows[half:]


def progress_steps(rows: Iterable[SampleRow], candidates: int) -> int:
    """How often :func:`evaluate` reports progress: per learnt prompt and candidate, and per held-out prompt."""
    total = 0
    for workload_rows in by_workload_of(rows).values():
        learn, held_out = split(workload_rows)
        total += len(learn) * candidates + len(held_out)
    return total


def _report(
    workload: str, learn: int, held_out: int, plain_ms: float | None, results: list[CandidateResult]
) -> WorkloadReport:
    report = WorkloadReport(workload, learn, held_out, plain_ms, results)
    best_predicted = max(results, key=lambda r: r.predicted_speedup or 0.0)
    if (best_predicted.predicted_speedup or 0.0) >= 1.0:
        report.recommendation, report.recommended_gamma = best_predicted.drafter, best_predicted.gamma
    measured = [r for r in results if r.measured_speedup is not None]
    best_measured = max(measured, key=lambda r: r.measured_speedup or 0.0, default=None)
    if best_measured is not None and (best_measured.measured_speedup or 0.0) > 1.0:
        report.measured_best = best_measured.drafter
    return report


def measure(result: CandidateResult, records: Sequence[RequestRecord], plain_ms: float | None) -> None:
    """Fill ``result``'s measured figures from its records; the speedup needs plain's decode time (``plain_ms``)."""
    ms = pooled_decode_ms_per_token(records)
    result.ms_per_token = ms
    result.measured_speedup = plain_ms / ms if plain_ms and ms else None
    result.drafted = sum(r.num_draft_tokens for r in records)
    result.accepted = sum(r.num_accepted_tokens for r in records)
    steps = sum(r.num_spec_steps for r in records)
    if result.drafted:
        result.acceptance = result.accepted / result.drafted
        result.acceptance_interval = wilson_interval(result.acceptance, result.drafted)
    if steps:
        result.mean_acceptance_length = (result.accepted + steps) / steps
    drafted, accepted = [0] * OUTPUT_SPANS, [0] * OUTPUT_SPANS
    for record in records:
        for span in range(OUTPUT_SPANS):
            drafted[span] += (record.drafted_by_span or [0] * OUTPUT_SPANS)[span]
            accepted[span] += (record.accepted_by_span or [0] * OUTPUT_SPANS)[span]
    result.by_output_position = [a / d if d else None for d, a in zip(drafted, accepted, strict=True)]


def _decode(
    decoder: SpeculativeDecoder,
    row: SampleRow,
    max_new_tokens: int,
    seed: int,
    *,
    mode: Mode,
    gamma: int | None = None,
) -> RequestRecord:
    result = decoder.generate(
        row.prompt,
        workload=row.workload,
        chat=row.chat and isinstance(row.prompt, str),
        max_new_tokens=row.max_new_tokens or max_new_tokens,
        temperature=row.temperature,
        top_p=row.top_p,
        seed=seed,
        mode=mode,
        gamma=gamma,
    )
    return result.record


def _say(progress: Callable[[str], None] | None, message: str) -> None:
    if progress is not None:
        progress(message)


def combined(local: Sequence[WorkloadReport], remote: Sequence[WorkloadReport]) -> list[WorkloadReport]:
    """Each workload's embedded report with the remote candidates after its own, in the sample's workload order.

    The recommendation stays the embedded report's; a workload only the remote candidates saw has none.
    """
    reports = {report.workload: report for report in local}
    for report in remote:
        if (mine := reports.get(report.workload)) is None:
            reports[report.workload] = report
            continue
        mine.candidates.extend(report.candidates)
        mine.plain_server_ms_per_token = report.plain_server_ms_per_token
    return list(reports.values())


def format_table(reports: Sequence[WorkloadReport]) -> str:
    """The reports as a plain-text table: per workload its plain baselines and candidates, then a verdict."""
    width = max([12, *(len(r.drafter) for report in reports for r in report.candidates)])
    header = (
        f"{'workload':<12} {'candidate':<{width}} {'predicted':>9} {'measured':>9} {'gamma':>5} "
        f"{'acceptance (95% CI)':>22} {'acc.len':>7} {'tok/s':>7} {'by position 0-32/32-128/128+':>28}"
    )
    lines = [header, "-" * len(header)]
    for report in reports:
        for label, ms in (("plain", report.plain_ms_per_token), ("plain server", report.plain_server_ms_per_token)):
            if ms:
                lines.append(f"{report.workload:<12} {label:<{width}} {'-':>9} {'1.00x':>9} {'-':>5} {'-':>22} "
                             f"{'-':>7} {1000.0 / ms:>7.1f} {'-':>28}")  # fmt: skip
        for r in report.candidates:
            interval = (
                f"{r.acceptance:.2f} ({r.acceptance_interval[0]:.2f}-{r.acceptance_interval[1]:.2f})"
                if r.acceptance is not None and r.acceptance_interval
                else "-"
            )
            predicted = f"{r.predicted_speedup:.2f}x" if r.predicted_speedup is not None else "-"
            measured = f"{r.measured_speedup:.2f}x" if r.measured_speedup is not None else "-"
            gamma = "-" if r.gamma is None else str(r.gamma)
            length = f"{r.mean_acceptance_length:.2f}" if r.mean_acceptance_length is not None else "-"
            speed = f"{1000.0 / r.ms_per_token:.1f}" if r.ms_per_token else "-"
            positions = "/".join("-" if share is None else f"{share:.2f}" for share in r.by_output_position)
            lines.append(
                f"{report.workload:<12} {r.drafter:<{width}} {predicted:>9} {measured:>9} {gamma:>5} "
                f"{interval:>22} {length:>7} {speed:>7} {positions:>28}"
            )
        if report.recommendation is None:
            lines.append(f"{report.workload:<12} no recommendation: no embedded candidate, so no prediction to check")
            continue
        gamma = f" at gamma {report.recommended_gamma}" if report.recommended_gamma else ""
        verdict = "matches" if report.recommendation_matches else f"the measured best is {report.measured_best}"
        lines.append(f"{report.workload:<12} recommend: {report.recommendation}{gamma} ({verdict})")
    judged = [r for r in reports if r.recommendation is not None]
    if judged:
        matched = sum(r.recommendation_matches for r in judged)
        lines.append(f"recommendation = measured best on {matched} of {len(judged)} workloads")
    return "\n".join(lines)
