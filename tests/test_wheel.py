"""draftwatch as pip installs it: the sdist and the wheel built from it create their database with no checkout.

The sources are copied out of the checkout, made into an sdist, and the wheel is built from the unpacked
sdist, as ``pip install draftwatch`` does from an index that has only the sdist. The wheel is installed with
``pip install --no-deps --target``; the interpreter under test starts with ``-S`` and a ``PYTHONPATH`` of that
folder and of this environment's packages minus draftwatch's editable install, in a folder outside the
checkout, so nothing of the checkout is importable there (the test checks where ``monitor`` came from).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import time
import tomllib
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.serving import free_port

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("setup.py", "pyproject.toml", "README.md", "migrations", "monitor", "decoder", "dashboard")


def _build(backend: str, source: Path, out: Path) -> Path:
    """``build_meta.<backend>`` run in ``source`` with this environment's setuptools (no download); the artefact."""
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", f"from setuptools import build_meta; print(build_meta.{backend}({str(out)!r}))"],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out / done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of an interpreter that imports draftwatch from the installed wheel only."""
    work = tmp_path_factory.mktemp("wheel")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", *SOURCES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    checkout = work / "checkout"
    for name in listed:
        if (ROOT / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            (checkout / name).write_bytes((ROOT / name).read_bytes())
    sdist = _build("build_sdist", checkout, work / "sdist")
    with tarfile.open(sdist) as archive:
        archive.extractall(work / "unpacked", filter="data")
    [unpacked] = (work / "unpacked").iterdir()
    wheel = _build("build_wheel", unpacked, work / "dist")

    target = work / "target"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(target),
         str(wheel)],
        check=True,
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    # This environment's packages, without draftwatch's editable install (its .pth and finder) and metadata.
    packages = work / "site-packages"
    packages.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.endswith(".pth") and "draftwatch" not in entry.name.lower():
            (packages / entry.name).symlink_to(entry)
    home = work / "home"
    home.mkdir()
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("DRAFTWATCH_")},
        "PYTHONPATH": f"{target}{os.pathsep}{packages}",
        "HOME": str(home),
        "DRAFTWATCH_DATA_DIR": str(home / "data"),
    }


def draftwatch(*args: str) -> list[str]:
    return [sys.executable, "-S", "-m", "monitor.commands", *args]


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(draftwatch(*args), env=env, cwd=env["HOME"], capture_output=True, text=True, timeout=120)


def test_draftwatch_imports_from_the_wheel_alone(installed: dict[str, str]) -> None:
    probe = (
        "import json, monitor, monitor.store.migrate as m; "
        "print(json.dumps([monitor.__file__, str(m.migrations_dir())]))"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe], env=installed, cwd=installed["HOME"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    module, migrations = map(Path, json.loads(done.stdout))
    target = Path(installed["PYTHONPATH"].split(os.pathsep)[0])
    assert module.is_relative_to(target) and not module.is_relative_to(ROOT), module
    assert migrations == target / "monitor/store/migrations", migrations


def test_db_upgrade_and_drift_run_work_from_the_wheel(installed: dict[str, str], db_url: str) -> None:
    env = {**installed, "DRAFTWATCH_DATABASE_URL": db_url}
    upgraded = run(env, "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    current = run(env, "db", "current")
    assert current.returncode == 0 and "(up to date)" in current.stdout, current
    drift = run(env, "drift", "run", "--json")
    assert drift.returncode == 0, drift.stderr
    json.loads(drift.stdout)


def test_serve_from_the_wheel_creates_its_database_and_becomes_ready(installed: dict[str, str], db_url: str) -> None:
    port = free_port()
    env = {**installed, "DRAFTWATCH_DATABASE_URL": db_url}
    process = subprocess.Popen(
        draftwatch("serve", "--port", str(port), "--no-scheduler"),
        env=env,
        cwd=env["HOME"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        ready = False
        while not ready and time.monotonic() < deadline:
            assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                time.sleep(0.1)
        assert ready, "draftwatch serve from the wheel did not become ready"
    finally:
        process.terminate()
        process.wait(30)


def test_the_image_s_lock_pins_every_dependency_at_a_version_pyproject_allows() -> None:
    """The Containerfile installs pylock.toml's files, hash-checked and without resolving: a dependency added to
    pyproject.toml, or a floor raised past the lock, must be locked again (the command is in the Containerfile)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lock = tomllib.loads((ROOT / "pylock.toml").read_text())
    locked = {canonicalize_name(p["name"]): p for p in lock["packages"] if "wheels" in p}
    for dependency in map(Requirement, project["dependencies"]):
        name = canonicalize_name(dependency.name)
        assert name in locked, f"pylock.toml lacks {name}: lock again (see the Containerfile)"
        assert dependency.specifier.contains(locked[name]["version"]), f"pylock.toml's {name} is not {dependency}"
        for extra in dependency.extras:  # psycopg[binary]: its extra's packages are locked as well
            assert f"{name}-{extra}" in locked, f"pylock.toml lacks {name}[{extra}]'s {name}-{extra}"
    assert all(w["hashes"]["sha256"] for p in locked.values() for w in p["wheels"])
