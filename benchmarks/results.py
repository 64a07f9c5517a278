"""Writing a benchmark's figures into its own section of benchmarks/RESULTS.md, leaving the others alone."""

from __future__ import annotations

import os
import platform
import re
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
HEADER = (
    "# Benchmark results\n\n"
    "Each section is rewritten by the benchmark named in its title; the command and machine are given.\n"
)


def cpu_description() -> str:
    """The CPU's model name and its widest vector extension: two machines of the same kind can differ in both,
    and PyTorch's CPU kernels ran twice as fast with AVX-512 as without it."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags_line = re.search(r"^flags\s*:\s*(.+)$", info, re.M)
    flags = set(flags_line.group(1).split()) if flags_line else set()
    vector = next((name for name in ("avx512f", "avx2", "avx", "sse4_2") if name in flags), "no AVX")
    return f"{model.group(1).strip() if model else platform.processor() or 'unknown CPU'}, {vector}"


def machine() -> str:
    """A short description of this machine: CPU count, architecture, Python and torch versions, load."""
    try:
        import torch

        torch_version = str(torch.__version__)
    except ImportError:
        torch_version = "not installed"
    # The load when the figures were written: a shared machine's absolute speeds mean little without it.
    load = ", load average (1/5/15 min) " + " / ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} CPU cores ({platform.machine()}, {cpu_description()}), "
        f"Python {platform.python_version()}, torch {torch_version}{load}"
    )


def write_section(title: str, body: str, argv: list[str] | None = None) -> None:
    """Replace (or append) the ``## title`` section of RESULTS.md with ``body`` plus command, date and machine."""
    args = list(argv if argv is not None else sys.argv)
    script = Path(args[0]) if args else None
    if script is not None and script.is_absolute() and script.is_relative_to(RESULTS.parent.parent):
        args[0] = str(script.relative_to(RESULTS.parent.parent))  # `python -m` gives the full path
    command = "python " + shlex.join(args)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = f"## {title}\n\nCommand: `{command}`  \nDate: {stamp}  \nMachine: {machine()}\n\n{body.strip()}\n"
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    found = pattern.search(text)
    text = pattern.sub(lambda _m: section + "\n", text) if found else text.rstrip() + "\n\n" + section
    RESULTS.write_text(text.rstrip() + "\n")
