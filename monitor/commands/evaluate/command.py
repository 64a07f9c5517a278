"""``draftwatch evaluate``: its arguments, where the prompts come from, the report printed and maybe stored.

The embedded candidates run here through decoder/evaluation.py; the remote ones (``--server``,
``--plain-server``) are measured first by :mod:`monitor.commands.evaluate.servers`, so that a
wrong URL fails in seconds, and their reports join the embedded ones' (``combined``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from decoder.cli import add_model_arguments, build_decoder
from decoder.evaluation import (
    SampleError,
    SampleRow,
    WorkloadReport,
    by_workload_of,
    combined,
    evaluate,
    format_table,
    parse_sample,
    progress_steps,
    read_sample,
    split,
)
from decoder.extras import refuse_without
from decoder.models.fetch import FetchError
from decoder.record import RecordError
from decoder.workloads import builtin_workloads
from monitor.commands.common import add_settings_arguments, run_with_engine, settings_from_args
from monitor.commands.evaluate.servers import Progress, ServerError, ServerVerdict, base_url, measure_servers
from monitor.config import ConfigError
from monitor.settings.masking import mask_urls

if TYPE_CHECKING:  # the database layer loads when --store runs, not when --help is read
    from sqlalchemy.engine import Engine

    from monitor.config import Settings

logger = logging.getLogger(__name__)


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
        from decoder.models.loading import ModelLoadError

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
        where = mask_urls(engine.url.render_as_string(hide_password=True))
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


def measured_rows(rows: Sequence[SampleRow], *, learning: bool) -> dict[str, list[SampleRow]]:
    """Per workload the rows a remote candidate is measured on: the embedded ones' held-out half, else all."""
    return {w: list(split(r)[1] if learning else r) for w, r in by_workload_of(rows).items()}
