"""Does torch.compile speed up a decode pass on this CPU? One-token passes, eager against compiled.

The target (default weights of this device: int4 on a CPU) decodes greedily over a cache, one
token per pass, exactly as the decode loop runs it; eager and ``torch.compile(dynamic=True)``
take turns in rounds on the same machine, and their tokens are compared. draftwatch's CPU kernels
are pybind functions that Dynamo cannot trace, so each is a graph break. Usage:

    python benchmarks/decoder_compile.py [--model qwen-coder-1.5b] [--steps 24] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import write_section
from decoder import load_model
from decoder.cpu.row_stable import row_stable_passes
from decoder.speculation.target_pass import target_logits

PROMPT = "def quicksort(values):\n    " * 8


def decode(model: Callable[..., Any], ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy one-token passes after a prefill of ``ids``: the tokens, and each pass's seconds."""
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.inference_mode():
        token = int(target_logits(model, torch.tensor([ids]), cache, keep=1)[0].argmax())
        tokens, seconds = [token], []
        for _ in range(steps):
            started = time.perf_counter()
            with row_stable_passes():
                logits = target_logits(model, torch.tensor([[token]]), cache, keep=1)  # (1, V)
            seconds.append(time.perf_counter() - started)
            token = int(logits[0].argmax())
            tokens.append(token)
    return tokens, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen-coder-1.5b", help="preset (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=24, help="one-token passes per run (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="eager / compiled turns (default: %(default)s)")
    parser.add_argument("--no-write", action="store_true", help="print, do not update RESULTS.md")
    args = parser.parse_args(argv)
    target = load_model(args.model)
    ids = list(target.tokenizer.encode(PROMPT))
    compiled = torch.compile(target.model, dynamic=True)
    started = time.perf_counter()
    reference, _ = decode(target.model, ids, 4)
    warm, _ = decode(compiled, ids, 4)
    lines = [
        f"{target.version}, one-token passes over a {len(ids)}-token prompt, {args.steps} per run, torch threads "
        f"{torch.get_num_threads()}. Compiling and the first runs took {time.perf_counter() - started:.0f} s.",
        "",
        "| round | eager, median ms a pass | compiled, median ms a pass | compiled / eager | same tokens |",
        "| ---: | ---: | ---: | ---: | --- |",
    ]
    for round_ in range(args.rounds):
        eager_tokens, eager_s = decode(target.model, ids, args.steps)
        compiled_tokens, compiled_s = decode(compiled, ids, args.steps)
        eager_ms, compiled_ms = statistics.median(eager_s) * 1000, statistics.median(compiled_s) * 1000
        same = eager_tokens == compiled_tokens and warm == reference
        lines.append(f"| {round_ + 1} | {eager_ms:.1f} | {compiled_ms:.1f} | {compiled_ms / eager_ms:.2f} | {same} |")
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_section("torch.compile on a decode pass (benchmarks/decoder_compile.py)", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
