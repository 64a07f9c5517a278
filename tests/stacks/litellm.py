"""A real LiteLLM proxy with draftwatch's callback loaded, for tests.

The ``litellm`` command is the one ``scripts/ensure-litellm.sh`` installs into the models' cache root
(:func:`decoder.models.fetch.cache_dir`), at the LiteLLM version pinned in that script. Without it the
tests skip, except under ``CI=true``, where ``make test`` has installed it and its absence is a failure
(as :func:`tests.stacks.llama_server.require_binary`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from decoder.models.fetch import cache_dir
from tests.serving import ROOT, free_port
from tests.stacks.llama_server import _stop

SCRIPT: Final = ROOT / "scripts" / "ensure-litellm.sh"
CALLBACK: Final = "monitor.gateways.litellm_callback.handler"
# The integration's settings the tests run it with: clients ask for ``smol``, whose plain deployment is
# ``smol-plain`` and whose rollout candidate is ``smol-next``; a quarter of each workload held out with no target,
# so that every 4 consecutive requests of a workload hold exactly one out (decoder/holdout.py's systematic
# schedule); the routing decisions and the rollouts read every 0.2 s.
HOLDOUT_SHARE: Final = 0.25
SETTINGS: Final[Mapping[str, str]] = {
    "DRAFTWATCH_LITELLM_DEPLOYMENTS": "smol=smol-plain",
    "DRAFTWATCH_LITELLM_CANDIDATES": "smol=smol-next",
    "DRAFTWATCH_LITELLM_HOLDOUT_SHARE": str(HOLDOUT_SHARE),
    "DRAFTWATCH_LITELLM_HOLDOUT_TARGET": "0",
    "DRAFTWATCH_LITELLM_REFRESH_S": "0.2",
}


def require_litellm() -> Path:
    """The ``litellm`` command of the script's venv; skips the test without it, fails it under ``CI=true``."""
    match = re.search(r'^LITELLM_VERSION="\$\{LITELLM_VERSION:-([^}]+)\}"', SCRIPT.read_text(), re.M)
    assert match, f"{SCRIPT} pins no LITELLM_VERSION"
    command = cache_dir() / "litellm" / os.environ.get("LITELLM_VERSION", match.group(1)) / "venv" / "bin" / "litellm"
    if command.is_file():
        return command
    reason = f"LiteLLM is not installed at {command}: run `bash scripts/ensure-litellm.sh`"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"LiteLLM is required under CI=true (make test installs it): {reason}")
    pytest.skip(reason)


@dataclass(frozen=True)
class LiteLLMProxy:
    """A running LiteLLM proxy: its base URL, its master key and the file its output goes to."""

    url: str
    key: str
    log: Path

    def output(self) -> str:
        """Everything LiteLLM has written so far."""
        return self.log.read_text(errors="replace")

    def tail(self) -> str:
        return self.output()[-3000:]


@contextmanager
def litellm_proxy(
    tmp: Path,
    models: Mapping[str, str],
    env: Mapping[str, str],
    general_settings: Mapping[str, Any] | None = None,
    *,
    target: str,
) -> Iterator[LiteLLMProxy]:
    """LiteLLM's proxy on a free loopback port, run in ``tmp`` with draftwatch's callback; stopped on exit.

    ``models``: each deployment's name and its engine's base URL (OpenAI's API under ``/v1``), asked for model
    ``target``; ``env``: on top of this process's environment (the integration's ``DRAFTWATCH_LITELLM_*``);
    ``general_settings``: the config's section of that name. Ready once ``GET /health/liveliness`` answers 200.
    """
    litellm = require_litellm()
    config = {
        "model_list": [
            {
                "model_name": name,
                "litellm_params": {"model": f"openai/{target}", "api_base": f"{url}/v1", "api_key": "none"},
            }
            for name, url in models.items()
        ],
        "litellm_settings": {"callbacks": [CALLBACK]},
        **({"general_settings": dict(general_settings)} if general_settings else {}),
    }
    (tmp / "config.yaml").write_text(json.dumps(config, indent=2))  # JSON is YAML
    key = "sk-" + secrets.token_hex(16)
    environ = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LITELLM_MASTER_KEY": key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the price list from the internet at start
        **env,
    }
    port = free_port()
    proxy = LiteLLMProxy(f"http://127.0.0.1:{port}", key, tmp / "litellm.log")
    command = [str(litellm), "--config", str(tmp / "config.yaml"), "--host", "127.0.0.1", "--port", str(port)]
    # Output goes to a file, not a pipe: a pipe nobody reads fills up and stalls the proxy.
    with proxy.log.open("wb") as sink:
        process = subprocess.Popen(
            command, env=environ, cwd=tmp, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, f"LiteLLM exited with status {process.returncode}:\n{proxy.tail()}"
            try:
                if httpx.get(f"{proxy.url}/health/liveliness", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass  # not listening yet
            assert time.monotonic() < deadline, f"LiteLLM was not ready after 90 s:\n{proxy.tail()}"
            time.sleep(0.2)
        yield proxy
    finally:
        _stop(process)  # as a llama-server: terminated, killed after 10 s
