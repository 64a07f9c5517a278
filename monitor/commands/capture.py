"""``draftwatch capture export | purge | status``: the opt-in prompt sample that ``draftwatch evaluate`` replays."""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from decoder.record import validate_workload
from monitor.commands.common import add_config_argument, argument_type, settings_or_report

if TYPE_CHECKING:
    from monitor.ingest.capture.sample import PromptSample
    from monitor.ingest.settings import CaptureSettings

DESCRIPTION: Final = (
    "The prompt sample. With capture.share above 0 (DRAFTWATCH_CAPTURE_SHARE), `draftwatch serve` keeps per "
    "workload a uniform sample of up to capture.max_per_workload real prompts with their sampling settings "
    "(proxied /v1/chat/completions and /v1/completions requests, and the embedded decoder's /v1/generate and "
    "/v1/chat/completions), so that `draftwatch evaluate --prompts FILE.jsonl` can try a candidate pairing on "
    "the traffic it would serve. It is off by default (share 0) because prompts are otherwise never stored: a "
    "record carries only a hash of its prompt, and a prompt can hold what its users would not want kept. The "
    "sample is a SQLite file of its own (capture.path, default prompt-sample.db in the data directory), never "
    "the records' database and never the logs; prompts older than capture.retention_days (default 7) are "
    "deleted, and `draftwatch capture purge` deletes them now."
)

WORKLOAD = argument_type(validate_workload)


def register(subparsers: Any) -> None:
    """Add the ``capture`` command group to the top-level parser's subparsers."""
    parser = subparsers.add_parser(
        "capture", help="the opt-in prompt sample for evaluate: export, purge, status", description=DESCRIPTION
    )
    add_config_argument(parser)
    parser.set_defaults(handler=lambda _args: (parser.print_help(), 2)[1])
    commands = parser.add_subparsers(dest="capture_command", metavar="CAPTURE_COMMAND")

    export = commands.add_parser(
        "export",
        help="write the sample as JSONL for `draftwatch evaluate --prompts`",
        description="Write the kept prompts, one JSON object a line ({workload, prompt | messages, chat?, "
        "temperature, top_p, max_new_tokens?}), per workload oldest first: evaluate learns on a workload's "
        "first half and measures on its newer half. The file holds real prompts: it is made readable by its "
        "owner only.",
    )
    export.add_argument("--workload", type=WORKLOAD, default=None, help="only this workload (default: all)")
    export.add_argument("--out", type=Path, default=None, help="file to write (default: standard output)")
    export.set_defaults(handler=_export)

    purge = commands.add_parser(
        "purge",
        help="delete the kept prompts now (of one workload, or all) and restart their counts",
        description="Delete the kept prompts, overwriting them in the file, and restart the workloads' "
        "counts of requests seen; prints how many prompts were removed.",
    )
    purge.add_argument("--workload", type=WORKLOAD, default=None, help="only this workload (default: all)")
    purge.set_defaults(handler=_purge)

    status = commands.add_parser("status", help="per workload: prompts kept, requests seen, the oldest kept prompt")
    status.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    status.set_defaults(handler=_status)


def _with_sample(
    args: argparse.Namespace, command: str, act: Callable[[PromptSample | None, CaptureSettings], int]
) -> int:
    """Settings, then the sample file if it exists (pruned to its retention first), then ``act``."""
    settings = settings_or_report(args, f"capture {command}")
    if settings is None:
        return 2
    from monitor.ingest.capture.sample import PromptSample

    try:
        sample = PromptSample.existing(settings.capture.path)
    except Exception as error:  # an unreadable file: say which, not a traceback
        print(f"draftwatch capture {command}: {settings.capture.path}: {error}", file=sys.stderr)
        return 1
    try:
        if sample is not None:
            sample.prune(settings.capture.retention_days, time.time())
        return act(sample, settings.capture)
    except (OSError, sqlite3.Error) as error:  # a locked or read-only file, an --out that cannot be written
        print(f"draftwatch capture {command}: {error}", file=sys.stderr)
        return 1
    finally:
        if sample is not None:
            sample.close()


def _absent(capture: CaptureSettings) -> str:
    state = "capture is off (capture.share = 0)" if capture.share == 0 else "nothing captured yet"
    return f"no prompt sample at {capture.path}: {state}"


def _export(args: argparse.Namespace) -> int:
    def act(sample: PromptSample | None, capture: CaptureSettings) -> int:
        lines = sample.lines(args.workload) if sample is not None else []
        if not lines:
            which = f" of workload {args.workload}" if args.workload else ""
            reason = _absent(capture) if sample is None else f"the prompt sample at {capture.path} holds no prompts"
            print(f"draftwatch capture export: {reason}{which}; nothing written", file=sys.stderr)
            return 1
        text = "".join(f"{line}\n" for line in lines)
        if args.out is None:
            sys.stdout.write(text)
            return 0
        # Owner-only, as the sample itself: the file holds real prompts.
        descriptor = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(descriptor, 0o600)  # O_CREAT's mode applies only to a new file
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        workloads = len({json.loads(line)["workload"] for line in lines})
        print(f"wrote {len(lines)} prompts of {workloads} workloads to {args.out}", file=sys.stderr)
        return 0

    return _with_sample(args, "export", act)


def _purge(args: argparse.Namespace) -> int:
    def act(sample: PromptSample | None, capture: CaptureSettings) -> int:
        if sample is None:
            print(f"removed 0 prompts ({_absent(capture)})")
            return 0
        removed = sample.purge(args.workload)
        which = f" of workload {args.workload}" if args.workload else ""
        print(f"removed {removed} prompts{which} from {capture.path}")
        return 0

    return _with_sample(args, "purge", act)


def _status(args: argparse.Namespace) -> int:
    def act(sample: PromptSample | None, capture: CaptureSettings) -> int:
        workloads = sample.status() if sample is not None else []
        if args.json:
            print(json.dumps([{"workload": w.workload, "kept": w.kept, "seen": w.seen,
                               "oldest": w.oldest.isoformat() if w.oldest else None, "since": w.since.isoformat()}
                              for w in workloads]))  # fmt: skip
            return 0
        on = f"share {capture.share:g}" if capture.share > 0 else "off (capture.share = 0)"
        print(f"prompt sample {capture.path}: {on}, at most {capture.max_per_workload} per workload, "
              f"kept {capture.retention_days} days")  # fmt: skip
        if not workloads:
            print("no prompts kept")
            return 0
        print(f"{'workload':<24} {'kept':>6} {'seen':>9}  {'oldest kept':<20} counting since")
        for w in workloads:
            oldest = w.oldest.strftime("%Y-%m-%d %H:%M:%S") if w.oldest else "-"
            print(f"{w.workload:<24} {w.kept:>6} {w.seen:>9}  {oldest:<20} {w.since:%Y-%m-%d %H:%M:%S}")
        return 0

    return _with_sample(args, "status", act)
