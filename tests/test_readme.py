"""The README stays true: its settings table matches the code and every command it shows parses."""

from __future__ import annotations

import re
import shlex
from inspect import signature
from pathlib import Path

import pytest

from monitor.commands.main import build_parser
from monitor.commands.settings_doc import settings_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_settings_table_lists_every_setting() -> None:
    text = README.read_text()
    embedded = text.split("<!-- settings:start -->\n", 1)[1].split("\n<!-- settings:end -->", 1)[0]
    assert embedded.strip() == settings_table(), "regenerate it with: python -m monitor.commands.settings_doc"


def shown_commands() -> list[list[str]]:
    """Every `draftwatch ...` command in the README's code blocks, as argument lists."""
    commands = []
    # Every fenced block is matched, whatever its language, so that a toml block cannot shift the pairing.
    for language, block in re.findall(r"```(\w*)\n(.*?)```", README.read_text(), re.S):
        if language not in ("", "sh", "bash"):
            continue
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            match = re.match(r"^(?:\.venv/bin/)?draftwatch\s+(.*)$", line)
            if match:
                commands.append(shlex.split(match.group(1)))
    return commands


def mentioned_subcommands() -> set[tuple[str, ...]]:
    """Every `draftwatch SUB [ACTION]` mentioned anywhere in the README."""
    found = set()
    for sub, action in re.findall(r"`draftwatch ([a-z]+)(?: ([a-z]+))?", README.read_text()):
        found.add((sub, action) if action in {"list", "fetch", "upgrade", "current", "downgrade", "run",
                                               "pin", "unpin", "deliver", "ack"} else (sub,))  # fmt: skip
    return found


def test_commands_in_code_blocks_parse() -> None:
    commands = shown_commands()
    assert len(commands) >= 5
    parser = build_parser()
    for argv in commands:
        args = parser.parse_args(argv)
        assert getattr(args, "handler", None) is not None, argv


@pytest.mark.parametrize("path", sorted(mentioned_subcommands()))
def test_help_of_every_mentioned_command(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*path, "--help"])
    assert exited.value.code == 0
    assert "usage: draftwatch" in capsys.readouterr().out


def test_controller_paragraph_quotes_the_code() -> None:
    """The figures the README gives for the controller are the code's defaults."""
    from scipy.stats import norm

    from decoder.speculation.calibration import CALIBRATION_ROUNDS
    from decoder.speculation.controller import Priors, SpeculationController, wilson_upper
    from decoder.speculation.speculative import REPLAN_STEPS, SpeculativeDecoder

    text = " ".join(README.read_text().split())
    controller = SpeculationController()
    assert f"with α's prior, {Priors().alpha})" in text
    assert f"with a probe every {controller.probe_every}th request" in text
    assert f"re-plans every {REPLAN_STEPS} steps" in text
    assert "at a 90 % upper bound of α" in text
    assert f"{CALIBRATION_ROUNDS} rounds of every pass size" in text
    assert "`decoder.calibrate_if_needed()`" in text and callable(SpeculativeDecoder.calibrate_if_needed)
    assert "`auto_calibrate=False`" in text and "auto_calibrate" in signature(SpeculativeDecoder).parameters
    assert wilson_upper.__defaults__ == (pytest.approx(norm.ppf(0.90), abs=1e-4),)  # z of a one-sided 90 % bound


def test_version_is_the_installed_package(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    from monitor.commands.main import main

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"draftwatch {version('draftwatch')}"
