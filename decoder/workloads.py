"""The built-in prompt set: a few prompts per workload, shared by the benchmarks and the demo."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources


@cache
def builtin_workloads() -> dict[str, list[str]]:
    """Workload tag -> prompts (user messages for the chat template).

    >>> sorted(builtin_workloads())
    ['code', 'code-edit', 'extract', 'german', 'prose']
    >>> all(len(prompts) >= 5 for prompts in builtin_workloads().values())
    True
    """
    data = json.loads(resources.files("decoder").joinpath("data/workloads.json").read_text(encoding="utf-8"))
    return {tag: list(prompts) for tag, prompts in data["workloads"].items()}


@cache
def copy_heavy_workloads() -> tuple[str, ...]:
    """The workloads whose outputs copy their input, where drafting should pay most."""
    data = json.loads(resources.files("decoder").joinpath("data/workloads.json").read_text(encoding="utf-8"))
    return tuple(data["copy_heavy"])
