"""The optional parts of the draftwatch distribution, and what a command says when one is missing.

The base install is the watching sidecar (ingest, store, drift, alerts, webhooks, API, scheduler);
``draftwatch[decoder]`` adds the embedded decoder (torch, transformers, gguf, accelerate), ``draftwatch[dashboard]``
the dashboard, ``draftwatch[all]`` both. Checking finds the packages without importing them, so a
command's ``--help`` stays fast.

>>> missing("decoder", {"torch": True, "transformers": True, "gguf": True, "accelerate": True}.get) is None
True
>>> missing("dashboard", {"streamlit": False, "altair": True}.get)
"streamlit is not installed: pip install 'draftwatch[dashboard]' (or 'draftwatch[all]')"
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from typing import Final

# The import names each extra brings (pyproject.toml's optional-dependencies).
EXTRAS: Final = {
    "decoder": ("torch", "transformers", "gguf", "accelerate"),
    "dashboard": ("streamlit", "altair"),
}
EXIT_MISSING: Final = 2  # a command whose extra is not installed exits with this


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def missing(extra: str, present: Callable[[str], bool | None] = installed) -> str | None:
    """What to install for ``extra``, naming the absent packages; None when all of them are there."""
    absent = [module for module in EXTRAS[extra] if not present(module)]
    if not absent:
        return None
    verb = "is" if len(absent) == 1 else "are"
    return f"{', '.join(absent)} {verb} not installed: pip install 'draftwatch[{extra}]' (or 'draftwatch[all]')"


def refuse_without(command: str, *extras: str) -> int | None:
    """:data:`EXIT_MISSING`, after saying on stderr what to install, when one of ``extras`` is absent; else None."""
    for extra in extras:
        absent = missing(extra)
        if absent is not None:
            print(f"{command}: {absent}", file=sys.stderr)
            return EXIT_MISSING
    return None
