"""``make image``, the build command docs/kubernetes.md shows: the images' labels are filled, never empty.

Run with ``CONTAINER=echo`` in a copy of the Makefile and pyproject.toml inside a new git checkout, so the
commands it would run are printed; tests/deploy/test_image.py builds and inspects a real image.
"""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def make_image(tmp_path: Path, origin: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    subprocess.run(["git", "init", "--quiet", str(tmp_path)], check=True)
    if origin is not None:
        subprocess.run(["git", "-C", str(tmp_path), "remote", "add", "origin", origin], check=True)
    return subprocess.run(["make", "--no-print-directory", "-C", str(tmp_path), "image", "CONTAINER=echo", *args],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


@pytest.mark.parametrize(
    ("origin", "source"),
    [
        ("https://ci:hunter2@git.example.org/team/draftwatch.git", "https://git.example.org/team/draftwatch"),
        ("git@github.com:team/draftwatch.git", "https://github.com/team/draftwatch"),
        ("https://github.com/team/draftwatch", "https://github.com/team/draftwatch"),
    ],
)
def test_make_image_labels_both_images_with_the_origin_and_the_version(
    tmp_path: Path, origin: str, source: str
) -> None:
    done = make_image(tmp_path, origin)
    assert done.returncode == 0, done.stderr
    builds = [line.split() for line in done.stdout.splitlines() if line.startswith("build ")]
    assert len(builds) == 2 and "hunter2" not in done.stdout
    for build in builds:
        assert f"SOURCE={source}" in build and f"VERSION={VERSION}" in build
    assert [b[b.index("-t") + 1] for b in builds] == [f"draftwatch:{VERSION}", f"draftwatch-dashboard:{VERSION}"]


def test_make_image_without_an_origin_asks_for_the_source(tmp_path: Path) -> None:
    done = make_image(tmp_path, None)
    assert done.returncode != 0 and "SOURCE=" in done.stderr and not done.stdout
    given = make_image(tmp_path, None, "SOURCE=https://example.org/draftwatch")
    assert given.returncode == 0 and "SOURCE=https://example.org/draftwatch" in given.stdout
