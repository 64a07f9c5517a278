"""Time to the first token of long prompts: draftwatch's prefill beside llama-server's, same GGUF, same cores.

    LLAMA_SERVER=$(bash scripts/ensure-llama-server.sh | tail -1) python benchmarks/ttft.py
    python benchmarks/ttft.py --lengths 100 1000 --repeats 1 --no-write

A long prompt (retrieved context, a document to summarise) waits for the whole prefill before its
first token, so at 1,000 tokens and more the prefill is what a user feels first. Each length is
a prompt of that many tokens (the built-in workloads' prompts, joined and repeated, cut to length
by the target's tokenizer), decoded to one new token, greedy. draftwatch's figure is the record's
``ttft_ms`` (the target reading the prompt, then choosing the token; plain, so no drafter reads it);
llama-server's is its own ``prompt_ms`` (prompt processing, no prompt cache) and the wall time of
the request around it. The two run in turn, per length and repeat, in one process.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tqdm.auto import tqdm

from benchmarks.decoder_speed import publish
from benchmarks.llamacpp import LlamaServer, server_binary
from decoder import SpeculativeDecoder, load_model
from decoder.models.fetch import fetch_preset
from decoder.workloads import builtin_workloads

TITLE = "Time to the first token of long prompts (benchmarks/ttft.py)"


def prompt_of_length(tokenizer: object, tokens: int) -> str:
    """Built-in prompts joined and repeated until ``tokens`` tokens, cut there and decoded back to text."""
    text = "\n\n".join(p for prompts in builtin_workloads().values() for p in prompts)
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
    repeated = (ids * (tokens // max(len(ids), 1) + 1))[:tokens]
    return tokenizer.decode(repeated)  # type: ignore[attr-defined, no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen-coder-1.5b", help="a preset (default: %(default)s)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[100, 1000, 4000],
                        help="prompt lengths in tokens (default: %(default)s)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=2, help="runs per length and method (default: %(default)s)")
    parser.add_argument("--no-write", action="store_true", help="print, do not update RESULTS.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    binary, why = server_binary()
    target = load_model(args.target)
    decoder = SpeculativeDecoder(target, None)
    server = LlamaServer(binary, fetch_preset(args.target), None, context=max(args.lengths) + 64) if binary else None
    ours: dict[int, list[float]] = {n: [] for n in args.lengths}
    theirs: dict[int, list[tuple[float, float]]] = {n: [] for n in args.lengths}
    counted: dict[int, tuple[int, int]] = {}
    try:
        with tqdm(total=len(args.lengths) * args.repeats, desc="long prompts", unit="run") as bar:
            for length in args.lengths:
                prompt = prompt_of_length(target.tokenizer, length)
                for _ in range(args.repeats):
                    record = decoder.generate(prompt, max_new_tokens=1, mode="plain").record
                    ours[length].append(float(record.ttft_ms or 0.0))
                    their_tokens = 0
                    if server is not None:
                        done = server.complete(prompt, 1)
                        theirs[length].append((done.prompt_seconds * 1000, done.seconds * 1000))
                        their_tokens = done.prompt_tokens
                    counted[length] = (record.prompt_tokens, their_tokens)
                    bar.update()
    finally:
        if server is not None:
            server.close()
    lines = [
        "| prompt tokens (ours / llama.cpp) | draftwatch TTFT ms | ms per prompt token | llama.cpp prompt ms | "
        "llama.cpp request ms | draftwatch ÷ llama.cpp prompt |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for length in args.lengths:
        mine = statistics.median(ours[length])
        tokens, their_tokens = counted[length]
        if theirs[length]:
            prompt_ms = statistics.median(p for p, _ in theirs[length])
            wall_ms = statistics.median(w for _, w in theirs[length])
            rest = f"{prompt_ms:.0f} | {wall_ms:.0f} | {mine / prompt_ms:.2f}"
        else:
            rest = " |  | "
        lines.append(f"| {tokens} / {their_tokens} | {mine:.0f} | {mine / tokens:.2f} | {rest} |")
    anchor = "llama-server on the same GGUF" if server is not None else f"no llama-server ({why})"
    body = (
        f"{target.name} ({target.quantization}) beside {anchor}, {args.repeats} run(s) per length, medians; one new "
        "token, greedy, plain (no drafter), no prompt cache. Target: draftwatch within 1.5× llama.cpp's prompt time "
        "at 1,000 tokens.\n\n" + "\n".join(lines)
    )
    return publish(args, TITLE, body)


if __name__ == "__main__":
    sys.exit(main())
