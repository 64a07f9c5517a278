"""``draftwatch evaluate``'s remote candidates: servers with their draft, measured over HTTP like embedded ones.

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

import json
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from decoder.evaluation import CandidateResult, SampleRow, WorkloadReport, measure
from decoder.record import RequestRecord, pooled_decode_ms_per_token
from monitor.settings.masking import mask_urls

if TYPE_CHECKING:  # the HTTP client loads when a server is asked, not when --help is read
    import httpx

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
    """A remote candidate that cannot be evaluated; the message names its URL (credentials masked) and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(mask_urls(message))


def base_url(url: str) -> str:
    """A server's base URL as given, or as an OpenAI client's base URL (ending in ``/v1``).

    >>> base_url("http://127.0.0.1:8080/v1/"), base_url("http://127.0.0.1:8080")
    ('http://127.0.0.1:8080', 'http://127.0.0.1:8080')
    """
    return url.rstrip("/").removesuffix("/v1")


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
                result = CandidateResult(f"server:{mask_urls(url)}", predicted_speedup=None, gamma=None, server=url)
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
    from monitor.proxy.forward.exchange import stack_of

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
        target_model=report.model or mask_urls(url),
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
