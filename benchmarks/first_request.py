"""A new workload's first request: how much slower than plain can it be, whatever its acceptance?

    python benchmarks/first_request.py                 # smollm2-135m + n-gram drafter, free prose, writes RESULTS.md
    python benchmarks/first_request.py --repeats 2 --no-write

A workload the controller has never seen is planned at the prior's acceptance, so its first request
speculates; on free prose the n-gram drafter's drafts mostly fail. Each prompt decodes, in turn:
plain; with a controller whose loss guard is on (the default 5 % budget); and with the guard
effectively off (a budget of 99 %), each controller's pair timed once at start and every request
on a workload name it has not seen. The figure is decode time per token after the first, as
everywhere in draftwatch (decoder/record.py), pooled over the prompts, and its ratio to plain.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tqdm.auto import tqdm

from benchmarks.decoder_speed import publish
from decoder import NgramDrafter, SpeculativeDecoder, load_model
from decoder.record import RequestRecord, pooled_decode_ms_per_token
from decoder.speculation.controller import SpeculationController
from decoder.workloads import builtin_workloads

TITLE = "A new workload's first request (benchmarks/first_request.py)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m", help="default: %(default)s")
    parser.add_argument("--workload", default="prose", help="built-in prompts to use (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="passes over the prompts (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="default: %(default)s")
    parser.add_argument("--no-write", action="store_true", help="print, do not update RESULTS.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    target = load_model(args.target)
    methods: dict[str, SpeculativeDecoder | None] = {"plain": None}
    for name, budget in (("controller, loss guard 5 %", 0.05), ("controller, guard off (99 %)", 0.99)):
        decoder = SpeculativeDecoder(target, NgramDrafter(), controller=SpeculationController(loss_budget=budget))
        decoder.calibrate()
        methods[name] = decoder
    plain = SpeculativeDecoder(target, None)
    prompts = builtin_workloads()[args.workload]
    records: dict[str, list[RequestRecord]] = defaultdict(list)
    runs = 0
    with tqdm(total=args.repeats * len(prompts) * len(methods), desc="first requests", unit="request") as bar:
        for _ in range(args.repeats):
            for prompt in prompts:
                runs += 1
                for name, method in methods.items():
                    mode = "plain" if method is None else None
                    result = (method or plain).generate(
                        prompt, chat=True, max_new_tokens=args.max_new_tokens, workload=f"new-{runs}", mode=mode
                    )
                    records[name].append(result.record)
                    bar.update()
    base = pooled_decode_ms_per_token(records["plain"]) or float("nan")
    lines = [
        "| method | decode ms/token | × plain | requests speculative | drafted | accepted | acceptance |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, found in records.items():
        ms = pooled_decode_ms_per_token(found) or float("nan")
        drafted = sum(r.num_draft_tokens for r in found)
        accepted = sum(r.num_accepted_tokens for r in found)
        speculative = sum(r.mode == "speculative" for r in found)
        rate = f"{accepted / drafted:.2f}" if drafted else ""
        lines.append(f"| {name} | {ms:.2f} | {ms / base:.3f} | {speculative} of {len(found)} | {drafted} | "
                     f"{accepted} | {rate} |")  # fmt: skip
    body = (
        f"{args.target} with the n-gram drafter on the built-in `{args.workload}` prompts (chat template, greedy, "
        f"{args.max_new_tokens} new tokens at most), {args.repeats} pass(es) over {len(prompts)} prompts, methods "
        "in turn per prompt; every controller request is on a workload it has never seen. × plain is the ratio of "
        "decode time per token after the first (target: ≤ 1.05).\n\n" + "\n".join(lines)
    )
    return publish(args, TITLE, body)


if __name__ == "__main__":
    sys.exit(main())
