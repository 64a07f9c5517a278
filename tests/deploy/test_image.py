"""The Containerfile, built with podman and run next to a real llama-server, as a serving team would run it.

``make test`` runs ``scripts/ensure-podman.sh`` first: podman, runc and a base image made from
Debian's packages (no registry is reachable here), passed as the build's ``BASE``. The image is
built once per session; its size and the sidecar's start time (``podman run`` to ``/readyz``) are
printed. The container shares the host's network (``--network=host``), so that it reaches
llama-server and PostgreSQL on loopback while binding every interface, as it does in a pod.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from decoder.models.fetch import cache_dir, fetch_preset
from tests.pg import PG_URL, create_pg_database, drop_pg_database
from tests.proxy.engine import rows
from tests.stacks.llama_server import BASE_ARGS, LlamaServer, free_port, llama_server, require_binary

pytestmark = [pytest.mark.models, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ensure-podman.sh"
TAG = "localhost/draftwatch:test"
TOKEN = "image-test-admin-token"
UID = "10001"


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:2])} exited {result.returncode}: {result.stderr[-2000:]}")
    return result


@dataclass(frozen=True)
class Image:
    tag: str
    size_mb: float
    build_s: float


@pytest.fixture(scope="module")
def image() -> Iterator[Image]:
    """The sidecar target, built on the base ``ensure-podman.sh`` prepared (which it runs: a no-op when ready)."""
    if shutil.which("podman") is None:
        reason = "podman is not installed: run `bash scripts/ensure-podman.sh`"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"podman is required under CI=true (make test installs it): {reason}")
        pytest.skip(reason)
    conf = cache_dir() / "image" / "containers.conf"
    os.environ.setdefault("CONTAINERS_CONF", str(conf))
    base = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=600, check=True)
    # The host's CA bundle, mounted where the build's pip reads it: a machine whose traffic to the
    # package index passes a TLS-inspecting proxy trusts that proxy only through the bundle.
    bundle = Path(os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt")
    pip_options = [f"--cert {bundle}"] if bundle.is_file() else []
    if os.environ.get("PIP_INDEX_URL"):
        pip_options.append(f"--index-url {os.environ['PIP_INDEX_URL']}")
    started = time.monotonic()
    podman(
        "build", "--format", "docker", "--network", "host", "--target", "sidecar",
        *(["--volume", f"{bundle}:{bundle}:ro"] if bundle.is_file() else []),
        "--build-arg", f"BASE={base.stdout.strip().splitlines()[-1]}",
        "--build-arg", f"PIP_OPTIONS={' '.join(pip_options)}",
        "--tag", TAG, str(ROOT),
        timeout=900,
    )  # fmt: skip
    build_s = time.monotonic() - started
    size = int(podman("image", "inspect", "--format", "{{.Size}}", TAG).stdout.strip())
    yield Image(TAG, size / 1e6, build_s)


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaServer]:
    binary = require_binary()
    model = fetch_preset("smollm2-135m", progress=False)
    with llama_server(model, *BASE_ARGS, "--threads", "1", binary=binary) as server:
        yield server


def inspect(tag: str) -> dict[str, Any]:
    """podman's view of the image: ``Config`` (the OCI config) and, beside it, the Docker-format ``Healthcheck``."""
    found: dict[str, Any] = json.loads(podman("image", "inspect", tag).stdout)[0]
    return found


def test_the_image_runs_unprivileged_without_a_compiler_labelled_with_the_project_s_version(image: Image) -> None:
    found = inspect(image.tag)
    config = found["Config"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["draftwatch", "serve"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == project["version"], "Containerfile's VERSION default"
    assert labels["org.opencontainers.image.licenses"] == project["license"]
    assert labels["org.opencontainers.image.title"] == "draftwatch"
    assert "/healthz" in " ".join(found["Healthcheck"]["Test"]), "built with --format docker, the HEALTHCHECK is kept"
    tools = podman("run", "--rm", "--entrypoint", "sh", image.tag, "-c",
                   "for t in gcc cc g++ make git; do command -v $t; done; id -u", check=False)  # fmt: skip
    assert tools.stdout.split() == [UID], f"a build tool in the final stage, or root: {tools.stdout}"


def test_the_image_holds_the_wheel_and_the_locked_dependencies_not_the_sources(image: Image) -> None:
    """As `pip install draftwatch` leaves it: monitor in site-packages with its migrations, pylock.toml's versions."""
    lock = tomllib.loads((ROOT / "pylock.toml").read_text())
    locked = {p["name"]: p["version"] for p in lock["packages"] if "wheels" in p}
    probe = (
        "import json, importlib.metadata as m, monitor, monitor.store.migrate as g; "
        "found = {d.name.lower().replace('_', '-'): d.version for d in m.distributions()}; "
        "print(json.dumps([monitor.__file__, str(g.migrations_dir()), found]))"
    )
    found = podman("run", "--rm", "--entrypoint", "python3", image.tag, "-c", probe).stdout.strip().splitlines()[-1]
    module, migrations, installed = json.loads(found)
    assert "/site-packages/monitor/" in module, module
    assert migrations.endswith("/site-packages/monitor/store/migrations"), migrations
    assert {name: installed.get(name) for name in locked} == locked
    assert podman("run", "--rm", "--entrypoint", "ls", image.tag, "/opt/draftwatch").stdout.split() == ["venv"]


def test_without_api_tokens_the_container_refuses_to_bind_and_says_what_to_set(image: Image) -> None:
    result = podman("run", "--rm", "--network", "host", image.tag, "--upstream", "http://127.0.0.1:9", check=False)
    assert result.returncode == 2, result.stderr
    assert "DRAFTWATCH_API_TOKENS" in result.stderr
    assert "Traceback" not in result.stderr


class Sidecar:
    """One ``podman run -d`` of the image; ``start_s`` is the time from the run to ``/readyz`` answering 200."""

    def __init__(self, tag: str, port: int, args: list[str], volume: Path | None, **env: str) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        environment = {"DRAFTWATCH_API_TOKENS": f"admin:{TOKEN}", "DRAFTWATCH_API_PORT": str(port), **env}
        started = time.monotonic()
        self.id = podman(
            # Read-only, as deploy/ runs it: everything it writes goes to the volume (or PostgreSQL).
            "run", "--detach", "--network", "host", "--read-only",
            *(arg for key, value in environment.items() for arg in ("--env", f"{key}={value}")),
            *(["--volume", f"{volume}:/var/lib/draftwatch"] if volume else []),
            tag, *args,
        ).stdout.strip()  # fmt: skip
        deadline = started + 90
        while True:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.exit_code() is not None:
                raise AssertionError(f"the sidecar did not become ready:\n{self.logs()[-3000:]}")
            time.sleep(0.1)
        self.start_s = time.monotonic() - started

    def exit_code(self) -> int | None:
        state = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", self.id).stdout.split()
        return int(state[1]) if state[0] in ("exited", "stopped") else None

    def logs(self) -> str:
        result = podman("logs", self.id, check=False)
        return result.stdout + result.stderr

    def remove(self) -> None:
        podman("rm", "--force", "--time", "0", self.id, check=False)


def chat(url: str, workload: str, max_tokens: int = 8) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers={"X-Workload": workload}, timeout=120)


def test_the_container_proxies_records_in_its_volume_and_drains_a_stream_on_sigterm(
    image: Image, engine: LlamaServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, int(UID), int(UID))  # rootful podman maps no user: the container's user owns it as on the host
    sidecar = Sidecar(image.tag, free_port(), ["--upstream", engine.url, "--upstream-kind", "llamacpp"], data)
    try:
        answered = chat(sidecar.url, "greeting")
        assert answered.status_code == 200, answered.text
        assert answered.json()["choices"][0]["message"]["content"]
        assert podman("healthcheck", "run", sidecar.id, check=False).returncode == 0, "the HEALTHCHECK fails"

        # A stream in flight when SIGTERM arrives runs to its end, and its record is written before exit.
        events: list[str] = []
        first = threading.Event()

        def stream() -> None:
            body = {"messages": [{"role": "user", "content": "Count from one to forty in words."}],
                    "max_tokens": 96, "temperature": 0, "stream": True}  # fmt: skip
            with httpx.stream("POST", f"{sidecar.url}/v1/chat/completions", json=body,
                              headers={"X-Workload": "draining"}, timeout=120) as response:  # fmt: skip
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        events.append(line)
                        first.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert first.wait(60), "the stream never started"
        podman("kill", "--signal", "TERM", sidecar.id)
        reader.join(120)
        assert events[-1] == "data: [DONE]", f"the stream was cut at SIGTERM after {len(events)} events"
        podman("wait", sidecar.id, timeout=60)
        assert sidecar.exit_code() == 0, sidecar.logs()[-3000:]
        logs = sidecar.logs()
        assert "Traceback" not in logs and "Say hello" not in logs and TOKEN not in logs
        assert "writer process" not in logs, "the recorder's writer process failed in the read-only container"

        database = data / "draftwatch.db"
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
            stored = dict(conn.execute("SELECT workload, count(*) FROM requests GROUP BY workload").fetchall())
        assert stored == {"greeting": 1, "draining": 1}
        with capsys.disabled():
            print(f"\n[image] {image.tag}: {image.size_mb:.0f} MB, built in {image.build_s:.0f} s, "
                  f"sidecar ready {sidecar.start_s:.1f} s after podman run")  # fmt: skip
    finally:
        sidecar.remove()


def test_the_container_writes_to_postgresql_as_a_fleet_s_sidecars_do(image: Image, engine: LlamaServer) -> None:
    name = create_pg_database()
    url = PG_URL.format(name=name)
    sidecar = Sidecar(image.tag, free_port(), ["--upstream", engine.url, "--no-scheduler"], None,
                      DRAFTWATCH_DATABASE_URL=url)  # fmt: skip
    try:
        assert chat(sidecar.url, "fleet").status_code == 200
        podman("stop", "--time", "30", sidecar.id, timeout=60)
        assert sidecar.exit_code() == 0, sidecar.logs()[-3000:]
        assert [(r["workload"], r["mode"], r["output_tokens"] > 0) for r in rows(url)] == [("fleet", "plain", True)]
    finally:
        sidecar.remove()
        drop_pg_database(name)
