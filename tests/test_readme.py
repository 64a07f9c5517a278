"""The README and the manual in docs/ stay true: the settings table matches the code, every command they show
parses, every link lands, and the README stays a landing page."""

from __future__ import annotations

import argparse
import re
import shlex
from inspect import signature
from pathlib import Path

import pytest

from monitor.commands.main import build_parser
from monitor.commands.settings_doc import settings_table

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))
README_MAX_LINES = 220


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_settings_table_lists_every_setting() -> None:
    text = (ROOT / "docs/configuration.md").read_text()
    embedded = text.split("<!-- settings:start -->\n", 1)[1].split("\n<!-- settings:end -->", 1)[0]
    assert embedded.strip() == settings_table(), "regenerate it with: python -m monitor.commands.settings_doc"


def shown_commands(page: Path) -> list[list[str]]:
    """Every `draftwatch ...` command in a page's shell code blocks, as argument lists."""
    commands = []
    # Every fenced block is matched, whatever its language, so that a toml block cannot shift the pairing.
    for language, block in re.findall(r"```(\w*)\n(.*?)```", page.read_text(), re.S):
        if language not in ("", "sh", "bash"):
            continue
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            match = re.match(r"^(?:\.venv/bin/)?draftwatch\s+(.*)$", line)
            if match:
                commands.append(shlex.split(match.group(1)))
    return commands


def sub_commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def mentioned_subcommands() -> set[tuple[str, ...]]:
    """Every `draftwatch SUB [ACTION]` mentioned anywhere in the README or the docs."""
    groups = sub_commands(build_parser())
    found: set[tuple[str, ...]] = set()
    for page in PAGES:
        for sub, action in re.findall(r"`draftwatch ([a-z]+)(?: ([a-z]+))?", page.read_text()):
            actions = sub_commands(groups[sub]) if sub in groups else {}
            found.add((sub, action) if action in actions else (sub,))
    return found


def test_the_pages_show_commands() -> None:
    assert len(shown_commands(README)) >= 5
    assert sum(len(shown_commands(page)) for page in PAGES) >= 40


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_commands_in_code_blocks_parse(page: Path) -> None:
    parser = build_parser()
    for argv in shown_commands(page):
        args = parser.parse_args(argv)
        assert getattr(args, "handler", None) is not None, argv


@pytest.mark.parametrize("path", sorted(mentioned_subcommands()))
def test_help_of_every_mentioned_command(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*path, "--help"])
    assert exited.value.code == 0
    assert "usage: draftwatch" in capsys.readouterr().out


def test_controller_paragraph_quotes_the_code() -> None:
    """The figures docs/decoder.md gives for the controller are the code's defaults."""
    from scipy.stats import norm

    from decoder.speculation.calibration import CALIBRATION_ROUNDS
    from decoder.speculation.controller import Priors, SpeculationController, wilson_upper
    from decoder.speculation.speculative import REPLAN_STEPS, SpeculativeDecoder

    text = " ".join((ROOT / "docs/decoder.md").read_text().split())
    controller = SpeculationController()
    assert f"with α's prior, {Priors().alpha})" in text
    assert f"with a probe every {controller.probe_every}th request" in text
    assert f"re-plans every {REPLAN_STEPS} steps" in text
    assert "at a 90 % upper bound of α" in text
    assert f"{CALIBRATION_ROUNDS} rounds of every pass size" in text
    assert "`decoder.calibrate_if_needed()`" in text and callable(SpeculativeDecoder.calibrate_if_needed)
    assert "`auto_calibrate=False`" in text and "auto_calibrate" in signature(SpeculativeDecoder).parameters
    assert wilson_upper.__defaults__ == (pytest.approx(norm.ppf(0.90), abs=1e-4),)  # z of a one-sided 90 % bound


def test_the_readme_is_a_landing_page() -> None:
    """The manual lives in docs/: the README says what this is and where each kind of user goes."""
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", text))
    pages = {page_id(page) for page in PAGES[1:]}
    unknown, missed = sorted(linked - pages), sorted(pages - linked)
    assert linked == pages, f"the README links {unknown}, no pages of docs/, and misses {missed} of its list of docs"


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    found: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"^#{1,6} (.*)$", line)):
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            found.add(slug)
    return found


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_link_lands(page: Path) -> None:
    """A relative link names a file that exists and, with a #fragment into a page, one of its headings."""
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page_id(page)} links {target}"
        if fragment and linked.suffix == ".md":
            assert fragment in anchors(linked), f"{page_id(page)} links {target}"


def test_version_is_the_installed_package(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    from monitor.commands.main import main

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"draftwatch {version('draftwatch')}"
