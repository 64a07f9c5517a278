"""``draftwatch evaluate``: candidate drafters on the embedded decoder and on remote servers, one report.

The embedded candidates are decoder/evaluation.py's. A remote candidate (``--server URL``) is a
running llama.cpp ``llama-server``, vLLM or SGLang server with its draft. Each of a workload's
measured prompts goes to it as an OpenAI-compatible request, at the row's sampling settings
(greedy unless the row says): ``/v1/chat/completions`` for a chat, so that the server applies its
model's chat template, and ``/v1/completions`` for a row with ``"chat": false``. The request
carries what SGLang needs to report its counts (monitor/proxy/asks.py; the others ignore those
fields). Which engine answered is told by the proxy's ``stack_of`` auto-detection, and the
sidecar's parser for that engine (monitor/ingest/stacks/) reads the answer: llama.cpp's
``timings``, vLLM's ``metrics`` (``--per-request-spec-decode-metrics summary``), SGLang's
``meta_info``/``sglext``. Its report becomes a record that decoder.evaluation.measure() sums like
an embedded one: acceptance and its interval, mean acceptance length, decode time per token. The
decode time is the engine's own where it reports one (llama.cpp ``timings.predicted_ms``; vLLM
``generation_time_ms``; SGLang's timestamps under ``--enable-metrics``); where it reports none,
the request is sent again streamed and timed here from the first event that carries generated
text to the last. With a plain server, each candidate's speedup gets a 95 % bootstrap interval
over the prompts and a verdict: ``pays`` (interval above 1), ``net_loss`` (below 1) or ``inconclusive``.

Two figures llama-server does not give directly:

* **speedup**: (llama-server) build 11434 has no per-request switch for speculation: ``"speculative.n_max": 0``,
  ``"speculative.types": "none"`` and the like are accepted and ignored, the request drafts as
  before (tried on the binary; the build's server reads no ``speculative.n_max`` key). Plain
  decoding is therefore a second server, ``--plain-server URL``: the same target without a
  draft, sent each prompt just before the candidates. Without one a remote speedup is unavailable.
* **verification passes**, which llama.cpp does not count (vLLM and SGLang do): each pass emits one token of the
  target's own after the drafts it accepted, so the passes after the first token number
  ``output - 1 - accepted`` (decoder/record.py's rule). A request that stops on a token inside a
  step leaves that step's later drafts counted as accepted, so there the length reads a little high.

Remote candidates are measured on the prompts the embedded ones are (a workload's held-out half),
or on the whole sample when there is no embedded candidate; they take no part in the
recommendation, which checks the embedded controller's predictions.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from decoder.cli import add_model_arguments, build_decoder
from decoder.evaluation import (
    CandidateResult,
    SampleError,
    SampleRow,
    WorkloadReport,
    by_workload_of,
    combined,
    evaluate,
    format_table,
    measure,
    parse_sample,
    progress_steps,
    read_sample,
    split,
)
from decoder.extras import refuse_without
from decoder.fetch import FetchError
from decoder.record import RecordError, RequestRecord, pooled_decode_ms_per_token
from decoder.workloads import builtin_workloads
from monitor.commands.common import add_settings_arguments, run_with_engine, settings_from_args
from monitor.config import ConfigError

if TYPE_CHECKING:  # the HTTP client loads when a server is asked, not when --help is read
    import httpx
    from sqlalchemy.engine import Engine

    from monitor.config import Settings
    from monitor.ingest.stacks import StackReport

logger = logging.getLogger(__name__)

# A CPU llama-server can take minutes for a long answer to a long prompt; a dead one is a refused connection.
REQUEST_TIMEOUT_S: Final = 600.0
# The fewest prompts timed on both servers that a speedup interval is drawn from.
MIN_TIMED: Final = 2
ENGINES: Final = (
    "a llama.cpp llama-server, a vLLM server started with --per-request-spec-decode-metrics summary, or an SGLang "
    "server started with --speculative-algorithm (the candidate with its draft)"
)
Progress = Callable[[str], None]


class ServerError(RuntimeError):
    """A remote candidate that cannot be evaluated; the message names its URL and what to do."""


def register(subparsers: Any) -> None:
    evaluate = subparsers.add_parser(
        "evaluate",
        help="try candidate drafters on a prompt sample and recommend one per workload",
        description="Replay a prompt sample per workload through each candidate drafter with the embedded "
        "decoder: the controller learns on the first half of a workload's prompts and predicts each "
        "candidate's speedup; the second half measures it against plain decoding. Prints acceptance (95% "
        "interval), mean acceptance length, decode tokens/s, predicted and measured speedup, and a "
        "recommendation (a drafter and gamma, or plain) per workload. Name candidates with --draft (repeatable; "
        "an old and a new draft version side by side) and --drafter ngram. A running llama-server, vLLM or "
        "SGLang server with its draft is a candidate too (--server URL, repeatable), measured on the same "
        "prompts; its speedup and verdict (pays, net_loss, inconclusive) need --plain-server, the same target "
        "served without a draft. With --server and neither --draft nor --drafter, nothing is decoded here and "
        "--target is not loaded.",
    )
    add_model_arguments(evaluate)
    source = evaluate.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", type=Path, metavar="FILE.jsonl",
                        help='one JSON object per line: {"workload", "prompt" | "messages", "chat"?, '
                        '"temperature"?, "top_p"?, "max_new_tokens"?}')  # fmt: skip
    source.add_argument("--builtin", action="store_true", help="the built-in sample: 5 prompts a workload")
    source.add_argument("--captured", action="store_true",
                        help="the sidecar's own sample of real prompts (capture.share, off by default; see "
                        "docs/capture.md), read from capture.path")  # fmt: skip
    evaluate.add_argument(
        "--server", action="append", default=[], metavar="URL",
        help="a server started with a candidate draft, by its base URL, e.g. http://127.0.0.1:8080: a llama.cpp "
        "llama-server (-md D --spec-type draft-simple), vLLM (--per-request-spec-decode-metrics summary) or SGLang "
        "(--speculative-algorithm); repeatable",
    )  # fmt: skip
    evaluate.add_argument(
        "--plain-server", metavar="URL", default=None,
        help="a server with the same target and no draft: the plain baseline of the --server candidates' "
        "speedup and its verdict (llama-server cannot turn drafting off per request; without it their speedup is "
        "unavailable)",
    )  # fmt: skip
    evaluate.add_argument(
        "--max-new-tokens", type=int, default=64, help="per prompt, unless its row says (default: %(default)s)"
    )
    evaluate.add_argument("--seed", type=int, default=0, help="seed for sampled rows (default: %(default)s)")
    evaluate.add_argument("--json", action="store_true", help="print the reports as JSON instead of a table")
    evaluate.add_argument(
        "--store", action="store_true",
        help="also store the verdict in the database (--database-url, else the settings'), where the dashboard's "
        "Pairs page shows the newest one per target and workload beside the live figures; prompts are not stored",
    )  # fmt: skip
    add_settings_arguments(evaluate)
    evaluate.set_defaults(handler=_evaluate)


def _evaluate(args: argparse.Namespace) -> int:
    servers = list(dict.fromkeys(base_url(url) for url in args.server))
    if args.plain_server is not None and not servers:
        print("error: --plain-server is the baseline of --server candidates: name at least one --server URL",
              file=sys.stderr)  # fmt: skip
        return 2
    local = bool(args.draft or args.drafter or not servers)
    if args.store and not local:
        print("error: --store files a verdict under the embedded target and its recommendation; a run with "
              "--server alone has neither: add --draft or --drafter (and --target)", file=sys.stderr)  # fmt: skip
        return 2
    if local and (refused := refuse_without("draftwatch evaluate", "decoder")) is not None:
        return refused
    from tqdm.auto import tqdm

    expected: tuple[type[Exception], ...] = (ServerError, FetchError, SampleError, RecordError, ValueError,
                                             ConfigError)  # fmt: skip
    if local:  # the model code, with torch, loads only to decode here
        from decoder.loading import ModelLoadError

        expected += (ModelLoadError,)
    try:
        if args.prompts is not None:
            rows = read_sample(args.prompts)
        elif args.captured:
            rows = captured_rows(settings_from_args(args))
        else:
            rows = [SampleRow(w, p) for w, prompts in builtin_workloads().items() for p in prompts]
        measured = measured_rows(rows, learning=local)
        total = sum(len(r) for r in measured.values()) if servers else 0
        with tqdm(total=total, desc="evaluating", unit="prompt", disable=None) as bar:  # None: on a terminal only

            def tick(text: str) -> None:
                bar.set_postfix_str(text)
                bar.update()

            # The servers first: a wrong URL fails in seconds, not after the embedded models' run.
            remote, verdicts = measure_servers(servers, measured, plain_server=args.plain_server,
                                               max_new_tokens=args.max_new_tokens, seed=args.seed,
                                               progress=tick)  # fmt: skip
            reports, target = _evaluate_locally(args, rows, bar, tick) if local else ([], (args.target, None))
    except expected as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    reports = combined(reports, remote)
    if args.json:
        print(json.dumps(with_verdicts([report.to_dict() for report in reports], verdicts), indent=2))
    else:
        print("\n".join([format_table(reports), *(verdict.line() for verdict in verdicts)]))
    return _store(args, reports, *target) if args.store else 0


def with_verdicts(reports: list[dict[str, Any]], verdicts: Sequence[ServerVerdict]) -> list[dict[str, Any]]:
    """The reports' dicts with each server candidate's ``speedup_interval`` and ``verdict`` (``None``: no interval)."""
    found = {(v.workload, v.drafter): v for v in verdicts}
    for report in reports:
        for candidate in report["candidates"]:
            if (verdict := found.get((report["workload"], candidate["drafter"]))) is not None:
                candidate["speedup_interval"] = verdict.interval
                candidate["verdict"] = verdict.word
    return reports


def _store(args: argparse.Namespace, reports: Sequence[WorkloadReport], target: str, version: str | None) -> int:
    """Put the verdict where the dashboard reads it; the report above is printed whatever happens here."""
    from monitor.store.evaluations import save_evaluation

    sample = str(args.prompts) if args.prompts is not None else "captured" if args.captured else "built-in sample"

    def action(engine: Engine, settings: Settings) -> int:
        run_id = save_evaluation(engine, [r.to_dict() for r in reports], target_model=target, target_version=version,
                                 sample=sample)  # fmt: skip
        where = engine.url.render_as_string(hide_password=True)
        print(f"stored evaluation {run_id} ({len(reports)} workload(s), target {target}) in {where}", file=sys.stderr)
        return 0

    return run_with_engine(args, "evaluate", action)


def captured_rows(settings: Settings) -> list[SampleRow]:
    """The prompt sample the sidecar keeps (monitor/ingest/capture/), past its retention pruned first."""
    from monitor.ingest.capture.sample import PromptSample

    path = settings.capture.path
    try:
        sample = PromptSample.existing(path)
        if sample is None:
            raise SampleError(f"no prompt sample at {path}: set capture.share above 0 on the sidecar and let it "
                              "see traffic (docs/capture.md), or give --prompts FILE.jsonl")  # fmt: skip
        try:
            sample.prune(settings.capture.retention_days, time.time())
            lines = sample.lines()
        finally:
            sample.close()
    except (OSError, sqlite3.Error) as error:
        raise SampleError(f"cannot read the prompt sample {path}: {error}") from None
    rows = parse_sample(lines, f"the prompt sample {path}")
    # A real sample has workloads that have barely been seen; they are left out, not the whole run.
    counts = Counter(row.workload for row in rows)
    if sparse := sorted(w for w, n in counts.items() if n < 2):
        logger.warning("left out of the evaluation (fewer than 2 captured prompts): %s", ", ".join(sparse))
        print(f"left out (fewer than 2 captured prompts): {', '.join(sparse)}", file=sys.stderr)
    kept = [row for row in rows if counts[row.workload] >= 2]
    if not kept:
        raise SampleError(f"the prompt sample {path} holds no workload with 2 prompts or more yet")
    return kept


def _evaluate_locally(
    args: argparse.Namespace, rows: Sequence[SampleRow], bar: Any, tick: Progress
) -> tuple[list[WorkloadReport], tuple[str, str | None]]:
    """The embedded candidates' reports, and the target's name and version they were measured on."""
    decoder = build_decoder(args, progress=sys.stderr.isatty())
    bar.total = (bar.total or 0) + progress_steps(rows, len(decoder.drafters))
    bar.refresh()
    reports = evaluate(decoder.target, decoder.drafters, rows, max_new_tokens=args.max_new_tokens, seed=args.seed,
                       progress=tick)  # fmt: skip
    return reports, (decoder.target.name, decoder.target.version)


def base_url(url: str) -> str:
    """A server's base URL as given, or as an OpenAI client's base URL (ending in ``/v1``).

    >>> base_url("http://127.0.0.1:8080/v1/"), base_url("http://127.0.0.1:8080")
    ('http://127.0.0.1:8080', 'http://127.0.0.1:8080')
    """
    return url.rstrip("/").removesuffix("/v1")


def measured_rows(rows: Sequence[SampleRow], *, learning: bool) -> dict[str, list[SampleRow]]:
    """Per workload the rows a remote candidate is measured on: the embedded ones' held-out half, else all."""
    return {w: list(split(r)[1] if learning else r) for w, r in by_workload_of(rows).items()}


@dataclass(frozen=True, slots=True)
class ServerVerdict:
    """A server candidate's speedup over the plain server, with its bootstrap interval (95 %, over prompts)."""

    workload: str
    drafter: str
    speedup: float | None
    interval: tuple[float, float] | None

    @property
    def word(self) -> str | None:
        """``pays`` (the interval above 1), ``net_loss`` (below 1), ``inconclusive``; ``None`` without an interval."""
        if self.interval is None:
            return None
        # The live verdict's rule; loaded here, since the drift room brings the database layer (not for --help).
        from monitor.drift.verdict import interval_verdict

        return interval_verdict(*self.interval)

    def line(self) -> str:
        if self.interval is None:
            return (f"{self.workload:<12} {self.drafter}: no verdict (a speedup interval needs --plain-server and "
                    f"{MIN_TIMED} timed prompts a side)")  # fmt: skip
        low, high = self.interval
        speedup = "-" if self.speedup is None else f"{self.speedup:.2f}x"
        return f"{self.workload:<12} {self.drafter}: speedup {speedup} (95% CI {low:.2f}-{high:.2f}): {self.word}"


def measure_servers(
    servers: Sequence[str],
    measured: Mapping[str, Sequence[SampleRow]],
    *,
    plain_server: str | None = None,
    max_new_tokens: int = 64,
    seed: int = 0,
    progress: Progress | None = None,
    client: httpx.Client | None = None,
) -> tuple[list[WorkloadReport], list[ServerVerdict]]:
    """Each server's figures per workload on its ``measured`` rows, prompt by prompt in turn (plain first), and each
    candidate's verdict from its speedup interval.

    Raises :class:`ServerError` naming the server that failed and what to do.
    """
    if not servers:
        return [], []
    import httpx

    reports, verdicts = [], []
    # A given client stays open for its owner (a test captures the answers with it).
    with nullcontext(client) if client else httpx.Client(timeout=REQUEST_TIMEOUT_S) as http:
        for workload, rows in measured.items():
            plain: list[RequestRecord] = []
            drafted: dict[str, list[RequestRecord]] = {url: [] for url in servers}
            for row in rows:
                if progress is not None:
                    progress(f"{workload}: asking {len(servers)} server(s)")
                if plain_server is not None:
                    plain.append(_ask(http, base_url(plain_server), row, max_new_tokens, seed, plain=True))
                for url in servers:
                    drafted[url].append(_ask(http, url, row, max_new_tokens, seed, plain=False))
            plain_ms = pooled_decode_ms_per_token(plain)
            results = []
            for url, records in drafted.items():
                result = CandidateResult(f"server:{url}", predicted_speedup=None, gamma=None, server=url)
                measure(result, records, plain_ms)
                if not result.drafted:
                    logger.warning(
                        "%s drafted nothing on %d %s prompts: check that it was started with its draft "
                        "(llama-server: -md DRAFT.gguf --spec-type draft-simple; vLLM: --speculative-config; "
                        "SGLang: --speculative-algorithm)",
                        url, len(records), workload,
                    )  # fmt: skip
                results.append(result)
                interval = speedup_interval(plain, records, seed=seed) if plain else None
                verdicts.append(ServerVerdict(workload, result.drafter, result.measured_speedup, interval))
            # Where the embedded candidates learned on the other half, combined() keeps their report's counts.
            report = WorkloadReport(workload, 0, len(rows), None, results, recommendation=None, measured_best=None)
            report.plain_server_ms_per_token = plain_ms
            reports.append(report)
    return reports, verdicts


def speedup_interval(
    plain: Sequence[RequestRecord], candidate: Sequence[RequestRecord], *, seed: int = 0, resamples: int = 2000
) -> tuple[float, float] | None:
    """The 95 % bootstrap interval of plain's pooled decode time over the candidate's, prompts resampled in pairs.

    Each prompt went to both servers, so a resample keeps a prompt's two answers together; ``None``
    with fewer than :data:`MIN_TIMED` prompts timed on both sides.
    """
    pairs = [(p, c) for p, c in zip(plain, candidate, strict=True)
             if p.decode_ms_per_token is not None and c.decode_ms_per_token is not None]  # fmt: skip
    if len(pairs) < MIN_TIMED:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        drawn = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        plain_ms = pooled_decode_ms_per_token(p for p, _ in drawn)
        ms = pooled_decode_ms_per_token(c for _, c in drawn)
        if plain_ms and ms:
            ratios.append(plain_ms / ms)
    if not ratios:
        return None
    ratios.sort()
    return ratios[int(0.025 * (len(ratios) - 1))], ratios[int(0.975 * (len(ratios) - 1))]


def _ask(http: httpx.Client, url: str, row: SampleRow, max_new_tokens: int, seed: int, *, plain: bool) -> RequestRecord:
    """One prompt sent to a server, its answer read by the sidecar's parser for that engine, as a record."""
    from monitor.ingest.stacks import PARSERS, StackError
    from monitor.proxy.asks import ask_sglang
    from monitor.proxy.forward import stack_of

    flag = "--plain-server" if plain else "--server"
    sampling = {"max_tokens": row.max_new_tokens or max_new_tokens, "temperature": row.temperature,
                "top_p": row.top_p, "seed": seed, "stream": False}  # fmt: skip
    if isinstance(row.prompt, str) and not row.chat:
        endpoint, body = "/v1/completions", {"prompt": row.prompt, **sampling}
    else:
        messages = [{"role": "user", "content": row.prompt}] if isinstance(row.prompt, str) else list(row.prompt)
        endpoint, body = "/v1/chat/completions", {"messages": messages, **sampling}
    # What SGLang needs to report its counts; llama-server and vLLM ignore fields they do not know.
    ask_sglang(body, endpoint)
    answer = _post(http, url, endpoint, body, flag)
    stack = stack_of("auto", endpoint, answer)
    try:
        if stack is None:
            raise StackError([])
        report = PARSERS[stack](answer, speculative=None if plain else True)
    except (ValueError, StackError) as error:  # a StackError is a ValueError
        raise ServerError(
            f"{url}{endpoint} gave no speculative counts ({str(error)[:300] or 'an answer of no engine known'}): "
            f"{flag} takes {ENGINES}"
        ) from None
    if plain and report.drafted:
        raise ServerError(
            f"{url} drafted {report.drafted} tokens for a {row.workload} prompt, but {flag} is the plain baseline: "
            "start it without a draft, on the same target as the --server candidates"
        )
    decode_ms = None
    if report.ttft_ms is None or report.latency_ms is None:
        # No engine timings (SGLang without --enable-metrics): the same request streamed, timed here.
        per_token = _streamed_ms_per_token(http, url, endpoint, body, flag)
        decode_ms = None if per_token is None else per_token * max(report.output_tokens - 1, 0)
    return _record(report, url, row, decode_ms)


def _post(http: httpx.Client, url: str, endpoint: str, body: Mapping[str, Any], flag: str) -> dict[str, Any]:
    import httpx

    try:
        response = http.post(f"{url}{endpoint}", json=body)
    except httpx.HTTPError as error:
        raise ServerError(
            f"cannot reach {url} ({type(error).__name__}: {error}): start the server there, or correct {flag}"
        ) from None
    if response.status_code != 200:
        raise ServerError(
            f"{url}{endpoint} answered {response.status_code} ({response.text[:200].strip()!r}): {flag} takes the "
            f"base URL of {ENGINES}, e.g. http://127.0.0.1:8080"
        )
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise ServerError(f"{url}{endpoint} answered with no JSON object: {flag} takes {ENGINES}")
    return answer


def _streamed_ms_per_token(
    http: httpx.Client, url: str, endpoint: str, body: Mapping[str, Any], flag: str
) -> float | None:
    """Decode milliseconds per token of ``body`` streamed: the first event with generated text to the last."""
    import httpx

    # A streamed SGLang chat refuses return_meta_info; the usage chunk gives the streamed answer's length.
    streamed = {k: v for k, v in body.items() if k != "return_meta_info"}
    streamed.update(stream=True, stream_options={"include_usage": True})
    first = last = None
    texts = 0
    tokens: int | None = None
    try:
        with http.stream("POST", f"{url}{endpoint}", json=streamed) as response:
            if response.status_code != 200:
                raise ServerError(f"{url}{endpoint} answered {response.status_code} to a streamed request: {flag} "
                                  f"takes {ENGINES}")  # fmt: skip
            for line in response.iter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                try:
                    event = json.loads(line[5:])
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                usage = event.get("usage")
                if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                    tokens = usage["completion_tokens"]
                if _carries_text(event):
                    last = time.perf_counter()
                    first = last if first is None else first
                    texts += 1
    except httpx.HTTPError as error:
        raise ServerError(
            f"{url}{endpoint} broke off a streamed request ({type(error).__name__}): check {flag}"
        ) from None
    count = tokens if tokens is not None else texts
    if first is None or last is None or count < 2:
        return None
    return (last - first) * 1000 / (count - 1)


def _carries_text(event: Mapping[str, Any]) -> bool:
    for choice in event.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        text = delta.get("content") or delta.get("reasoning_content") if isinstance(delta, dict) else choice.get("text")
        if text:
            return True
    return False


def _record(report: StackReport, url: str, row: SampleRow, decode_ms: float | None = None) -> RequestRecord:
    """The report in the record's terms; llama.cpp's verification passes inferred (the module's docstring)."""
    now = datetime.now(UTC)
    steps = report.steps
    if steps is None:  # llama.cpp does not count its passes
        steps = max(report.output_tokens - 1 - report.accepted, 1 if report.accepted else 0)
    return RequestRecord(
        request_id=report.request_id or "evaluate",
        ts_start=now,
        ts_end=now,
        workload=row.workload,
        target_model=report.model or url,
        drafter="server",
        mode=report.mode,
        num_speculative_tokens=report.num_speculative_tokens or 0,
        prompt_tokens=report.prompt_tokens,
        output_tokens=report.output_tokens,
        num_spec_steps=steps if report.mode == "speculative" else 0,
        num_draft_tokens=report.drafted,
        num_accepted_tokens=report.accepted,
        ttft_ms=report.ttft_ms,
        latency_ms=report.latency_ms,
        decode_ms=decode_ms,
        temperature=row.temperature,
        top_p=row.top_p,
        finish_reason=report.finish_reason or "stop",
        source=f"evaluate:{report.stack}",
    )
