"""A real browser on the real command: ``draftwatch dashboard`` on a free port, headless Chromium.

Every page is opened, waited for until its script has finished running, screenshotted into
``test-artifacts/dashboard/`` and its text checked (title present, no "Traceback", no "Error").
The Overview screenshot also becomes ``docs/dashboard.png`` when that file is missing or
``DRAFTWATCH_UPDATE_SCREENSHOT=1`` (so ordinary runs leave the committed image alone).

Chromium and chromedriver are Debian's packages, installed by ``scripts/ensure-chromium.sh``
(``make test`` runs it); without them the test is skipped, except under ``CI=true``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dashboard.conftest import Store

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
PAGES = {"Overview": "", "Workload": "workload", "Drift": "drift", "Alerts": "alerts", "Pairs": "pairs",
         "Rollouts": "rollouts"}  # fmt: skip

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(base: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"draftwatch dashboard exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as response:
                if response.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError("the dashboard did not become healthy within a minute")


@pytest.fixture
def server(seeded_store: Store, tmp_path: Path) -> Iterator[str]:
    command = Path(sys.executable).with_name("draftwatch")
    argv = [str(command)] if command.exists() else [sys.executable, "-m", "monitor.commands"]
    port = _free_port()
    log = (tmp_path / "dashboard.log").open("wb")
    proc = subprocess.Popen(
        [*argv, "dashboard", "--port", str(port), "--database-url", seeded_store.url],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base, proc)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture
def browser() -> Iterator[object]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        if os.environ.get("CI") == "true":
            pytest.fail("chromium/chromedriver missing: run scripts/ensure-chromium.sh")
        pytest.skip("chromium/chromedriver not installed (scripts/ensure-chromium.sh)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="dw-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",  # we run as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1440,1200",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _finished(driver: object, title: str, timeout: float = 45.0) -> str:
    """Wait until the page shows ``title`` and Streamlit's "running" indicator is gone twice in a row."""
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + timeout
    settled = 0
    text = ""
    while time.monotonic() < deadline:
        text = driver.find_element(By.TAG_NAME, "body").text  # type: ignore[attr-defined]
        running = driver.execute_script(  # type: ignore[attr-defined]
            "return document.querySelectorAll('[data-testid=\"stStatusWidget\"] *').length"
            " + document.querySelectorAll('[data-testid=\"stSkeleton\"]').length"
        )
        headings = [h.text for h in driver.find_elements(By.TAG_NAME, "h1")]  # type: ignore[attr-defined]
        settled = settled + 1 if title in headings and not running else 0
        if settled >= 3:
            return str(text)
        time.sleep(0.5)
    raise AssertionError(f"page {title!r} did not finish running; it shows:\n{text[:2000]}")


def test_every_page_in_a_real_browser(server: str, browser: object) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for title, path in PAGES.items():
        browser.get(f"{server}/{path}")  # type: ignore[attr-defined]
        text = _finished(browser, title)
        time.sleep(1.0)  # charts draw after the script finishes
        shot = ARTIFACTS / f"{title.lower()}.png"
        assert browser.save_screenshot(str(shot)), shot  # type: ignore[attr-defined]
        assert "Traceback" not in text and "Error" not in text, text[:2000]
        for other in PAGES:  # the navigation lists every page
            assert other in text
        if title == "Overview":
            assert "alert(s) firing" in text
            docs = ROOT / "docs" / "dashboard.png"
            if not docs.exists() or os.environ.get("DRAFTWATCH_UPDATE_SCREENSHOT") == "1":
                shutil.copyfile(shot, docs)
