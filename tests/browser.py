"""Headless Debian chromium for the browser tests, driven through its own chromedriver (selenium).

`make test` installs both (`make chromium`); where they are missing the tests skip and say so.
Screenshots go to $SHARDLOG_TEST_ARTIFACTS (default .artifacts/ at the repository's root), so a
failing or passing run leaves a picture of what the page showed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("SHARDLOG_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("SHARDLOG_CHROMEDRIVER", shutil.which("chromedriver") or "/usr/bin/chromedriver")


def artifacts_dir() -> Path:
    d = Path(os.environ.get("SHARDLOG_TEST_ARTIFACTS", ROOT / ".artifacts"))
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def browser() -> Iterator:
    """One headless chromium for the session (a WebDriver); pages are opened with `.get(url)`."""
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.skip(f"no chromium at {CHROMIUM} or chromedriver at {CHROMEDRIVER}: run `make chromium` (apt, as root)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def screenshot(browser, request) -> Callable[[str], Path]:
    """`screenshot("label")` saves the current page as <artifacts>/<test name>-<label>.png."""

    def take(label: str) -> Path:
        name = request.node.name.replace("/", "_").replace("[", "-").replace("]", "")
        path = artifacts_dir() / f"{name}-{label}.png"
        assert browser.save_screenshot(str(path)), f"chromium could not save a screenshot to {path}"
        return path

    return take
